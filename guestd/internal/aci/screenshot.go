package aci

import (
	"bytes"
	"context"
	"image"
	"time"

	aciv1 "github.com/forkfleet/forkfleet/api/gen/forkfleet/aci/v1"
	"github.com/forkfleet/forkfleet/guestd/internal/desktop"
	"github.com/forkfleet/forkfleet/guestd/internal/encode"
)

const (
	defaultJPEGQuality    = 80
	defaultSettleTimeout  = time.Second
	maxSettle             = 60 * time.Second
	shrinkBuffersAbove    = 64 << 20
	hashLen               = 16
	maxScreenshotLongEdge = 1 << 14
)

// executorState is owned by the session's executor goroutine: buffers reused
// across requests so a steady stream of screenshots allocates nothing.
type executorState struct {
	hello      bool
	wantsReady bool
	zlibTiles  bool // the client takes zlib screencast tiles

	frame  desktop.Frame // captured BGRX pixels
	scaled []byte        // downscale output
	enc    []byte        // encoded image; aliased by the reply until emit
}

func (e *executorState) release() {
	e.frame.Pix, e.scaled, e.enc = nil, nil, nil
}

// screenshot captures, optionally composites the cursor and downscales,
// hashes, and encodes unless the hash matches if_none_match. field prefixes
// error fields ("screenshot" or "step.observe").
func (ss *session) screenshot(ctx context.Context, r *aciv1.ScreenshotRequest, field string) (*aciv1.ScreenshotResponse, error) {
	d, err := ss.srv.desktop()
	if err != nil {
		return nil, err
	}
	format := r.GetFormat()
	switch format {
	case aciv1.ImageFormat_IMAGE_FORMAT_UNSPECIFIED:
		format = aciv1.ImageFormat_IMAGE_FORMAT_PNG
	case aciv1.ImageFormat_IMAGE_FORMAT_PNG, aciv1.ImageFormat_IMAGE_FORMAT_JPEG, aciv1.ImageFormat_IMAGE_FORMAT_NONE:
	default:
		return nil, errInvalid(field+".format", "unknown image format %d", int32(format))
	}
	quality := int(r.GetQuality())
	if quality > 100 {
		return nil, errInvalid(field+".quality", "quality %d: want 1..100", quality)
	}
	if quality == 0 {
		quality = defaultJPEGQuality
	}
	if n := len(r.GetIfNoneMatch()); n != 0 && n != hashLen {
		return nil, errInvalid(field+".if_none_match", "if_none_match must be a %d-byte frame_hash, got %d bytes", hashLen, n)
	}
	if r.GetMaxLongEdge() > maxScreenshotLongEdge {
		return nil, errInvalid(field+".max_long_edge", "max_long_edge %d too large", r.GetMaxLongEdge())
	}
	sw, sh := d.ScreenSize()
	region, err := clipRegion(r.GetRegion(), sw, sh, field+".region")
	if err != nil {
		return nil, err
	}
	if settle := time.Duration(r.GetSettleMs()) * time.Millisecond; settle > 0 {
		bound := defaultSettleTimeout
		if r.GetSettleTimeoutMs() > 0 {
			bound = time.Duration(r.GetSettleTimeoutMs()) * time.Millisecond
		}
		if settle > maxSettle || bound > maxSettle {
			return nil, errInvalid(field+".settle_ms", "settle_ms and settle_timeout_ms are capped at %s", maxSettle)
		}
		// Not settling within the bound is not an error: the client gets
		// the frame as it is at the deadline.
		if _, err := ss.srv.damage.settle(ctx, settle, bound); err != nil {
			return nil, err
		}
	}

	e := &ss.exec
	t0 := time.Now()
	capturedAt := ss.srv.since()
	if err := d.Capture(region, &e.frame); err != nil {
		return nil, err
	}
	img := encode.Image{Pix: e.frame.Pix, Stride: e.frame.Stride, Width: region.Dx(), Height: region.Dy()}
	if r.GetIncludeCursor() {
		// The frame is our copy, so drawing into it is free. A missing
		// sprite (no XFIXES) leaves the frame as captured.
		if c, cerr := d.CursorImage(); cerr == nil && c.Width > 0 {
			p := image.Pt(c.X-c.XHot, c.Y-c.YHot).Sub(region.Min)
			if err := encode.CompositeARGB(img, p.X, p.Y, c.ARGB, c.Width, c.Height); err != nil {
				return nil, err
			}
		}
	}
	if m := int(r.GetMaxLongEdge()); m > 0 {
		scaled, err := encode.Downscale(e.scaled, img, m)
		if err != nil {
			return nil, err
		}
		if &scaled.Pix[0] != &img.Pix[0] {
			e.scaled = scaled.Pix
		}
		img = scaled
	}
	sum, err := encode.Hash128(img)
	if err != nil {
		return nil, err
	}
	captureNs := time.Since(t0)
	resp := &aciv1.ScreenshotResponse{
		Format:       format,
		Width:        uint32(img.Width),
		Height:       uint32(img.Height),
		FrameHash:    sum[:],
		Region:       &aciv1.Rect{X: int32(region.Min.X), Y: int32(region.Min.Y), Width: int32(region.Dx()), Height: int32(region.Dy())},
		CaptureNs:    uint64(captureNs),
		CapturedAtNs: uint64(capturedAt),
	}
	if inm := r.GetIfNoneMatch(); len(inm) == hashLen && bytes.Equal(inm, sum[:]) {
		resp.NotModified = true
		return resp, nil
	}
	if format == aciv1.ImageFormat_IMAGE_FORMAT_NONE {
		return resp, nil
	}
	t1 := time.Now()
	switch format {
	case aciv1.ImageFormat_IMAGE_FORMAT_PNG:
		e.enc, err = encode.EncodePNG(e.enc[:0], img)
	case aciv1.ImageFormat_IMAGE_FORMAT_JPEG:
		e.enc, err = encode.EncodeJPEG(e.enc[:0], img, quality)
	}
	if err != nil {
		return nil, err
	}
	resp.EncodeNs = uint64(time.Since(t1))
	resp.Data = e.enc
	e.trim()
	return resp, nil
}

// trim drops buffers an unusually large capture grew, after the reply that
// aliases them has been built (the slice header keeps the bytes alive until
// emit has marshaled it).
func (e *executorState) trim() {
	if cap(e.frame.Pix) > shrinkBuffersAbove {
		e.frame.Pix = nil
	}
	if cap(e.scaled) > shrinkBuffersAbove {
		e.scaled = nil
	}
	if cap(e.enc) > shrinkBuffersAbove {
		e.enc = nil
	}
}
