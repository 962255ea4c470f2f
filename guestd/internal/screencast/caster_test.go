package screencast

import (
	"bytes"
	"context"
	"errors"
	"image"
	"math/rand/v2"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	clientsc "github.com/forkfleet/forkfleet/api/screencast"

	aciv1 "github.com/forkfleet/forkfleet/api/gen/forkfleet/aci/v1"
	"github.com/forkfleet/forkfleet/guestd/internal/acierr"
	"github.com/forkfleet/forkfleet/guestd/internal/desktop"
	"github.com/forkfleet/forkfleet/guestd/internal/encode"
)

// sink is a test client: it applies every frame to a compositor.
type sink struct {
	comp *clientsc.Compositor

	mu     sync.Mutex
	frames []*aciv1.ScreencastFrame
	errs   []error
	drop   func(*aciv1.ScreencastFrame) bool
	signal chan struct{}
}

func newSink(opts ...clientsc.Option) *sink {
	return &sink{comp: clientsc.NewCompositor(clientsc.BGRX, opts...), signal: make(chan struct{}, 1)}
}

func (k *sink) send(f *aciv1.ScreencastFrame) error {
	k.mu.Lock()
	k.frames = append(k.frames, f)
	drop := k.drop != nil && k.drop(f)
	k.mu.Unlock()
	if !drop {
		if err := k.comp.Apply(f); err != nil {
			k.mu.Lock()
			k.errs = append(k.errs, err)
			k.mu.Unlock()
		}
	}
	select {
	case k.signal <- struct{}{}:
	default:
	}
	return nil
}

func (k *sink) count() int {
	k.mu.Lock()
	defer k.mu.Unlock()
	return len(k.frames)
}

func (k *sink) snapshot() ([]*aciv1.ScreencastFrame, []error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	return append([]*aciv1.ScreencastFrame(nil), k.frames...), append([]error(nil), k.errs...)
}

// waitScreen waits until the compositor is in sync and holds want's pixels
// (B, G, R). It compares pixels, not hashes: delta frames carry no hash
// unless the stream asked for them.
func (k *sink) waitScreen(t *testing.T, want encode.Image, timeout time.Duration) {
	t.Helper()
	deadline := time.After(timeout)
	var pix []byte
	for {
		if k.comp.Synced() {
			var w, h int
			pix, w, h = k.comp.Snapshot(pix)
			if w == want.Width && h == want.Height && equalRGB(pix, want) {
				return
			}
		}
		select {
		case <-k.signal:
		case <-time.After(20 * time.Millisecond):
		case <-deadline:
			fr, errs := k.snapshot()
			t.Fatalf("compositor never reached the screen's pixels (%d frames, errors %v)", len(fr), errs)
		}
	}
}

// waitHash waits until the compositor holds a frame whose server hash is
// want: for lossy streams, whose pixels never match the screen exactly.
// Only frames that carry a hash (keyframes, or every frame of a stream
// started with frame_hashes) can satisfy it.
func (k *sink) waitHash(t *testing.T, want [16]byte, timeout time.Duration) {
	t.Helper()
	deadline := time.After(timeout)
	for {
		if bytes.Equal(k.comp.FrameHash(), want[:]) && k.comp.Synced() {
			return
		}
		select {
		case <-k.signal:
		case <-time.After(20 * time.Millisecond):
		case <-deadline:
			fr, errs := k.snapshot()
			t.Fatalf("compositor never reached the screen's hash (%d frames, errors %v)", len(fr), errs)
		}
	}
}

// equalRGB reports whether the BGRX framebuffer got holds want's pixels.
func equalRGB(got []byte, want encode.Image) bool {
	for y := 0; y < want.Height; y++ {
		row := want.Row(y)
		g := got[y*want.Width*4 : (y+1)*want.Width*4]
		for x := 0; x < want.Width; x++ {
			if g[4*x] != row[4*x] || g[4*x+1] != row[4*x+1] || g[4*x+2] != row[4*x+2] {
				return false
			}
		}
	}
	return true
}

// payloadBytes is the frame's encoded pixel data: tiles and zlib chunk.
func payloadBytes(f *aciv1.ScreencastFrame) int {
	n := len(f.GetZlibChunk())
	for _, tl := range f.GetTiles() {
		n += len(tl.GetData())
	}
	return n
}

func imageOf(pix []byte, w, h int) encode.Image {
	return encode.Image{Pix: pix, Stride: w * 4, Width: w, Height: h}
}

// sameRGB fails the test at the first pixel whose B, G, R differ.
func sameRGB(t *testing.T, got []byte, want encode.Image) {
	t.Helper()
	if len(got) != want.Width*want.Height*4 {
		t.Fatalf("framebuffer %d bytes, want %dx%d", len(got), want.Width, want.Height)
	}
	for y := 0; y < want.Height; y++ {
		row := want.Row(y)
		g := got[y*want.Width*4 : (y+1)*want.Width*4]
		for x := 0; x < want.Width; x++ {
			if !bytes.Equal(g[4*x:4*x+3], row[4*x:4*x+3]) {
				t.Fatalf("pixel (%d,%d): got %v want %v", x, y, g[4*x:4*x+3], row[4*x:4*x+3])
			}
		}
	}
}

func hashOf(t *testing.T, img encode.Image) [16]byte {
	t.Helper()
	h, err := encode.Hash128(img)
	if err != nil {
		t.Fatal(err)
	}
	return h
}

func startStream(t *testing.T, c *Caster, req *aciv1.ScreencastStartRequest, k *sink, opts ...StartOption) uint32 {
	t.Helper()
	id, err := c.Start(t.Context(), req, k.send, opts...)
	if err != nil {
		t.Fatalf("Start: %v", err)
	}
	t.Cleanup(func() { _ = c.Stop(id) })
	return id
}

func typeText(d *fakeDisplay, x0, y0 int, text string, pause time.Duration) {
	col, row := 0, 0
	for i := 0; i < len(text); i++ {
		if text[i] == '\n' || col >= 100 {
			col, row = 0, row+1
			continue
		}
		d.glyph(x0, y0, col, row, text[i])
		col++
		if pause > 0 {
			time.Sleep(pause)
		}
	}
}

const sample = "the quick brown fox jumps over the lazy dog\nls -la /usr/share/doc | grep fox\necho hello world; make test\n"

func TestReconstructTyping(t *testing.T) {
	for _, tc := range []struct {
		name string
		zlib bool
	}{{"png", false}, {"zlib", true}} {
		t.Run(tc.name, func(t *testing.T) {
			d := newFakeDisplay(640, 400)
			c := New(d, Options{})
			k := newSink()
			var opts []StartOption
			if tc.zlib {
				opts = append(opts, WithZlib())
			}
			startStream(t, c, &aciv1.ScreencastStartRequest{Fps: 60, Delta: true}, k, opts...)
			typeText(d, 10, 10, sample+sample, 2*time.Millisecond)
			d.scroll(image.Rect(10, 10, 630, 100), 13)
			typeText(d, 10, 120, sample, time.Millisecond)
			// A large repaint (a window opening).
			d.draw(image.Rect(300, 150, 620, 390), func(x, y int) (byte, byte, byte) { return byte(x * y), byte(x), byte(y) })
			want := imageOf(d.snapshot(), 640, 400)
			k.waitScreen(t, want, 5*time.Second)
			pix, _, _ := k.comp.Snapshot(nil)
			sameRGB(t, pix, want)
			frames, errs := k.snapshot()
			if len(errs) != 0 {
				t.Fatalf("compositor errors: %v", errs)
			}
			var deltaBytes, deltas int
			formats := map[aciv1.ImageFormat]int{}
			for _, f := range frames {
				if f.GetKeyframe() {
					continue
				}
				deltas++
				deltaBytes += payloadBytes(f)
				formats[f.GetFormat()]++
			}
			// Typing goes as zlib; the large repaint as PNG (scheduling may
			// split it across two frames, so at least one).
			if tc.zlib && (formats[FormatZlib] == 0 || formats[aciv1.ImageFormat_IMAGE_FORMAT_PNG] == 0) {
				t.Fatalf("delta frame formats %v: want zlib frames and PNG for the large repaint", formats)
			}
			t.Logf("%s: %d frames, %d delta frames, %.0f tile bytes per delta frame", tc.name, len(frames), deltas, float64(deltaBytes)/float64(max(deltas, 1)))
		})
	}
}

func TestIdleSendsOneKeyframe(t *testing.T) {
	d := newFakeDisplay(320, 200)
	c := New(d, Options{})
	k := newSink()
	startStream(t, c, &aciv1.ScreencastStartRequest{Fps: 60, Delta: true}, k)
	time.Sleep(watchSettle + 300*time.Millisecond)
	frames, _ := k.snapshot()
	if len(frames) != 1 || !frames[0].GetKeyframe() || frames[0].GetSeq() != 1 {
		t.Fatalf("idle stream sent %d frames (first keyframe=%v), want exactly one keyframe", len(frames), len(frames) > 0 && frames[0].GetKeyframe())
	}
	// The keyframe plus the one settle re-check; no polling.
	if n := d.captures.Load(); n > 2 {
		t.Fatalf("idle stream captured %d times", n)
	}
	if n := d.polls.Load(); n != 0 {
		t.Fatalf("hidden-cursor stream polled the cursor %d times", n)
	}
	// Damage that changes nothing sends nothing either.
	d.draw(image.Rect(5, 5, 50, 50), func(x, y int) (byte, byte, byte) { return 0xee, 0xee, 0xee })
	time.Sleep(100 * time.Millisecond)
	if n := k.count(); n != 1 {
		t.Fatalf("no-op damage sent %d frames", n-1)
	}
}

func TestGapRequestsKeyframe(t *testing.T) {
	d := newFakeDisplay(320, 200)
	c := New(d, Options{})
	var id atomic.Uint32
	var asked atomic.Int32
	k := newSink(clientsc.WithKeyframeRequester(func(stream uint32) {
		asked.Add(1)
		if err := c.Keyframe(stream); err != nil {
			t.Errorf("Keyframe: %v", err)
		}
	}))
	k.drop = func(f *aciv1.ScreencastFrame) bool { return f.GetSeq() == 3 }
	id.Store(startStream(t, c, &aciv1.ScreencastStartRequest{Fps: 60, Delta: true}, k, WithZlib()))
	typeText(d, 5, 5, sample, 3*time.Millisecond)
	want := imageOf(d.snapshot(), 320, 200)
	k.waitScreen(t, want, 5*time.Second)
	pix, _, _ := k.comp.Snapshot(nil)
	sameRGB(t, pix, want)
	if asked.Load() != 1 {
		t.Fatalf("keyframe requested %d times, want 1", asked.Load())
	}
	st := k.comp.Stats()
	if st.Gaps != 1 || st.Keyframes != 2 {
		t.Fatalf("stats %+v: want 1 gap and 2 keyframes", st)
	}
	if err := c.Keyframe(id.Load() + 100); !errors.Is(err, ErrNoStream) && acierr.From(err).Code != aciv1.ErrorCode_ERROR_CODE_NOT_FOUND {
		t.Fatalf("Keyframe(unknown) = %v", err)
	}
}

func TestSlowClientBoundedAndCoalesced(t *testing.T) {
	d := newFakeDisplay(640, 400)
	c := New(d, Options{})
	k := newSink()
	gate := make(chan struct{})
	var inFlight, maxInFlight, calls atomic.Int32
	send := func(f *aciv1.ScreencastFrame) error {
		n := inFlight.Add(1)
		defer inFlight.Add(-1)
		if n > maxInFlight.Load() {
			maxInFlight.Store(n)
		}
		if calls.Add(1) == 2 {
			<-gate // the client stops reading after the keyframe
		}
		return k.send(f)
	}
	id, err := c.Start(t.Context(), &aciv1.ScreencastStartRequest{Fps: 60, Delta: true}, send, WithZlib())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Stop(id)
	for i := 0; calls.Load() < 2; i++ {
		typeText(d, 0, 0, string(rune('a'+i%26)), 0)
		time.Sleep(5 * time.Millisecond)
	}
	var before runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	rng := rand.New(rand.NewPCG(1, 2))
	for i := 0; i < 5000; i++ {
		x, y := rng.IntN(600), rng.IntN(380)
		v := byte(i)
		d.draw(image.Rect(x, y, x+rng.IntN(40)+1, y+rng.IntN(20)+1), func(int, int) (byte, byte, byte) { return v, v ^ 0x55, 0x10 })
	}
	var after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&after)
	c.mu.Lock()
	s := c.streams[id]
	c.mu.Unlock()
	s.mu.Lock()
	pendingRects := len(s.dirty.rects)
	s.mu.Unlock()
	if pendingRects > maxDirtyRects {
		t.Fatalf("%d pending damage rectangles, cap %d", pendingRects, maxDirtyRects)
	}
	if grown := int64(after.HeapAlloc) - int64(before.HeapAlloc); grown > 4<<20 {
		t.Fatalf("heap grew %d bytes while the client was stalled", grown)
	}
	if n := calls.Load(); n != 2 {
		t.Fatalf("%d send calls while the first delta was blocked, want 2", n)
	}
	close(gate)
	want := imageOf(d.snapshot(), 640, 400)
	k.waitScreen(t, want, 5*time.Second)
	pix, _, _ := k.comp.Snapshot(nil)
	sameRGB(t, pix, want)
	if maxInFlight.Load() != 1 {
		t.Fatalf("%d frames in flight at once", maxInFlight.Load())
	}
	frames, errs := k.snapshot()
	if len(errs) != 0 {
		t.Fatalf("compositor errors: %v", errs)
	}
	var coalesced uint32
	for i, f := range frames {
		if f.GetSeq() != uint64(i+1) {
			t.Fatalf("frame %d has seq %d", i, f.GetSeq())
		}
		coalesced += f.GetCoalesced()
	}
	if coalesced == 0 {
		t.Fatal("no frame reports coalesced damage")
	}
	t.Logf("%d frames after 5000 draws, %d coalesced", len(frames), coalesced)
}

func TestScaledRegionAndCursor(t *testing.T) {
	d := newFakeDisplay(640, 400)
	arrow := make([]uint32, 8*8)
	for i := range arrow {
		arrow[i] = 0xff102030
	}
	d.cursor = desktop.Cursor{X: 100, Y: 100, XHot: 1, YHot: 1, Width: 8, Height: 8, ARGB: arrow}
	c := New(d, Options{})
	region := image.Rect(40, 20, 600, 380)

	kScaled := newSink()
	startStream(t, c, &aciv1.ScreencastStartRequest{Fps: 60, Delta: true, MaxLongEdge: 280}, kScaled)
	kRegion := newSink()
	startStream(t, c, &aciv1.ScreencastStartRequest{Fps: 60, Delta: true, Cursor: aciv1.CursorMode_CURSOR_MODE_OVERLAY,
		Region: &aciv1.Rect{X: int32(region.Min.X), Y: int32(region.Min.Y), Width: int32(region.Dx()), Height: int32(region.Dy())}}, kRegion, WithZlib())
	var events atomic.Int32
	kEvents := newSink()
	startStream(t, c, &aciv1.ScreencastStartRequest{Fps: 60, Delta: true, Cursor: aciv1.CursorMode_CURSOR_MODE_EVENTS}, kEvents,
		WithCursorEvents(func(*aciv1.CursorEvent) error { events.Add(1); return nil }))

	typeText(d, 30, 30, sample, time.Millisecond)
	d.mu.Lock()
	d.cursor.X, d.cursor.Y = 300, 200
	d.mu.Unlock()
	typeText(d, 30, 200, sample, time.Millisecond)
	time.Sleep(50 * time.Millisecond)

	screen := imageOf(d.snapshot(), 640, 400)
	scaled, err := encode.Downscale(nil, screen, 280)
	if err != nil {
		t.Fatal(err)
	}
	kScaled.waitScreen(t, scaled, 5*time.Second)
	pix, w, h := kScaled.comp.Snapshot(nil)
	if w != scaled.Width || h != scaled.Height {
		t.Fatalf("scaled stream %dx%d, want %dx%d", w, h, scaled.Width, scaled.Height)
	}
	sameRGB(t, pix, scaled)

	reg := imageOf(append([]byte(nil), screen.SubImage(region).Pix...), region.Dx(), region.Dy())
	reg.Stride = screen.Stride
	withCursor := imageOf(make([]byte, region.Dx()*region.Dy()*4), region.Dx(), region.Dy())
	for y := 0; y < reg.Height; y++ {
		copy(withCursor.Row(y), reg.Row(y))
	}
	if err := encode.CompositeARGB(withCursor, 300-1-region.Min.X, 200-1-region.Min.Y, arrow, 8, 8); err != nil {
		t.Fatal(err)
	}
	kRegion.waitScreen(t, withCursor, 5*time.Second)
	pix, _, _ = kRegion.comp.Snapshot(nil)
	sameRGB(t, pix, withCursor)

	if events.Load() != 2 {
		t.Fatalf("%d cursor events, want 2 (initial position and one move)", events.Load())
	}
}

func TestStartValidation(t *testing.T) {
	d := newFakeDisplay(320, 200)
	c := New(d, Options{MaxStreams: 1})
	nop := func(*aciv1.ScreencastFrame) error { return nil }
	for _, tc := range []struct {
		req   *aciv1.ScreencastStartRequest
		field string
	}{
		{&aciv1.ScreencastStartRequest{Fps: 61}, "screencast_start.fps"},
		{&aciv1.ScreencastStartRequest{Quality: 101}, "screencast_start.quality"},
		{&aciv1.ScreencastStartRequest{Format: FormatZlib, Delta: true}, "screencast_start.format"},
		{&aciv1.ScreencastStartRequest{Format: 9}, "screencast_start.format"},
		{&aciv1.ScreencastStartRequest{Region: &aciv1.Rect{X: 300, Y: 0, Width: 40, Height: 10}}, "screencast_start.region"},
		{&aciv1.ScreencastStartRequest{Cursor: aciv1.CursorMode_CURSOR_MODE_EVENTS}, "screencast_start.cursor"},
	} {
		_, err := c.Start(t.Context(), tc.req, nop)
		e := acierr.From(err)
		if e.Code != aciv1.ErrorCode_ERROR_CODE_INVALID_ARGUMENT || e.Field != tc.field {
			t.Errorf("Start(%v) = %v, want INVALID_ARGUMENT on %s", tc.req, err, tc.field)
		}
	}
	id, err := c.Start(t.Context(), &aciv1.ScreencastStartRequest{}, nop)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Start(t.Context(), &aciv1.ScreencastStartRequest{}, nop); acierr.From(err).Code != aciv1.ErrorCode_ERROR_CODE_RESOURCE_EXHAUSTED {
		t.Fatalf("second stream over the cap: %v", err)
	}
	if err := c.Stop(id); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Second)
	defer cancel()
	if err := c.Close(ctx); err != nil {
		t.Fatal(err)
	}
	if c.Streams() != 0 {
		t.Fatalf("%d streams after Close", c.Streams())
	}
	deadline := time.Now().Add(time.Second)
	for d.watching() != 0 && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	if d.watching() != 0 {
		t.Fatal("damage watcher still running with no streams")
	}
}

// fillTerminal types rows of dense text into a fake terminal at (0, 0).
func fillTerminal(d *fakeDisplay, rows, cols int) {
	for row := 0; row < rows; row++ {
		for col := 0; col < cols; col++ {
			d.glyph(0, 0, col, row, byte('a'+(row*7+col*3)%26))
		}
	}
}

func TestScrollSentAsCopy(t *testing.T) {
	for _, tc := range []struct {
		name string
		opts []StartOption
	}{{"png", nil}, {"zlib", []StartOption{WithZlib()}}} {
		t.Run(tc.name, func(t *testing.T) {
			d := newFakeDisplay(640, 400)
			fillTerminal(d, 29, 100)
			c := New(d, Options{})
			k := newSink()
			startStream(t, c, &aciv1.ScreencastStartRequest{Fps: 60, Delta: true}, k, tc.opts...)
			k.waitScreen(t, imageOf(d.snapshot(), 640, 400), 5*time.Second)
			before := k.count()
			// One line scrolls out at the top and a new one is typed at the
			// bottom, like a terminal after Return.
			d.scroll(image.Rect(0, 0, 640, 29*13), 13)
			for col := 0; col < 90; col++ {
				d.glyph(0, 0, col, 28, byte('A'+col%26))
			}
			want := imageOf(d.snapshot(), 640, 400)
			k.waitScreen(t, want, 5*time.Second)
			pix, _, _ := k.comp.Snapshot(nil)
			sameRGB(t, pix, want)
			frames, errs := k.snapshot()
			if len(errs) != 0 {
				t.Fatal(errs)
			}
			total := 0
			for _, f := range frames[before:] {
				total += payloadBytes(f)
			}
			t.Logf("%s: scroll of a dense 640x377 area: %d frames, %d tile bytes", tc.name, len(frames)-before, total)
			if tc.name == "zlib" && total > 4096 {
				t.Fatalf("zlib scroll cost %d bytes: the copy was not used", total)
			}
		})
	}
}

func TestKeyframeIntervalAndFullFrames(t *testing.T) {
	d := newFakeDisplay(320, 200)
	c := New(d, Options{})
	kInt := newSink()
	startStream(t, c, &aciv1.ScreencastStartRequest{Fps: 60, Delta: true, KeyframeIntervalMs: 100}, kInt)
	kFull := newSink()
	startStream(t, c, &aciv1.ScreencastStartRequest{Fps: 60, Format: aciv1.ImageFormat_IMAGE_FORMAT_JPEG}, kFull)
	time.Sleep(watchSettle)
	for i := 0; i < 30; i++ {
		typeText(d, 0, 0, string(rune('a'+i)), 0)
		time.Sleep(10 * time.Millisecond)
	}
	want := imageOf(d.snapshot(), 320, 200)
	kInt.waitScreen(t, want, 5*time.Second)
	kFull.waitHash(t, hashOf(t, want), 5*time.Second)
	frames, _ := kInt.snapshot()
	keys := 0
	for _, f := range frames {
		if f.GetKeyframe() {
			keys++
		}
	}
	if keys < 2 || keys == len(frames) {
		t.Fatalf("interval stream: %d keyframes of %d frames, want periodic ones among deltas", keys, len(frames))
	}
	frames, _ = kFull.snapshot()
	for _, f := range frames {
		if !f.GetKeyframe() || len(f.GetTiles()) != 1 || f.GetFormat() != aciv1.ImageFormat_IMAGE_FORMAT_JPEG {
			t.Fatalf("non-delta stream sent a frame that is not a whole JPEG: keyframe=%v tiles=%d", f.GetKeyframe(), len(f.GetTiles()))
		}
	}
	// Quiet again: the interval does not produce keyframes of an unchanged
	// screen.
	n := kInt.count()
	time.Sleep(300 * time.Millisecond)
	if kInt.count() != n {
		t.Fatalf("keyframe interval sent %d frames of an unchanged screen", kInt.count()-n)
	}
}

func TestGateHoldsFirstFrame(t *testing.T) {
	d := newFakeDisplay(64, 64)
	c := New(d, Options{})
	k := newSink()
	gate := make(chan struct{})
	startStream(t, c, &aciv1.ScreencastStartRequest{}, k, WithGate(gate))
	time.Sleep(50 * time.Millisecond)
	if n := k.count(); n != 0 {
		t.Fatalf("%d frames before the gate opened", n)
	}
	close(gate)
	k.waitScreen(t, imageOf(d.snapshot(), 64, 64), 2*time.Second)
}
