//go:build linux

package suites

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"sync"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/forkfleet/forkfleet/api/aci"
	aciv1 "github.com/forkfleet/forkfleet/api/gen/forkfleet/aci/v1"
	controldv1 "github.com/forkfleet/forkfleet/api/gen/forkfleet/controld/v1"
	"github.com/forkfleet/forkfleet/benchd/internal/result"
	"github.com/forkfleet/forkfleet/benchd/internal/suiteapi"
)

// dedupSuite measures observation dedup over a forked fleet through one
// shared FrameCache.
type dedupSuite struct {
	ns     intList
	rounds int
}

func (*dedupSuite) Name() string { return "dedup" }
func (*dedupSuite) Description() string {
	return "forked fleet N in {4,8,16}: observe-all rounds with dedup off, sequential, concurrent and diverging with a shared FrameCache: bytes per round, hit rate"
}
func (d *dedupSuite) Flags(fs *flag.FlagSet) {
	d.ns = intList{4, 8, 16}
	fs.Var(&d.ns, "dedup-ns", "fleet sizes")
	fs.IntVar(&d.rounds, "dedup-rounds", 6, "observe-all rounds per mode")
}
func (d *dedupSuite) Check(ctx context.Context, env *suiteapi.Env) error {
	return checkControld(ctx, env)
}

func (d *dedupSuite) Run(ctx context.Context, env *suiteapi.Env) ([]result.Row, error) {
	c, err := dialControld(ctx, env)
	if err != nil {
		return nil, err
	}
	defer c.Close()
	src, ck, err := golden(ctx, c, controldv1.CheckpointTier_CHECKPOINT_TIER_MEMORY)
	c.remove(ctx, src)
	if err != nil {
		return nil, err
	}
	defer c.removeCheckpoint(ctx, ck.GetId())
	rounds := env.Samples(d.rounds)
	var rows []result.Row
	for _, n := range d.ns {
		resp, err := c.ck.ForkCheckpoint(ctx, &controldv1.ForkCheckpointRequest{CheckpointId: ck.GetId(), Count: uint32(n),
			Labels: map[string]string{benchLabel: "1"}, Ttl: durationpb.New(benchTTL)})
		if err != nil {
			return nil, fmt.Errorf("fork %d: %w", n, err)
		}
		var eps []*controldv1.Endpoint
		for _, rep := range resp.GetReplicas() {
			if verified(rep) {
				eps = append(eps, rep.GetEndpoint())
			}
		}
		r, err := d.fleet(ctx, env, n, eps, rounds)
		for _, rep := range resp.GetReplicas() {
			c.remove(ctx, rep.GetSandbox().GetId())
		}
		if err != nil {
			return nil, fmt.Errorf("fleet %d: %w", n, err)
		}
		rows = append(rows, r...)
	}
	return rows, nil
}

func (d *dedupSuite) fleet(ctx context.Context, env *suiteapi.Env, n int, eps []*controldv1.Endpoint, rounds int) ([]result.Row, error) {
	if len(eps) < n {
		env.Notef("fleet N=%d: only %d replicas verified; measuring those", n, len(eps))
	}
	if len(eps) == 0 {
		return nil, errors.New("no verified replica")
	}
	req := aci.JPEG(80)
	var rows []result.Row
	for _, mode := range []string{"off", "sequential", "concurrent", "diverging"} {
		var cache *aci.FrameCache
		wire := &wireCounter{}
		var sessions []*aci.Session
		opts := []aci.DialOption{}
		if mode != "off" {
			cache = aci.NewFrameCache(0)
			opts = append(opts, aci.WithFrameCache(cache))
		}
		for _, ep := range eps {
			s, err := dialEndpointCounted(ctx, ep, wire, opts...)
			if err != nil {
				for _, s := range sessions {
					s.Close()
				}
				return nil, err
			}
			sessions = append(sessions, s)
		}
		lbl := labels("n", itoa(n), "mode", mode)
		bytesRound := result.NewSeries("dedup.bytes_per_round", "bytes", lbl)
		hitRate := result.NewSeries("dedup.hit_rate", "percent", lbl)
		hitRate.Better = result.BetterHigher
		var prev aci.FrameCacheStats
		for r := 0; r < rounds; r++ {
			if mode == "diverging" {
				// Every replica's screen changes every round, differently.
				for i, s := range sessions {
					if _, err := s.Step(ctx, []*aciv1.Action{aci.Type(string(rune('a' + (i+r)%26)))}, nil); err != nil {
						return nil, err
					}
				}
				time.Sleep(100 * time.Millisecond)
			}
			w0 := wire.Total()
			var failed int
			if mode == "sequential" || mode == "off" {
				for _, s := range sessions {
					if _, err := s.Screenshot(ctx, req); err != nil {
						failed++
					}
				}
			} else {
				var wg sync.WaitGroup
				var mu sync.Mutex
				for _, s := range sessions {
					wg.Add(1)
					go func(s *aci.Session) {
						defer wg.Done()
						if _, err := s.Screenshot(ctx, req); err != nil {
							mu.Lock()
							failed++
							mu.Unlock()
						}
					}(s)
				}
				wg.Wait()
			}
			if failed > 0 {
				bytesRound.Fail()
				continue
			}
			bytesRound.Add(float64(wire.Total() - w0))
			if cache != nil {
				st := cache.Stats()
				h, m := st.Hits-prev.Hits, st.Misses-prev.Misses
				if h+m > 0 {
					hitRate.Add(float64(h) / float64(h+m) * 100)
				}
				prev = st
			}
		}
		for _, s := range sessions {
			s.Close()
		}
		rows = append(rows, bytesRound.Row())
		if hitRate.Len() > 0 {
			rows = append(rows, hitRate.Row())
		}
		env.Progressf("dedup: N=%d %s done", n, mode)
	}
	return rows, nil
}
