//go:build linux

package suites

import (
	"flag"
	"image"
	"image/color"
	"slices"
	"testing"
	"time"

	aciv1 "github.com/forkfleet/forkfleet/api/gen/forkfleet/aci/v1"
	"github.com/forkfleet/forkfleet/api/screencast"
	"google.golang.org/protobuf/proto"
)

func TestWSHeaderLen(t *testing.T) {
	for _, c := range []struct{ n, want int }{{0, 2}, {125, 2}, {126, 4}, {65535, 4}, {65536, 10}, {1 << 24, 10}} {
		if got := wsHeaderLen(c.n); got != c.want {
			t.Errorf("wsHeaderLen(%d) = %d, want %d", c.n, got, c.want)
		}
	}
}

// TestFrameWireBytes: the accounting equals the marshaled envelope guestd
// writes plus the WebSocket header, for a small delta and a large keyframe.
func TestFrameWireBytes(t *testing.T) {
	for _, size := range []int{15, 200_000} {
		ev := &aciv1.Event{Event: &aciv1.Event_Frame{Frame: &aciv1.ScreencastFrame{
			StreamId: 3, Seq: 1234, CapturedAtNs: 987654321012, Format: screencast.FormatZlib, Width: 1280, Height: 800,
			Tiles:     []*aciv1.Tile{{Rect: &aciv1.Rect{X: 40, Y: 60, Width: 6, Height: 13}, Data: make([]byte, size)}},
			FrameHash: make([]byte, 16),
		}}}
		b, err := proto.Marshal(&aciv1.ServerMessage{Reply: &aciv1.ServerMessage_Event{Event: ev}})
		if err != nil {
			t.Fatal(err)
		}
		if got, want := frameWireBytes(ev), int64(len(b)+wsHeaderLen(len(b))); got != want {
			t.Errorf("payload %d: wire %d, want %d", size, got, want)
		}
		if got := framePayloadBytes(ev.GetFrame()); got != int64(size) {
			t.Errorf("payload %d: got %d", size, got)
		}
	}
	// A compact zlib delta frame: the chunk is the payload.
	f := &aciv1.ScreencastFrame{StreamId: 3, Seq: 1234, Format: screencast.FormatZlib, CapturedAtDeltaUs: 83000, ZlibChunk: make([]byte, 15)}
	ev := &aciv1.Event{Event: &aciv1.Event_Frame{Frame: f}}
	if got := framePayloadBytes(f); got != 15 {
		t.Errorf("zlib chunk payload %d, want 15", got)
	}
	if got := frameWireBytes(ev); got > 40 {
		t.Errorf("a 15-byte zlib delta frame costs %d wire bytes", got)
	}
}

func TestRxLogFirstByte(t *testing.T) {
	var l rxLog
	t0 := time.Unix(1000, 0)
	l.read(100, t0)                         // bytes 0..99: an earlier message
	l.read(50, t0.Add(10*time.Millisecond)) // 100..149: first part of a 120-byte message
	l.read(70, t0.Add(12*time.Millisecond)) // 150..219: its rest
	if got := l.firstByte(120); !got.Equal(t0.Add(10 * time.Millisecond)) {
		t.Fatalf("message spanning two reads dated %v", got.Sub(t0))
	}
	if got := l.firstByte(70); !got.Equal(t0.Add(12 * time.Millisecond)) {
		t.Fatalf("message in the last read dated %v", got.Sub(t0))
	}
	if got := l.firstByte(1 << 20); !got.Equal(t0) {
		t.Fatalf("oversized message dated %v, want the oldest read", got.Sub(t0))
	}
	if l.Rx() != 220 {
		t.Fatalf("rx %d", l.Rx())
	}
	// The log stays bounded.
	for i := 0; i < 5*rxLogKeep; i++ {
		l.read(1, t0)
	}
	if len(l.reads) >= 2*rxLogKeep {
		t.Fatalf("read log grew to %d", len(l.reads))
	}
}

func TestKeyPairer(t *testing.T) {
	var p keyPairer
	t0 := time.Unix(0, 0)
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
	if _, ok := p.update(at(5)); ok {
		t.Fatal("an update without keys paired")
	}
	p.key(at(10))
	p.key(at(20))
	p.key(at(40))
	// One update covers the first two keys: one sample, the oldest's.
	if d, ok := p.update(at(25)); !ok || d != 15*time.Millisecond {
		t.Fatalf("got %v %v", d, ok)
	}
	if p.unanswered() != 1 {
		t.Fatalf("%d keys pending", p.unanswered())
	}
	// An update that began before the key does not answer it.
	if _, ok := p.update(at(39)); ok {
		t.Fatal("update before the key paired")
	}
	if d, ok := p.update(at(42)); !ok || d != 2*time.Millisecond {
		t.Fatalf("got %v %v", d, ok)
	}
}

func TestMismatchedPixels(t *testing.T) {
	a := image.NewRGBA(image.Rect(0, 0, 4, 3))
	b := image.NewNRGBA(image.Rect(0, 0, 4, 3))
	for y := 0; y < 3; y++ {
		for x := 0; x < 4; x++ {
			c := color.RGBA{uint8(x * 10), uint8(y * 20), 7, 255}
			a.Set(x, y, c)
			b.Set(x, y, color.NRGBA{c.R, c.G, c.B, 255})
		}
	}
	if n := mismatchedPixels(a, b); n != 0 {
		t.Fatalf("identical images: %d", n)
	}
	b.Set(1, 1, color.NRGBA{1, 2, 3, 255})
	b.Set(3, 2, color.NRGBA{1, 2, 3, 255})
	if n := mismatchedPixels(a, b); n != 2 {
		t.Fatalf("two changed pixels: %d", n)
	}
	if n := mismatchedPixels(a, image.NewRGBA(image.Rect(0, 0, 5, 3))); n != 15 {
		t.Fatalf("size mismatch: %d", n)
	}
}

func TestModeListFlag(t *testing.T) {
	fs := flag.NewFlagSet("x", flag.ContinueOnError)
	var s screencastSuite
	s.Flags(fs)
	if len(s.modes) != len(castModes) {
		t.Fatalf("default modes %v", s.modes.String())
	}
	if err := fs.Parse([]string{"--screencast-modes", "delta-zlib, full-png"}); err != nil {
		t.Fatal(err)
	}
	if s.modes.String() != "delta-zlib,full-png" {
		t.Fatalf("modes %s", s.modes.String())
	}
	if err := s.modes.Set("delta-gif"); err == nil {
		t.Fatal("unknown mode accepted")
	}
	zl, _ := castModeNamed("delta-zlib")
	dp, _ := castModeNamed("delta-png")
	dj, _ := castModeNamed("delta-jpeg-q80")
	if !zl.Lossless() || !dp.Lossless() || dj.Lossless() || !zl.Zlib || dp.Zlib {
		t.Fatal("mode table")
	}
}

func TestWithoutCap(t *testing.T) {
	got := withoutCap([]string{"a", screencast.CapabilityZlib, "b"}, screencast.CapabilityZlib)
	if !slices.Equal(got, []string{"a", "b"}) {
		t.Fatalf("%v", got)
	}
}

func TestMedian(t *testing.T) {
	if m := median([]float64{5, 1, 3}); m != 3 {
		t.Fatal(m)
	}
	if m := median([]float64{4, 1, 3, 2}); m != 2.5 {
		t.Fatal(m)
	}
	if m := median(nil); m != 0 {
		t.Fatal(m)
	}
}
