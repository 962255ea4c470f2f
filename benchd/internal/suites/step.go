//go:build linux

package suites

import (
	"context"
	"flag"
	"fmt"
	"time"

	"go.opentelemetry.io/otel/attribute"
	oteltrace "go.opentelemetry.io/otel/trace"

	"github.com/forkfleet/forkfleet/api/aci"
	aciv1 "github.com/forkfleet/forkfleet/api/gen/forkfleet/aci/v1"
	"github.com/forkfleet/forkfleet/benchd/internal/delayproxy"
	"github.com/forkfleet/forkfleet/benchd/internal/harness"
	"github.com/forkfleet/forkfleet/benchd/internal/result"
	"github.com/forkfleet/forkfleet/benchd/internal/suiteapi"
)

// stepSuite measures a k-action agent step plus a JPEG q80 observation
// through an emulated WAN: sequential (k+1 awaited round trips), pipelined
// (k+1 requests in flight at once) and fused (one StepRequest).
type stepSuite struct {
	rtts intList
	ks   intList
	n    int
}

func (*stepSuite) Name() string { return "step" }
func (*stepSuite) Description() string {
	return "k in {3,5,8} actions + JPEG q80 observe, sequential vs pipelined vs fused step, through a delay proxy at RTT 0/50/150/300 ms"
}

func (s *stepSuite) Flags(fs *flag.FlagSet) {
	s.rtts = intList{0, 50, 150, 300}
	s.ks = intList{3, 5, 8}
	fs.Var(&s.rtts, "step-rtts", "added round-trip times in ms")
	fs.Var(&s.ks, "step-ks", "actions per step")
	fs.IntVar(&s.n, "step-n", 30, "steps per cell (--n overrides)")
}

func (s *stepSuite) Check(ctx context.Context, env *suiteapi.Env) error { return checkHostGuest(env) }

var stepModes = []string{"sequential", "pipelined", "fused"}

func (s *stepSuite) Run(ctx context.Context, env *suiteapi.Env) ([]result.Row, error) {
	hg, err := startHostGuest(ctx, env)
	if err != nil {
		return nil, err
	}
	defer hg.Stop()
	if err := hg.Desktop.SetScene(ctx, harness.SceneSparse, env.WorkDir); err != nil {
		return nil, err
	}
	n, warm := env.Samples(s.n), env.Warmups(3)
	observe := aci.JPEG(80)
	var rows []result.Row
	for _, rttMs := range s.rtts {
		rtt := time.Duration(rttMs) * time.Millisecond
		p, err := delayproxy.New(hg.Guestd.Addr, rtt)
		if err != nil {
			return nil, err
		}
		sess, err := aci.Dial(ctx, "ws://"+p.Addr()+aci.DefaultUnixPath, "", aci.WithClientName("benchd-step"))
		if err != nil {
			p.Close()
			return nil, fmt.Errorf("dial through proxy: %w", err)
		}
		// Validate the emulation before any step timing: a ping must take
		// the added RTT plus loopback.
		ping := result.NewSeries("step.proxy_ping", "ms", labels("rtt_ms", itoa(rttMs)))
		if err := suiteapi.Measure(ctx, ping, 2, 20, func(bool) (float64, error) {
			t0 := time.Now()
			_, err := sess.Ping(ctx, nil)
			return suiteapi.Ms(time.Since(t0)), err
		}); err != nil {
			sess.Close()
			p.Close()
			return nil, err
		}
		pr := ping.Row()
		rows = append(rows, pr)
		if pr.P50 == nil || *pr.P50 < float64(rttMs) || *pr.P50 > float64(rttMs)+25 {
			sess.Close()
			p.Close()
			return nil, fmt.Errorf("delay proxy invalid: ping p50 %v ms through a %d ms proxy", pr.P50, rttMs)
		}
		env.Progressf("step: RTT %d ms validated (ping p50 %.1f ms)", rttMs, *pr.P50)
		for _, k := range s.ks {
			p50 := map[string]float64{}
			for _, mode := range stepModes {
				lbl := labels("rtt_ms", itoa(rttMs), "k", itoa(k), "mode", mode, "series", fmt.Sprintf("%s k=%d", mode, k))
				lat := result.NewSeries("step.latency", "ms", lbl)
				i := 0
				err := suiteapi.Measure(ctx, lat, warm, n, func(bool) (float64, error) {
					i++
					sctx, sp := env.Tracer.Start(ctx, "step", oteltrace.WithAttributes(attribute.String("mode", mode),
						attribute.Int("k", k), attribute.Int("rtt_ms", rttMs)))
					defer sp.End()
					t0 := time.Now()
					if err := runStep(sctx, sess, mode, stepActions(k, i), observe); err != nil {
						sp.RecordError(err)
						return 0, err
					}
					return suiteapi.Ms(time.Since(t0)), nil
				})
				if err != nil {
					sess.Close()
					p.Close()
					return nil, err
				}
				r := lat.Row()
				rows = append(rows, r)
				if r.P50 != nil {
					p50[mode] = *r.P50
					rows = append(rows, result.Single("step.rate", "steps/s", lbl, 1000 / *r.P50))
				}
			}
			for _, mode := range []string{"pipelined", "fused"} {
				if p50["sequential"] > 0 && p50[mode] > 0 {
					rows = append(rows, result.Single("step.speedup_vs_sequential", "x",
						labels("rtt_ms", itoa(rttMs), "k", itoa(k), "mode", mode), p50["sequential"]/p50[mode]))
				}
			}
			env.Progressf("step: RTT %d k=%d: sequential %.1f / pipelined %.1f / fused %.1f ms", rttMs, k, p50["sequential"], p50["pipelined"], p50["fused"])
		}
		sess.Close()
		p.Close()
	}
	return rows, nil
}

// stepActions alternates moves and clicks on the root background of the
// sparse scene, shifting each step so no two steps are identical.
func stepActions(k, step int) []*aciv1.Action {
	out := make([]*aciv1.Action, k)
	for j := range out {
		x, y := 900+(step*7+j*13)%300, 500+(step*3+j*11)%250
		if j%2 == 0 {
			out[j] = aci.Move(x, y)
		} else {
			out[j] = aci.Click(x, y)
		}
	}
	return out
}

func runStep(ctx context.Context, s *aci.Session, mode string, actions []*aciv1.Action, observe *aciv1.ScreenshotRequest) error {
	switch mode {
	case "sequential":
		for _, a := range actions {
			r, err := s.Step(ctx, []*aciv1.Action{a}, nil)
			if err != nil {
				return err
			}
			if err := stepErr(r, 1); err != nil {
				return err
			}
		}
		r, err := s.Screenshot(ctx, observe)
		if err != nil {
			return err
		}
		if !validImage("jpeg", r) {
			return suiteapi.ErrUnverified
		}
		return nil
	case "pipelined":
		calls := make([]*aci.Call, 0, len(actions)+1)
		for _, a := range actions {
			c, err := s.Start(ctx, &aciv1.ClientMessage{Request: &aciv1.ClientMessage_Step{Step: &aciv1.StepRequest{Actions: []*aciv1.Action{a}}}})
			if err != nil {
				return err
			}
			calls = append(calls, c)
		}
		c, err := s.Start(ctx, &aciv1.ClientMessage{Request: &aciv1.ClientMessage_Screenshot{Screenshot: observe}})
		if err != nil {
			return err
		}
		calls = append(calls, c)
		var firstErr error
		for i, c := range calls {
			m, err := c.Wait(ctx)
			if err == nil {
				if i < len(actions) {
					err = stepErr(m.GetStep(), 1)
				} else if !validImage("jpeg", m.GetScreenshot()) {
					err = suiteapi.ErrUnverified
				}
			}
			if firstErr == nil {
				firstErr = err
			}
		}
		return firstErr
	case "fused":
		r, err := s.Step(ctx, actions, observe)
		if err != nil {
			return err
		}
		if err := stepErr(r, len(actions)); err != nil {
			return err
		}
		if !validImage("jpeg", r.GetObservation()) {
			return suiteapi.ErrUnverified
		}
		return nil
	}
	return fmt.Errorf("unknown step mode %q", mode)
}
