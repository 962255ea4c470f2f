package aci

import (
	"context"
	"errors"
	"fmt"
	"image"
	"runtime/debug"
	"strconv"
	"time"

	"github.com/coder/websocket"

	"github.com/forkfleet/forkfleet/api/errdefs"
	aciv1 "github.com/forkfleet/forkfleet/api/gen/forkfleet/aci/v1"
	"github.com/forkfleet/forkfleet/guestd/internal/desktop"
	"github.com/forkfleet/forkfleet/guestd/internal/encode"
	"github.com/forkfleet/forkfleet/guestd/internal/gcpace"
	"github.com/forkfleet/forkfleet/guestd/internal/sysops"
)

const (
	defaultCheckpointHold = 5 * time.Second
	maxCheckpointHold     = 60 * time.Second
	checkpointCloseGrace  = 50 * time.Millisecond
	// StatusCheckpoint is the close code agents see when their session ends
	// for a checkpoint (1012, Service Restart: reconnecting is the remedy).
	StatusCheckpoint = websocket.StatusCode(1012)
	// StatusTokensReplaced closes the sessions a replica had open when
	// restored installed its own tokens (1008, Policy Violation: they were
	// opened with its checkpoint's tokens).
	StatusTokensReplaced = websocket.StatusPolicyViolation
)

// checkpointPrepare closes every session but keep and refuses new agent
// sessions until the hold lifts: CRIU cannot carry an established
// connection from outside the sandbox into a dump, and a client reconnecting
// in the window before the freeze would fail the checkpoint.
//
// It then reports the frame a memory-tier replica is born with: after the
// sessions are gone nothing but the apps themselves can draw, so once the
// screen has been still for settle_ms the hash taken here is the frame the
// freeze captures.
func (s *Server) checkpointPrepare(ctx context.Context, keep *session, req *aciv1.CheckpointPrepareRequest) (*aciv1.CheckpointPrepareResponse, error) {
	start := time.Now()
	hold := time.Duration(req.GetHoldMs()) * time.Millisecond
	switch {
	case hold == 0:
		hold = defaultCheckpointHold
	case hold > maxCheckpointHold:
		return nil, errInvalid("checkpoint_prepare.hold_ms", "at most %d", maxCheckpointHold.Milliseconds())
	}
	settle := time.Duration(req.GetSettleMs()) * time.Millisecond
	bound := time.Duration(req.GetSettleTimeoutMs()) * time.Millisecond
	if bound == 0 {
		bound = defaultSettleTimeout
	}
	if settle > maxSettle || bound > maxSettle {
		return nil, errInvalid("checkpoint_prepare.settle_ms", "settle_ms and settle_timeout_ms are capped at %s", maxSettle)
	}
	s.holdUntil.Store(time.Now().Add(hold).UnixNano())
	victims := s.sessionsExcept(keep)
	for _, ss := range victims {
		ss.closeWith(StatusCheckpoint, "checkpoint")
	}
	// Reply only once the sockets are gone, so the caller can dump right
	// after it closes its own session. Peers get a moment to answer the
	// close frame; a checkpoint does not wait for slow ones.
	deadline := time.NewTimer(checkpointCloseGrace)
	defer deadline.Stop()
	for _, ss := range victims {
		select {
		case <-ss.closeDone:
		case <-deadline.C:
		}
		if ss.raw != nil {
			ss.raw.Close()
		} else {
			ss.cancel()
		}
	}
	resp := &aciv1.CheckpointPrepareResponse{ClosedSessions: uint32(len(victims))}
	// Freed heap goes back to the kernel during the settle: the probe there
	// watches the sandbox's other processes, and the dump should find state,
	// not scratch. A replica then restores a small heap paced for its
	// size: the spare keeps its first session and screenshot from
	// collecting (see releaseScratch).
	scavenged := make(chan struct{})
	go func() {
		defer close(scavenged)
		freeHeap()
	}()
	defer func() { <-scavenged }()
	closed := time.Since(start)
	var settleTook, hashTook time.Duration // logged: where a checkpoint's wait goes
	if d, err := s.desktop(); err == nil {
		t := time.Now()
		settled := true
		// With the X server grabbed nothing can draw between the hash and
		// the dump, so there is nothing to wait for: an animating page would
		// only run the wait into its bound.
		if _, grabs := d.(ServerGrabber); settle > 0 && !grabs {
			var err error
			if settled, err = s.damage.stillFor(ctx, settle, bound, s.opts.SandboxCPU); err != nil {
				return nil, err
			}
		}
		settleTook, t = time.Since(t), time.Now()
		// From here to the dump only guestd may draw: the frame hashed next
		// is the frame the dump holds, on a page that animates too.
		if err := s.grabForDump(d, hold); err != nil {
			return nil, err
		}
		// Usually answered from the last capture (no damage since): no
		// capture, so the segments released at the last prepare stay empty.
		shot, err := keep.screenshot(ctx, &aciv1.ScreenshotRequest{Format: aciv1.ImageFormat_IMAGE_FORMAT_NONE}, "checkpoint_prepare")
		if err != nil {
			s.releaseGrab()
			return nil, err
		}
		hashTook = time.Since(t)
		resp.FrameHash, resp.Settled = shot.GetFrameHash(), settled
		// A replica must prove its pixels with a capture of its own: until
		// checkpoint_done (the source) or restored (a replica) no frame is
		// proven, nor stored as proven by a screenshot in flight. The source
		// gets its frame back (still proven only while nothing was drawn).
		s.preparedShot.Store(s.provedShot.Load())
		s.setShotEpoch(false)
		s.releaseCaptureBuffers()
	}
	<-scavenged
	s.log.Info("checkpoint prepare", "closed_sessions", len(victims), "hold", hold, "settled", resp.Settled,
		"close", closed, "settle", settleTook, "hash", hashTook, "total", time.Since(start))
	return resp, nil
}

// sessionsExcept lists every open session but keep.
func (s *Server) sessionsExcept(keep *session) []*session {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]*session, 0, len(s.sessions))
	for ss := range s.sessions {
		if ss != keep {
			out = append(out, ss)
		}
	}
	return out
}

// liftHold ends a checkpoint hold (CheckpointDone on the source, Restored on
// a replica).
func (s *Server) liftHold() { s.holdUntil.Store(0) }

// checkpointDone ends a checkpoint on the source that runs on: the hold is
// lifted and the frame proven before the dump is trusted again.
func (s *Server) checkpointDone() {
	s.liftHold()
	s.releaseGrab()
	e := s.setShotEpoch(true)
	if p := s.preparedShot.Swap(nil); p != nil && p.epoch%2 == 0 {
		back := *p
		back.epoch = e
		s.provedShot.Store(&back)
	}
}

// setShotEpoch moves shotEpoch to the next even (proven frames answer) or
// odd (they do not) value and returns it.
func (s *Server) setShotEpoch(on bool) uint64 {
	for {
		e := s.shotEpoch.Load()
		next := e + 1
		if (next%2 == 0) != on {
			next++
		}
		if s.shotEpoch.CompareAndSwap(e, next) {
			return next
		}
	}
}

// held reports whether new agent sessions are refused for a checkpoint.
func (s *Server) held() bool {
	until := s.holdUntil.Load()
	return until != 0 && time.Now().UnixNano() < until
}

// releaseScratch gives the capture buffers KSM cannot merge and freed heap
// back to the kernel: a frozen pool member should hold only state, not
// scratch. Its copy of the screen stays (ScratchReleaser.ReleaseShared),
// and its next collection waits for spareAfterRelease of growth (gcpace.Spare):
// the claimant's session and first screenshot allocate more than a small
// heap's pacing allows, and a collection on a heap KSM merged would fault
// every page it writes inside that screenshot.
func (s *Server) releaseScratch() int {
	n := 0
	if r := s.scratchReleaser(); r != nil {
		n = r.ReleaseShared()
	}
	freeHeap()
	return n
}

// freeHeap gives freed heap back to the kernel and leaves the collector a
// spare (spareAfterRelease) before its next collection.
func freeHeap() {
	debug.FreeOSMemory()
	gcpace.Spare(spareAfterRelease)
}

// spareAfterRelease is the heap growth a guestd that gave its freed heap
// back (a pool member before its freeze, a checkpoint's source and so its
// replicas) may make before it collects: a new session and its first
// full-screen PNG (the encoder's deflate state per worker, the band cache)
// with room to spare.
const spareAfterRelease = 16 << 20

// releaseCaptureBuffers drops the pages of the desktop's capture buffers
// (the shared-memory segments the X server writes frames into); the next
// capture faults them back in.
func (s *Server) releaseCaptureBuffers() int {
	if r := s.scratchReleaser(); r != nil {
		return r.ReleaseScratch(0)
	}
	return 0
}

// scratchReleaser is the desktop as a ScratchReleaser; nil when there is
// no desktop or it holds no scratch.
func (s *Server) scratchReleaser() ScratchReleaser {
	if d, err := s.desktop(); err == nil {
		if r, ok := d.(ScratchReleaser); ok {
			return r
		}
	}
	return nil
}

// releaseIdleScratch gives d's capture buffers back whenever no capture
// used them for Options.ScratchIdle, until ctx ends. Checked every tenth
// of that: a buffer goes at most 1.1 idle periods after its last use.
func (s *Server) releaseIdleScratch(ctx context.Context, d Desktop) {
	r, ok := d.(ScratchReleaser)
	if !ok || s.opts.ScratchIdle < 0 {
		return
	}
	t := time.NewTicker(max(s.opts.ScratchIdle/10, time.Millisecond))
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			if n := r.ReleaseScratch(s.opts.ScratchIdle); n > 0 {
				s.log.Debug("idle capture buffers released", "bytes", n, "idle", s.opts.ScratchIdle)
			}
		}
	}
}

// grabForDump makes guestd the X server's only client (see ServerGrabber)
// until checkpoint_done, restored, or hold elapses in the process that
// grabbed: a replica restored after the hold has lapsed keeps the grab until
// its restored request captures its first frame.
func (s *Server) grabForDump(d Desktop, hold time.Duration) error {
	g, ok := d.(ServerGrabber)
	if !ok {
		return nil
	}
	s.grab.Lock()
	defer s.grab.Unlock()
	if s.grab.held == nil {
		if err := g.GrabServer(); err != nil {
			return err
		}
		s.grab.held = g
		s.grab.start = processStart()
	}
	if s.grab.timer != nil {
		s.grab.timer.Stop()
	}
	s.grab.timer = time.AfterFunc(hold, s.expireGrab)
	return nil
}

// expireGrab releases a grab whose checkpoint never ended (controld gone),
// but only in the process that took it. In a replica the timer of the
// source's memory fires as soon as the restore resumes it, when the hold
// has lapsed since the dump: that replica's grab is restored's to release,
// after its first capture.
func (s *Server) expireGrab() {
	if st := processStart(); st != "" && st != s.startOfGrab() {
		return
	}
	s.log.Warn("checkpoint hold expired: releasing the X server grab")
	s.releaseGrab()
}

// holdApps stops the session's apps until resume_apps (restored with
// hold_apps); the X server runs on.
func (s *Server) holdApps() {
	if s.opts.StopApps == nil {
		return
	}
	s.apps.Lock()
	defer s.apps.Unlock()
	if s.apps.cont == nil {
		s.apps.cont = s.opts.StopApps()
	}
}

// resumeApps continues the apps holdApps holds and returns how many.
func (s *Server) resumeApps() int {
	s.apps.Lock()
	cont := s.apps.cont
	s.apps.cont = nil
	s.apps.Unlock()
	if cont == nil {
		return 0
	}
	return cont()
}

func (s *Server) startOfGrab() string {
	s.grab.Lock()
	defer s.grab.Unlock()
	return s.grab.start
}

// releaseGrab ends the grab, if held.
func (s *Server) releaseGrab() {
	s.grab.Lock()
	defer s.grab.Unlock()
	if s.grab.timer != nil {
		s.grab.timer.Stop()
		s.grab.timer = nil
	}
	if s.grab.held == nil {
		return
	}
	if err := s.grab.held.UngrabServer(); err != nil {
		s.log.Warn("release the X server grab", "err", err)
	}
	s.grab.held = nil
}

// bornBandBytes bounds a band of the born frame's capture (bornFrameHash).
const bornBandBytes = 256 << 10

// bornFrameHash captures the whole screen (never a cached frame: the dumped
// memory knows only the source's screen) and returns its frame hash, as
// ScreenshotResponse.frame_hash of a full-screen capture without cursor. A
// replica calls it while it still holds the grab restored from the dump,
// before any app drew: on an animating page too, the frame the dump holds.
//
// A FrameViewer is captured in bands of whole rows, bornBandBytes at most:
// the capture segment of a replica is empty (released before the dump), and
// a full-screen capture into it would fault in all of it on both sides (the
// X server writing, guestd reading: 2,000 page faults at 1280x800, 5 to 9
// ms of CPU per replica of a fork) for a frame that is only hashed. The
// grab keeps the bands one frame.
//
// With keep (a pool member, restored with hold_apps) the frame is read into
// the ScreenMirror instead, which release_scratch keeps: the copy's pages
// are faulted in while the pool fills, not in the claimant's first
// screenshot, which then reads only the rows drawn since (the copies of a
// pool's members are equal, and KSM merges them).
func (s *Server) bornFrameHash(ctx context.Context, keep bool) ([]byte, error) {
	d, err := s.desktop()
	if err != nil {
		return nil, err
	}
	w, h := d.ScreenSize()
	if keep {
		if sum, err := hashMirror(ctx, d, w, h); !errors.Is(err, errdefs.ErrUnavailable) {
			return sum, err
		}
	}
	if v, ok := d.(FrameViewer); ok {
		return hashInBands(v, w, h, max(1, bornBandBytes/(w*4)))
	}
	var f desktop.Frame
	if err := d.Capture(image.Rect(0, 0, w, h), &f); err != nil {
		return nil, err
	}
	sum, err := encode.Hash128(encode.Image{Pix: f.Pix, Stride: f.Stride, Width: w, Height: h})
	if err != nil {
		return nil, err
	}
	return sum[:], nil
}

// hashMirror is Hash128 of the w x h screen, read through d's
// ScreenMirror. An error wrapping errdefs.ErrUnavailable means d has none.
func hashMirror(ctx context.Context, d Desktop, w, h int) ([]byte, error) {
	sq, ok := d.(DamageSequencer)
	m, ok2 := d.(ScreenMirror)
	if !ok || !ok2 {
		return nil, fmt.Errorf("no screen mirror: %w", errdefs.ErrUnavailable)
	}
	if _, err := sq.DamageSeqSync(ctx); err != nil {
		return nil, err
	}
	var sum [16]byte
	err := m.CaptureScreenSynced(func(f *desktop.Frame) (err error) {
		sum, err = encode.Hash128(encode.Image{Pix: f.Pix, Stride: f.Stride, Width: w, Height: h})
		return err
	})
	if err != nil {
		return nil, err
	}
	return sum[:], nil
}

// hashInBands is Hash128 of the w x h screen, captured rows at a time.
func hashInBands(v FrameViewer, w, h, rows int) ([]byte, error) {
	b, err := encode.NewBandHasher(w, h)
	if err != nil {
		return nil, err
	}
	for y := 0; y < h; y += rows {
		band := image.Rect(0, y, w, min(y+rows, h))
		err := v.CaptureView(band, func(f *desktop.Frame) error {
			return b.Write(encode.Image{Pix: f.Pix, Stride: f.Stride, Width: band.Dx(), Height: band.Dy()})
		})
		if err != nil {
			return nil, err
		}
	}
	sum, err := b.Sum()
	if err != nil {
		return nil, err
	}
	return sum[:], nil
}

// processStart is this process's start time (clock ticks since the host
// booted). A CRIU restore creates the process anew, so it differs in a
// replica. "" when unknown.
func processStart() string {
	st, err := sysops.ReadStat(0)
	if err != nil {
		return ""
	}
	return strconv.FormatUint(st.Start, 10)
}
