//go:build linux

package x11

import (
	"image"
	"time"

	"github.com/jezek/xgb/shm"
	"github.com/jezek/xgb/xproto"
)

func timeAfter(sec int) <-chan time.Time { return time.After(time.Duration(sec) * time.Second) }

func shmGetImageOnly(d *Desktop, r image.Rectangle) (*shm.GetImageReply, error) {
	return shm.GetImage(d.conn, xproto.Drawable(d.root), int16(r.Min.X), int16(r.Min.Y),
		uint16(r.Dx()), uint16(r.Dy()), 0xffffffff, xproto.ImageFormatZPixmap, d.cap.shmSeg, 0).Reply()
}
