//go:build linux

package suites

import (
	"context"
	"flag"
	"fmt"
	"time"

	"go.opentelemetry.io/otel/attribute"
	oteltrace "go.opentelemetry.io/otel/trace"

	aciv1 "github.com/forkfleet/forkfleet/api/gen/forkfleet/aci/v1"
	"github.com/forkfleet/forkfleet/benchd/internal/harness"
	"github.com/forkfleet/forkfleet/benchd/internal/result"
	"github.com/forkfleet/forkfleet/benchd/internal/suiteapi"
)

// codecSuite is the observation codec ladder: format x quality x downscale
// on three content types, bytes and round-trip latency per cell.
type codecSuite struct {
	qualities intList
	edges     intList
	n         int
}

func (*codecSuite) Name() string { return "codec" }
func (*codecSuite) Description() string {
	return "codec ladder: PNG and JPEG q10/50/80/95 at native/1024/768/512 on sparse, dense and photo content: bytes, latency, encode time"
}

func (c *codecSuite) Flags(fs *flag.FlagSet) {
	c.qualities = intList{10, 50, 80, 95}
	c.edges = intList{0, 1024, 768, 512}
	fs.Var(&c.qualities, "codec-qualities", "JPEG qualities")
	fs.Var(&c.edges, "codec-edges", "max_long_edge values (0: native)")
	fs.IntVar(&c.n, "codec-n", 30, "samples per cell (--n overrides)")
}

func (c *codecSuite) Check(ctx context.Context, env *suiteapi.Env) error { return checkHostGuest(env) }

func (c *codecSuite) Run(ctx context.Context, env *suiteapi.Env) ([]result.Row, error) {
	hg, err := startHostGuest(ctx, env)
	if err != nil {
		return nil, err
	}
	defer hg.Stop()
	n, warm := env.Samples(c.n), env.Warmups(3)
	type cell struct {
		name string
		req  *aciv1.ScreenshotRequest
	}
	var rows []result.Row
	for _, sc := range harness.Scenes {
		if err := hg.Desktop.SetScene(ctx, sc, env.WorkDir); err != nil {
			return nil, err
		}
		// Every sample follows a one-pixel repaint: capture and encode are
		// measured, not guestd's cache of an unchanged frame.
		touch, err := hg.Desktop.NewToucher()
		if err != nil {
			return nil, err
		}
		content := string(sc)
		env.Progressf("codec: scene %s", content)
		for _, edge := range c.edges {
			edgeName := "native"
			if edge > 0 {
				edgeName = itoa(edge)
			}
			cells := []cell{{"png", &aciv1.ScreenshotRequest{Format: aciv1.ImageFormat_IMAGE_FORMAT_PNG, MaxLongEdge: uint32(edge)}}}
			for _, q := range c.qualities {
				if q < 1 || q > 100 {
					return nil, fmt.Errorf("codec: quality %d out of 1..100", q)
				}
				cells = append(cells, cell{fmt.Sprintf("jpeg-q%d", q), &aciv1.ScreenshotRequest{
					Format: aciv1.ImageFormat_IMAGE_FORMAT_JPEG, Quality: uint32(q), MaxLongEdge: uint32(edge)}})
			}
			for _, ce := range cells {
				lbl := labels("content", content, "codec", ce.name, "edge", edgeName)
				lat := result.NewSeries("codec.latency", "ms", lbl)
				size := result.NewSeries("codec.bytes", "bytes", lbl)
				enc := result.NewSeries("codec.encode", "ms", lbl)
				format := "png"
				if ce.req.Format == aciv1.ImageFormat_IMAGE_FORMAT_JPEG {
					format = "jpeg"
				}
				cctx, sp := env.Tracer.Start(ctx, "codec.cell", oteltrace.WithAttributes(
					attribute.String("content", content), attribute.String("codec", ce.name), attribute.String("edge", edgeName)))
				err := suiteapi.Measure(cctx, lat, warm, n, func(w bool) (float64, error) {
					if err := touch.Touch(); err != nil {
						return 0, err
					}
					t0 := time.Now()
					r, err := hg.Session.Screenshot(cctx, ce.req)
					d := time.Since(t0)
					if err != nil {
						return 0, err
					}
					if !validImage(format, r) || (edge > 0 && max(r.GetWidth(), r.GetHeight()) > uint32(edge)) {
						return 0, suiteapi.ErrUnverified
					}
					if !w {
						size.Add(float64(len(r.GetData())))
						enc.Add(float64(r.GetEncodeNs()) / 1e6)
					}
					return suiteapi.Ms(d), nil
				})
				sp.End()
				if err != nil {
					touch.Close()
					return nil, err
				}
				rows = append(rows, lat.Row(), size.Row(), enc.Row())
			}
		}
		touch.Close()
	}
	return rows, nil
}
