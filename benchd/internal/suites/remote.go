//go:build linux

package suites

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"slices"
	"strings"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"

	controldv1 "github.com/forkfleet/forkfleet/api/gen/forkfleet/controld/v1"
	"github.com/forkfleet/forkfleet/api/registrytest"
	"github.com/forkfleet/forkfleet/benchd/internal/result"
	"github.com/forkfleet/forkfleet/benchd/internal/suiteapi"
)

// remoteSuite measures checkpoints through an OCI registry: a real
// docker-registry on loopback (registrytest), controld pushing, pulling and
// forking by registry reference. Between steps the suite deletes the local
// image with ctr (synchronous garbage collection), so every pull and every
// first fork fetches the checkpoint's bytes for real.
type remoteSuite struct {
	reps      int
	ns        intList
	ramMB     int
	namespace string
	ctr       string
	settle    time.Duration
	// The fleet of two controlds of the suite's own.
	hostsBin       string
	hostsNamespace string
	hostsNs        intList
}

func (*remoteSuite) Name() string { return "remote" }
func (*remoteSuite) Description() string {
	return "checkpoints through an OCI registry on loopback: bytes pushed vs dumped, push and pull time (bare desktop and the 300 MB shape), fork of a registry reference to verified usable N in {1,8}: first (with the pull) and second (from the cached import) vs a local fork"
}
func (s *remoteSuite) Flags(fs *flag.FlagSet) {
	fs.IntVar(&s.reps, "remote-reps", 3, "repetitions (--n overrides)")
	s.ns = intList{1, 8}
	fs.Var(&s.ns, "remote-ns", "replica counts of the forks of a registry reference")
	fs.IntVar(&s.ramMB, "remote-ram-mb", 300, "RAM of the reference shape pushed and pulled (plus 100 MB on disk; 0: bare desktop only)")
	fs.StringVar(&s.namespace, "remote-namespace", "forkfleet", "controld's containerd namespace (its local images are deleted between steps)")
	fs.StringVar(&s.ctr, "remote-ctr", "", "ctr binary ($FORKFLEET_CTR, else ctr on PATH)")
	fs.DurationVar(&s.settle, "remote-settle", time.Second, "pause before each measured fork (controld refills its precreated fork containers in the background)")
	fs.StringVar(&s.hostsBin, "remote-hosts-controld", "", "controld binary of the two hosts the suite runs (default: the controld beside benchd; forkfleet-image beside it imports their image)")
	fs.StringVar(&s.hostsNamespace, "remote-hosts-namespace", "forkfleet-bench-host", "containerd namespace prefix of those hosts (-a, -b: created, emptied at the end but for the desktop image)")
	s.hostsNs = intList{1, 8}
	fs.Var(&s.hostsNs, "remote-hosts-ns", "replica counts of the forks spread over two hosts (0: no hosts)")
}

func (s *remoteSuite) Check(ctx context.Context, env *suiteapi.Env) error {
	if _, err := os.Stat(registrytest.Bin); err != nil {
		return suiteapi.Skipf("docker-registry not installed (make test-tools): %v", err)
	}
	if _, err := s.ctrBin(); err != nil {
		return suiteapi.Skipf("%v", err)
	}
	return checkControld(ctx, env)
}

func (s *remoteSuite) ctrBin() (string, error) {
	for _, c := range []string{s.ctr, os.Getenv("FORKFLEET_CTR")} {
		if c != "" {
			return c, nil
		}
	}
	p, err := exec.LookPath("ctr")
	if err != nil {
		return "", fmt.Errorf("ctr not found (--remote-ctr or FORKFLEET_CTR from /etc/forkfleet/host.env)")
	}
	return p, nil
}

func (s *remoteSuite) Run(ctx context.Context, env *suiteapi.Env) ([]result.Row, error) {
	c, err := dialControld(ctx, env)
	if err != nil {
		return nil, err
	}
	defer c.Close()
	dir, err := os.MkdirTemp(env.WorkDir, "registry-")
	if err != nil {
		return nil, err
	}
	reg, err := registrytest.Start(ctx, "", dir)
	if err != nil {
		return nil, err
	}
	defer reg.Close()
	ctr, err := s.ctrBin()
	if err != nil {
		return nil, err
	}
	r := &remoteRun{s: s, env: env, c: c, reg: reg.Addr, ctr: ctr}
	reps := env.Samples(s.reps)
	var rows []result.Row
	rows = append(rows, r.shape(ctx, "bare-desktop", 0, reps, true)...)
	if s.ramMB > 0 {
		rows = append(rows, r.shape(ctx, fmt.Sprintf("ram-%dMB+disk-100MB", s.ramMB), s.ramMB, reps, false)...)
	}
	if slices.Max(s.hostsNs) > 0 {
		hrows, err := r.runHosts(ctx, reps)
		if err != nil {
			env.Notef("remote: forks over two hosts not measured: %v", err)
		}
		rows = append(rows, hrows...)
	}
	return rows, nil
}

type remoteRun struct {
	s   *remoteSuite
	env *suiteapi.Env
	c   *controld
	reg string
	ctr string
	seq int
}

// rmImage deletes a local image of namespace ns with its blobs (ctr's
// synchronous delete collects them), so the next pull fetches them.
func (r *remoteRun) rmImage(ctx context.Context, ns, name string) error {
	out, err := exec.CommandContext(ctx, r.ctr, "-a", containerdAddress(), "-n", ns, "images", "rm", "--sync", name).CombinedOutput()
	if err != nil && !strings.Contains(string(out), "not found") {
		return fmt.Errorf("ctr images rm %s: %v: %s", name, err, strings.TrimSpace(string(out)))
	}
	return nil
}

// rmImages deletes every image of namespace ns but the desktop image (kept
// for the next run).
func (r *remoteRun) rmImages(ctx context.Context, ns string) {
	out, err := exec.CommandContext(ctx, r.ctr, "-a", containerdAddress(), "-n", ns, "images", "ls", "-q").Output()
	if err != nil {
		r.env.Notef("remote: list images of %s: %v", ns, err)
		return
	}
	for _, name := range strings.Fields(string(out)) {
		if !strings.HasPrefix(name, "localhost/forkfleet/desktop:") {
			if err := r.rmImage(ctx, ns, name); err != nil {
				r.env.Notef("remote: %v", err)
			}
		}
	}
}

func containerdAddress() string {
	if addr := os.Getenv("FORKFLEET_CONTAINERD_ADDRESS"); addr != "" {
		return addr
	}
	return "/run/forkfleet/containerd/containerd.sock"
}

// shape measures reps checkpoints of one sandbox shape: push, pull and,
// with forks, the forks of the registry reference.
func (r *remoteRun) shape(ctx context.Context, shape string, ramMB, reps int, forks bool) []result.Row {
	lbl := labels("shape", shape)
	dumped := result.NewSeries("remote.dumped_size", "MB", lbl)
	pushedSz := result.NewSeries("remote.pushed_size", "MB", lbl)
	ratio := result.NewSeries("remote.pushed_over_dumped", "%", lbl)
	push := result.NewSeries("remote.push", "ms", lbl)
	pull := result.NewSeries("remote.pull", "ms", lbl)
	pulledSz := result.NewSeries("remote.pulled_size", "MB", lbl)
	forkRows := map[string]*forkSeries{}
	series := func(kind string, n int) *forkSeries {
		k := kind + "/" + itoa(n)
		if forkRows[k] == nil {
			forkRows[k] = &forkSeries{
				wall:   result.NewSeries("remote.fork."+kind+".wall", "ms", labels("shape", shape, "n", itoa(n))),
				phases: newForkBreakdown("memory", itoa(n), "shape", shape, "fork", kind),
			}
		}
		return forkRows[k]
	}
	for rep := 0; rep < reps; rep++ {
		if err := r.rep(ctx, ramMB, forks, dumped, pushedSz, ratio, push, pull, pulledSz, series); err != nil {
			r.env.Notef("remote %s rep %d: %v", shape, rep+1, err)
		}
	}
	rows := []result.Row{dumped.Row(), pushedSz.Row(), ratio.Row(), push.Row(), pull.Row(), pulledSz.Row()}
	for _, n := range r.s.ns {
		if !forks {
			break
		}
		kinds := []string{"first", "cached", "cached_tag", "local"}
		for _, k := range kinds {
			rows = append(rows, series(k, n).wall.Row())
		}
		for _, k := range kinds {
			rows = append(rows, series(k, n).phases.rows()...)
		}
		// The goals as ratios of p50s in this run: a cached fork against a
		// local one, a first fork against a local one plus the pull.
		first, local := series("first", n).wall.Row(), series("local", n).wall.Row()
		pl := pull.Row()
		for _, k := range []string{"cached", "cached_tag"} {
			if c := series(k, n).wall.Row(); c.P50 != nil && local.P50 != nil && *local.P50 > 0 {
				rows = append(rows, result.Single("remote.fork."+k+"_over_local", "x", labels("shape", shape, "n", itoa(n)), *c.P50 / *local.P50))
			}
		}
		if first.P50 != nil && local.P50 != nil && pl.P50 != nil && *local.P50+*pl.P50 > 0 {
			rows = append(rows, result.Single("remote.fork.first_over_local_plus_pull", "x", labels("shape", shape, "n", itoa(n)), *first.P50/(*local.P50+*pl.P50)))
		}
	}
	return rows
}

func (r *remoteRun) rep(ctx context.Context, ramMB int, forks bool, dumped, pushedSz, ratio, push, pull, pulledSz *result.Series,
	series func(string, int) *forkSeries) error {
	src, err := r.c.create(ctx)
	if err != nil {
		return fmt.Errorf("create: %w", err)
	}
	defer r.c.remove(ctx, src.GetSandbox().GetId())
	if ramMB > 0 {
		if err := (&checkpointSuite{ballMB: ramMB}).ballast(ctx, src.GetEndpoint()); err != nil {
			return err
		}
	}
	ck, err := r.c.ck.CreateCheckpoint(ctx, &controldv1.CreateCheckpointRequest{SandboxId: src.GetSandbox().GetId(),
		Tier: controldv1.CheckpointTier_CHECKPOINT_TIER_MEMORY, Labels: map[string]string{benchLabel: "1"}})
	if err != nil {
		return fmt.Errorf("checkpoint: %w", err)
	}
	ckID := ck.GetCheckpoint().GetId()
	defer r.c.removeCheckpoint(ctx, ckID)
	r.c.remove(ctx, src.GetSandbox().GetId())
	d := ck.GetCheckpoint().GetMemoryBytes() + ck.GetCheckpoint().GetLayerBytes()

	// Push (export included: compression is part of what a push costs).
	r.seq++
	repo := fmt.Sprintf("%s/forkfleet/bench-%d-%d", r.reg, time.Now().UnixNano(), r.seq)
	ref := repo + ":v1"
	t0 := time.Now()
	ex, err := r.c.ck.ExportCheckpoint(ctx, &controldv1.ExportCheckpointRequest{Id: ckID, Reference: ref, Push: true})
	if err != nil {
		push.Fail()
		return fmt.Errorf("push: %w", err)
	}
	push.Add(suiteapi.Ms(time.Since(t0)))
	dumped.Add(mb(d))
	pushedSz.Add(mb(ex.GetPushedBytes()))
	ratio.Add(100 * float64(ex.GetPushedBytes()) / float64(d))
	pinned := repo + "@" + ex.GetDigest()

	// Pull into an empty store: the export's image and blobs go first.
	if err := r.rmImage(ctx, r.s.namespace, ref); err != nil {
		return err
	}
	t0 = time.Now()
	im, err := r.c.ck.ImportCheckpoint(ctx, &controldv1.ImportCheckpointRequest{Reference: ref, Pull: true})
	if err != nil {
		pull.Fail()
		return fmt.Errorf("pull: %w", err)
	}
	pull.Add(suiteapi.Ms(time.Since(t0)))
	pulledSz.Add(mb(im.GetPulledBytes()))
	r.c.removeCheckpoint(ctx, im.GetCheckpoint().GetId())
	r.env.Progressf("remote: pushed %.1f of %.1f MB dumped in %.0f ms, pulled in %.0f ms", mb(ex.GetPushedBytes()), mb(d), push.Values()[push.Len()-1], pull.Values()[pull.Len()-1])
	if !forks {
		return r.rmImage(ctx, r.s.namespace, ref)
	}
	for _, n := range r.s.ns {
		// Cold: nothing of the image here, the fork pulls it.
		for _, name := range []string{ref, pinned} {
			if err := r.rmImage(ctx, r.s.namespace, name); err != nil {
				return err
			}
		}
		remoteCk, err := r.fork(ctx, series("first", n), &controldv1.ForkCheckpointRequest{CheckpointReference: ref, Count: uint32(n)})
		if err != nil {
			return err
		}
		// Then the import forked again, by digest (as client.DialHosts'
		// forks name it: no registry request) and by tag (one: which digest
		// the tag names now), and the local checkpoint. They take turns
		// going first (the fork slots controld precreates favour the most
		// recent checkpoint forked).
		round := []func() error{
			func() error {
				_, err := r.fork(ctx, series("cached", n), &controldv1.ForkCheckpointRequest{CheckpointReference: pinned, Count: uint32(n)})
				return err
			},
			func() error {
				_, err := r.fork(ctx, series("cached_tag", n), &controldv1.ForkCheckpointRequest{CheckpointReference: ref, Count: uint32(n)})
				return err
			},
			func() error {
				_, err := r.fork(ctx, series("local", n), &controldv1.ForkCheckpointRequest{CheckpointId: ckID, Count: uint32(n)})
				return err
			},
		}
		k := r.seq % len(round)
		for _, f := range append(round[k:], round[:k]...) {
			if err := f(); err != nil {
				return err
			}
		}
		r.c.removeCheckpoint(ctx, remoteCk)
	}
	return r.rmImage(ctx, r.s.namespace, pinned)
}

// forkSeries is one kind of fork (first, cached, cached_tag or local) at one count: its
// wall clock and, phase by phase, where its replicas spent their time
// (controld's waterfall: a cached fork and a local one may differ only
// before task_start, where a fork of a tag asks the registry for its digest).
type forkSeries struct {
	wall   *result.Series
	phases *forkBreakdown
}

// fork forks and records the wall clock when every replica is verified; it
// returns the checkpoint forked.
func (r *remoteRun) fork(ctx context.Context, fs *forkSeries, req *controldv1.ForkCheckpointRequest) (string, error) {
	s := fs.wall
	req.Labels, req.Ttl = map[string]string{benchLabel: "1"}, durationpb.New(benchTTL)
	sleepCtx(ctx, r.s.settle)
	t0 := time.Now()
	resp, err := r.c.ck.ForkCheckpoint(ctx, req)
	w := time.Since(t0)
	if err != nil {
		s.Fail()
		return "", fmt.Errorf("fork %s%s N=%d: %w", req.GetCheckpointId(), req.GetCheckpointReference(), req.GetCount(), err)
	}
	good := 0
	for _, rep := range resp.GetReplicas() {
		if rep.GetErrorCode() == 0 && rep.GetSandbox() != nil && verified(rep) {
			good++
			fs.phases.add(rep)
		}
		r.c.remove(ctx, rep.GetSandbox().GetId())
	}
	if good == int(req.GetCount()) && len(resp.GetReplicas()) == good {
		s.Add(suiteapi.Ms(w))
	} else {
		s.Unverified()
	}
	r.env.Progressf("remote: fork %s%s N=%d: %d verified in %.0f ms", req.GetCheckpointId(), req.GetCheckpointReference(), req.GetCount(), good, suiteapi.Ms(w))
	return resp.GetCheckpointId(), nil
}

func mb(b int64) float64 { return float64(b) / 1e6 }
