package aci

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"image"
	"log/slog"
	mrand "math/rand/v2"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/forkfleet/forkfleet/api/aci/wire"
	aciv1 "github.com/forkfleet/forkfleet/api/gen/forkfleet/aci/v1"
	"github.com/forkfleet/forkfleet/guestd/internal/acierr"
	"github.com/forkfleet/forkfleet/guestd/internal/sysops"
)

// rng is guestd's own PRNG (session ids). A CRIU restore clones its state
// into every replica, so RestoredRequest re-seeds it from the kernel and the
// entropy controld sends; without that, replicas of one checkpoint would
// hand out identical ids.
type rng struct {
	mu sync.Mutex
	c  *mrand.ChaCha8
}

func (r *rng) seed(extra []byte) error {
	var fresh [32]byte
	if _, err := rand.Read(fresh[:]); err != nil {
		return err
	}
	h := sha256.New()
	h.Write(fresh[:])
	h.Write(extra)
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.c != nil {
		var old [32]byte
		r.c.Read(old[:])
		h.Write(old[:])
	}
	var key [32]byte
	copy(key[:], h.Sum(nil))
	r.c = mrand.NewChaCha8(key)
	return nil
}

func (r *rng) id() string {
	var b [12]byte
	r.mu.Lock()
	r.c.Read(b[:])
	r.mu.Unlock()
	return hex.EncodeToString(b[:])
}

// damageTracker keeps the time of the last X damage so settle waits need no
// capture. One watcher per desktop, shared by all sessions.
type damageTracker struct {
	base        time.Time
	last        atomic.Int64 // ns since base of the last damage event
	lastInput   atomic.Int64 // ns since base of the last request that may draw
	activeSince atomic.Int64 // ns since base when the running watch started
	active      atomic.Bool  // a watch is running (DAMAGE available)
}

// touch records a request that may make something draw (input, window
// operations, launches): its repaint may still be on its way.
func (t *damageTracker) touch() { t.lastInput.Store(t.now()) }

func (t *damageTracker) now() int64 { return int64(time.Since(t.base)) }

func (t *damageTracker) run(ctx context.Context, d Desktop, log *slog.Logger) {
	ch := make(chan image.Rectangle, 256)
	errc := make(chan error, 1)
	go func() { errc <- d.WatchDamage(ctx, ch) }()
	t.activeSince.Store(t.now())
	t.active.Store(true)
	defer t.active.Store(false)
	for {
		select {
		case <-ch:
			t.last.Store(t.now())
		case err := <-errc:
			if err != nil && ctx.Err() == nil {
				log.Warn("damage watch ended; settle waits fall back to fixed delays", "err", err)
			}
			if ctx.Err() != nil {
				return
			}
			// WatchDamage may return at once after arming a watch of its own
			// goroutine; keep consuming until ctx ends.
			errc = nil
		case <-ctx.Done():
			return
		}
	}
}

// settle waits until no damage was seen for quiet, counting from the call
// (an input's repaint may still be on its way), bounded by bound. It reports
// whether the screen settled; ctx ending returns its error.
func (t *damageTracker) settle(ctx context.Context, quiet, bound time.Duration) (bool, error) {
	if !t.active.Load() {
		// Without DAMAGE the best available is a fixed quiet period.
		d := min(quiet, bound)
		tm := time.NewTimer(d)
		defer tm.Stop()
		select {
		case <-tm.C:
			return quiet <= bound, nil
		case <-ctx.Done():
			return false, ctx.Err()
		}
	}
	start := t.now()
	deadline := start + int64(bound)
	tm := time.NewTimer(quiet)
	defer tm.Stop()
	for {
		select {
		case <-tm.C:
		case <-ctx.Done():
			return false, ctx.Err()
		}
		now := t.now()
		quietUntil := max(t.last.Load(), start) + int64(quiet)
		if now >= quietUntil {
			return true, nil
		}
		if now >= deadline {
			return false, nil
		}
		tm.Reset(time.Duration(min(quietUntil, deadline) - now))
	}
}

// stillFor waits until the screen has been still for quiet: no damage and
// no drawing request for quiet, counting from the last of them rather than
// from the call, so a desktop that has been still costs no wait. With cpu,
// it then also waits for a probe window in which nothing in the sandbox
// ran: an app that is busy (a shell starting) may draw next. Bounded by
// bound; reports whether it settled. Without DAMAGE it waits quiet (capped
// by bound) from the call.
func (t *damageTracker) stillFor(ctx context.Context, quiet, bound time.Duration, cpu func() (time.Duration, error)) (bool, error) {
	if !t.active.Load() {
		return t.settle(ctx, quiet, bound)
	}
	deadline := t.now() + int64(bound)
	sleep := func(until int64) error {
		tm := time.NewTimer(time.Duration(until - t.now()))
		defer tm.Stop()
		select {
		case <-tm.C:
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	for {
		quietUntil := max(t.last.Load(), t.lastInput.Load(), t.activeSince.Load()) + int64(quiet)
		now := t.now()
		if now >= deadline {
			return false, nil
		}
		if now < quietUntil {
			if err := sleep(min(quietUntil, deadline)); err != nil {
				return false, err
			}
			continue
		}
		if cpu == nil {
			return true, nil
		}
		before, err := cpu()
		if err != nil {
			return true, nil // the probe is a refinement; damage already says still
		}
		if err := sleep(min(now+int64(cpuProbe), deadline)); err != nil {
			return false, err
		}
		after, err := cpu()
		ran := after - before
		if err == nil && ran < cpuIdle && ran > -cpuIdle && t.last.Load() < now {
			return true, nil
		}
	}
}

// cpuProbe is the window in which the sandbox's processes must not run for
// the screen to count as settled, and cpuIdle what still counts as not
// running (timer wakeups). A process exiting in the window lowers the sum.
const (
	cpuProbe = 10 * time.Millisecond
	cpuIdle  = 300 * time.Microsecond
)

// memoryMark stores the verifier value in the heap only.
func (s *Server) memoryMark(req *aciv1.MemoryMarkRequest) (*aciv1.MemoryMarkResponse, error) {
	v := req.GetValue()
	if len(v) == 0 || len(v) > 4096 {
		return nil, errInvalid("memory_mark.value", "value must be 1..4096 bytes, got %d", len(v))
	}
	s.mark.Lock()
	s.mark.value = append([]byte(nil), v...)
	s.mark.Unlock()
	return &aciv1.MemoryMarkResponse{}, nil
}

func (s *Server) memoryChallenge(req *aciv1.MemoryChallengeRequest) (*aciv1.MemoryChallengeResponse, error) {
	if len(req.GetNonce()) == 0 || len(req.GetNonce()) > 4096 {
		return nil, errInvalid("memory_challenge.nonce", "nonce must be 1..4096 bytes")
	}
	s.mark.Lock()
	key := s.mark.value
	s.mark.Unlock()
	if key == nil {
		return nil, acierr.New(aciv1.ErrorCode_ERROR_CODE_FAILED_PRECONDITION, "", "no memory mark set")
	}
	return &aciv1.MemoryChallengeResponse{Mac: wire.ProofMAC(key, req.GetNonce())}, nil
}

// restored installs a replica's identity after a CRIU restore: its own
// tokens of both roles (the restored ones, its checkpoint's, are refused
// from now on, and sessions other than the caller's, which may have been
// opened with them, are closed), generation, id and entropy.
func (s *Server) restored(ctx context.Context, caller *session, req *aciv1.RestoredRequest) (*aciv1.RestoredResponse, error) {
	if req.GetToken() == "" {
		return nil, errInvalid("restored.token", "token is empty")
	}
	if req.GetAdminToken() == "" {
		return nil, errInvalid("restored.admin_token", "admin token is empty")
	}
	if len(req.GetEntropy()) < 32 {
		return nil, errInvalid("restored.entropy", "entropy must be at least 32 bytes, got %d", len(req.GetEntropy()))
	}
	if g := s.generation.Load(); req.GetGeneration() < g {
		return nil, acierr.New(aciv1.ErrorCode_ERROR_CODE_FAILED_PRECONDITION, "restored.generation",
			"generation %d is older than the current %d", req.GetGeneration(), g)
	}
	// A pool's member: its apps stop first thing (the X server runs on for
	// the capture below and the proofs) and run again at its claim
	// (resume_apps).
	if req.GetHoldApps() {
		s.holdApps()
	}
	// Writing to /dev/urandom mixes the bytes into the kernel pool without
	// crediting entropy; RNDADDENTROPY would need CAP_SYS_ADMIN.
	if f, err := os.OpenFile(s.opts.EntropySink, os.O_WRONLY, 0); err != nil {
		return nil, acierr.New(aciv1.ErrorCode_ERROR_CODE_INTERNAL, "", "entropy sink: %v", err)
	} else {
		_, werr := f.Write(req.GetEntropy())
		f.Close()
		if werr != nil {
			return nil, acierr.New(aciv1.ErrorCode_ERROR_CODE_INTERNAL, "", "entropy sink: %v", werr)
		}
	}
	if err := s.rng.seed(req.GetEntropy()); err != nil {
		return nil, err
	}
	// Before the new secrets arrive: CRIU restores the flag, but nothing may
	// open guestd's memory in between.
	if err := sysops.Undumpable(); err != nil {
		return nil, acierr.New(aciv1.ErrorCode_ERROR_CODE_INTERNAL, "", "prctl(PR_SET_DUMPABLE, 0): %v", err)
	}
	// CRIU restores each mapping's KSM advice, not the process-wide opt-in:
	// memory this replica maps from now on, and what it starts, merges too.
	if err := sysops.MergeMemory(); err != nil {
		s.log.Warn("restored: PR_SET_MEMORY_MERGE", "err", err)
	}
	s.tokens.Store(newTokens(req.GetToken(), req.GetAdminToken()))
	for _, ss := range s.sessionsExcept(caller) {
		ss.closeWith(StatusTokensReplaced, "tokens replaced")
	}
	s.generation.Store(req.GetGeneration())
	// What the dumped memory knew about the screen is the source's, never
	// a replica's.
	s.preparedShot.Store(nil)
	s.provedShot.Store(nil)
	s.setShotEpoch(true)
	s.liftHold()
	if id := req.GetSandboxId(); id != "" {
		s.sandboxID.Store(&id)
	}
	// The frame this replica was born with, captured while the grab the
	// dump holds keeps every app from drawing (see grabForDump); then the
	// apps may draw again. A pool member keeps it as its screen copy.
	resp := &aciv1.RestoredResponse{}
	if h, err := s.bornFrameHash(ctx, req.GetHoldApps()); err == nil {
		resp.FrameHash = h
	} else if !errors.Is(err, errNoDesktop) {
		s.log.Warn("restored: capture the first frame", "err", err)
	}
	s.releaseGrab()
	s.log.Info("restored", "generation", req.GetGeneration(), "sandbox_id", req.GetSandboxId(), "hold_apps", req.GetHoldApps())
	return resp, nil
}
