//go:build linux

package suites

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"sync"
	"time"

	"go.opentelemetry.io/otel/attribute"
	oteltrace "go.opentelemetry.io/otel/trace"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/forkfleet/forkfleet/api/aci"
	aciv1 "github.com/forkfleet/forkfleet/api/gen/forkfleet/aci/v1"
	controldv1 "github.com/forkfleet/forkfleet/api/gen/forkfleet/controld/v1"
	"github.com/forkfleet/forkfleet/benchd/internal/result"
	"github.com/forkfleet/forkfleet/benchd/internal/suite"
)

// checkpointSuite measures live checkpoints of a running sandbox.
type checkpointSuite struct {
	n      int
	peer   bool
	ballMB int
}

func (*checkpointSuite) Name() string { return "checkpoint" }
func (*checkpointSuite) Description() string {
	return "live memory-tier checkpoint of a bare desktop and of a 300 MB-RAM + 100 MB-disk sandbox: total, frozen, dump, layer, sizes; podman checkpoint/restore peer"
}
func (s *checkpointSuite) Flags(fs *flag.FlagSet) {
	fs.IntVar(&s.n, "checkpoint-n", 10, "checkpoints per shape (--n overrides)")
	fs.BoolVar(&s.peer, "checkpoint-podman", true, "also measure podman checkpoint --leave-running / restore of the same image")
	fs.IntVar(&s.ballMB, "checkpoint-ram-mb", 300, "RAM held by the reference shape's ballast process")
}
func (s *checkpointSuite) Check(ctx context.Context, env *suite.Env) error {
	return checkControld(ctx, env)
}

func (s *checkpointSuite) Run(ctx context.Context, env *suite.Env) ([]result.Row, error) {
	c, err := dialControld(ctx, env)
	if err != nil {
		return nil, err
	}
	defer c.Close()
	n, warm := env.Samples(s.n), env.Warmups(1)
	resp, err := c.create(ctx)
	if err != nil {
		return nil, fmt.Errorf("create source sandbox: %w", err)
	}
	defer c.remove(ctx, resp.GetSandbox().GetId())
	image := resp.GetSandbox().GetImage()
	rows, err := s.shape(ctx, env, c, resp.GetSandbox().GetId(), "bare-desktop", n, warm)
	if err != nil {
		return nil, err
	}
	// The reference shape: RAM a process holds and touches, plus disk.
	ref, err := c.create(ctx)
	if err != nil {
		return nil, fmt.Errorf("create reference sandbox: %w", err)
	}
	defer c.remove(ctx, ref.GetSandbox().GetId())
	if err := s.ballast(ctx, ref.GetEndpoint()); err != nil {
		env.Notef("reference shape (%d MB RAM + 100 MB disk) skipped: %v", s.ballMB, err)
	} else {
		r, err := s.shape(ctx, env, c, ref.GetSandbox().GetId(), fmt.Sprintf("ram-%dMB+disk-100MB", s.ballMB), n, warm)
		if err != nil {
			return nil, err
		}
		rows = append(rows, r...)
	}
	if s.peer {
		r, err := podmanCheckpointPeer(ctx, env, image, n)
		if err != nil {
			env.Notef("podman peer not measured: %v", err)
		} else {
			rows = append(rows, r...)
			rows = append(rows, checkpointRatios(rows)...)
		}
	}
	return rows, nil
}

// checkpointRatios compares our bare-desktop checkpoint with podman's on
// the same image in the same run.
func checkpointRatios(rows []result.Row) []result.Row {
	var ours, peer *float64
	for _, r := range rows {
		switch {
		case r.Metric == "checkpoint.client_total" && r.Labels["shape"] == "bare-desktop":
			ours = r.P50
		case r.Metric == "peer.podman_checkpoint_leave_running":
			peer = r.P50
		}
	}
	if ours == nil || peer == nil || *ours <= 0 {
		return nil
	}
	return []result.Row{result.Single("checkpoint.speedup_vs_podman", "x", labels("shape", "bare-desktop"), *peer / *ours)}
}

// ballast makes the sandbox hold ballMB of random bytes in one process's
// memory and 100 MB on disk, using only coreutils of the minbase image: tail
// -c buffers the last N bytes of a pipe that never reaches EOF.
func (s *checkpointSuite) ballast(ctx context.Context, ep *controldv1.Endpoint) error {
	sess, err := dialEndpoint(ctx, ep)
	if err != nil {
		return err
	}
	defer sess.Close()
	r, err := sess.Exec(ctx, &aciv1.ExecRequest{Argv: []string{"dd", "if=/dev/urandom", "of=/root/ballast", "bs=1M", "count=100"}, TimeoutMs: 120000})
	if err != nil {
		return fmt.Errorf("disk ballast: %w", err)
	}
	if r.GetExitCode() != 0 {
		return fmt.Errorf("disk ballast: dd exit %d: %s", r.GetExitCode(), r.GetStderr())
	}
	size := fmt.Sprintf("%dM", s.ballMB)
	if _, err := sess.Launch(ctx, &aciv1.LaunchRequest{Argv: []string{"sh", "-c",
		"{ head -c " + size + " /dev/urandom; exec sleep 2147483647; } | exec tail -c " + size}}); err != nil {
		return fmt.Errorf("RAM ballast: %w", err)
	}
	// Wait until tail holds the whole ballast.
	deadline := time.Now().Add(2 * time.Minute)
	for time.Now().Before(deadline) {
		r, err := sess.Exec(ctx, &aciv1.ExecRequest{Argv: []string{"sh", "-c",
			"for p in /proc/[0-9]*; do if [ \"$(cat $p/comm 2>/dev/null)\" = tail ]; then grep VmRSS $p/status; fi; done"}})
		if err == nil {
			var kb int
			if _, serr := fmt.Sscanf(string(r.GetStdout()), "VmRSS: %d kB", &kb); serr == nil && kb >= s.ballMB*1024*95/100 {
				return nil
			}
		}
		time.Sleep(time.Second)
	}
	return fmt.Errorf("RAM ballast did not reach %d MB within 2 minutes", s.ballMB)
}

func (s *checkpointSuite) shape(ctx context.Context, env *suite.Env, c *controld, sandboxID, shape string, n, warm int) ([]result.Row, error) {
	lbl := labels("shape", shape, "tier", "memory")
	client := result.NewSeries("checkpoint.client_total", "ms", lbl)
	total := result.NewSeries("checkpoint.total", "ms", lbl)
	frozen := result.NewSeries("checkpoint.frozen", "ms", lbl)
	dump := result.NewSeries("checkpoint.dump", "ms", lbl)
	layer := result.NewSeries("checkpoint.layer", "ms", lbl)
	mem := result.NewSeries("checkpoint.memory_size", "MB", lbl)
	disk := result.NewSeries("checkpoint.layer_size", "MB", lbl)
	for i := 0; i < warm+n; i++ {
		cctx, sp := env.Tracer.Start(ctx, "checkpoint", oteltrace.WithAttributes(attribute.String("shape", shape)))
		t0 := time.Now()
		r, err := c.ck.CreateCheckpoint(cctx, &controldv1.CreateCheckpointRequest{SandboxId: sandboxID,
			Tier: controldv1.CheckpointTier_CHECKPOINT_TIER_MEMORY, Labels: map[string]string{benchLabel: "1"}})
		d := time.Since(t0)
		sp.End()
		if i < warm {
			client.Warmup()
			if err == nil {
				c.removeCheckpoint(ctx, r.GetCheckpoint().GetId())
			}
			continue
		}
		if err != nil {
			client.Fail()
			env.Progressf("checkpoint %s: %v", shape, err)
			continue
		}
		ck := r.GetCheckpoint()
		client.Add(suite.Ms(d))
		t := ck.GetTiming()
		total.Add(dur(t.GetTotal()))
		frozen.Add(dur(t.GetFrozen()))
		dump.Add(dur(t.GetDump()))
		layer.Add(dur(t.GetLayer()))
		mem.Add(float64(ck.GetMemoryBytes()) / 1e6)
		disk.Add(float64(ck.GetLayerBytes()) / 1e6)
		c.removeCheckpoint(ctx, ck.GetId())
		env.Progressf("checkpoint %s %d/%d: %.0f ms (frozen %.0f)", shape, i+1-warm, n, suite.Ms(d), dur(t.GetFrozen()))
	}
	// The source must still be running: the checkpoint is live.
	g, err := c.sb.GetSandbox(ctx, &controldv1.GetSandboxRequest{Id: sandboxID})
	if err != nil || g.GetSandbox().GetState() != controldv1.SandboxState_SANDBOX_STATE_READY {
		return nil, fmt.Errorf("source sandbox not running after checkpoints: %v %v", g.GetSandbox().GetState(), err)
	}
	return []result.Row{client.Row(), total.Row(), frozen.Row(), dump.Row(), layer.Row(), mem.Row(), disk.Row()}, nil
}

// golden boots a sandbox and checkpoints it at tier; the caller deletes both.
func golden(ctx context.Context, c *controld, tier controldv1.CheckpointTier) (sandboxID string, ck *controldv1.Checkpoint, err error) {
	resp, err := c.create(ctx)
	if err != nil {
		return "", nil, fmt.Errorf("create golden sandbox: %w", err)
	}
	r, err := c.ck.CreateCheckpoint(ctx, &controldv1.CreateCheckpointRequest{SandboxId: resp.GetSandbox().GetId(), Tier: tier,
		Labels: map[string]string{benchLabel: "1"}})
	if err != nil {
		return resp.GetSandbox().GetId(), nil, fmt.Errorf("checkpoint golden: %w", err)
	}
	return resp.GetSandbox().GetId(), r.GetCheckpoint(), nil
}

// forkSuite measures fork to usable, verified replicas.
type forkSuite struct {
	ns   intList
	reps int
}

func (*forkSuite) Name() string { return "fork" }
func (*forkSuite) Description() string {
	return "fork N in {1,2,4,8,16} verified replicas from one checkpoint, memory and disk tiers: wall, per replica, memory per replica"
}
func (f *forkSuite) Flags(fs *flag.FlagSet) {
	f.ns = intList{1, 2, 4, 8, 16}
	fs.Var(&f.ns, "fork-ns", "replica counts")
	fs.IntVar(&f.reps, "fork-reps", 3, "repetitions per N (--n overrides)")
}
func (f *forkSuite) Check(ctx context.Context, env *suite.Env) error { return checkControld(ctx, env) }

func (f *forkSuite) Run(ctx context.Context, env *suite.Env) ([]result.Row, error) {
	c, err := dialControld(ctx, env)
	if err != nil {
		return nil, err
	}
	defer c.Close()
	reps := env.Samples(f.reps)
	var rows []result.Row
	for _, tier := range []struct {
		name string
		t    controldv1.CheckpointTier
	}{{"memory", controldv1.CheckpointTier_CHECKPOINT_TIER_MEMORY}, {"disk", controldv1.CheckpointTier_CHECKPOINT_TIER_DISK}} {
		src, ck, err := golden(ctx, c, tier.t)
		c.remove(ctx, src)
		if err != nil {
			env.Notef("fork tier %s not measured: %v", tier.name, err)
			continue
		}
		for _, n := range f.ns {
			lbl := labels("tier", tier.name, "n", itoa(n))
			wall := result.NewSeries("fork.fanout.wall", "ms", lbl)
			per := result.NewSeries("fork.replica_usable", "ms", lbl)
			amort := result.NewSeries("fork.wall_per_replica", "ms", lbl)
			pss := result.NewSeries("fork.replica_pss", "MB", lbl)
			rss := result.NewSeries("fork.replica_rss", "MB", lbl)
			for r := 0; r < reps; r++ {
				fctx, sp := env.Tracer.Start(ctx, "fork", oteltrace.WithAttributes(attribute.String("tier", tier.name), attribute.Int("n", n)))
				t0 := time.Now()
				resp, err := c.ck.ForkCheckpoint(fctx, &controldv1.ForkCheckpointRequest{CheckpointId: ck.GetId(), Count: uint32(n),
					Labels: map[string]string{benchLabel: "1"}, Ttl: durationpb.New(benchTTL)})
				w := time.Since(t0)
				sp.End()
				if err != nil {
					wall.Fail()
					for i := 0; i < n; i++ {
						per.Fail()
					}
					env.Progressf("fork %s N=%d: %v", tier.name, n, err)
					continue
				}
				good := 0
				for _, rep := range resp.GetReplicas() {
					switch {
					case rep.GetErrorCode() != 0 || rep.GetSandbox() == nil:
						per.Fail()
					case !verified(rep):
						per.Unverified()
					default:
						good++
						per.Add(dur(rep.GetTook()))
						if r, p, ok := memoryOf(sandboxPids(rep.GetSandbox().GetId())); ok {
							pss.Add(p)
							rss.Add(r)
						}
					}
				}
				// A wall clock counts only when every replica is verified.
				if good == n && len(resp.GetReplicas()) == n {
					wall.Add(suite.Ms(w))
					amort.Add(suite.Ms(w) / float64(n))
				} else {
					wall.Unverified()
				}
				for _, rep := range resp.GetReplicas() {
					c.remove(ctx, rep.GetSandbox().GetId())
				}
				env.Progressf("fork %s N=%d rep %d: %d/%d verified in %.0f ms", tier.name, n, r+1, good, n, suite.Ms(w))
			}
			rows = append(rows, wall.Row(), per.Row(), amort.Row())
			if pss.Len() > 0 {
				rows = append(rows, pss.Row(), rss.Row())
			}
		}
		c.removeCheckpoint(ctx, ck.GetId())
	}
	if len(rows) == 0 {
		return nil, errors.New("no fork tier could be measured")
	}
	return rows, nil
}

// poolSuite measures claims from a warm pool under bursts larger than it.
type poolSuite struct {
	size   int
	bursts intList
	image  string
}

func (*poolSuite) Name() string { return "pool" }
func (*poolSuite) Description() string {
	return "claim to usable from a warm pool, hits vs misses, and hit rate under bursts up to 2x the pool size"
}
func (p *poolSuite) Flags(fs *flag.FlagSet) {
	p.bursts = intList{2, 4, 8}
	fs.IntVar(&p.size, "pool-size", 4, "warm pool size")
	fs.Var(&p.bursts, "pool-bursts", "concurrent claims per burst")
	fs.StringVar(&p.image, "pool-image", "", "image of the pool (empty: the image controld boots by default)")
}
func (p *poolSuite) Check(ctx context.Context, env *suite.Env) error { return checkControld(ctx, env) }

func (p *poolSuite) Run(ctx context.Context, env *suite.Env) ([]result.Row, error) {
	c, err := dialControld(ctx, env)
	if err != nil {
		return nil, err
	}
	defer c.Close()
	reps := env.Samples(3)
	// The path a claim saves: a cold create to usable, in the same run. It
	// also names the image the pool is built from (controld's default).
	cold := result.NewSeries("pool.claim_usable", "ms", labels("served", "cold-create-no-pool"))
	image := p.image
	for i := 0; i < reps; i++ {
		t0 := time.Now()
		resp, err := c.create(ctx)
		if err == nil {
			err = firstScreenshot(ctx, resp.GetEndpoint())
			if image == "" {
				image = resp.GetSandbox().GetImage()
			}
			c.remove(ctx, resp.GetSandbox().GetId())
		}
		switch {
		case err == nil:
			cold.Add(suite.Ms(time.Since(t0)))
		case errors.Is(err, suite.ErrUnverified):
			cold.Unverified()
		default:
			cold.Fail()
		}
	}
	if image == "" {
		return nil, errors.New("no cold boot succeeded, so the pool image is unknown (pass --pool-image)")
	}
	pr, err := c.pl.CreatePool(ctx, &controldv1.CreatePoolRequest{Name: fmt.Sprintf("benchd-%d", time.Now().UnixNano()),
		Size: uint32(p.size), Source: &controldv1.CreatePoolRequest_Image{Image: image}, Labels: map[string]string{benchLabel: "1"}})
	if err != nil {
		return nil, fmt.Errorf("create pool: %w", err)
	}
	poolID := pr.GetPool().GetId()
	defer func() {
		dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
		defer cancel()
		c.pl.DeletePool(dctx, &controldv1.DeletePoolRequest{Id: poolID})
	}()
	waitFull := func() error {
		deadline := time.Now().Add(3 * time.Minute)
		for {
			g, err := c.pl.GetPool(ctx, &controldv1.GetPoolRequest{Id: poolID})
			if err != nil {
				return err
			}
			if g.GetPool().GetAvailable() >= uint32(p.size) {
				return nil
			}
			if time.Now().After(deadline) {
				return fmt.Errorf("pool refilled to %d of %d in 3 minutes", g.GetPool().GetAvailable(), p.size)
			}
			time.Sleep(200 * time.Millisecond)
		}
	}
	rows := []result.Row{cold.Row()}
	for _, b := range p.bursts {
		hit := result.NewSeries("pool.claim_usable", "ms", labels("burst", itoa(b), "pool_size", itoa(p.size), "served", "hit"))
		miss := result.NewSeries("pool.claim_usable", "ms", labels("burst", itoa(b), "pool_size", itoa(p.size), "served", "miss"))
		rate := result.NewSeries("pool.hit_rate", "percent", labels("burst", itoa(b), "pool_size", itoa(p.size)))
		rate.Better = result.BetterHigher
		for r := 0; r < reps; r++ {
			if err := waitFull(); err != nil {
				return nil, err
			}
			var mu sync.Mutex
			var ids []string
			hits := 0
			var wg sync.WaitGroup
			for i := 0; i < b; i++ {
				wg.Add(1)
				go func() {
					defer wg.Done()
					t0 := time.Now()
					cr, err := c.pl.ClaimPool(ctx, &controldv1.ClaimPoolRequest{PoolId: poolID, Labels: map[string]string{benchLabel: "1"},
						Ttl: durationpb.New(benchTTL)})
					if err == nil {
						err = firstScreenshot(ctx, cr.GetEndpoint())
					}
					d := time.Since(t0)
					mu.Lock()
					defer mu.Unlock()
					if cr != nil {
						ids = append(ids, cr.GetSandbox().GetId())
					}
					s := miss
					if cr.GetHit() {
						s = hit
						hits++
					}
					switch {
					case err == nil:
						s.Add(suite.Ms(d))
					case errors.Is(err, suite.ErrUnverified):
						s.Unverified()
					default:
						s.Fail()
					}
				}()
			}
			wg.Wait()
			rate.Add(float64(hits) / float64(b) * 100)
			for _, id := range ids {
				c.remove(ctx, id)
			}
			env.Progressf("pool: burst %d rep %d: %d hits", b, r+1, hits)
		}
		for _, s := range []*result.Series{hit, miss} {
			if s.Len() > 0 || s.Row().Failed > 0 {
				rows = append(rows, s.Row())
			}
		}
		rows = append(rows, rate.Row())
	}
	return rows, nil
}

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
func (d *dedupSuite) Check(ctx context.Context, env *suite.Env) error { return checkControld(ctx, env) }

func (d *dedupSuite) Run(ctx context.Context, env *suite.Env) ([]result.Row, error) {
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

func (d *dedupSuite) fleet(ctx context.Context, env *suite.Env, n int, eps []*controldv1.Endpoint, rounds int) ([]result.Row, error) {
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
