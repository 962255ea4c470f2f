//go:build linux

package suites

import (
	"context"
	"errors"
	"flag"
	"sync"
	"time"

	"github.com/forkfleet/forkfleet/benchd/internal/result"
	"github.com/forkfleet/forkfleet/benchd/internal/suiteapi"
)

type fanoutSuite struct {
	ns   intList
	reps int
}

func (*fanoutSuite) Name() string { return "fanout" }
func (*fanoutSuite) Description() string {
	return "boot N in {1,4,8,16} sandboxes concurrently: wall clock, per sandbox, host memory and per-sandbox RSS/PSS"
}
func (f *fanoutSuite) Flags(fs *flag.FlagSet) {
	f.ns = intList{1, 4, 8, 16}
	fs.Var(&f.ns, "fanout-ns", "concurrent boot counts")
	fs.IntVar(&f.reps, "fanout-reps", 3, "repetitions per N (--n overrides)")
}
func (f *fanoutSuite) Check(ctx context.Context, env *suiteapi.Env) error {
	return checkControld(ctx, env)
}

func (f *fanoutSuite) Run(ctx context.Context, env *suiteapi.Env) ([]result.Row, error) {
	c, err := dialControld(ctx, env)
	if err != nil {
		return nil, err
	}
	defer c.Close()
	reps := env.Samples(f.reps)
	var rows []result.Row
	pidsFound := true
	for _, n := range f.ns {
		lbl := labels("n", itoa(n))
		wall := result.NewSeries("fanout.wall", "ms", lbl)
		per := result.NewSeries("fanout.per_sandbox", "ms", lbl)
		amort := result.NewSeries("fanout.wall_per_sandbox", "ms", lbl)
		host := result.NewSeries("fanout.host_memory_per_sandbox", "MB", lbl)
		rss := result.NewSeries("fanout.sandbox_rss", "MB", lbl)
		pss := result.NewSeries("fanout.sandbox_pss", "MB", lbl)
		cg := result.NewSeries("fanout.sandbox_cgroup_memory", "MB", lbl)
		for r := 0; r < reps; r++ {
			before := hostUsedMB()
			ids := make([]string, n)
			errs := make([]error, n)
			took := make([]time.Duration, n)
			var wg sync.WaitGroup
			t0 := time.Now()
			for i := 0; i < n; i++ {
				wg.Add(1)
				go func(i int) {
					defer wg.Done()
					s0 := time.Now()
					resp, err := c.create(ctx)
					if err == nil {
						ids[i] = resp.GetSandbox().GetId()
						err = firstScreenshot(ctx, resp.GetEndpoint())
					}
					errs[i], took[i] = err, time.Since(s0)
				}(i)
			}
			wg.Wait()
			w := time.Since(t0)
			// Series are not safe for concurrent use: record after the wait.
			for i, err := range errs {
				switch {
				case err == nil:
					per.Add(suiteapi.Ms(took[i]))
				case errors.Is(err, suiteapi.ErrUnverified):
					per.Unverified()
				default:
					per.Fail()
				}
			}
			ok := 0
			for _, e := range errs {
				if e == nil {
					ok++
				}
			}
			if ok == n {
				wall.Add(suiteapi.Ms(w))
				amort.Add(suiteapi.Ms(w) / float64(n))
				// Let the desktops settle before reading memory.
				time.Sleep(2 * time.Second)
				host.Add((hostUsedMB() - before) / float64(n))
				for _, id := range ids {
					pids := sandboxPids(id)
					if len(pids) == 0 {
						pidsFound = false
						if mb, ok := cgroupMemoryMB(id); ok {
							cg.Add(mb)
						}
						continue
					}
					r, p, okp := memoryOf(pids)
					rss.Add(r)
					if okp {
						pss.Add(p)
					}
				}
			} else {
				wall.Fail()
				amort.Fail()
			}
			for _, id := range ids {
				c.remove(ctx, id)
			}
			env.Progressf("fanout: N=%d rep %d: %d/%d usable in %.0f ms", n, r+1, ok, n, suiteapi.Ms(w))
		}
		rows = append(rows, wall.Row(), per.Row(), amort.Row(), host.Row())
		if rss.Len() > 0 {
			rows = append(rows, rss.Row())
		}
		if pss.Len() > 0 {
			rows = append(rows, pss.Row())
		}
		if cg.Len() > 0 {
			rows = append(rows, cg.Row())
		}
	}
	if !pidsFound {
		env.Notef("some sandbox processes were not found in /proc (FORKFLEET_SANDBOX_ID in guestd's environment): per-sandbox RSS/PSS rows cover only those found, the others fall back to their memory cgroup usage (fanout.sandbox_cgroup_memory); host memory per sandbox covers all")
	}
	return rows, nil
}
