//go:build linux

package suites

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"slices"
	"strconv"
	"strings"
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
	fs.IntVar(&s.ballMB, "checkpoint-ram-mb", 300, "RAM held by the reference shape's ballast process (0: no reference shape)")
}

// Peers: podman's checkpoint and restore of the same container, unless
// --checkpoint-podman=false.
func (s *checkpointSuite) Peers() []string { return podmanPeers(s.peer) }

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
	if s.ballMB <= 0 {
		env.Notef("reference shape skipped (--checkpoint-ram-mb %d)", s.ballMB)
		return append(rows, s.peerRows(ctx, env, image, n, warm, rows)...), nil
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
	return append(rows, s.peerRows(ctx, env, image, n, warm, rows)...), nil
}

// peerRows measures podman (when asked) and our ratios against it.
func (s *checkpointSuite) peerRows(ctx context.Context, env *suite.Env, image string, n, warm int, ours []result.Row) []result.Row {
	if !s.peer {
		return nil
	}
	rows := s.podmanRows(ctx, env, image, n, warm)
	return append(rows, checkpointRatios(slices.Concat(ours, rows))...)
}

// podmanRows runs podman's checkpoint --leave-running and restore --import
// of the same image as baseline rows, and our bare-desktop checkpoint as
// ratios against them. A peer that cannot run is a note, not a failure.
func (s *checkpointSuite) podmanRows(ctx context.Context, env *suite.Env, image string, n, warm int) []result.Row {
	peer, err := newPodmanPeer(ctx, env, image, "bare-desktop")
	if err != nil {
		env.Notef("podman peer not measured: %v", err)
		return nil
	}
	defer peer.Close(ctx)
	rows := peer.checkpointRows(ctx, n, warm)
	archive, err := peer.exportCheckpoint(ctx)
	if err != nil {
		env.Notef("podman restore not measured: export: %v", err)
	} else {
		rows = append(rows, peer.restoreRows(ctx, archive, []int{1}, n)...)
		rows = append(rows, peer.restoreRows(ctx, archive, []int{4}, max(3, n/3))...)
	}
	return rows
}

// checkpointRatios compares our bare-desktop checkpoint with podman's on
// the same image in the same run, per podman archive compression (podman
// always writes an archive; ours stays in the memory tier).
func checkpointRatios(rows []result.Row) []result.Row {
	var ours *float64
	for _, r := range rows {
		if r.Metric == "checkpoint.client_total" && r.Labels["shape"] == "bare-desktop" && !r.Baseline {
			ours = r.P50
		}
	}
	if ours == nil || *ours <= 0 {
		return nil
	}
	var out []result.Row
	for _, r := range rows {
		if r.Metric == "peer.podman_checkpoint_leave_running" && r.Baseline && r.P50 != nil {
			out = append(out, result.Single("checkpoint.speedup_vs_podman", "x",
				labels("shape", "bare-desktop", "tier", "memory", "podman_compress", r.Labels["compress"]), *r.P50 / *ours))
		}
	}
	return out
}

// ballast makes the sandbox hold ballMB of random bytes in one process's
// memory and 100 MB on disk (its writable layer: /tmp, which the agent user
// may write), using only coreutils of the minbase image: tail -c buffers the
// last N bytes of a pipe that never reaches EOF.
func (s *checkpointSuite) ballast(ctx context.Context, ep *controldv1.Endpoint) error {
	sess, err := dialEndpoint(ctx, ep)
	if err != nil {
		return err
	}
	defer sess.Close()
	r, err := sess.Exec(ctx, &aciv1.ExecRequest{Argv: []string{"dd", "if=/dev/urandom", "of=/tmp/ballast", "bs=1M", "count=100"}, TimeoutMs: 120000})
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
	ns      intList
	reps    int
	settle  time.Duration
	ksmWait time.Duration
	peer    bool
	// The reference shape (issue #18): a sandbox holding ramMB in one
	// process plus 100 MB on disk, forked eagerly shapeNs ways.
	ramMB   int
	shapeNs intList
}

func (*forkSuite) Name() string { return "fork" }
func (*forkSuite) Description() string {
	return "fork N in {1,2,4,8,16} verified replicas from one checkpoint, memory and disk tiers, and the reference shape (300 MB RAM + 100 MB disk) N in {1,4,8}: wall, per replica, memory per replica"
}
func (f *forkSuite) Flags(fs *flag.FlagSet) {
	f.ns = intList{1, 2, 4, 8, 16}
	fs.Var(&f.ns, "fork-ns", "replica counts")
	fs.IntVar(&f.reps, "fork-reps", 3, "repetitions per N (--n overrides)")
	fs.DurationVar(&f.settle, "fork-settle", time.Second, "wait after a fork before reading replica memory")
	fs.DurationVar(&f.ksmWait, "fork-ksm-wait", 15*time.Second, "on the last repetition per N, read replica memory again this long after the fork (KSM merges over time; 0 disables)")
	fs.BoolVar(&f.peer, "fork-podman", true, "also measure podman restore --import of the same image, N=1 and N=4, as the fork's peer")
	f.shapeNs = intList{1, 4, 8}
	fs.IntVar(&f.ramMB, "fork-ram-mb", 300, "RAM held by the reference shape's ballast process, forked --fork-shape-ns ways (memory tier; 0: no reference shape)")
	fs.Var(&f.shapeNs, "fork-shape-ns", "replica counts of the reference shape")
}

// Peers: podman's restore of the same container, unless --fork-podman=false.
func (f *forkSuite) Peers() []string { return podmanPeers(f.peer) }

func (f *forkSuite) Check(ctx context.Context, env *suite.Env) error { return checkControld(ctx, env) }

func (f *forkSuite) Run(ctx context.Context, env *suite.Env) ([]result.Row, error) {
	c, err := dialControld(ctx, env)
	if err != nil {
		return nil, err
	}
	defer c.Close()
	reps := env.Samples(f.reps)
	var rows []result.Row
	image := ""
	for _, tier := range []struct {
		name string
		t    controldv1.CheckpointTier
	}{{"memory", controldv1.CheckpointTier_CHECKPOINT_TIER_MEMORY}, {"disk", controldv1.CheckpointTier_CHECKPOINT_TIER_DISK}} {
		src, ck, err := golden(ctx, c, tier.t)
		if image == "" && src != "" {
			if g, gerr := c.sb.GetSandbox(ctx, &controldv1.GetSandboxRequest{Id: src}); gerr == nil {
				image = g.GetSandbox().GetImage()
			}
		}
		c.remove(ctx, src)
		if err != nil {
			env.Notef("fork tier %s not measured: %v", tier.name, err)
			continue
		}
		for _, n := range f.ns {
			rows = append(rows, f.forkN(ctx, env, c, ck.GetId(), tier.name, n, reps)...)
		}
		c.removeCheckpoint(ctx, ck.GetId())
	}
	if len(rows) == 0 {
		return nil, errors.New("no fork tier could be measured")
	}
	if f.ramMB > 0 {
		rows = append(rows, f.referenceShape(ctx, env, c, reps)...)
	}
	if f.peer {
		rows = append(rows, f.podmanRows(ctx, env, image, reps)...)
		rows = append(rows, forkRatios(rows)...)
	}
	return rows, nil
}

// referenceShape forks the reference shape (ramMB of RAM one process holds
// and touches, 100 MB written on disk) from a memory-tier checkpoint: the
// figure that grows with the sandbox's memory under eager restore.
func (f *forkSuite) referenceShape(ctx context.Context, env *suite.Env, c *controld, reps int) []result.Row {
	shape := fmt.Sprintf("ram-%dMB+disk-100MB", f.ramMB)
	ref, err := c.create(ctx)
	if err != nil {
		env.Notef("reference shape not forked: create: %v", err)
		return nil
	}
	defer c.remove(ctx, ref.GetSandbox().GetId())
	if err := (&checkpointSuite{ballMB: f.ramMB}).ballast(ctx, ref.GetEndpoint()); err != nil {
		env.Notef("reference shape not forked: %v", err)
		return nil
	}
	r, err := c.ck.CreateCheckpoint(ctx, &controldv1.CreateCheckpointRequest{SandboxId: ref.GetSandbox().GetId(),
		Labels: map[string]string{benchLabel: "1"}})
	if err != nil {
		env.Notef("reference shape not forked: checkpoint: %v", err)
		return nil
	}
	defer c.removeCheckpoint(ctx, r.GetCheckpoint().GetId())
	var rows []result.Row
	for _, n := range f.shapeNs {
		rows = append(rows, f.forkN(ctx, env, c, r.GetCheckpoint().GetId(), "memory", n, reps, "shape", shape)...)
	}
	return rows
}

// forkN forks n replicas of checkpoint ckID reps times: wall clock, per
// replica, the restore breakdown, and memory per replica (after settle, and
// on the last repetition after ksmWait). extra are labels every row carries.
func (f *forkSuite) forkN(ctx context.Context, env *suite.Env, c *controld, ckID, tier string, n, reps int, extra ...string) []result.Row {
	lbl := labels(append([]string{"tier", tier, "n", itoa(n)}, extra...)...)
	wall := result.NewSeries("fork.fanout.wall", "ms", lbl)
	per := result.NewSeries("fork.replica_usable", "ms", lbl)
	amort := result.NewSeries("fork.wall_per_replica", "ms", lbl)
	pss := result.NewSeries("fork.replica_pss", "MB", lbl)
	rss := result.NewSeries("fork.replica_rss", "MB", lbl)
	klbl := labels(append([]string{"tier", tier, "n", itoa(n), "after_s", strconv.Itoa(int(f.ksmWait.Seconds()))}, extra...)...)
	pssKSM := result.NewSeries("fork.replica_pss_after_ksm", "MB", klbl)
	rssKSM := result.NewSeries("fork.replica_rss_after_ksm", "MB", klbl)
	breakdown := newForkBreakdown(tier, itoa(n), extra...)
	for r := 0; r < reps; r++ {
		fctx, sp := env.Tracer.Start(ctx, "fork", oteltrace.WithAttributes(attribute.String("tier", tier), attribute.Int("n", n)))
		t0 := time.Now()
		resp, err := c.ck.ForkCheckpoint(fctx, &controldv1.ForkCheckpointRequest{CheckpointId: ckID, Count: uint32(n),
			Labels: map[string]string{benchLabel: "1"}, Ttl: durationpb.New(benchTTL)})
		w := time.Since(t0)
		sp.End()
		if err != nil {
			wall.Fail()
			for i := 0; i < n; i++ {
				per.Fail()
			}
			env.Progressf("fork %s N=%d: %v", tier, n, err)
			continue
		}
		good := 0
		var ok []string
		for _, rep := range resp.GetReplicas() {
			switch {
			case rep.GetErrorCode() != 0 || rep.GetSandbox() == nil:
				per.Fail()
			case !verified(rep):
				per.Unverified()
			default:
				good++
				per.Add(dur(rep.GetTook()))
				breakdown.add(rep)
				ok = append(ok, rep.GetSandbox().GetId())
			}
		}
		// A wall clock counts only when every replica is verified.
		if good == n && len(resp.GetReplicas()) == n {
			wall.Add(suite.Ms(w))
			amort.Add(suite.Ms(w) / float64(n))
		} else {
			wall.Unverified()
		}
		// Memory per verified replica once the fleet settled, and on
		// the last repetition again after KSM had time to merge.
		sleepCtx(ctx, f.settle-time.Since(t0))
		missing := replicaMemory(ok, pss, rss)
		if r == reps-1 && f.ksmWait > 0 {
			sleepCtx(ctx, f.ksmWait-time.Since(t0))
			missing += replicaMemory(ok, pssKSM, rssKSM)
		}
		if missing > 0 {
			env.Notef("fork %s N=%d: processes of %d replica(s) not found (cgroup or FORKFLEET_SANDBOX_ID): their memory is not in the PSS/RSS rows", tier, n, missing)
		}
		for _, rep := range resp.GetReplicas() {
			c.remove(ctx, rep.GetSandbox().GetId())
		}
		env.Progressf("fork %s N=%d rep %d: %d/%d verified in %.0f ms", tier, n, r+1, good, n, suite.Ms(w))
	}
	rows := []result.Row{wall.Row(), per.Row(), amort.Row()}
	rows = append(rows, breakdown.rows()...)
	for _, s := range []*result.Series{pss, rss, pssKSM, rssKSM} {
		if s.Len() > 0 {
			rows = append(rows, s.Row())
		}
	}
	return rows
}

// podmanRows measures podman restore --import of the same image, N=1 and
// N=4 at once, and our fork's wall clocks as ratios against it: both count
// a replica once its guestd answers.
func (f *forkSuite) podmanRows(ctx context.Context, env *suite.Env, image string, reps int) []result.Row {
	if image == "" {
		env.Notef("podman peer not measured: no golden sandbox named the image")
		return nil
	}
	peer, err := newPodmanPeer(ctx, env, image, "bare-desktop")
	if err != nil {
		env.Notef("podman peer not measured: %v", err)
		return nil
	}
	defer peer.Close(ctx)
	archive, err := peer.exportCheckpoint(ctx)
	if err != nil {
		env.Notef("podman peer not measured: export: %v", err)
		return nil
	}
	var ns []int
	for _, n := range []int{1, 4} {
		if contains(intStrings(f.ns), itoa(n)) {
			ns = append(ns, n)
		}
	}
	return peer.restoreRows(ctx, archive, ns, max(reps, 5))
}

// forkRatios divides podman's restore wall clock (all N verified) by ours
// for the same N, per tier.
func forkRatios(rows []result.Row) []result.Row {
	// A ratio compares the same shape: the fork suite's bare rows carry
	// no shape label, its podman rows "bare-desktop".
	shapeOf := func(r result.Row) string {
		if s := r.Labels["shape"]; s != "" {
			return s
		}
		return "bare-desktop"
	}
	peer := map[[2]string]float64{}
	for _, r := range rows {
		if r.Baseline && r.Metric == "peer.podman_restore.wall" && r.P50 != nil {
			peer[[2]string{shapeOf(r), r.Labels["n"]}] = *r.P50
		}
	}
	var out []result.Row
	for _, r := range rows {
		if r.Baseline || r.Metric != "fork.fanout.wall" || r.P50 == nil || *r.P50 <= 0 {
			continue
		}
		if p, ok := peer[[2]string{shapeOf(r), r.Labels["n"]}]; ok {
			out = append(out, result.Single("fork.speedup_vs_podman", "x", labels("tier", r.Labels["tier"], "n", r.Labels["n"]), p / *r.P50))
		}
	}
	return out
}

// replicaMemory adds each replica's PSS and RSS (MB, summed over its
// processes) and returns how many replicas' processes were not found.
func replicaMemory(ids []string, pss, rss *result.Series) (missing int) {
	for _, id := range ids {
		r, p, ok := memoryOf(sandboxProcs(id))
		if !ok {
			missing++
			continue
		}
		pss.Add(p)
		rss.Add(r)
	}
	return missing
}

// sleepCtx waits d (nothing when d <= 0) or until ctx ends.
func sleepCtx(ctx context.Context, d time.Duration) {
	if d <= 0 {
		return
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}

func intStrings(l intList) []string {
	out := make([]string, len(l))
	for i, v := range l {
		out[i] = itoa(v)
	}
	return out
}

// poolSuite measures claims from warm pools under bursts larger than them:
// an image pool (booted, running desktops) and a checkpoint pool (replicas
// forked from a memory-tier checkpoint and kept frozen; a claim thaws one).
type poolSuite struct {
	size    int
	bursts  intList
	image   string
	kinds   string
	ksmWait time.Duration
}

// poolKindLabel keys the pool's sandboxes, so its idle replicas can be
// listed apart from everything else benchd runs.
const poolKindLabel = "forkfleet.dev/benchd-pool"

func (*poolSuite) Name() string { return "pool" }
func (*poolSuite) Description() string {
	return "image and frozen-checkpoint pools: claim RPC and claim to first ACI answer (hit vs miss), hit rate under bursts up to 2x the pool, PSS per idle pooled replica"
}
func (p *poolSuite) Flags(fs *flag.FlagSet) {
	p.bursts = intList{2, 4, 8}
	fs.IntVar(&p.size, "pool-size", 4, "warm pool size")
	fs.Var(&p.bursts, "pool-bursts", "concurrent claims per burst")
	fs.StringVar(&p.image, "pool-image", "", "image of the pool (empty: the image controld boots by default)")
	fs.StringVar(&p.kinds, "pool-kinds", "image,checkpoint", "pools to measure: image (booted desktops), checkpoint (frozen replicas of a memory-tier checkpoint)")
	fs.DurationVar(&p.ksmWait, "pool-ksm-wait", 20*time.Second, "read idle replica memory again this long after the pool filled (KSM merges over time; 0 disables)")
}
func (p *poolSuite) Check(ctx context.Context, env *suite.Env) error { return checkControld(ctx, env) }

// claimTimes are the milestones of one claim, from the client's side.
type claimTimes struct {
	rpc, usable, screenshot time.Duration
}

// usableAfter completes a claim or create at t0: the sandbox's endpoint
// answers a first ACI request (ping), then a first screenshot.
func usableAfter(ctx context.Context, t0 time.Time, ep *controldv1.Endpoint, ct *claimTimes) error {
	s, err := dialEndpoint(ctx, ep)
	if err != nil {
		return err
	}
	defer s.Close()
	if _, err := s.Ping(ctx, []byte("benchd")); err != nil {
		return err
	}
	ct.usable = time.Since(t0)
	r, err := s.Screenshot(ctx, aci.PNG())
	if err != nil {
		return err
	}
	if !validImage("png", r) {
		return suite.ErrUnverified
	}
	ct.screenshot = time.Since(t0)
	return nil
}

// claimSeries are one cell's series: served hit or miss.
type claimSeries struct{ rpc, server, usable, screenshot *result.Series }

func newClaimSeries(lbl map[string]string) *claimSeries {
	return &claimSeries{
		rpc:        result.NewSeries("pool.claim_rpc", "ms", lbl),
		server:     result.NewSeries("pool.claim_server", "ms", lbl),
		usable:     result.NewSeries("pool.claim_usable", "ms", lbl),
		screenshot: result.NewSeries("pool.claim_first_screenshot", "ms", lbl),
	}
}

func (cs *claimSeries) record(ct claimTimes, server time.Duration, rpcOK bool, err error) {
	switch {
	case !rpcOK:
		for _, s := range cs.all() {
			s.Fail()
		}
		return
	case err == nil:
		cs.usable.Add(suite.Ms(ct.usable))
		cs.screenshot.Add(suite.Ms(ct.screenshot))
	case errors.Is(err, suite.ErrUnverified):
		cs.usable.Add(suite.Ms(ct.usable))
		cs.screenshot.Unverified()
	case ct.usable > 0:
		cs.usable.Add(suite.Ms(ct.usable))
		cs.screenshot.Fail()
	default:
		cs.usable.Fail()
		cs.screenshot.Fail()
	}
	if ct.usable > 0 {
		// The RPC counts once the sandbox it returned proved usable.
		cs.rpc.Add(suite.Ms(ct.rpc))
		cs.server.Add(suite.Ms(server))
	} else {
		cs.rpc.Unverified()
		cs.server.Unverified()
	}
}

func (cs *claimSeries) all() []*result.Series {
	return []*result.Series{cs.rpc, cs.server, cs.usable, cs.screenshot}
}

func (p *poolSuite) Run(ctx context.Context, env *suite.Env) ([]result.Row, error) {
	c, err := dialControld(ctx, env)
	if err != nil {
		return nil, err
	}
	defer c.Close()
	reps := env.Samples(3)
	// The path a claim saves: a cold create to usable, in the same run. It
	// also names the image the pool is built from (controld's default).
	cold := newClaimSeries(labels("served", "cold-create-no-pool"))
	image := p.image
	for i := 0; i < reps; i++ {
		t0 := time.Now()
		resp, err := c.create(ctx)
		ct := claimTimes{rpc: time.Since(t0)}
		if err == nil {
			err = usableAfter(ctx, t0, resp.GetEndpoint(), &ct)
			if image == "" {
				image = resp.GetSandbox().GetImage()
			}
			c.remove(ctx, resp.GetSandbox().GetId())
		}
		cold.record(ct, ct.rpc, resp != nil, err)
	}
	if image == "" {
		return nil, errors.New("no cold boot succeeded, so the pool image is unknown (pass --pool-image)")
	}
	rows := []result.Row{cold.usable.Row(), cold.screenshot.Row()}
	measured := 0
	for _, kind := range strings.Split(p.kinds, ",") {
		var src controldv1.CreatePoolRequest
		switch strings.TrimSpace(kind) {
		case "image":
			src.Source = &controldv1.CreatePoolRequest_Image{Image: image}
		case "checkpoint":
			gsrc, ck, err := golden(ctx, c, controldv1.CheckpointTier_CHECKPOINT_TIER_MEMORY)
			c.remove(ctx, gsrc)
			if err != nil {
				env.Notef("checkpoint pool not measured: %v", err)
				continue
			}
			defer c.removeCheckpoint(ctx, ck.GetId())
			src.Source = &controldv1.CreatePoolRequest_CheckpointId{CheckpointId: ck.GetId()}
		case "":
			continue
		default:
			return nil, fmt.Errorf("--pool-kinds: unknown pool kind %q (image, checkpoint)", kind)
		}
		r, err := p.measure(ctx, env, c, strings.TrimSpace(kind), &src, reps)
		if err != nil {
			env.Notef("%s pool: %v", kind, err)
			continue
		}
		rows = append(rows, r...)
		measured++
	}
	if measured == 0 {
		return nil, errors.New("no pool could be measured")
	}
	return rows, nil
}

// measure creates one pool from req's source, reads its idle replicas'
// memory, then claims in bursts; the pool is deleted afterwards.
func (p *poolSuite) measure(ctx context.Context, env *suite.Env, c *controld, kind string, req *controldv1.CreatePoolRequest, reps int) ([]result.Row, error) {
	name := fmt.Sprintf("benchd-%s-%d", kind, time.Now().UnixNano())
	req.Name, req.Size = name, uint32(p.size)
	req.Labels = map[string]string{benchLabel: "1", poolKindLabel: name}
	pr, err := c.pl.CreatePool(ctx, req)
	if err != nil {
		return nil, fmt.Errorf("create pool: %w", err)
	}
	poolID := pr.GetPool().GetId()
	defer func() {
		dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 60*time.Second)
		defer cancel()
		if _, err := c.pl.DeletePool(dctx, &controldv1.DeletePoolRequest{Id: poolID}); err != nil {
			env.Progressf("delete pool %s: %v", poolID, err)
		}
	}()
	idle := controldv1.SandboxState_SANDBOX_STATE_READY
	if pr.GetPool().GetFrozen() {
		idle = controldv1.SandboxState_SANDBOX_STATE_SUSPENDED
	}
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
			time.Sleep(100 * time.Millisecond)
		}
	}
	t0 := time.Now()
	if err := waitFull(); err != nil {
		return nil, err
	}
	poolLbl := func(kv ...string) map[string]string {
		return labels(append([]string{"pool", kind, "pool_size", itoa(p.size)}, kv...)...)
	}
	fill := result.Single("pool.fill", "ms", poolLbl(), suite.Ms(time.Since(t0)))
	rows := []result.Row{fill}
	// Memory of the idle replicas: right after warm-up, and for the frozen
	// pool again once KSM had time to merge their identical pages.
	waits := []time.Duration{0}
	if idle == controldv1.SandboxState_SANDBOX_STATE_SUSPENDED && p.ksmWait > 0 {
		waits = append(waits, p.ksmWait)
	}
	filled := time.Now()
	for _, w := range waits {
		sleepCtx(ctx, w-time.Since(filled))
		after := strconv.Itoa(int(time.Since(filled).Round(time.Second).Seconds()))
		pss := result.NewSeries("pool.idle_replica_pss", "MB", poolLbl("after_s", after))
		rss := result.NewSeries("pool.idle_replica_rss", "MB", poolLbl("after_s", after))
		ls, err := c.sb.ListSandboxes(ctx, &controldv1.ListSandboxesRequest{Labels: map[string]string{poolKindLabel: name},
			States: []controldv1.SandboxState{idle}})
		if err != nil {
			return nil, fmt.Errorf("list pool replicas: %w", err)
		}
		var ids []string
		for _, sb := range ls.GetSandboxes() {
			if sb.GetPoolId() == poolID {
				ids = append(ids, sb.GetId())
			}
		}
		if missing := replicaMemory(ids, pss, rss); missing > 0 || len(ids) == 0 {
			env.Notef("%s pool: processes of %d of %d idle replicas not found: PSS/RSS rows cover only those found", kind, missing, len(ids))
		}
		if pss.Len() > 0 {
			rows = append(rows, pss.Row(), rss.Row())
			env.Progressf("%s pool: idle replica PSS p50 %.1f MB after %s s", kind, *pss.Row().P50, after)
		}
	}
	for _, b := range p.bursts {
		hit := newClaimSeries(poolLbl("burst", itoa(b), "served", "hit"))
		miss := newClaimSeries(poolLbl("burst", itoa(b), "served", "miss"))
		rate := result.NewSeries("pool.hit_rate", "percent", poolLbl("burst", itoa(b)))
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
					ct := claimTimes{rpc: time.Since(t0)}
					if err == nil {
						err = usableAfter(ctx, t0, cr.GetEndpoint(), &ct)
					} else {
						env.Progressf("%s pool claim: %v", kind, err)
					}
					mu.Lock()
					defer mu.Unlock()
					s := miss
					if cr != nil {
						ids = append(ids, cr.GetSandbox().GetId())
						if cr.GetHit() {
							s = hit
							hits++
						}
					}
					s.record(ct, cr.GetTook().AsDuration(), cr != nil, err)
				}()
			}
			wg.Wait()
			rate.Add(float64(hits) / float64(b) * 100)
			for _, id := range ids {
				c.remove(ctx, id)
			}
			env.Progressf("%s pool: burst %d rep %d: %d hits", kind, b, r+1, hits)
		}
		for _, cs := range []*claimSeries{hit, miss} {
			for _, s := range cs.all() {
				if row := s.Row(); row.N > 0 || row.Failed > 0 || row.Unverified > 0 {
					rows = append(rows, row)
				}
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
