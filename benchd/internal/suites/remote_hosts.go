//go:build linux

package suites

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/forkfleet/forkfleet/api/client"
	controldv1 "github.com/forkfleet/forkfleet/api/gen/forkfleet/controld/v1"
	"github.com/forkfleet/forkfleet/benchd/internal/result"
	"github.com/forkfleet/forkfleet/benchd/internal/suiteapi"
)

// The remote suite's fleet: two controlds of benchd's own standing in for
// two hosts (each with its own state, sockets, ports and containerd
// namespace, as controld's TestRealStackHosts runs them), one trainer's
// client.DialHosts over both and the suite's registry. A fork of N
// replicas spread over the two hosts (the checkpoint's host forks its
// share, the other pulls it by digest and forks the rest) is measured
// against the same N on the checkpoint's host alone, in the same run.

// benchHost is one of those controlds.
type benchHost struct {
	name, ns, sock string
	extra          []string // more controld flags (restart keeps them)
	c              *controld
	cmd            *exec.Cmd
	exited         chan error
}

// desktopLayout is the desktop image's OCI layout (images/desktop/build.sh,
// FORKFLEET_IMAGE_CACHE moves it as it does for the tests).
func desktopLayout() string {
	dir := os.Getenv("FORKFLEET_IMAGE_CACHE")
	if dir == "" {
		dir = "/var/cache/forkfleet/images"
	}
	return filepath.Join(dir, "desktop-oci")
}

// hostsBinaries returns controld and forkfleet-image for the fleet: bin, or
// the controld beside benchd's own executable (make build puts them
// together), and forkfleet-image beside controld.
func hostsBinaries(bin, self string) (controldBin, imageBin string, err error) {
	if bin == "" {
		bin = filepath.Join(filepath.Dir(self), "controld")
	}
	imageBin = filepath.Join(filepath.Dir(bin), "forkfleet-image")
	for _, p := range []string{bin, imageBin} {
		if _, err := os.Stat(p); err != nil {
			return "", "", fmt.Errorf("%s: %w (make build, or --remote-hosts-controld)", p, err)
		}
	}
	return bin, imageBin, nil
}

// startBenchHost imports the desktop image into namespace ns (skipped when
// there already) and runs controld bin as host name with its state under
// dir, until stop; extra flags go after benchd's own (a repeated flag: the
// last one counts).
func startBenchHost(ctx context.Context, env *suiteapi.Env, bin, imageBin, name, ns, dir string, extra ...string) (*benchHost, error) {
	addr := os.Getenv("FORKFLEET_CONTAINERD_ADDRESS")
	if addr == "" {
		addr = "/run/forkfleet/containerd/containerd.sock"
	}
	if out, err := exec.CommandContext(ctx, imageBin, "import", "--address", addr, "--namespace", ns, desktopLayout()).CombinedOutput(); err != nil {
		return nil, fmt.Errorf("import the desktop image into %s: %v: %s", ns, err, strings.TrimSpace(string(out)))
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	// An empty file: the built-in defaults, not the host's own
	// /etc/forkfleet/controld.toml (its sockets, token, TLS).
	cfgFile := filepath.Join(dir, "controld.toml")
	if err := os.WriteFile(cfgFile, nil, 0o600); err != nil {
		return nil, err
	}
	h := &benchHost{name: "bench-" + name, ns: ns, sock: filepath.Join(dir, "c.sock"), extra: extra, exited: make(chan error, 1)}
	// Appended: a restarted controld (lazyrestart) adds to its log.
	logf, err := os.OpenFile(filepath.Join(dir, "controld.log"), os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
	if err != nil {
		return nil, err
	}
	defer logf.Close()
	h.cmd = exec.Command(bin, append([]string{"--config", cfgFile, "--host", h.name,
		"--state-dir", filepath.Join(dir, "state"), "--checkpoint-dir", filepath.Join(dir, "checkpoints"),
		"--grpc-unix", h.sock, "--grpc-tcp", "127.0.0.1:0", "--token-file", "",
		"--gateway-listen", "127.0.0.1:0", "--metrics-listen", "127.0.0.1:0",
		"--containerd-address", addr, "--containerd-namespace", ns, "--log-level", "warn"}, extra...)...)
	h.cmd.Stdout, h.cmd.Stderr = logf, logf
	// Gone with benchd, whatever ends it.
	h.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGTERM}
	if err := h.cmd.Start(); err != nil {
		return nil, err
	}
	go func() { h.exited <- h.cmd.Wait() }()
	deadline := time.Now().Add(30 * time.Second)
	for {
		if _, err := os.Stat(h.sock); err == nil {
			if h.c, err = dialSocket(ctx, h.sock); err == nil {
				break
			}
		}
		select {
		case err := <-h.exited:
			return nil, fmt.Errorf("controld %s exited at start (%v): see %s", h.name, err, filepath.Join(dir, "controld.log"))
		case <-time.After(50 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			h.stop()
			return nil, fmt.Errorf("controld %s did not serve within 30 s", h.name)
		}
	}
	env.Progressf("remote: host %s serving on %s (namespace %s)", h.name, h.sock, ns)
	return h, nil
}

// dialSocket connects to a controld of benchd's own (no token) and waits
// until it answers.
func dialSocket(ctx context.Context, sock string) (*controld, error) {
	cl, err := client.Dial(ctx, "unix://"+sock, client.WithToken(""))
	if err != nil {
		return nil, err
	}
	c := &controld{c: cl, sb: cl.SandboxService(), ck: cl.CheckpointService(), pl: cl.PoolService()}
	cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if _, err := c.sb.ListSandboxes(cctx, &controldv1.ListSandboxesRequest{}); err != nil {
		c.Close()
		return nil, err
	}
	return c, nil
}

// stop deletes everything the host holds (it is benchd's: a stopped
// controld would leave sandboxes running and checkpoint layers in its
// namespace) and stops it.
func (h *benchHost) stop() {
	if h.c != nil {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		sbs, _ := h.c.sb.ListSandboxes(ctx, &controldv1.ListSandboxesRequest{})
		for _, sb := range sbs.GetSandboxes() {
			h.c.remove(ctx, sb.GetId())
		}
		cks, _ := h.c.ck.ListCheckpoints(ctx, &controldv1.ListCheckpointsRequest{})
		for _, ck := range cks.GetCheckpoints() {
			h.c.removeCheckpoint(ctx, ck.GetId())
		}
		cancel()
		h.c.Close()
	}
	_ = h.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-h.exited:
	case <-time.After(30 * time.Second):
		_ = h.cmd.Process.Kill()
		<-h.exited
	}
}

// hostsRun measures forks over the two hosts.
type hostsRun struct {
	r    *remoteRun
	a, b *benchHost
	// phases: the replicas' waterfalls by fork kind, count and host.
	phases map[string]*forkBreakdown
}

// phase is the waterfall of the replicas on host of forks of kind (single,
// first, again) of n.
func (hr *hostsRun) phase(kind string, n int, host string) *forkBreakdown {
	k := kind + "/" + itoa(n) + "/" + host
	if hr.phases[k] == nil {
		hr.phases[k] = newForkBreakdown("memory", itoa(n), "shape", "bare-desktop", "fork", "hosts_"+kind, "host", host)
	}
	return hr.phases[k]
}

// runHosts starts the two hosts, measures reps rounds and stops them.
func (r *remoteRun) runHosts(ctx context.Context, reps int) ([]result.Row, error) {
	bin, imageBin, err := hostsBinaries(r.s.hostsBin, r.env.Self)
	if err != nil {
		return nil, err
	}
	var hosts []*benchHost
	defer func() {
		for _, h := range hosts {
			h.stop()
			r.rmImages(context.WithoutCancel(ctx), h.ns)
		}
	}()
	for _, name := range []string{"a", "b"} {
		h, err := startBenchHost(ctx, r.env, bin, imageBin, name, r.s.hostsNamespace+"-"+name, filepath.Join(r.env.WorkDir, "host-"+name))
		if err != nil {
			return nil, err
		}
		hosts = append(hosts, h)
	}
	hr := &hostsRun{r: r, a: hosts[0], b: hosts[1], phases: map[string]*forkBreakdown{}}
	var rows []result.Row
	for _, n := range r.s.hostsNs {
		if n < 1 {
			continue
		}
		lbl := func(h int) map[string]string { return labels("shape", "bare-desktop", "n", itoa(n), "hosts", itoa(h)) }
		single := result.NewSeries("remote.hosts.fork.wall", "ms", lbl(1))
		first := result.NewSeries("remote.hosts.fork.first.wall", "ms", lbl(2))
		spread := result.NewSeries("remote.hosts.fork.wall", "ms", lbl(2))
		other := result.NewSeries("remote.hosts.replicas_on_other_host", "replicas", lbl(2))
		for rep := 0; rep < reps; rep++ {
			if err := hr.rep(ctx, n, rep, single, first, spread, other); err != nil {
				r.env.Notef("remote hosts N=%d rep %d: %v", n, rep+1, err)
			}
		}
		rows = append(rows, single.Row(), first.Row(), spread.Row(), other.Row())
		for _, kind := range []string{"single", "first", "again"} {
			for _, h := range hosts {
				if bd := hr.phases[kind+"/"+itoa(n)+"/"+h.name]; bd != nil {
					rows = append(rows, bd.rows()...)
				}
			}
		}
		if s, sp := single.Row(), spread.Row(); s.P50 != nil && sp.P50 != nil && *s.P50 > 0 {
			rows = append(rows, result.Single("remote.hosts.fork.spread_over_single", "x", labels("shape", "bare-desktop", "n", itoa(n)), *sp.P50 / *s.P50))
		}
	}
	return rows, nil
}

// rep checkpoints a desktop on host a and forks it n ways: on a alone, and
// spread over both hosts by the fleet client, first (a exports and pushes
// it, b pulls it) and again (b forks its import); for n=1, on b (a pushed
// it before: b pulls, imports and forks it, then forks its import again).
// The single and the second spread fork take turns going first.
func (hr *hostsRun) rep(ctx context.Context, n, rep int, single, first, spread, other *result.Series) error {
	r, a, b := hr.r, hr.a, hr.b
	src, err := a.c.create(ctx)
	if err != nil {
		return fmt.Errorf("create: %w", err)
	}
	defer a.c.remove(ctx, src.GetSandbox().GetId())
	ck, err := a.c.ck.CreateCheckpoint(ctx, &controldv1.CreateCheckpointRequest{SandboxId: src.GetSandbox().GetId(),
		Tier: controldv1.CheckpointTier_CHECKPOINT_TIER_MEMORY, Labels: map[string]string{benchLabel: "1"}})
	if err != nil {
		return fmt.Errorf("checkpoint: %w", err)
	}
	ckID := ck.GetCheckpoint().GetId()
	defer a.c.removeCheckpoint(ctx, ckID)
	a.c.remove(ctx, src.GetSandbox().GetId())

	// A new client per round: it pushes each checkpoint once, and this
	// round's first spread fork must push.
	r.seq++
	repo := fmt.Sprintf("%s/forkfleet/hosts-%d-%d", r.reg, time.Now().UnixNano(), r.seq)
	fleet, err := client.DialHosts(ctx, []string{"unix://" + a.sock, "unix://" + b.sock}, client.WithToken(""), client.WithCheckpointRegistry(repo))
	if err != nil {
		return err
	}
	defer fleet.Close()
	// What b imported, deleted with its replicas at the end of the round.
	var imported []string
	defer func() {
		for _, id := range imported {
			b.c.removeCheckpoint(ctx, id)
		}
		r.rmImage(context.WithoutCancel(ctx), a.ns, repo+":"+ckID)
	}()

	forkSingle := func() error {
		sleepCtx(ctx, r.s.settle)
		t0 := time.Now()
		resp, err := a.c.ck.ForkCheckpoint(ctx, &controldv1.ForkCheckpointRequest{CheckpointId: ckID, Count: uint32(n),
			Labels: map[string]string{benchLabel: "1"}, Ttl: durationpb.New(benchTTL)})
		w := time.Since(t0)
		if err != nil {
			single.Fail()
			return fmt.Errorf("fork on %s: %w", a.name, err)
		}
		reps := resp.GetReplicas()
		good := 0
		for _, rp := range reps {
			if verified(rp) {
				good++
				hr.phase("single", n, a.name).add(rp)
			}
			a.c.remove(ctx, rp.GetSandbox().GetId())
		}
		record(single, w, good == n && len(reps) == n)
		r.env.Progressf("remote: hosts: fork N=%d on %s: %d verified in %.0f ms", n, a.name, good, suiteapi.Ms(w))
		return nil
	}
	// N=1 has nothing to spread: b forks what a pushed (by digest, as the
	// fleet client sends it; the push is done before the clock starts).
	pinned := ""
	if n == 1 {
		ex, err := a.c.ck.ExportCheckpoint(ctx, &controldv1.ExportCheckpointRequest{Id: ckID, Reference: repo + ":" + ckID, Push: true})
		if err != nil {
			return fmt.Errorf("push: %w", err)
		}
		pinned = repo + "@" + ex.GetDigest()
	}
	fork := func() ([]client.ForkResult, error) {
		opts := []client.ForkOption{client.WithLabels(map[string]string{benchLabel: "1"}), client.WithTTL(benchTTL)}
		if pinned == "" {
			return fleet.Checkpoint(ckID).Fork(ctx, n, opts...)
		}
		res, _, err := b.c.c.ForkRemote(ctx, pinned, n, opts...)
		return res, err
	}
	forkSpread := func(s *result.Series) error {
		sleepCtx(ctx, r.s.settle)
		t0 := time.Now()
		res, err := fork()
		w := time.Since(t0)
		if err != nil {
			s.Fail()
			return fmt.Errorf("fork over both hosts: %w", err)
		}
		kind := "again"
		if s == first {
			kind = "first"
		}
		good, onOther := 0, 0
		for _, fr := range res {
			if fr.Sandbox == nil {
				continue
			}
			if fr.Err == nil && fr.Replica != nil && verified(fr.Replica) {
				good++
				hr.phase(kind, n, fr.Sandbox.Info().GetHost()).add(fr.Replica)
			}
			if info := fr.Sandbox.Info(); info.GetHost() == b.name {
				onOther++
				if id := info.GetCheckpointId(); id != "" && !slices.Contains(imported, id) {
					imported = append(imported, id)
				}
			}
			dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
			if err := fr.Sandbox.Delete(dctx); err != nil && !errors.Is(err, context.Canceled) {
				r.env.Notef("remote hosts: delete replica %s: %v", fr.Sandbox.ID(), err)
			}
			cancel()
		}
		record(s, w, good == n && len(res) == n)
		if s == first {
			other.Add(float64(onOther))
		}
		r.env.Progressf("remote: hosts: fork N=%d over %s and %s (%d on %s): %d verified in %.0f ms", n, a.name, b.name, onOther, b.name, good, suiteapi.Ms(w))
		return nil
	}
	steps := []func() error{forkSingle, func() error { return forkSpread(first) }, func() error { return forkSpread(spread) }}
	if rep%2 == 1 {
		steps = []func() error{steps[1], steps[2], steps[0]}
	}
	for _, f := range steps {
		if err := f(); err != nil {
			return err
		}
	}
	return nil
}

// record adds a fork's wall clock when every replica was verified.
func record(s *result.Series, w time.Duration, ok bool) {
	if ok {
		s.Add(suiteapi.Ms(w))
	} else {
		s.Unverified()
	}
}
