package recording

import (
	"bytes"
	"encoding/binary"
	"errors"
	"io"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	aciv1 "github.com/forkfleet/forkfleet/api/gen/forkfleet/aci/v1"
)

// TestStreamFile: records read back as written; a file cut inside a record
// reads up to the cut; a record claiming more than maxRecord is refused
// before anything is allocated for it.
func TestStreamFile(t *testing.T) {
	at := time.Unix(1700000000, 123)
	f := &aciv1.ScreencastFrame{StreamId: 1, Seq: 4, Keyframe: true, Width: 2, Height: 2, FrameHash: []byte{1, 2}}
	rec, err := frameRecord(f, at)
	if err != nil {
		t.Fatal(err)
	}
	file := append(streamMagic[:], rec...)
	file = append(file, cursorRecord(5, -1, at)...)
	full := len(file)
	file = append(file, rec[:len(rec)-3]...) // cut mid-record
	r, err := NewStreamReader(bytes.NewReader(file))
	if err != nil {
		t.Fatal(err)
	}
	a, err := r.Next()
	if err != nil || !proto.Equal(a.Frame, f) || !a.At.Equal(at) {
		t.Fatalf("frame %v %v", a, err)
	}
	c, err := r.Next()
	if err != nil || c.Cursor != [2]int32{5, -1} {
		t.Fatalf("cursor %v %v", c, err)
	}
	if _, err := r.Next(); err != io.EOF {
		t.Fatalf("cut record: %v", err)
	}
	huge := append([]byte(nil), file[:full]...)
	huge = binary.LittleEndian.AppendUint32(huge, maxRecord+1)
	huge = append(huge, kindFrame, 0, 0, 0, 0, 0, 0, 0, 0)
	r, _ = NewStreamReader(bytes.NewReader(huge))
	r.Next()
	r.Next()
	if _, err := r.Next(); !errors.Is(err, ErrBadStream) {
		t.Fatalf("oversized record: %v", err)
	}
	if _, err := NewStreamReader(bytes.NewReader([]byte("not a recording"))); !errors.Is(err, ErrBadStream) {
		t.Fatalf("bad magic: %v", err)
	}
}

// TestRecorderSkipsToKeyframe: a recorder whose queue is full skips frames
// (never blocks the hub), asks for a keyframe once rather than per frame,
// and goes on from the next keyframe that fits.
func TestRecorderSkipsToKeyframe(t *testing.T) {
	r := &recorder{wake: make(chan struct{}, 1)}
	big := func(key bool) *aciv1.ScreencastFrame {
		return &aciv1.ScreencastFrame{Keyframe: key, Tiles: []*aciv1.Tile{{Data: make([]byte, 20<<20)}}}
	}
	small := &aciv1.ScreencastFrame{Seq: 2}
	if !r.Frame(big(true), time.Time{}) {
		t.Fatal("the first keyframe was refused")
	}
	if r.Frame(big(false), time.Time{}) {
		t.Fatal("a frame past the queue's bound was taken")
	}
	if !r.Frame(small, time.Time{}) || !r.Frame(small, time.Time{}) {
		t.Fatal("asked for a keyframe again within a second")
	}
	if r.skipped.Load() != 3 || len(r.queue) != 1 {
		t.Fatalf("skipped %d, queued %d", r.skipped.Load(), len(r.queue))
	}
	r.queue, r.qbytes = nil, 0 // the writer caught up
	if !r.Frame(small, time.Time{}) || len(r.queue) != 0 {
		t.Fatal("a delta was recorded before the keyframe")
	}
	if !r.Frame(&aciv1.ScreencastFrame{Keyframe: true}, time.Time{}) || !r.Frame(small, time.Time{}) || len(r.queue) != 2 {
		t.Fatalf("after the keyframe: %d queued", len(r.queue))
	}
}
