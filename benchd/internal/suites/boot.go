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
	"github.com/forkfleet/forkfleet/benchd/internal/suiteapi"
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
	return "boot waterfall per milestone (controld phases + client first screenshot), apart for boots from a warm slot and cold ones, vs the ctr run --rm /bin/true floor"
}
func (b *bootSuite) Flags(fs *flag.FlagSet) {
	fs.IntVar(&b.n, "boot-n", 10, "boots (--n overrides)")
	fs.BoolVar(&b.floor, "boot-floor", true, "also time ctr run --rm IMAGE /bin/true, the runtime floor")
	fs.StringVar(&b.image, "boot-image", "", "image to boot (default: controld's default image, which warm slots serve; another boots cold)")
}
func (b *bootSuite) Check(ctx context.Context, env *suiteapi.Env) error {
	return checkControld(ctx, env)
}

func (b *bootSuite) Run(ctx context.Context, env *suiteapi.Env) ([]result.Row, error) {
	c, err := dialControld(ctx, env)
	if err != nil {
		return nil, err
	}
	defer c.Close()
	n, warm := env.Samples(b.n), env.Warmups(1)
	// Boots back to back alternate between controld's warm slot and a cold
	// boot (the slot is refilled in the background while the next request
	// comes): one series per milestone and start, since one p50 over both
	// lands between the two modes, wherever the slowest warm boot and the
	// fastest cold one are.
	type key struct{ milestone, start string }
	phases := map[key]*result.Series{}
	order := map[key]float64{}
	usable := map[string]*result.Series{}
	usableOf := func(start string) *result.Series {
		if usable[start] == nil {
			usable[start] = result.NewSeries("boot.client_usable", "ms", labels("milestone", "first screenshot answered (client)", "start", start))
		}
		return usable[start]
	}
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
				usableOf(startCold).Warmup()
			} else {
				usableOf(startCold).Fail()
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
		start := bootStart(bp)
		span.SetAttributes(attribute.String("start", start))
		for _, ph := range bp {
			at := ph.GetAt().AsDuration()
			_, ps := env.Tracer.Start(bctx, "boot.phase."+ph.GetName(), oteltrace.WithTimestamp(t0.Add(prev)))
			ps.End(oteltrace.WithTimestamp(t0.Add(at)))
			prev = at
			if isWarm {
				continue
			}
			k := key{ph.GetName(), start}
			s, ok := phases[k]
			if !ok {
				s = result.NewSeries("boot.milestone", "ms", labels("milestone", k.milestone, "start", start))
				phases[k] = s
			}
			s.Add(suiteapi.Ms(at))
			order[k] += suiteapi.Ms(at)
		}
		_, ps := env.Tracer.Start(bctx, "boot.phase.client_first_screenshot", oteltrace.WithTimestamp(t0.Add(created)))
		ps.End()
		span.End()
		u := usableOf(start)
		switch {
		case isWarm:
			u.Warmup()
		case errors.Is(err, suiteapi.ErrUnverified):
			u.Unverified()
		case err != nil:
			u.Fail()
		default:
			u.Add(suiteapi.Ms(total))
		}
		c.remove(ctx, sb.GetId())
		env.Progressf("boot %d/%d (%s): usable after %.0f ms", i+1, warm+n, start, suiteapi.Ms(total))
	}
	names := make([]key, 0, len(phases))
	for k := range phases {
		names = append(names, k)
	}
	// Cold boots first, each start's milestones in the order reached.
	sort.Slice(names, func(i, j int) bool {
		if names[i].start != names[j].start {
			return names[i].start == startCold
		}
		return order[names[i]]/float64(phases[names[i]].Len()) < order[names[j]]/float64(phases[names[j]].Len())
	})
	var rows []result.Row
	for _, k := range names {
		rows = append(rows, phases[k].Row())
	}
	var ur result.Row
	for _, start := range []string{startCold, startWarmSlot} {
		if usable[start] == nil {
			continue
		}
		r := usable[start].Row()
		r.Metric = "boot.milestone"
		rows = append(rows, r)
		if start == startCold {
			ur = r
		}
	}
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
	err = suiteapi.Measure(ctx, floor, 1, n, func(bool) (float64, error) {
		i++
		id := fmt.Sprintf("benchd-floor-%d-%d", time.Now().UnixNano(), i)
		_, d, err := runTimed(ctx, nil, "ctr", "-a", containerdSocket, "-n", containerdNS, "run", "--rm", image, id, "/bin/true")
		return suiteapi.Ms(d), err
	})
	if err != nil {
		return nil, err
	}
	fr := floor.Row()
	rows = append(rows, fr)
	// The floor is a cold start of the runtime: against the cold boots.
	if fr.P50 != nil && ur.P50 != nil && *fr.P50 > 0 {
		rows = append(rows, result.Single("boot.usable_over_floor", "x", nil, *ur.P50 / *fr.P50))
		rows[len(rows)-1].Better = result.BetterLower
	}
	return rows, nil
}

// Boot starts (the label start of the boot rows).
const (
	startCold     = "cold"
	startWarmSlot = "warm_slot"
)

// bootStart says how controld started a boot: from a warm slot (created
// ahead of the request, so its create milestone is at 0) or cold.
func bootStart(phases []*controldv1.BootPhase) string {
	for _, p := range phases {
		if p.GetName() == "create" {
			if p.GetAt().AsDuration() == 0 {
				return startWarmSlot
			}
			return startCold
		}
	}
	return startCold
}
