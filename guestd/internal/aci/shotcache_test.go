package aci

import (
	"bytes"
	"context"
	"errors"
	"image"
	"image/png"
	"sync"
	"sync/atomic"
	"testing"

	aciclient "github.com/forkfleet/forkfleet/api/aci"
	aciv1 "github.com/forkfleet/forkfleet/api/gen/forkfleet/aci/v1"
	"github.com/forkfleet/forkfleet/guestd/internal/desktop"
)

// seqDesktop adds a damage sequence and a lending capture to fakeDesktop:
// draw bumps the sequence, and the test can make captures or syncs fail.
type seqDesktop struct {
	*fakeDesktop
	seq      atomic.Uint64
	captures atomic.Int32
	views    atomic.Int32

	mu          sync.Mutex
	failCapture error
	failSync    error
}

func newSeqDesktop(w, h int) *seqDesktop { return &seqDesktop{fakeDesktop: newFakeDesktop(w, h)} }

func (s *seqDesktop) draw(r image.Rectangle, b, g, rr byte) {
	s.fill(r, b, g, rr)
	s.seq.Add(1)
}

func (s *seqDesktop) DamageSeqSync(ctx context.Context) (uint64, error) {
	s.mu.Lock()
	err := s.failSync
	s.mu.Unlock()
	if err != nil {
		return 0, err
	}
	return s.seq.Load(), ctx.Err()
}

func (s *seqDesktop) Capture(r image.Rectangle, dst *desktop.Frame) error {
	s.mu.Lock()
	err := s.failCapture
	s.mu.Unlock()
	s.captures.Add(1)
	if err != nil {
		return err
	}
	return s.fakeDesktop.Capture(r, dst)
}

// CaptureView lends a scratch frame that it scribbles over afterwards, so a
// screenshot that kept a reference to it would show garbage.
func (s *seqDesktop) CaptureView(r image.Rectangle, fn func(*desktop.Frame) error) error {
	s.views.Add(1)
	var f desktop.Frame
	if err := s.Capture(r, &f); err != nil {
		return err
	}
	err := fn(&f)
	for i := range f.Pix {
		f.Pix[i] = 0xee
	}
	return err
}

var (
	_ DamageSequencer = (*seqDesktop)(nil)
	_ FrameViewer     = (*seqDesktop)(nil)
)

func TestScreenshotCacheSkipsCaptureWithoutDamage(t *testing.T) {
	h := newHarness(t)
	sd := newSeqDesktop(64, 48)
	h.srv.SetDesktop(sd)
	c := h.session(aciToken)
	shotOf := func(req *aciv1.ScreenshotRequest) *aciv1.ScreenshotResponse {
		t.Helper()
		r := call(t, c, shot(req))
		if r.GetError() != nil {
			t.Fatalf("screenshot: %v", r.GetError())
		}
		return r.GetScreenshot()
	}
	png := &aciv1.ScreenshotRequest{Format: aciv1.ImageFormat_IMAGE_FORMAT_PNG}

	first := shotOf(png)
	if n := sd.captures.Load(); n != 1 || sd.views.Load() != 1 {
		t.Fatalf("first screenshot: %d captures, %d views", n, sd.views.Load())
	}
	checkPixel(t, first.GetData(), 10, 10, 0x50, 0x40, 0x30)

	// Nothing drawn: the same bytes, no capture.
	again := shotOf(png)
	if sd.captures.Load() != 1 || !bytes.Equal(again.GetData(), first.GetData()) || !bytes.Equal(again.GetFrameHash(), first.GetFrameHash()) {
		t.Fatalf("repeat: %d captures, equal data %v", sd.captures.Load(), bytes.Equal(again.GetData(), first.GetData()))
	}
	nm := shotOf(&aciv1.ScreenshotRequest{Format: aciv1.ImageFormat_IMAGE_FORMAT_PNG, IfNoneMatch: first.GetFrameHash()})
	if !nm.GetNotModified() || len(nm.GetData()) != 0 || sd.captures.Load() != 1 {
		t.Fatalf("if_none_match: not_modified %v, %d bytes, %d captures", nm.GetNotModified(), len(nm.GetData()), sd.captures.Load())
	}

	// Another shape is another frame.
	reg := shotOf(&aciv1.ScreenshotRequest{Format: aciv1.ImageFormat_IMAGE_FORMAT_NONE, Region: &aciv1.Rect{X: 0, Y: 0, Width: 8, Height: 8}})
	if sd.captures.Load() != 2 || bytes.Equal(reg.GetFrameHash(), first.GetFrameHash()) {
		t.Fatalf("region: %d captures", sd.captures.Load())
	}
	shotOf(&aciv1.ScreenshotRequest{Format: aciv1.ImageFormat_IMAGE_FORMAT_NONE, MaxLongEdge: 32})
	shotOf(&aciv1.ScreenshotRequest{Format: aciv1.ImageFormat_IMAGE_FORMAT_NONE, IncludeCursor: true})
	if sd.captures.Load() != 4 {
		t.Fatalf("downscale and cursor shapes: %d captures, want 4", sd.captures.Load())
	}
	// The cursor is part of the key: moving it needs a new frame.
	cur1 := shotOf(&aciv1.ScreenshotRequest{Format: aciv1.ImageFormat_IMAGE_FORMAT_NONE, IncludeCursor: true})
	if sd.captures.Load() != 4 {
		t.Fatalf("repeated cursor shot captured again")
	}
	sd.MoveTo(20, 20)
	cur2 := shotOf(&aciv1.ScreenshotRequest{Format: aciv1.ImageFormat_IMAGE_FORMAT_NONE, IncludeCursor: true})
	if sd.captures.Load() != 5 || bytes.Equal(cur1.GetFrameHash(), cur2.GetFrameHash()) {
		t.Fatalf("moved cursor: %d captures, hash changed %v", sd.captures.Load(), !bytes.Equal(cur1.GetFrameHash(), cur2.GetFrameHash()))
	}

	// A draw bumps the sequence: the full frame is captured and differs.
	sd.draw(image.Rect(10, 10, 12, 12), 1, 2, 3)
	drawn := shotOf(png)
	if sd.captures.Load() != 6 || bytes.Equal(drawn.GetFrameHash(), first.GetFrameHash()) {
		t.Fatalf("after draw: %d captures", sd.captures.Load())
	}
	checkPixel(t, drawn.GetData(), 10, 10, 3, 2, 1)
	nm = shotOf(&aciv1.ScreenshotRequest{IfNoneMatch: first.GetFrameHash()})
	if nm.GetNotModified() || sd.captures.Load() != 6 {
		t.Fatalf("stale if_none_match: not_modified %v, %d captures", nm.GetNotModified(), sd.captures.Load())
	}
	// A JPEG of the same frame needs pixels once, then is cached too.
	j1 := shotOf(&aciv1.ScreenshotRequest{Format: aciv1.ImageFormat_IMAGE_FORMAT_JPEG})
	j2 := shotOf(&aciv1.ScreenshotRequest{Format: aciv1.ImageFormat_IMAGE_FORMAT_JPEG})
	if sd.captures.Load() != 7 || !bytes.Equal(j1.GetData(), j2.GetData()) || !bytes.Equal(j1.GetFrameHash(), drawn.GetFrameHash()) {
		t.Fatalf("jpeg: %d captures", sd.captures.Load())
	}
	// A different quality is a different encoding.
	shotOf(&aciv1.ScreenshotRequest{Format: aciv1.ImageFormat_IMAGE_FORMAT_JPEG, Quality: 30})
	if sd.captures.Load() != 8 {
		t.Fatalf("jpeg q30: %d captures, want 8", sd.captures.Load())
	}

	// A damage that left the pixels as they were (a redraw) recaptures but
	// reuses the PNG encoding of those pixels.
	sd.seq.Add(1)
	re := shotOf(png)
	if sd.captures.Load() != 9 || !bytes.Equal(re.GetData(), drawn.GetData()) || re.GetEncodeNs() != 0 {
		t.Fatalf("redraw: %d captures, same data %v, encode %d ns", sd.captures.Load(), bytes.Equal(re.GetData(), drawn.GetData()), re.GetEncodeNs())
	}

	// A failed capture drops the proof: the next request captures again
	// although the sequence did not move.
	sd.seq.Add(1)
	sd.mu.Lock()
	sd.failCapture = errors.New("boom")
	sd.mu.Unlock()
	if r := call(t, c, shot(png)); r.GetError() == nil {
		t.Fatal("failed capture returned a frame")
	}
	sd.mu.Lock()
	sd.failCapture = nil
	sd.mu.Unlock()
	n := sd.captures.Load()
	shotOf(png)
	if sd.captures.Load() != n+1 {
		t.Fatal("screenshot after a failed capture came from the cache")
	}

	// Without a working sequence every request captures.
	sd.mu.Lock()
	sd.failSync = errors.New("no damage")
	sd.mu.Unlock()
	n = sd.captures.Load()
	shotOf(png)
	shotOf(png)
	if sd.captures.Load() != n+2 {
		t.Fatalf("sync failing: %d captures, want %d", sd.captures.Load(), n+2)
	}
	sd.mu.Lock()
	sd.failSync = nil
	sd.mu.Unlock()
	shotOf(png)

	// A new desktop (X reconnect) starts its own sequence at the same
	// value: nothing cached for the old one may be served.
	sd2 := newSeqDesktop(64, 48)
	sd2.fill(image.Rect(0, 0, 64, 48), 9, 9, 9)
	sd2.seq.Store(sd.seq.Load())
	h.srv.SetDesktop(sd2)
	got := shotOf(png)
	if sd2.captures.Load() != 1 {
		t.Fatalf("new desktop: %d captures", sd2.captures.Load())
	}
	checkPixel(t, got.GetData(), 0, 0, 9, 9, 9)
}

func TestScreenshotCacheIsPerShapeAcrossSteps(t *testing.T) {
	h := newHarness(t)
	sd := newSeqDesktop(64, 48)
	h.srv.SetDesktop(sd)
	c := h.session(aciToken)
	step := func(x int32) *aciv1.StepResponse {
		t.Helper()
		r := call(t, c, &aciv1.ClientMessage{Request: &aciv1.ClientMessage_Step{Step: &aciv1.StepRequest{
			Actions: []*aciv1.Action{{Action: &aciv1.Action_Click{Click: &aciv1.ClickAction{At: &aciv1.Point{X: x, Y: 5}}}}},
			Observe: &aciv1.ScreenshotRequest{Format: aciv1.ImageFormat_IMAGE_FORMAT_PNG}}}})
		if r.GetStep().GetObservation() == nil {
			t.Fatalf("step: %v", r)
		}
		return r.GetStep()
	}
	a := step(1)
	b := step(2)
	if sd.captures.Load() != 1 || !bytes.Equal(a.GetObservation().GetData(), b.GetObservation().GetData()) {
		t.Fatalf("clicks without damage: %d captures", sd.captures.Load())
	}
	sd.draw(image.Rect(0, 40, 64, 48), 200, 0, 0)
	cc := step(3)
	if sd.captures.Load() != 2 {
		t.Fatalf("click with damage: %d captures", sd.captures.Load())
	}
	checkPixel(t, cc.GetObservation().GetData(), 5, 45, 0, 0, 200)
}

// checkPixel decodes a PNG and checks the pixel at (x, y).
func checkPixel(t *testing.T, data []byte, x, y int, r, g, b byte) {
	t.Helper()
	img, err := png.Decode(bytes.NewReader(data))
	if err != nil {
		t.Fatalf("decode: %v", err)
	}
	rr, gg, bb, _ := img.At(x, y).RGBA()
	if byte(rr>>8) != r || byte(gg>>8) != g || byte(bb>>8) != b {
		t.Fatalf("pixel (%d,%d) = %02x%02x%02x, want %02x%02x%02x", x, y, rr>>8, gg>>8, bb>>8, r, g, b)
	}
}

// A hash-only request answers from the frame another session captured while
// nothing was drawn since (a checkpoint's admin session finds the agent's).
func TestScreenshotHashSharedAcrossSessions(t *testing.T) {
	h := newHarness(t)
	sd := newSeqDesktop(64, 48)
	h.srv.SetDesktop(sd)
	agent, other := h.session(aciToken), h.session(aciToken)
	shotOf := func(c *aciclient.WireConn, req *aciv1.ScreenshotRequest) *aciv1.ScreenshotResponse {
		t.Helper()
		r := call(t, c, shot(req))
		if r.GetError() != nil {
			t.Fatalf("screenshot: %v", r.GetError())
		}
		return r.GetScreenshot()
	}
	none := &aciv1.ScreenshotRequest{Format: aciv1.ImageFormat_IMAGE_FORMAT_NONE}
	first := shotOf(agent, &aciv1.ScreenshotRequest{Format: aciv1.ImageFormat_IMAGE_FORMAT_PNG})
	got := shotOf(other, none)
	if sd.captures.Load() != 1 || !bytes.Equal(got.GetFrameHash(), first.GetFrameHash()) || got.GetWidth() != 64 || got.GetHeight() != 48 {
		t.Fatalf("hash-only in another session: %d captures, same hash %v, %dx%d",
			sd.captures.Load(), bytes.Equal(got.GetFrameHash(), first.GetFrameHash()), got.GetWidth(), got.GetHeight())
	}
	if nm := shotOf(other, &aciv1.ScreenshotRequest{Format: aciv1.ImageFormat_IMAGE_FORMAT_NONE, IfNoneMatch: first.GetFrameHash()}); !nm.GetNotModified() {
		t.Fatal("if_none_match of the shared hash: not not_modified")
	}
	// Pixels are still this session's own capture.
	if shotOf(other, &aciv1.ScreenshotRequest{Format: aciv1.ImageFormat_IMAGE_FORMAT_PNG}); sd.captures.Load() != 2 {
		t.Fatalf("png in the other session: %d captures, want 2", sd.captures.Load())
	}
	sd.draw(image.Rect(1, 1, 3, 3), 9, 9, 9)
	after := shotOf(agent, none)
	if sd.captures.Load() != 3 || bytes.Equal(after.GetFrameHash(), first.GetFrameHash()) {
		t.Fatalf("after a draw: %d captures, hash changed %v", sd.captures.Load(), !bytes.Equal(after.GetFrameHash(), first.GetFrameHash()))
	}
}

// A frame proven before checkpoint_prepare is not in the dumped memory: a
// replica's pixel proof captures for real (even before its restored
// request), and only the source gets the frame back, at checkpoint_done.
func TestProvenFrameAcrossCheckpoint(t *testing.T) {
	none := &aciv1.ClientMessage{Request: &aciv1.ClientMessage_Screenshot{Screenshot: &aciv1.ScreenshotRequest{Format: aciv1.ImageFormat_IMAGE_FORMAT_NONE}}}
	prepare := &aciv1.ClientMessage{Request: &aciv1.ClientMessage_CheckpointPrepare{CheckpointPrepare: &aciv1.CheckpointPrepareRequest{}}}
	done := &aciv1.ClientMessage{Request: &aciv1.ClientMessage_CheckpointDone{CheckpointDone: &aciv1.CheckpointDoneRequest{}}}
	restored := &aciv1.ClientMessage{Request: &aciv1.ClientMessage_Restored{Restored: &aciv1.RestoredRequest{
		Token: "replica-token", AdminToken: "replica-admin", Generation: 2, SandboxId: "sb-replica", Entropy: bytes.Repeat([]byte{7}, 32)}}}
	ok := func(c *aciclient.WireConn, m *aciv1.ClientMessage) *aciv1.ServerMessage {
		t.Helper()
		r := call(t, c, m)
		if r.GetError() != nil {
			t.Fatalf("%T: %v", m.GetRequest(), r.GetError())
		}
		return r
	}
	for _, end := range []string{"checkpoint_done", "restored"} {
		h := newHarness(t)
		sd := newSeqDesktop(64, 48)
		h.srv.SetDesktop(sd)
		ok(h.session(aciToken), none) // capture 1
		admin := h.session(adminToken)
		prep := ok(admin, prepare).GetCheckpointPrepare()
		if sd.captures.Load() != 1 || len(prep.GetFrameHash()) == 0 {
			t.Fatalf("prepare: %d captures, hash %x; want the proven frame's", sd.captures.Load(), prep.GetFrameHash())
		}
		// What a replica would run before its restored request arrives.
		if ok(admin, none); sd.captures.Load() != 2 {
			t.Fatalf("hash-only after prepare: %d captures, want a capture of its own", sd.captures.Load())
		}
		agentToken := aciToken
		if end == "restored" {
			ok(admin, restored)
			agentToken = "replica-token"
		} else {
			ok(admin, done)
		}
		ok(h.session(agentToken), none)
		want := int32(4) // restored captures the replica's first frame, then a screenshot captures
		if end == "checkpoint_done" {
			want = 2 // the source trusts its frame again
		}
		if got := sd.captures.Load(); got != want {
			t.Errorf("after %s: %d captures, want %d", end, got, want)
		}
	}
}
