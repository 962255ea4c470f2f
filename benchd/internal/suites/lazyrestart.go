//go:build linux

package suites

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"

	controldv1 "github.com/forkfleet/forkfleet/api/gen/forkfleet/controld/v1"
	"github.com/forkfleet/forkfleet/benchd/internal/result"
	"github.com/forkfleet/forkfleet/benchd/internal/suiteapi"
)

// lazyRestartSuite measures the first lazy fork of a checkpoint after a
// controld restart, with the checkpoint's hot set (lazy restore's working
// set, controld/docs/forks.md "Lazy restore") persisted across the restart
// and without it (its file removed while controld is down, so the fork
// learns it again, as every first fork after a restart did before), each
// either the first fork after the restart ("cold") or the first of this
// checkpoint after a lazy fork of another ("warm": controld's own first-fork
// costs paid). It runs a controld of its own (as the remote suite's hosts),
// restarted before every measurement; the variants take turns, the order
// reversed every other round.
//
// Each measured fork is followed by a second lazy fork of the same
// checkpoint on the same controld (--lazyrestart-second after a pause of
// --lazyrestart-gap: what a warm controld's fork costs, in the same run),
// and both report their phases (fork.replica_phase_at: create, task_start,
// guestd_listening, ... usable, as the fork suite). The variant
// "persisted/settled" waits --lazyrestart-settle after the restart before
// its first fork: what the first fork pays for controld's own start-up work
// (reconciliation, warm slots) going on beside it.
type lazyRestartSuite struct {
	n        int
	images   string
	bin      string
	ns       string
	variants string
	second   bool
	gap      time.Duration
	settle   time.Duration
	logLevel string
	keepLog  string
}

func (*lazyRestartSuite) Name() string { return "lazyrestart" }
func (*lazyRestartSuite) Description() string {
	return "first lazy fork of a checkpoint after a controld restart (its own controld), hot set persisted vs relearned, cold and after another checkpoint's fork"
}
func (s *lazyRestartSuite) Flags(fs *flag.FlagSet) {
	fs.IntVar(&s.n, "lazyrestart-n", 6, "restarts per variant and image (--n overrides)")
	fs.StringVar(&s.images, "lazyrestart-images", "desktop", "images to checkpoint: desktop (bare), web (Chromium), comma separated")
	fs.StringVar(&s.bin, "lazyrestart-controld", "", "controld binary (default: the controld beside benchd; forkfleet-image beside it imports the images)")
	fs.StringVar(&s.ns, "lazyrestart-namespace", "forkfleet-bench-lazyrestart", "containerd namespace of its controld (created; emptied at the end but for the images)")
	fs.StringVar(&s.variants, "lazyrestart-variants", strings.Join(lazyRestartVariants, ","), "variants, comma separated: hot set persisted|relearned / controld cold|warm|settled")
	fs.BoolVar(&s.second, "lazyrestart-second", true, "after each measured fork, fork the checkpoint again on the same controld (the fork=second rows)")
	fs.DurationVar(&s.gap, "lazyrestart-gap", 3*time.Second, "pause before the second fork (the first's background completion and fork slots settle)")
	fs.DurationVar(&s.settle, "lazyrestart-settle", 5*time.Second, "the settled variants' pause between the restart and the fork")
	fs.StringVar(&s.logLevel, "lazyrestart-log-level", "warn", "its controld's --log-level (info logs each persisted hot set loaded)")
	fs.StringVar(&s.keepLog, "lazyrestart-log", "", "append its controld's log (every restart) to this file")
}

// lazyRestartVariants are the variants run by default.
var lazyRestartVariants = []string{"persisted/cold", "relearned/cold", "persisted/warm", "relearned/warm", "persisted/settled"}

func (s *lazyRestartSuite) Check(ctx context.Context, env *suiteapi.Env) error {
	_, _, err := hostsBinaries(s.bin, env.Self)
	if err != nil {
		return suiteapi.Skipf("%v", err)
	}
	return nil
}

// lazyRestartImages maps -lazyrestart-images to image names and layouts.
var lazyRestartImages = map[string][2]string{
	"desktop": {"", "desktop-oci"},
	"web":     {"localhost/forkfleet/desktop-web:latest", "desktop-web-oci"},
}

func (s *lazyRestartSuite) Run(ctx context.Context, env *suiteapi.Env) ([]result.Row, error) {
	bin, imageBin, err := hostsBinaries(s.bin, env.Self)
	if err != nil {
		return nil, err
	}
	// Short: a lazy restore's socket is <state>/runtime/work/<id>-restore/
	// lazy-pages.socket, and a unix socket's path is at most 107 bytes.
	dir, err := os.MkdirTemp("", "lr")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	var rows []result.Row
	for _, name := range strings.Split(s.images, ",") {
		img, ok := lazyRestartImages[name]
		if !ok {
			return nil, fmt.Errorf("lazyrestart: unknown image %q (desktop, web)", name)
		}
		hdir := filepath.Join(dir, name[:1])
		r, err := s.measure(ctx, env, bin, imageBin, hdir, name, img[0], filepath.Join(filepath.Dir(desktopLayout()), img[1]))
		if err != nil {
			env.Notef("lazyrestart %s: %v", name, err)
		}
		if s.keepLog != "" {
			if err := appendFile(s.keepLog, filepath.Join(hdir, "controld.log")); err != nil {
				env.Notef("lazyrestart %s: keep the log: %v", name, err)
			}
		}
		rows = append(rows, r...)
	}
	return rows, nil
}

// measure checkpoints image on its own controld, forks it lazily once (the
// set is learned and written), then restarts controld before each fork.
func (s *lazyRestartSuite) measure(ctx context.Context, env *suiteapi.Env, bin, imageBin, dir, shape, image, layout string) ([]result.Row, error) {
	addr := os.Getenv("FORKFLEET_CONTAINERD_ADDRESS")
	if addr == "" {
		addr = "/run/forkfleet/containerd/containerd.sock"
	}
	if image != "" {
		if out, err := exec.CommandContext(ctx, imageBin, "import", "--address", addr, "--namespace", s.ns, layout).CombinedOutput(); err != nil {
			return nil, fmt.Errorf("import %s: %v: %s", layout, err, strings.TrimSpace(string(out)))
		}
	}
	variants := strings.Split(s.variants, ",")
	for _, v := range variants {
		hot, ctld, _ := strings.Cut(v, "/")
		if !slices.Contains([]string{"persisted", "relearned"}, hot) || !slices.Contains([]string{"cold", "warm", "settled"}, ctld) {
			return nil, fmt.Errorf("lazyrestart: unknown variant %q (persisted|relearned / cold|warm|settled)", v)
		}
	}
	h, err := startBenchHost(ctx, env, bin, imageBin, "lazyrestart", s.ns, dir, "--log-level", s.logLevel)
	if err != nil {
		return nil, err
	}
	defer func() { h.stop() }()
	src, err := h.c.createImage(ctx, image)
	if err != nil {
		return nil, fmt.Errorf("create: %w", err)
	}
	if image != "" {
		if err := openCounterPage(ctx, src.GetEndpoint()); err != nil {
			return nil, fmt.Errorf("counter page: %w", err)
		}
	}
	// Two checkpoints of the source: the one measured, and one whose lazy
	// fork warms a restarted controld up first (the "warm" rows: the first
	// lazy fork of a checkpoint once controld serves others already).
	var cks [2]string
	for i := range cks {
		ck, err := h.c.ck.CreateCheckpoint(ctx, &controldv1.CreateCheckpointRequest{SandboxId: src.GetSandbox().GetId(),
			Tier: controldv1.CheckpointTier_CHECKPOINT_TIER_MEMORY, Labels: map[string]string{benchLabel: "1"}})
		if err != nil {
			return nil, fmt.Errorf("checkpoint: %w", err)
		}
		cks[i] = ck.GetCheckpoint().GetId()
	}
	h.c.remove(ctx, src.GetSandbox().GetId())
	forkOf := func(ckID string) (time.Duration, *controldv1.ForkReplica, error) {
		t0 := time.Now()
		r, err := h.c.ck.ForkCheckpoint(ctx, &controldv1.ForkCheckpointRequest{CheckpointId: ckID, Count: 1,
			RestoreMode: controldv1.RestoreMode_RESTORE_MODE_LAZY, Labels: map[string]string{benchLabel: "1"}})
		wall := time.Since(t0)
		if err != nil {
			return 0, nil, err
		}
		rep := r.GetReplicas()[0]
		h.c.remove(ctx, rep.GetSandbox().GetId())
		if !verified(rep) {
			return 0, nil, fmtErr(rep.GetErrorCode(), rep.GetErrorMessage())
		}
		return wall, rep, nil
	}
	for _, ck := range cks {
		_, rep, err := forkOf(ck)
		if err != nil {
			return nil, fmt.Errorf("the learning fork: %w", err)
		}
		st := rep.GetLazyRestore()
		env.Progressf("lazyrestart %s: learned %d fault pages in %d faults", shape, st.GetFaultPages(), st.GetFaults())
	}
	hotDir := filepath.Join(dir, "state", "runtime", "hotsets")
	// By variant and fork (first, second): wall, faults, hot pages, and
	// the replica's phases.
	type forkSeries struct {
		wall, faults, hot *result.Series
		phases            *forkBreakdown
	}
	series := map[string]*forkSeries{}
	for _, v := range variants {
		hot, ctld, _ := strings.Cut(v, "/")
		for _, nth := range []string{"first", "second"} {
			l := labels("shape", shape, "hot_set", hot, "controld", ctld, "fork", nth)
			series[v+"/"+nth] = &forkSeries{result.NewSeries("lazyrestart.fork.wall", "ms", l),
				result.NewSeries("lazyrestart.fork.faults", "faults", l), result.NewSeries("lazyrestart.fork.hot_pages", "pages", l),
				newForkBreakdown("memory", "1", "shape", shape, "hot_set", hot, "controld", ctld, "fork", nth)}
		}
	}
	record := func(key string, wall time.Duration, rep *controldv1.ForkReplica) {
		st := rep.GetLazyRestore()
		ss := series[key]
		ss.wall.Add(ms(wall))
		ss.faults.Add(float64(st.GetFaults()))
		ss.hot.Add(float64(st.GetHotPages()))
		ss.phases.add(rep)
		env.Progressf("lazyrestart %s %s: %.1f ms, %d faults, %d hot pages", shape, key, ms(wall), st.GetFaults(), st.GetHotPages())
	}
	n := env.Samples(s.n)
	for i := 0; i < n; i++ {
		order := append([]string(nil), variants...)
		if i%2 == 1 {
			slices.Reverse(order)
		}
		for _, v := range order {
			if err := h.restart(ctx, env, bin, imageBin, dir, func() error {
				if strings.HasPrefix(v, "relearned") {
					files, _ := filepath.Glob(filepath.Join(hotDir, "*.hot"))
					for _, f := range files {
						if err := os.Remove(f); err != nil {
							return err
						}
					}
				}
				return nil
			}); err != nil {
				return nil, err
			}
			switch {
			case strings.HasSuffix(v, "/warm"):
				if _, _, err := forkOf(cks[1]); err != nil {
					env.Notef("lazyrestart %s %s round %d: warm-up: %v", shape, v, i+1, err)
				}
			case strings.HasSuffix(v, "/settled"):
				sleepCtx(ctx, s.settle)
			}
			wall, rep, err := forkOf(cks[0])
			if err != nil {
				env.Notef("lazyrestart %s %s round %d: %v", shape, v, i+1, err)
				series[v+"/first"].wall.Fail()
				continue
			}
			record(v+"/first", wall, rep)
			if !s.second {
				continue
			}
			sleepCtx(ctx, s.gap)
			if wall, rep, err = forkOf(cks[0]); err != nil {
				env.Notef("lazyrestart %s %s round %d: second fork: %v", shape, v, i+1, err)
				series[v+"/second"].wall.Fail()
				continue
			}
			record(v+"/second", wall, rep)
		}
	}
	var rows []result.Row
	for _, v := range variants {
		for _, nth := range []string{"first", "second"} {
			ss := series[v+"/"+nth]
			if nth == "second" && !s.second {
				continue
			}
			rows = append(rows, ss.wall.Row(), ss.faults.Row(), ss.hot.Row())
			rows = append(rows, ss.phases.rows()...)
		}
	}
	return rows, nil
}

// restart stops the host's controld, leaving what it holds, runs between
// (controld down), and starts it again on the same state.
func (h *benchHost) restart(ctx context.Context, env *suiteapi.Env, bin, imageBin, dir string, between func() error) error {
	h.c.Close()
	h.c = nil
	_ = h.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-h.exited:
	case <-time.After(30 * time.Second):
		_ = h.cmd.Process.Kill()
		<-h.exited
	}
	if err := between(); err != nil {
		return err
	}
	n, err := startBenchHost(ctx, env, bin, imageBin, strings.TrimPrefix(h.name, "bench-"), h.ns, dir, h.extra...)
	if err != nil {
		return err
	}
	*h = *n
	return nil
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// appendFile appends src's bytes to dst (created when missing).
func appendFile(dst, src string) error {
	b, err := os.ReadFile(src)
	if err != nil {
		return err
	}
	f, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
	if err != nil {
		return err
	}
	if _, err := f.Write(b); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}
