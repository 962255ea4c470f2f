//go:build linux

package aci

import (
	"context"
	"fmt"
	"image"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jezek/xgb/xproto"

	aciv1 "github.com/forkfleet/forkfleet/api/gen/forkfleet/aci/v1"
	"github.com/forkfleet/forkfleet/guestd/internal/desktop"
	"github.com/forkfleet/forkfleet/guestd/internal/encode"
)

// denseText is deterministic ANSI-coloured filler (as benchd's dense scene).
func denseText(cols, rows int) string {
	words := []string{"fork", "fleet", "sandbox", "checkpoint", "replica", "observe", "pixel", "guestd", "controld",
		"latency", "frame", "encode", "xterm", "desktop", "agent", "step", "cursor", "window", "tile", "hash"}
	var b strings.Builder
	seed := uint32(2463534242)
	next := func() uint32 { seed ^= seed << 13; seed ^= seed >> 17; seed ^= seed << 5; return seed }
	for r := 0; r < rows; r++ {
		for n := 0; n < cols-12; {
			w := words[next()%uint32(len(words))]
			fmt.Fprintf(&b, "\x1b[%dm%s\x1b[0m ", 31+next()%7, w)
			n += len(w) + 1
		}
		b.WriteString("\n")
	}
	return b.String()
}

// startXterm runs xterm on display with args and waits until it has drawn.
func startXterm(b *testing.B, display string, args ...string) {
	b.Helper()
	cmd := exec.Command("/usr/bin/xterm", args...)
	cmd.Env = append(os.Environ(), "DISPLAY="+display)
	if err := cmd.Start(); err != nil {
		b.Fatalf("xterm: %v", err)
	}
	b.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
}

// plainDesktop exposes only the Desktop methods of the desktop it wraps.
type plainDesktop struct{ Desktop }

// BenchmarkRealScreenshot measures screenshots through the real WebSocket
// on a real 1280x800 Xvfb (FORKFLEET_INTEGRATION=1), reporting p50/p90:
//
//	idle:    the screen did not change (answered from the session's frame)
//	small:   a 24x16 repaint before every request (a typed character)
//	full:    the region shifts by one pixel per request, so every band of
//	         the frame is new (the encoder's full cost)
//	inm:     if_none_match with the current hash, idle screen
//	click:   click + PNG observation in one step, with a small repaint
//
// Every case also runs as plain/...: through a Desktop without the optional
// DamageSequencer and FrameViewer, i.e. capture, copy and hash every time.
func BenchmarkRealScreenshot(b *testing.B) {
	if _, err := os.Stat("/usr/bin/xterm"); err != nil {
		b.Skip("xterm missing")
	}
	display := startXvfb(b)
	rs := newRealServer(b, display)
	p := newPainter(b, display)
	p.fill(xproto.Drawable(p.root), 0x2f3b4c, image.Rect(0, 0, realW, realH))
	p.sync()
	ctx := context.Background()

	scenes := []struct {
		name  string
		setup func()
	}{
		{"sparse", func() {
			startXterm(b, display, "-fn", "fixed", "+sb", "-geometry", "80x24+40+40")
		}},
		{"dense", func() {
			path := filepath.Join(b.TempDir(), "dense.txt")
			if err := os.WriteFile(path, []byte(denseText(200, 60)), 0o644); err != nil {
				b.Fatal(err)
			}
			startXterm(b, display, "-fn", "fixed", "+sb", "-bg", "black", "-fg", "grey85", "-geometry", "208x58+0+0",
				"-e", "sh", "-c", "cat "+path+"; exec sleep 100000")
		}},
	}
	png := aciv1.ImageFormat_IMAGE_FORMAT_PNG
	for _, sc := range scenes {
		sc.setup()
		time.Sleep(700 * time.Millisecond) // xterm maps and draws
		repaint := func(i int) {
			p.fill(xproto.Drawable(p.root), uint32(0x10101*(i%200)), image.Rect(1200, 760, 1224, 776))
			p.sync()
		}
		var hash []byte
		cases := []struct {
			name   string
			before func(i int)
			msg    func(i int) *aciv1.ClientMessage
		}{
			{"png_idle", nil, func(int) *aciv1.ClientMessage { return shot(&aciv1.ScreenshotRequest{Format: png}) }},
			{"png_small", repaint, func(int) *aciv1.ClientMessage { return shot(&aciv1.ScreenshotRequest{Format: png}) }},
			{"png_full", nil, func(i int) *aciv1.ClientMessage {
				return shot(&aciv1.ScreenshotRequest{Format: png, Region: &aciv1.Rect{X: int32(i % 2), Width: realW - 1, Height: realH}})
			}},
			{"none_full", nil, func(i int) *aciv1.ClientMessage {
				return shot(&aciv1.ScreenshotRequest{Format: aciv1.ImageFormat_IMAGE_FORMAT_NONE, Region: &aciv1.Rect{X: int32(i % 2), Width: realW - 1, Height: realH}})
			}},
			{"jpeg80_small", repaint, func(int) *aciv1.ClientMessage {
				return shot(&aciv1.ScreenshotRequest{Format: aciv1.ImageFormat_IMAGE_FORMAT_JPEG, Quality: 80})
			}},
			{"inm_idle", nil, func(int) *aciv1.ClientMessage {
				return shot(&aciv1.ScreenshotRequest{Format: png, IfNoneMatch: hash})
			}},
			{"inm_small", repaint, func(int) *aciv1.ClientMessage {
				return shot(&aciv1.ScreenshotRequest{Format: png, IfNoneMatch: hash})
			}},
			{"click_png_small", repaint, func(i int) *aciv1.ClientMessage {
				return &aciv1.ClientMessage{Request: &aciv1.ClientMessage_Step{Step: &aciv1.StepRequest{
					Actions: []*aciv1.Action{{Action: &aciv1.Action_Click{Click: &aciv1.ClickAction{At: &aciv1.Point{X: 1270, Y: 790}}}}},
					Observe: &aciv1.ScreenshotRequest{Format: png}}}}
			}},
		}
		for _, tc := range cases {
			for _, mode := range []string{"", "plain/"} {
				// plain hides the optional interfaces: every request captures
				// (copied out) as before the damage-proven cache.
				if mode == "" {
					rs.srv.SetDesktop(rs.desk)
				} else {
					rs.srv.SetDesktop(plainDesktop{rs.desk})
				}
				b.Run(sc.name+"/"+mode+tc.name, func(b *testing.B) {
					r, err := rs.c.Call(ctx, shot(&aciv1.ScreenshotRequest{Format: aciv1.ImageFormat_IMAGE_FORMAT_NONE}))
					if err != nil {
						b.Fatal(err)
					}
					hash = r.GetScreenshot().GetFrameHash()
					lat := make([]time.Duration, 0, b.N)
					var encNs, capNs []time.Duration
					var bytes int
					b.ResetTimer()
					for i := 0; i < b.N; i++ {
						if tc.before != nil {
							b.StopTimer()
							tc.before(i)
							b.StartTimer()
						}
						t0 := time.Now()
						r, err := rs.c.Call(ctx, tc.msg(i))
						lat = append(lat, time.Since(t0))
						if err != nil || r.GetError() != nil {
							b.Fatal(err, r.GetError())
						}
						s := r.GetScreenshot()
						if s == nil {
							s = r.GetStep().GetObservation()
						}
						if s == nil {
							b.Fatalf("no frame: %v", r)
						}
						bytes = len(s.GetData())
						encNs = append(encNs, time.Duration(s.GetEncodeNs()))
						capNs = append(capNs, time.Duration(s.GetCaptureNs()))
					}
					b.StopTimer()
					slices.Sort(lat)
					b.ReportMetric(float64(lat[len(lat)/2].Microseconds()), "p50-µs")
					b.ReportMetric(float64(lat[len(lat)*9/10].Microseconds()), "p90-µs")
					b.ReportMetric(float64(bytes), "bytes")
					slices.Sort(encNs)
					slices.Sort(capNs)
					b.ReportMetric(float64(encNs[len(encNs)/2].Microseconds()), "enc-p50-µs")
					b.ReportMetric(float64(capNs[len(capNs)/2].Microseconds()), "cap-p50-µs")
				})
			}
		}
		rs.srv.SetDesktop(rs.desk)
		// The encoders alone on this scene's frame, in process.
		var frame desktop.Frame
		if err := rs.desk.Capture(image.Rect(0, 0, realW, realH), &frame); err != nil {
			b.Fatal(err)
		}
		img := encode.Image{Pix: frame.Pix, Stride: frame.Stride, Width: realW, Height: realH}
		var out []byte
		b.Run(sc.name+"/enc_png", func(b *testing.B) {
			for i := 0; i < b.N; i++ {
				out, _ = encode.EncodePNG(out[:0], img)
			}
			b.ReportMetric(float64(len(out)), "bytes")
		})
		b.Run(sc.name+"/enc_pngstream_fresh", func(b *testing.B) {
			var st encode.PNGStream
			for i := 0; i < b.N; i++ {
				st.Reset()
				out, _ = st.Encode(out[:0], img)
			}
			b.ReportMetric(float64(len(out)), "bytes")
		})
		b.Run(sc.name+"/hash128", func(b *testing.B) {
			for i := 0; i < b.N; i++ {
				encode.Hash128(img)
			}
		})
	}
}
