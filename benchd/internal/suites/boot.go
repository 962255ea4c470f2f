//go:build linux

package suites

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"sort"
	"time"

	"go.opentelemetry.io/otel/attribute"
	oteltrace "go.opentelemetry.io/otel/trace"

	controldv1 "github.com/forkfleet/forkfleet/api/gen/forkfleet/controld/v1"
	"github.com/forkfleet/forkfleet/benchd/internal/result"
	"github.com/forkfleet/forkfleet/benchd/internal/suite"
)

// containerdSocket and namespace controld uses (the floor runs there too).
const (
	containerdSocket = "/run/forkfleet/containerd/containerd.sock"
	containerdNS     = "forkfleet"
)

type bootSuite struct {
	n     int
	floor bool
	image string
}

func (*bootSuite) Name() string { return "boot" }
func (*bootSuite) Description() string {
	return "cold boot waterfall per milestone (controld phases + client first screenshot), vs the ctr run --rm /bin/true floor"
}
func (b *bootSuite) Flags(fs *flag.FlagSet) {
	fs.IntVar(&b.n, "boot-n", 10, "boots (--n overrides)")
	fs.BoolVar(&b.floor, "boot-floor", true, "also time ctr run --rm IMAGE /bin/true, the runtime floor")
	fs.StringVar(&b.image, "boot-image", "", "image to boot (default: controld's default image, which warm slots serve; another boots cold)")
}
func (b *bootSuite) Check(ctx context.Context, env *suite.Env) error {
	return checkControld(ctx, env)
}

func (b *bootSuite) Run(ctx context.Context, env *suite.Env) ([]result.Row, error) {
	c, err := dialControld(ctx, env)
	if err != nil {
		return nil, err
	}
	defer c.Close()
	n, warm := env.Samples(b.n), env.Warmups(1)
	phases := map[string]*result.Series{}
	order := map[string]float64{}
	usable := result.NewSeries("boot.client_usable", "ms", labels("milestone", "first screenshot answered (client)"))
	image := ""
	for i := 0; i < warm+n; i++ {
		isWarm := i < warm
		t0 := time.Now()
		bctx, span := env.Tracer.Start(ctx, "boot", oteltrace.WithAttributes(attribute.Int("i", i), attribute.Bool("warmup", isWarm)))
		resp, err := c.createImage(bctx, b.image)
		created := time.Since(t0)
		if err != nil {
			span.RecordError(err)
			span.End()
			if isWarm {
				usable.Warmup()
			} else {
				usable.Fail()
			}
			env.Progressf("boot %d: %v", i, err)
			continue
		}
		sb := resp.GetSandbox()
		image = sb.GetImage()
		err = firstScreenshot(bctx, resp.GetEndpoint())
		total := time.Since(t0)
		// One span per boot phase, placed at controld's own offsets.
		prev := time.Duration(0)
		bp := append([]*controldv1.BootPhase(nil), sb.GetBoot()...)
		sort.Slice(bp, func(i, j int) bool { return bp[i].GetAt().AsDuration() < bp[j].GetAt().AsDuration() })
		for _, ph := range bp {
			at := ph.GetAt().AsDuration()
			_, ps := env.Tracer.Start(bctx, "boot.phase."+ph.GetName(), oteltrace.WithTimestamp(t0.Add(prev)))
			ps.End(oteltrace.WithTimestamp(t0.Add(at)))
			prev = at
			if isWarm {
				continue
			}
			s, ok := phases[ph.GetName()]
			if !ok {
				s = result.NewSeries("boot.milestone", "ms", labels("milestone", ph.GetName()))
				phases[ph.GetName()] = s
			}
			s.Add(suite.Ms(at))
			order[ph.GetName()] += suite.Ms(at)
		}
		_, ps := env.Tracer.Start(bctx, "boot.phase.client_first_screenshot", oteltrace.WithTimestamp(t0.Add(created)))
		ps.End()
		span.End()
		switch {
		case isWarm:
			usable.Warmup()
		case errors.Is(err, suite.ErrUnverified):
			usable.Unverified()
		case err != nil:
			usable.Fail()
		default:
			usable.Add(suite.Ms(total))
		}
		c.remove(ctx, sb.GetId())
		env.Progressf("boot %d/%d: usable after %.0f ms", i+1, warm+n, suite.Ms(total))
	}
	names := make([]string, 0, len(phases))
	for k := range phases {
		names = append(names, k)
	}
	sort.Slice(names, func(i, j int) bool { return order[names[i]] < order[names[j]] })
	var rows []result.Row
	for _, k := range names {
		rows = append(rows, phases[k].Row())
	}
	ur := usable.Row()
	ur.Metric = "boot.milestone"
	rows = append(rows, ur)
	// The floor: the runtime alone starting and reaping a trivial task of the
	// same image.
	if !b.floor {
		return rows, nil
	}
	if image == "" {
		env.Notef("no successful boot, so the image for the ctr floor is unknown: floor not measured")
		return rows, nil
	}
	if _, err := lookPath("ctr"); err != nil {
		env.Notef("ctr not installed: floor not measured")
		return rows, nil
	}
	floor := result.NewSeries("boot.floor_ctr_run_true", "ms", labels("image", image))
	floor.Baseline = true
	i := 0
	err = suite.Measure(ctx, floor, 1, n, func(bool) (float64, error) {
		i++
		id := fmt.Sprintf("benchd-floor-%d-%d", time.Now().UnixNano(), i)
		_, d, err := runTimed(ctx, nil, "ctr", "-a", containerdSocket, "-n", containerdNS, "run", "--rm", image, id, "/bin/true")
		return suite.Ms(d), err
	})
	if err != nil {
		return nil, err
	}
	fr := floor.Row()
	rows = append(rows, fr)
	if fr.P50 != nil && ur.P50 != nil && *fr.P50 > 0 {
		rows = append(rows, result.Single("boot.usable_over_floor", "x", nil, *ur.P50 / *fr.P50))
		rows[len(rows)-1].Better = result.BetterLower
	}
	return rows, nil
}
