//go:build linux

package suites

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/forkfleet/forkfleet/api/aci"
	"github.com/forkfleet/forkfleet/api/aci/pagetest"
	aciv1 "github.com/forkfleet/forkfleet/api/gen/forkfleet/aci/v1"
	controldv1 "github.com/forkfleet/forkfleet/api/gen/forkfleet/controld/v1"
	"github.com/forkfleet/forkfleet/benchd/internal/result"
	"github.com/forkfleet/forkfleet/benchd/internal/suiteapi"
)

// browserShape labels every row of the browser suite.
const browserShape = "browser"

// browserSuite measures the web desktop (Chromium) where agents spend their
// time: boot to the start page loaded, a live checkpoint with a page whose
// JavaScript keeps state, forks of it, pool claims, replica memory, and
// podman's checkpoint and restore of the same container in the same run.
type browserSuite struct {
	image   string
	n       int
	ns      intList
	ksmWait time.Duration
	peer    bool
	// restores are the fork restore modes measured, in turn.
	restores restoreModes
}

func (*browserSuite) Name() string { return "browser" }
func (*browserSuite) Description() string {
	return "web desktop (Chromium, a page whose JS keeps state): boot to page loaded, live checkpoint, fork N=1/4 verified, pool claim, idle replica PSS after KSM; podman checkpoint/restore peer"
}
func (b *browserSuite) Flags(fs *flag.FlagSet) {
	b.ns = intList{1, 4}
	fs.StringVar(&b.image, "browser-image", "localhost/forkfleet/desktop-web:latest", "the web desktop image (make image-web)")
	fs.IntVar(&b.n, "browser-n", 8, "samples per measurement (--n overrides)")
	fs.Var(&b.ns, "browser-fork-ns", "replica counts")
	fs.DurationVar(&b.ksmWait, "browser-ksm-wait", 30*time.Second, "read replica memory again this long after the fork (KSM merges over time)")
	fs.BoolVar(&b.peer, "browser-podman", true, "also measure podman checkpoint --leave-running / restore of the same image")
	b.restores = restoreModes{controldv1.RestoreMode_RESTORE_MODE_EAGER}
	fs.Var(&b.restores, "browser-restore", "restore modes of the browser forks, each measured in turn: eager, lazy, auto (lazy fails under strict overcommit, vm.overcommit_memory=2: docs/security.md)")
}
func (b *browserSuite) Peers() []string { return podmanPeers(b.peer) }
func (b *browserSuite) Check(ctx context.Context, env *suiteapi.Env) error {
	return checkControld(ctx, env)
}

func (b *browserSuite) Run(ctx context.Context, env *suiteapi.Env) ([]result.Row, error) {
	c, err := dialControld(ctx, env)
	if err != nil {
		return nil, err
	}
	defer c.Close()
	n, warm := env.Samples(b.n), env.Warmups(1)

	rows, src, err := b.boots(ctx, env, c, n, warm)
	if err != nil {
		return nil, err
	}
	defer c.remove(ctx, src.GetSandbox().GetId())
	if err := openCounterPage(ctx, src.GetEndpoint()); err != nil {
		return nil, fmt.Errorf("counter page: %w", err)
	}
	// The source's own memory, with the page running.
	if rss, pss, ok := memoryOf(sandboxProcs(src.GetSandbox().GetId())); ok {
		rows = append(rows, result.Single("browser.source_pss", "MB", labels("shape", browserShape), pss),
			result.Single("browser.source_rss", "MB", labels("shape", browserShape), rss))
	}

	ckRows, err := (&checkpointSuite{}).shape(ctx, env, c, src.GetSandbox().GetId(), browserShape, n, warm)
	if err != nil {
		return nil, err
	}
	rows = append(rows, ckRows...)

	r, err := c.ck.CreateCheckpoint(ctx, &controldv1.CreateCheckpointRequest{SandboxId: src.GetSandbox().GetId(),
		Labels: map[string]string{benchLabel: "1"}})
	if err != nil {
		return nil, fmt.Errorf("checkpoint to fork from: %w", err)
	}
	ck := r.GetCheckpoint()
	defer c.removeCheckpoint(ctx, ck.GetId())
	f := &forkSuite{settle: 2 * time.Second, ksmWait: b.ksmWait}
	for _, k := range b.ns {
		for _, m := range b.restores {
			rows = append(rows, f.forkN(ctx, env, c, ck.GetId(), "memory", k, max(2, n/k), m, "shape", browserShape)...)
		}
	}
	rows = append(rows, lazySpeedups(rows)...)

	// Claims from a frozen pool of replicas of the page.
	p := &poolSuite{size: 2, bursts: intList{1}, ksmWait: b.ksmWait}
	pr, err := p.measure(ctx, env, c, "browser-checkpoint", &controldv1.CreatePoolRequest{
		Source: &controldv1.CreatePoolRequest_CheckpointId{CheckpointId: ck.GetId()}}, n)
	if err != nil {
		env.Notef("browser pool not measured: %v", err)
	}
	rows = append(rows, pr...)
	if err := b.claimShowsPage(ctx, env, c, ck.GetId()); err != nil {
		return nil, err
	}

	if b.peer {
		peer := b.podmanRows(ctx, env, n, warm)
		rows = append(rows, peer...)
		rows = append(rows, browserRatios(rows)...)
	}
	return rows, nil
}

// boots measures create to the start page loaded (the browser window
// carries its title) n times and keeps the last sandbox as the source.
func (b *browserSuite) boots(ctx context.Context, env *suiteapi.Env, c *controld, n, warm int) ([]result.Row, *controldv1.CreateSandboxResponse, error) {
	lbl := labels("shape", browserShape)
	usable := result.NewSeries("browser.boot_usable", "ms", lbl)
	loaded := result.NewSeries("browser.boot_page_loaded", "ms", lbl)
	var keep *controldv1.CreateSandboxResponse
	for i := 0; i < warm+n; i++ {
		t0 := time.Now()
		resp, err := c.createImage(ctx, b.image)
		if err != nil {
			if i == 0 {
				return nil, nil, fmt.Errorf("boot %s: %w (make image-web builds it)", b.image, err)
			}
			loaded.Fail()
			continue
		}
		u := time.Since(t0)
		err = waitWindowTitle(ctx, resp.GetEndpoint(), func(t string) bool { return strings.HasPrefix(t, "forkfleet") })
		l := time.Since(t0)
		switch {
		case i < warm:
			loaded.Warmup()
		case err != nil:
			loaded.Fail()
			env.Progressf("browser boot: %v", err)
		default:
			usable.Add(suiteapi.Ms(u))
			loaded.Add(suiteapi.Ms(l))
			env.Progressf("browser boot %d/%d: usable %.0f ms, page loaded %.0f ms", i+1-warm, n, suiteapi.Ms(u), suiteapi.Ms(l))
		}
		if keep != nil {
			c.remove(ctx, keep.GetSandbox().GetId())
		}
		keep = resp
	}
	if keep == nil {
		return nil, nil, errors.New("no browser desktop booted")
	}
	return []result.Row{usable.Row(), loaded.Row()}, keep, nil
}

// claimShowsPage claims a replica of the page from a frozen pool and checks
// the first screenshot after the claim shows the page: the window is the
// counter page's and the frame is not blank.
func (b *browserSuite) claimShowsPage(ctx context.Context, env *suiteapi.Env, c *controld, ckID string) error {
	pr, err := c.pl.CreatePool(ctx, &controldv1.CreatePoolRequest{Name: fmt.Sprintf("benchd-browser-shows-%d", time.Now().UnixNano()),
		Source: &controldv1.CreatePoolRequest_CheckpointId{CheckpointId: ckID}, Size: 1, Labels: map[string]string{benchLabel: "1"}})
	if err != nil {
		return fmt.Errorf("pool: %w", err)
	}
	defer c.pl.DeletePool(context.WithoutCancel(ctx), &controldv1.DeletePoolRequest{Id: pr.GetPool().GetId()})
	deadline := time.Now().Add(2 * time.Minute)
	for {
		g, err := c.pl.GetPool(ctx, &controldv1.GetPoolRequest{Id: pr.GetPool().GetId()})
		if err != nil {
			return err
		}
		if g.GetPool().GetAvailable() > 0 {
			break
		}
		if time.Now().After(deadline) {
			return errors.New("pool did not fill in 2 minutes")
		}
		time.Sleep(100 * time.Millisecond)
	}
	cr, err := c.pl.ClaimPool(ctx, &controldv1.ClaimPoolRequest{PoolId: pr.GetPool().GetId(), Labels: map[string]string{benchLabel: "1"}})
	if err != nil {
		return fmt.Errorf("claim: %w", err)
	}
	defer c.remove(ctx, cr.GetSandbox().GetId())
	s, err := dialEndpoint(ctx, cr.GetEndpoint())
	if err != nil {
		return err
	}
	defer s.Close()
	shot, err := s.Screenshot(ctx, &aciv1.ScreenshotRequest{Format: aciv1.ImageFormat_IMAGE_FORMAT_PNG})
	if err != nil {
		return fmt.Errorf("first screenshot after the claim: %w", err)
	}
	ws, err := s.ListWindows(ctx)
	if err != nil {
		return err
	}
	title := ""
	for _, w := range ws {
		title = w.GetTitle()
	}
	if !strings.HasPrefix(title, "counter ") || len(shot.GetData()) < 4096 {
		return fmt.Errorf("first screenshot after a claim does not show the page: window %q, %d bytes of PNG", title, len(shot.GetData()))
	}
	env.Notef("first screenshot after a pool claim shows the page (window %q, %d B PNG)", title, len(shot.GetData()))
	return nil
}

// openCounterPage writes the counter page into the sandbox and opens it as
// an agent would: the URL typed into the focused browser's address bar.
func openCounterPage(ctx context.Context, ep *controldv1.Endpoint) error {
	s, err := dialEndpoint(ctx, ep)
	if err != nil {
		return err
	}
	defer s.Close()
	return typeCounterPage(ctx, s)
}

// typeCounterPage opens the counter page (the suite's workload: it
// animates) once the desktop is ready, then waits for its title.
func typeCounterPage(ctx context.Context, s *aci.Session) error {
	// Ready: the browser's window is focused on its start page.
	if _, err := s.WaitReady(ctx); err != nil {
		return err
	}
	if err := pagetest.Open(ctx, s, pagetest.CounterPath, pagetest.Counter); err != nil {
		return err
	}
	return waitTitle(ctx, s, func(t string) bool { return strings.HasPrefix(t, "counter ") })
}

// waitWindowTitle polls the sandbox's windows until a title satisfies ok.
func waitWindowTitle(ctx context.Context, ep *controldv1.Endpoint, ok func(string) bool) error {
	s, err := dialEndpoint(ctx, ep)
	if err != nil {
		return err
	}
	defer s.Close()
	return waitTitle(ctx, s, ok)
}

func waitTitle(ctx context.Context, s *aci.Session, ok func(string) bool) error {
	deadline := time.Now().Add(60 * time.Second)
	for {
		ws, err := s.ListWindows(ctx)
		if err != nil {
			return err
		}
		var titles []string
		for _, w := range ws {
			if ok(w.GetTitle()) {
				return nil
			}
			titles = append(titles, w.GetTitle())
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("no window with the expected title in 60 s (windows %q)", titles)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// podmanRows runs podman's checkpoint and restore of the same image with the
// same CRIU options controld gives it (the image's ghost limit), on the
// same page.
func (b *browserSuite) podmanRows(ctx context.Context, env *suiteapi.Env, n, warm int) []result.Row {
	conf := filepath.Join(env.WorkDir, "browser-criu.conf")
	if err := os.WriteFile(conf, []byte("tcp-close\nfile-locks\nnetwork-lock skip\nghost-limit 67108864\n"), 0o644); err != nil {
		env.Notef("podman peer not measured: %v", err)
		return nil
	}
	peer, err := newPodmanPeer(ctx, env, b.image, browserShape, "--annotation", "org.criu.config="+conf)
	if err != nil {
		env.Notef("podman peer not measured: %v", err)
		return nil
	}
	defer peer.Close(ctx)
	if err := peer.withSession(ctx, peer.source, typeCounterPage); err != nil {
		env.Notef("podman peer: the counter page did not open (%v); measured on the start page", err)
	}
	rows := peer.checkpointRows(ctx, n, warm)
	archive, err := peer.exportCheckpoint(ctx)
	if err != nil {
		env.Notef("podman restore not measured: export: %v", err)
		return rows
	}
	rows = append(rows, peer.restoreRows(ctx, archive, []int{1}, n)...)
	return append(rows, peer.restoreRows(ctx, archive, []int{4}, max(2, n/4))...)
}

// browserRatios: our checkpoint and forks against podman's on the same
// container in the same run.
func browserRatios(rows []result.Row) []result.Row {
	var ck *float64
	for _, r := range rows {
		if r.Metric == "checkpoint.client_total" && r.Labels["shape"] == browserShape && !r.Baseline {
			ck = r.P50
		}
	}
	var out []result.Row
	for _, r := range rows {
		if !r.Baseline || r.P50 == nil || r.Labels["shape"] != browserShape {
			continue
		}
		if r.Metric == "peer.podman_checkpoint_leave_running" && ck != nil && *ck > 0 {
			out = append(out, result.Single("checkpoint.speedup_vs_podman", "x",
				labels("shape", browserShape, "tier", "memory", "podman_compress", r.Labels["compress"]), *r.P50 / *ck))
		}
	}
	for _, fr := range forkRatios(rows) {
		fr.Labels["shape"] = browserShape
		out = append(out, fr)
	}
	return out
}
