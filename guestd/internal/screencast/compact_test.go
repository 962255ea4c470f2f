package screencast

import (
	"bytes"
	"image"
	"sync"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	aciv1 "github.com/forkfleet/forkfleet/api/gen/forkfleet/aci/v1"
)

// TestCompactDeltaFrames: by default only keyframes carry geometry,
// absolute time and a hash; delta frames carry a time delta. With
// frame_hashes every frame carries the hash of the pixels the client then
// holds. Both reconstruct pixel-exactly.
func TestCompactDeltaFrames(t *testing.T) {
	d := newFakeDisplay(320, 200)
	c := New(d, Options{})
	kDefault, kHashes := newSink(), newSink()
	startStream(t, c, &aciv1.ScreencastStartRequest{Fps: 60, Delta: true}, kDefault, WithZlib())
	startStream(t, c, &aciv1.ScreencastStartRequest{Fps: 60, Delta: true, FrameHashes: true}, kHashes, WithZlib())
	t0 := time.Now()
	time.Sleep(watchSettle)
	typeText(d, 5, 5, sample, 3*time.Millisecond)
	want := imageOf(d.snapshot(), 320, 200)
	kDefault.waitScreen(t, want, 5*time.Second)
	kHashes.waitScreen(t, want, 5*time.Second)

	frames, errs := kDefault.snapshot()
	if len(errs) != 0 || len(frames) < 10 {
		t.Fatalf("%d frames, compositor errors %v", len(frames), errs)
	}
	key := frames[0]
	if !key.GetKeyframe() || key.GetWidth() != 320 || key.GetHeight() != 200 || len(key.GetFrameHash()) != 16 ||
		key.GetCapturedAtNs() < uint64(t0.Add(-time.Second).UnixNano()) {
		t.Fatalf("keyframe %dx%d hash %x captured_at_ns %d", key.GetWidth(), key.GetHeight(), key.GetFrameHash(), key.GetCapturedAtNs())
	}
	var sumUs uint64
	var maxSize int
	for _, f := range frames[1:] {
		if f.GetKeyframe() || f.GetWidth() != 0 || f.GetHeight() != 0 || f.GetCapturedAtNs() != 0 || f.GetFrameHash() != nil {
			t.Fatalf("delta frame %d not compact: keyframe=%v %dx%d captured_at_ns=%d hash=%x",
				f.GetSeq(), f.GetKeyframe(), f.GetWidth(), f.GetHeight(), f.GetCapturedAtNs(), f.GetFrameHash())
		}
		sumUs += f.GetCapturedAtDeltaUs()
		if f.GetFormat() == FormatZlib {
			maxSize = max(maxSize, proto.Size(f))
		}
	}
	// The deltas add up to the last frame's time: within the test's span.
	last := time.UnixMicro(int64(key.GetCapturedAtNs()/1e3) + int64(sumUs))
	if got := kDefault.comp.CapturedAt(); !got.Equal(last) || last.Before(t0) || last.After(time.Now()) {
		t.Fatalf("reconstructed capture time %v (compositor %v), test ran %v..%v", last, got, t0, time.Now())
	}
	if kDefault.comp.FrameHash() != nil {
		t.Fatalf("compositor reports a hash after hashless delta frames")
	}
	t.Logf("largest zlib delta frame: %d bytes of protobuf", maxSize)

	frames, errs = kHashes.snapshot()
	if len(errs) != 0 {
		t.Fatalf("compositor errors %v", errs)
	}
	for _, f := range frames {
		if len(f.GetFrameHash()) != 16 {
			t.Fatalf("frame_hashes stream: frame %d has hash %x", f.GetSeq(), f.GetFrameHash())
		}
	}
	if h := hashOf(t, want); !bytes.Equal(kHashes.comp.FrameHash(), h[:]) {
		t.Fatalf("last frame hash %x, screen %x", kHashes.comp.FrameHash(), h)
	}
}

// TestIdleOneKeyframeEveryMode: over a quiet window every kind of stream
// delivers exactly one keyframe and then nothing, the watch-start re-check
// and damage that changes no pixel included.
func TestIdleOneKeyframeEveryMode(t *testing.T) {
	for _, tc := range []struct {
		name string
		req  *aciv1.ScreencastStartRequest
		opts []StartOption
	}{
		{"full-png", &aciv1.ScreencastStartRequest{Fps: 30}, nil},
		{"full-jpeg", &aciv1.ScreencastStartRequest{Fps: 30, Format: aciv1.ImageFormat_IMAGE_FORMAT_JPEG}, nil},
		{"full-none", &aciv1.ScreencastStartRequest{Fps: 30, Format: aciv1.ImageFormat_IMAGE_FORMAT_NONE}, nil},
		{"full-scaled", &aciv1.ScreencastStartRequest{Fps: 30, MaxLongEdge: 100}, nil},
		{"delta-png", &aciv1.ScreencastStartRequest{Fps: 30, Delta: true}, nil},
		{"delta-zlib", &aciv1.ScreencastStartRequest{Fps: 30, Delta: true}, []StartOption{WithZlib()}},
		{"delta-jpeg", &aciv1.ScreencastStartRequest{Fps: 30, Delta: true, Format: aciv1.ImageFormat_IMAGE_FORMAT_JPEG}, nil},
		{"delta-interval", &aciv1.ScreencastStartRequest{Fps: 30, Delta: true, KeyframeIntervalMs: 50}, nil},
		{"full-overlay", &aciv1.ScreencastStartRequest{Fps: 30, Cursor: aciv1.CursorMode_CURSOR_MODE_OVERLAY}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			d := newFakeDisplay(320, 200)
			d.cursor.X, d.cursor.Y = 40, 40
			c := New(d, Options{})
			k := newSink()
			startStream(t, c, tc.req, k, tc.opts...)
			// Past the re-check, then damage that changes nothing.
			time.Sleep(watchSettle + 200*time.Millisecond)
			d.draw(image.Rect(5, 5, 50, 50), func(x, y int) (byte, byte, byte) { return 0xee, 0xee, 0xee })
			time.Sleep(300 * time.Millisecond)
			frames, errs := k.snapshot()
			if len(frames) != 1 || !frames[0].GetKeyframe() || frames[0].GetSeq() != 1 {
				t.Fatalf("quiet stream sent %d frames (first keyframe=%v), want exactly one keyframe",
					len(frames), len(frames) > 0 && frames[0].GetKeyframe())
			}
			if tc.req.GetFormat() != aciv1.ImageFormat_IMAGE_FORMAT_NONE && tc.req.GetFormat() != aciv1.ImageFormat_IMAGE_FORMAT_JPEG && len(errs) != 0 {
				t.Fatalf("compositor errors %v", errs)
			}
			// A real change still goes out.
			d.draw(image.Rect(60, 60, 70, 70), func(x, y int) (byte, byte, byte) { return 1, 2, 3 })
			deadline := time.Now().Add(2 * time.Second)
			for k.count() < 2 && time.Now().Before(deadline) {
				time.Sleep(5 * time.Millisecond)
			}
			if n := k.count(); n != 2 {
				t.Fatalf("a visible change sent %d frames, want 1", n-1)
			}
		})
	}
}

// TestFPSCap: under continuous damage a stream sends at most fps frames a
// second, spaced by at least 1/fps, and keeps up with that rate.
func TestFPSCap(t *testing.T) {
	for _, fps := range []int{10, 25} {
		t.Run(itoaTest(fps), func(t *testing.T) {
			t.Parallel()
			d := newFakeDisplay(320, 200)
			c := New(d, Options{})
			var mu sync.Mutex
			var at []time.Time
			send := func(f *aciv1.ScreencastFrame) error {
				mu.Lock()
				at = append(at, time.Now())
				mu.Unlock()
				return nil
			}
			id, err := c.Start(t.Context(), &aciv1.ScreencastStartRequest{Fps: uint32(fps), Delta: true}, send, WithZlib())
			if err != nil {
				t.Fatal(err)
			}
			defer func() { _ = c.Stop(id) }()
			// Damage every 2 ms (a video, a spinner) for 2 seconds.
			const window = 2 * time.Second
			stop := time.Now().Add(window)
			for i := 0; time.Now().Before(stop); i++ {
				d.draw(image.Rect(i%300, 10, i%300+8, 26), func(x, y int) (byte, byte, byte) { return byte(i), byte(x), byte(y) })
				time.Sleep(2 * time.Millisecond)
			}
			time.Sleep(200 * time.Millisecond)
			mu.Lock()
			times := append([]time.Time(nil), at...)
			mu.Unlock()
			interval := time.Second / time.Duration(fps)
			// The pacing holds from when a frame's build starts; sends
			// are that far apart give or take the builds' jitter, which
			// a loaded machine stretches, so single gaps get slack and
			// the mean does not.
			for i := 1; i < len(times); i++ {
				if gap := times[i].Sub(times[i-1]); gap < interval/2 {
					t.Fatalf("frames %d and %d %v apart at %d fps (interval %v)", i, i+1, gap, fps, interval)
				}
			}
			if n := len(times); n > 2 {
				if mean := times[n-1].Sub(times[1]) / time.Duration(n-2); mean < interval-2*time.Millisecond {
					t.Fatalf("mean gap %v at %d fps (interval %v)", mean, fps, interval)
				}
			}
			// The keyframe, then one frame per interval of the window
			// (and one for the damage still pending when it ended).
			limit := 1 + int(window/interval) + 1
			if n := len(times); n > limit || n < limit*7/10 {
				t.Fatalf("%d frames in %v at %d fps: want at most %d and at least %d", n, window, fps, limit, limit*7/10)
			}
			t.Logf("%d fps: %d frames in %v", fps, len(times), window)
		})
	}
}

func itoaTest(n int) string {
	return string(rune('0'+n/10)) + string(rune('0'+n%10)) + "fps"
}
