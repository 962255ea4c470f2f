//go:build linux

package guestd

import (
	"context"
	"slices"
	"testing"
	"time"

	aciv1 "github.com/forkfleet/forkfleet/api/gen/forkfleet/aci/v1"
)

// BenchmarkE2E measures round trips through the real WebSocket to the real
// guestd binary on real Xvfb (FORKFLEET_INTEGRATION=1), reporting p50/p90.
func BenchmarkE2E(b *testing.B) {
	g := startGuest(b)
	c := g.client(b)
	ctx := context.Background()
	move := func(i int) *aciv1.ClientMessage {
		return &aciv1.ClientMessage{Request: &aciv1.ClientMessage_Step{Step: &aciv1.StepRequest{Actions: []*aciv1.Action{
			{Action: &aciv1.Action_Move{Move: &aciv1.MoveAction{To: &aciv1.Point{X: int32(100 + i%200), Y: 100}}}}}}}}
	}
	var hash []byte
	cases := []struct {
		name string
		msg  func(i int) *aciv1.ClientMessage
	}{
		{"ping", func(int) *aciv1.ClientMessage {
			return &aciv1.ClientMessage{Request: &aciv1.ClientMessage_Ping{Ping: &aciv1.PingRequest{}}}
		}},
		{"move", move},
		{"screenshot_not_modified", func(int) *aciv1.ClientMessage {
			return &aciv1.ClientMessage{Request: &aciv1.ClientMessage_Screenshot{Screenshot: &aciv1.ScreenshotRequest{IfNoneMatch: hash}}}
		}},
		{"click_plus_png", func(i int) *aciv1.ClientMessage {
			return &aciv1.ClientMessage{Request: &aciv1.ClientMessage_Step{Step: &aciv1.StepRequest{
				Actions: []*aciv1.Action{{Action: &aciv1.Action_Click{Click: &aciv1.ClickAction{At: &aciv1.Point{X: int32(500 + i%2), Y: 700}}}}},
				Observe: &aciv1.ScreenshotRequest{Format: aciv1.ImageFormat_IMAGE_FORMAT_PNG}}}}
		}},
	}
	for _, tc := range cases {
		b.Run(tc.name, func(b *testing.B) {
			if tc.name == "screenshot_not_modified" {
				r, err := c.Call(ctx, &aciv1.ClientMessage{Request: &aciv1.ClientMessage_Screenshot{Screenshot: &aciv1.ScreenshotRequest{Format: aciv1.ImageFormat_IMAGE_FORMAT_NONE}}})
				if err != nil {
					b.Fatal(err)
				}
				hash = r.GetScreenshot().GetFrameHash()
			}
			lat := make([]time.Duration, 0, b.N)
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				t0 := time.Now()
				r, err := c.Call(ctx, tc.msg(i))
				lat = append(lat, time.Since(t0))
				if err != nil || r.GetError() != nil {
					b.Fatal(err, r.GetError())
				}
			}
			b.StopTimer()
			slices.Sort(lat)
			b.ReportMetric(float64(lat[len(lat)/2].Microseconds()), "p50-µs")
			b.ReportMetric(float64(lat[len(lat)*9/10].Microseconds()), "p90-µs")
		})
	}
}
