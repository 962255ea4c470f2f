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
	"time"

	"go.opentelemetry.io/otel/attribute"
	oteltrace "go.opentelemetry.io/otel/trace"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/forkfleet/forkfleet/api/aci"
	controldv1 "github.com/forkfleet/forkfleet/api/gen/forkfleet/controld/v1"
	"github.com/forkfleet/forkfleet/benchd/internal/result"
	"github.com/forkfleet/forkfleet/benchd/internal/suiteapi"
)

// forkSuite measures fork to usable, verified replicas.
type forkSuite struct {
	ns      intList
	image   string // the golden sandbox's; controld's default when empty
	reps    int
	settle  time.Duration
	ksmWait time.Duration
	peer    bool
	// The reference shape (issue #18): a sandbox holding ramMB in one
	// process plus 100 MB on disk, forked eagerly shapeNs ways.
	ramMB   int
	shapeNs intList
	// restores are the restore modes memory-tier forks are measured in,
	// one after the other in the same run (eager, lazy): the reference
	// shape's at every N, the bare desktop's other than eager at lazyNs.
	restores restoreModes
	lazyNs   intList
}

// restoreModes is a list flag of fork restore modes: eager, lazy, auto.
type restoreModes []controldv1.RestoreMode

func (m *restoreModes) String() string {
	var out []string
	for _, v := range *m {
		out = append(out, restoreName(v))
	}
	return strings.Join(out, ",")
}

func (m *restoreModes) Set(s string) error {
	*m = nil
	for _, f := range strings.Split(s, ",") {
		v, ok := controldv1.RestoreMode_value["RESTORE_MODE_"+strings.ToUpper(strings.TrimSpace(f))]
		if !ok || v == 0 {
			return fmt.Errorf("restore mode %q: want eager, lazy or auto", f)
		}
		*m = append(*m, controldv1.RestoreMode(v))
	}
	return nil
}

// restoreName is a mode's row label value: eager, lazy, auto.
func restoreName(m controldv1.RestoreMode) string {
	return strings.ToLower(strings.TrimPrefix(m.String(), "RESTORE_MODE_"))
}

// restoreLabels are the labels of rows forked in mode m: none for eager
// (the rows every earlier run has), "restore" otherwise.
func restoreLabels(m controldv1.RestoreMode, extra ...string) []string {
	if m == controldv1.RestoreMode_RESTORE_MODE_EAGER {
		return extra
	}
	return append(slices.Clone(extra), "restore", restoreName(m))
}

func (*forkSuite) Name() string { return "fork" }
func (*forkSuite) Description() string {
	return "fork N in {1,2,4,8,16} verified replicas from one checkpoint, memory and disk tiers, and the reference shape (300 MB RAM + 100 MB disk) N in {1,4,8}: wall, per replica, memory per replica"
}
func (f *forkSuite) Flags(fs *flag.FlagSet) {
	f.ns = intList{1, 2, 4, 8, 16, 64}
	fs.Var(&f.ns, "fork-ns", "replica counts")
	fs.StringVar(&f.image, "fork-image", "", "image of the golden sandbox (controld's default, the bare desktop, when empty)")
	fs.IntVar(&f.reps, "fork-reps", 3, "repetitions per N (--n overrides)")
	fs.DurationVar(&f.settle, "fork-settle", time.Second, "wait after a fork before reading replica memory")
	fs.DurationVar(&f.ksmWait, "fork-ksm-wait", 15*time.Second, "on the last repetition per N, read replica memory again this long after the fork (KSM merges over time; 0 disables)")
	fs.BoolVar(&f.peer, "fork-podman", true, "also measure podman restore --import of the same image, N=1 and N=4, as the fork's peer")
	f.shapeNs = intList{1, 4, 8}
	fs.IntVar(&f.ramMB, "fork-ram-mb", 300, "RAM held by the reference shape's ballast process, forked --fork-shape-ns ways (memory tier; 0: no reference shape)")
	fs.Var(&f.shapeNs, "fork-shape-ns", "replica counts of the reference shape")
	f.restores = restoreModes{controldv1.RestoreMode_RESTORE_MODE_EAGER, controldv1.RestoreMode_RESTORE_MODE_LAZY}
	fs.Var(&f.restores, "fork-restore", "restore modes of the memory-tier forks (the reference shape's; the bare desktop's at --fork-lazy-ns), each measured in turn: eager, lazy, auto")
	f.lazyNs = intList{1, 16}
	fs.Var(&f.lazyNs, "fork-lazy-ns", "replica counts at which the bare desktop is also forked in --fork-restore's other modes")
}

// Peers: podman's restore of the same container, unless --fork-podman=false.
func (f *forkSuite) Peers() []string { return podmanPeers(f.peer) }

func (f *forkSuite) Check(ctx context.Context, env *suiteapi.Env) error {
	return checkControld(ctx, env)
}

func (f *forkSuite) Run(ctx context.Context, env *suiteapi.Env) ([]result.Row, error) {
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
		src, ck, err := goldenOf(ctx, c, f.image, tier.t)
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
		modes := f.restores
		if tier.t == controldv1.CheckpointTier_CHECKPOINT_TIER_DISK {
			modes = restoreModes{controldv1.RestoreMode_RESTORE_MODE_EAGER} // a disk replica boots
		}
		for _, n := range f.ns {
			for _, m := range modes {
				if m != controldv1.RestoreMode_RESTORE_MODE_EAGER && !slices.Contains(f.lazyNs, n) {
					continue
				}
				rows = append(rows, f.forkN(ctx, env, c, ck.GetId(), tier.name, n, reps, m)...)
			}
		}
		c.removeCheckpoint(ctx, ck.GetId())
	}
	if len(rows) == 0 {
		return nil, errors.New("no fork tier could be measured")
	}
	if f.ramMB > 0 {
		rows = append(rows, f.referenceShape(ctx, env, c, reps)...)
	}
	rows = append(rows, lazySpeedups(rows)...)
	if f.peer {
		rows = append(rows, f.podmanRows(ctx, env, image, reps)...)
		rows = append(rows, forkRatios(rows)...)
	}
	return rows, nil
}

// referenceShape forks the reference shape (ramMB of RAM one process holds
// and touches, 100 MB written on disk) from a memory-tier checkpoint: the
// figure that grows with the sandbox's memory under eager restore.
func (f *forkSuite) referenceShape(ctx context.Context, env *suiteapi.Env, c *controld, reps int) []result.Row {
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
		for _, m := range f.restores {
			rows = append(rows, f.forkN(ctx, env, c, r.GetCheckpoint().GetId(), "memory", n, reps, m, "shape", shape)...)
		}
	}
	return rows
}

// forkN forks n replicas of checkpoint ckID reps times: wall clock, per
// replica, the restore breakdown, and memory per replica (after settle, and
// on the last repetition after ksmWait), restored in mode (a lazy
// replica's rows carry restore=lazy). extra are labels every row carries.
func (f *forkSuite) forkN(ctx context.Context, env *suiteapi.Env, c *controld, ckID, tier string, n, reps int, mode controldv1.RestoreMode, extra ...string) []result.Row {
	extra = restoreLabels(mode, extra...)
	modes := map[controldv1.RestoreMode]int{}
	lbl := labels(append([]string{"tier", tier, "n", itoa(n)}, extra...)...)
	wall := result.NewSeries("fork.fanout.wall", "ms", lbl)
	per := result.NewSeries("fork.replica_usable", "ms", lbl)
	amort := result.NewSeries("fork.wall_per_replica", "ms", lbl)
	// The fan-out's end: its replicas deleted at once, to the last, and
	// the host's CPU over it per replica (a trainer pays it every round).
	teardown := result.NewSeries("fork.teardown.wall", "ms", lbl)
	teardownCPU := result.NewSeries("fork.teardown.cpu_per_replica", "ms", lbl)
	mem := newReplicaMem("fork.replica", "", lbl, false)
	klbl := labels(append([]string{"tier", tier, "n", itoa(n), "after_s", strconv.Itoa(int(f.ksmWait.Seconds()))}, extra...)...)
	memKSM := newReplicaMem("fork.replica", "_after_ksm", klbl, true)
	scans := result.NewSeries("fork.ksm_full_scans", "scans", klbl)
	breakdown := newForkBreakdown(tier, itoa(n), extra...)
	// A lazy replica's page server up to its answer: faults, the pages
	// they brought in, and the pages left to it.
	lazyFaults := result.NewSeries("fork.lazy.faults", "faults", lbl)
	lazyFaultPages := result.NewSeries("fork.lazy.fault_pages", "pages", lbl)
	lazyPages := result.NewSeries("fork.lazy.lazy_pages", "pages", lbl)
	// and the pages that came in ahead of faults from the checkpoint's
	// working set (0 for its first lazy fork, which learns it).
	lazyHotPages := result.NewSeries("fork.lazy.hot_pages", "pages", lbl)
	first := newFirstShots(lbl)
	res := replicaResources(ctx, env, c, ckID, n)
	for r := 0; r < reps; r++ {
		fctx, sp := env.Tracer.Start(ctx, "fork", oteltrace.WithAttributes(attribute.String("tier", tier), attribute.Int("n", n)))
		ksm0 := readKSM(ksmDir)
		t0 := time.Now()
		resp, err := c.ck.ForkCheckpoint(fctx, &controldv1.ForkCheckpointRequest{CheckpointId: ckID, Count: uint32(n),
			Labels: map[string]string{benchLabel: "1"}, Ttl: durationpb.New(benchTTL), Resources: res, RestoreMode: mode})
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
		var eps []*controldv1.Endpoint
		failed := map[string]int{}
		for _, rep := range resp.GetReplicas() {
			switch {
			case rep.GetErrorCode() != 0 || rep.GetSandbox() == nil:
				per.Fail()
				failed[rep.GetErrorMessage()]++
			case !verified(rep):
				per.Unverified()
			default:
				good++
				modes[rep.GetRestoreMode()]++
				if st := rep.GetLazyRestore(); st != nil {
					lazyFaults.Add(float64(st.GetFaults()))
					lazyFaultPages.Add(float64(st.GetFaultPages()))
					lazyPages.Add(float64(st.GetLazyPages()))
					lazyHotPages.Add(float64(st.GetHotPages()))
				}
				per.Add(dur(rep.GetTook()))
				breakdown.add(rep)
				ok = append(ok, rep.GetSandbox().GetId())
				eps = append(eps, rep.GetEndpoint())
			}
		}
		for msg, k := range failed {
			env.Notef("fork %s N=%d%s: %d replica(s) failed: %s", tier, n, labelSuffix(extra), k, msg)
		}
		// A wall clock counts only when every replica is verified.
		if good == n && len(resp.GetReplicas()) == n {
			wall.Add(suiteapi.Ms(w))
			amort.Add(suiteapi.Ms(w) / float64(n))
		} else {
			wall.Unverified()
		}
		// Memory per verified replica once the fleet settled, and on
		// the last repetition again after KSM had time to merge.
		sleepCtx(ctx, f.settle-time.Since(t0))
		missing := mem.add(ok)
		if r == reps-1 && f.ksmWait > 0 {
			sleepCtx(ctx, f.ksmWait-time.Since(t0))
			missing += memKSM.add(ok)
			// Whether KSM had time: a page merges once two full scans
			// saw it unchanged.
			ksm := readKSM(ksmDir)
			scans.Add(ksm.fullScansSince(ksm0))
			env.Notef("fork %s N=%d%s, %.0f s after the fork: %.0f full KSM scans since; %s", tier, n, labelSuffix(extra),
				f.ksmWait.Seconds(), ksm.fullScansSince(ksm0), ksm.summary())
		}
		if missing > 0 {
			env.Notef("fork %s N=%d: processes of %d replica(s) not found (cgroup or FORKFLEET_SANDBOX_ID): their memory is not in the PSS/RSS rows", tier, n, missing)
		}
		// After the memory reads, which a full capture would grow.
		first.add(ctx, eps)
		var ids []string
		for _, rep := range resp.GetReplicas() {
			if id := rep.GetSandbox().GetId(); id != "" {
				ids = append(ids, id)
			}
		}
		tw, tcpu, terr := c.removeAll(ctx, ids)
		switch {
		case terr != nil:
			teardown.Fail()
			env.Notef("fork %s N=%d%s: delete: %v", tier, n, labelSuffix(extra), terr)
		case len(ids) == n:
			teardown.Add(suiteapi.Ms(tw))
			teardownCPU.Add(suiteapi.Ms(tcpu) / float64(n))
		}
		env.Progressf("fork %s N=%d rep %d: %d/%d verified in %.0f ms, deleted in %.0f ms", tier, n, r+1, good, n, suiteapi.Ms(w), suiteapi.Ms(tw))
	}
	for m, k := range modes {
		if m != mode && mode != controldv1.RestoreMode_RESTORE_MODE_AUTO {
			env.Notef("fork %s N=%d%s: %d replica(s) restored %s", tier, n, labelSuffix(extra), k, restoreName(m))
		}
	}
	rows := []result.Row{wall.Row(), per.Row(), amort.Row(), teardown.Row()}
	if teardownCPU.Len() > 0 {
		rows = append(rows, teardownCPU.Row())
	}
	if lazyPages.Len() > 0 {
		rows = append(rows, lazyFaults.Row(), lazyFaultPages.Row(), lazyPages.Row(), lazyHotPages.Row())
	}
	rows = append(rows, breakdown.rows()...)
	rows = append(rows, first.rows()...)
	rows = append(rows, mem.rows()...)
	rows = append(rows, memKSM.rows()...)
	if scans.Len() > 0 {
		rows = append(rows, scans.Row())
	}
	return rows
}

// podmanRows measures podman restore --import of the same image, N=1 and
// N=4 at once, and our fork's wall clocks as ratios against it: both count
// a replica once its guestd answers.
func (f *forkSuite) podmanRows(ctx context.Context, env *suiteapi.Env, image string, reps int) []result.Row {
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
			lbl := labels("tier", r.Labels["tier"], "n", r.Labels["n"])
			if m := r.Labels["restore"]; m != "" {
				lbl["restore"] = m
			}
			out = append(out, result.Single("fork.speedup_vs_podman", "x", lbl, p / *r.P50))
		}
	}
	return out
}

// lazySpeedups divides each eager fork's p50 (wall and per replica) by the
// same fork's lazy p50 in this run: fork.lazy_speedup, per tier, shape, n.
func lazySpeedups(rows []result.Row) []result.Row {
	key := func(r result.Row) [4]string {
		return [4]string{r.Metric, r.Labels["tier"], r.Labels["shape"], r.Labels["n"]}
	}
	eager := map[[4]string]float64{}
	for _, r := range rows {
		if (r.Metric == "fork.fanout.wall" || r.Metric == "fork.replica_usable") && r.Labels["restore"] == "" && r.P50 != nil {
			eager[key(r)] = *r.P50
		}
	}
	var out []result.Row
	for _, r := range rows {
		if r.Labels["restore"] != "lazy" || r.P50 == nil || *r.P50 <= 0 {
			continue
		}
		if e, ok := eager[key(r)]; ok {
			lbl := labels("tier", r.Labels["tier"], "n", r.Labels["n"], "of", r.Metric)
			if s := r.Labels["shape"]; s != "" {
				lbl["shape"] = s
			}
			out = append(out, result.Single("fork.lazy_speedup", "x", lbl, e / *r.P50))
		}
	}
	return out
}

// labelSuffix renders extra labels (key, value, ...) as " key=value ...".
func labelSuffix(kv []string) string {
	var b strings.Builder
	for i := 0; i+1 < len(kv); i += 2 {
		b.WriteString(" " + kv[i] + "=" + kv[i+1])
	}
	return b.String()
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

// replicaResources are the limits n replicas of checkpoint ckID are forked
// with: the checkpoint's (nil), unless n replicas with its memory limit do
// not fit the host's admission room (the sum of the sandboxes' memory
// limits it admits, GetHostStatus): then the largest memory limit that
// fits, as a trainer forking that wide on this host would ask for. The
// replicas hold about 25 MB each, far below either limit.
func replicaResources(ctx context.Context, env *suiteapi.Env, c *controld, ckID string, n int) *controldv1.Resources {
	ck, err := c.ck.GetCheckpoint(ctx, &controldv1.GetCheckpointRequest{Id: ckID})
	if err != nil {
		return nil
	}
	hs, err := c.c.HostStatus(ctx)
	if err != nil {
		return nil
	}
	if room := int(hs.GetMaxSandboxes()) - int(hs.GetSandboxes()); room < n {
		env.Notef("fork N=%d: the host admits %d more sandboxes", n, room)
	}
	limit := ck.GetCheckpoint().GetResources().GetMemoryBytes()
	if limit == 0 {
		limit = hs.GetDefaultMemoryBytes()
	}
	room := hs.GetMaxMemoryBytes() - hs.GetAdmittedMemoryBytes()
	if limit == 0 || room <= 0 || int64(n)*limit <= room {
		return nil
	}
	fit := room / int64(n) &^ (1<<20 - 1) // whole MiB
	env.Notef("fork N=%d: replicas forked with a %d MiB memory limit each (%d MiB with the checkpoint's would be past the host's admission room of %d MiB)",
		n, fit>>20, int64(n)*limit>>20, room>>20)
	return &controldv1.Resources{MemoryBytes: fit}
}

// firstShotsPerFork bounds the replicas of a fan-out whose first
// screenshot is taken, one after another, so N=64 does not add seconds.
const firstShotsPerFork = 4

// firstShots is a replica's first observation: a trainer's next call after
// a fork is a screenshot, and a replica's first full-screen capture faults
// in the capture buffers its source gave back before the dump (guestd's
// checkpoint_prepare), which "usable" does not include.
type firstShots struct {
	shot, capture, encode *result.Series
}

func newFirstShots(lbl map[string]string) *firstShots {
	return &firstShots{
		shot:    result.NewSeries("fork.replica_first_screenshot", "ms", lbl),
		capture: result.NewSeries("fork.replica_first_capture", "ms", lbl),
		encode:  result.NewSeries("fork.replica_first_encode", "ms", lbl),
	}
}

// add takes a first PNG screenshot of up to firstShotsPerFork of the
// replicas at eps in turn: dial to the answer, and guestd's capture_ns and
// encode_ns.
// Not firstScreenshot: its time would include the session's close, which
// waits for the server's close frame.
func (f *firstShots) add(ctx context.Context, eps []*controldv1.Endpoint) {
	for _, ep := range eps[:min(len(eps), firstShotsPerFork)] {
		t0 := time.Now()
		s, err := dialEndpoint(ctx, ep)
		if err != nil {
			f.shot.Fail()
			continue
		}
		r, err := s.Screenshot(ctx, aci.PNG())
		took := time.Since(t0)
		s.Close()
		switch {
		case err != nil:
			f.shot.Fail()
		case !validImage("png", r):
			f.shot.Unverified()
		default:
			f.shot.Add(suiteapi.Ms(took))
			f.capture.Add(float64(r.GetCaptureNs()) / 1e6)
			f.encode.Add(float64(r.GetEncodeNs()) / 1e6)
		}
	}
}

func (f *firstShots) rows() []result.Row {
	if f.shot.Len() == 0 {
		return nil
	}
	return []result.Row{f.shot.Row(), f.capture.Row(), f.encode.Row()}
}
