package screencast

import (
	"bytes"
	"errors"
	"image"
	"image/color"
	"image/jpeg"
	"testing"

	"google.golang.org/protobuf/proto"

	"github.com/forkfleet/forkfleet/api/aci/wire"
	aciv1 "github.com/forkfleet/forkfleet/api/gen/forkfleet/aci/v1"
)

// FuzzApply feeds hostile frames to a compositor that holds a 64x48
// keyframe: whatever a guestd sends, Apply returns nil or one of its
// errors, never panics, and keeps its framebuffer within the maximum frame.
func FuzzApply(f *testing.F) {
	const w, h = 64, 48
	grey := func(x, y int) color.RGBA { return color.RGBA{uint8(x), uint8(y), 7, 255} }
	var jb bytes.Buffer
	jpeg.Encode(&jb, image.NewRGBA(image.Rect(0, 0, 8, 8)), nil)
	z := newZlibStream(f)
	seeds := []*aciv1.ScreencastFrame{
		keyframe(f, 5, w, h, grey),
		{StreamId: 1, Seq: 2, Format: aciv1.ImageFormat_IMAGE_FORMAT_PNG, Tiles: []*aciv1.Tile{{Rect: rect(1, 2, 8, 8), Data: pngOf(f, 8, 8, grey)}}},
		{StreamId: 1, Seq: 2, Format: aciv1.ImageFormat_IMAGE_FORMAT_JPEG, Tiles: []*aciv1.Tile{{Rect: rect(0, 0, 8, 8), Data: jb.Bytes()}}},
		{StreamId: 1, Seq: 2, Format: aciv1.ImageFormat_IMAGE_FORMAT_PNG, Tiles: []*aciv1.Tile{{Rect: rect(0, 0, 16, 16), Data: pngBomb(8000, 8000)}}},
		z.records(f, 2, w, h, rec{rect(0, 0, 4, 4), raw(4, 4, 1, 2, 3)}, rec{rect(8, 8, 16, 8), copyOp(0, 0)}, rec{rect(0, 40, 64, 8), []byte{wire.ZlibOpSolid, 9, 9, 9}}),
		{StreamId: 1, Seq: 2, Format: FormatZlibTiles, Tiles: []*aciv1.Tile{{Rect: rect(0, 0, 2, 2), Data: []byte{0x62, 0x60, 0x00, 0x00}}}},
		{StreamId: 1, Seq: 3, Keyframe: true, Format: aciv1.ImageFormat_IMAGE_FORMAT_PNG, Width: 32768, Height: 32768},
	}
	for _, s := range seeds {
		b, err := proto.Marshal(s)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	key, err := proto.Marshal(keyframe(f, 1, w, h, grey))
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		frame := &aciv1.ScreencastFrame{}
		if err := proto.Unmarshal(data, frame); err != nil {
			return
		}
		c := NewCompositor(BGRX)
		k := &aciv1.ScreencastFrame{}
		proto.Unmarshal(key, k)
		if err := c.Apply(k); err != nil {
			t.Fatal(err)
		}
		for range 2 { // twice: the zlib stream carries state across frames
			err := c.Apply(frame)
			if err != nil && !errors.Is(err, ErrCorrupt) && !errors.Is(err, ErrGap) && !errors.Is(err, ErrAwaitingKeyframe) {
				t.Fatalf("unclassified error: %v", err)
			}
			if fw, fh := c.Size(); fw > DefaultMaxFrameEdge || fh > DefaultMaxFrameEdge {
				t.Fatalf("framebuffer %dx%d", fw, fh)
			}
		}
	})
}
