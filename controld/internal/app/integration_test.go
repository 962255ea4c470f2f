package app_test

import (
	"context"
	"errors"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/containerd/containerd/v2/core/images"
	"github.com/containerd/containerd/v2/pkg/namespaces"

	"github.com/forkfleet/forkfleet/api/aci"
	controldv1 "github.com/forkfleet/forkfleet/api/gen/forkfleet/controld/v1"
	"github.com/forkfleet/forkfleet/controld/internal/app"
	"github.com/forkfleet/forkfleet/controld/internal/config"
	"github.com/forkfleet/forkfleet/controld/internal/containerdrt"
	"github.com/forkfleet/forkfleet/controld/internal/testenv"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
)

// TestRealStack runs controld on the real containerd + runc + CRIU with the
// desktop image and real guestd: boot, ACI through the gateway, a memory
// checkpoint, a verified fork, a frozen pool claim. Opt in with
// FORKFLEET_INTEGRATION=1. It uses its own containerd namespace
// (forkfleet-controld-it, see testenv) holding the desktop image, because
// reconciliation deletes unknown sandboxes of its namespace.
func TestRealStack(t *testing.T) {
	cfg, address, ns := realStackConfig(t, "forkfleet-controld-it")

	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	rt := realStackRuntime(t, ctx, cfg, filepath.Join(cfg.StateDir, "runtime"))

	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	if testing.Verbose() {
		log = slog.New(slog.NewTextHandler(os.Stderr, nil))
	}
	// launch runs controld and returns a client connection and its stop.
	launch := func() (*grpc.ClientConn, func()) {
		runCtx, stop := context.WithCancel(ctx)
		done := make(chan error, 1)
		ready := make(chan app.Addrs, 1)
		go func() {
			done <- app.Run(runCtx, cfg, app.Deps{Runtime: rt, Logger: log, OnReady: func(a app.Addrs) { ready <- a }})
		}()
		var addrs app.Addrs
		select {
		case addrs = <-ready:
		case err := <-done:
			t.Fatalf("controld: %v", err)
		}
		conn, err := grpc.NewClient("unix://"+addrs.GRPCUnix, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			t.Fatal(err)
		}
		return conn, func() {
			conn.Close()
			stop()
			if err := <-done; err != nil {
				t.Errorf("shutdown: %v", err)
			}
		}
	}
	conn, stopControld := launch()
	defer func() { stopControld() }()
	var (
		sbc controldv1.SandboxServiceClient
		ckc controldv1.CheckpointServiceClient
		plc controldv1.PoolServiceClient
	)
	clients := func(conn *grpc.ClientConn) {
		sbc = controldv1.NewSandboxServiceClient(conn)
		ckc = controldv1.NewCheckpointServiceClient(conn)
		plc = controldv1.NewPoolServiceClient(conn)
	}
	clients(conn)
	// Cleanup in dependency order: pool (its warm replicas), sandboxes
	// (forks pin their checkpoint), then the checkpoint.
	var created []string
	var poolID, ckID, diskCk, exportRef string
	var exportCks []string
	defer func() {
		bg := context.Background()
		if poolID != "" {
			if _, err := plc.DeletePool(bg, &controldv1.DeletePoolRequest{Id: poolID}); err != nil {
				t.Errorf("delete pool: %v", err)
			}
		}
		for _, id := range created {
			if _, err := sbc.DeleteSandbox(bg, &controldv1.DeleteSandboxRequest{Id: id}); err != nil {
				t.Errorf("delete %s: %v", id, err)
			}
		}
		for _, id := range exportCks {
			if _, err := ckc.DeleteCheckpoint(bg, &controldv1.DeleteCheckpointRequest{Id: id}); err != nil {
				t.Errorf("delete checkpoint %s: %v", id, err)
			}
		}
		if exportRef != "" {
			if err := rt.Client().ImageService().Delete(namespaces.WithNamespace(bg, ns), exportRef, images.SynchronousDelete()); err != nil {
				t.Errorf("delete image %s: %v", exportRef, err)
			}
		}
		if diskCk != "" {
			if _, err := ckc.DeleteCheckpoint(bg, &controldv1.DeleteCheckpointRequest{Id: diskCk}); err != nil {
				t.Errorf("delete disk checkpoint: %v", err)
			}
		}
		if ckID != "" {
			if _, err := ckc.DeleteCheckpoint(bg, &controldv1.DeleteCheckpointRequest{Id: ckID, Cascade: true}); err != nil {
				t.Errorf("delete checkpoint: %v", err)
			}
		}
	}()

	start := time.Now()
	cr, err := sbc.CreateSandbox(ctx, &controldv1.CreateSandboxRequest{WaitReady: true})
	if err != nil {
		t.Fatalf("create: %v (image %s, containerd %s, namespace %s)", err, cfg.DefaultImage, address, ns)
	}
	created = append(created, cr.Sandbox.Id)
	t.Logf("cold boot to usable: %v", time.Since(start))
	for _, p := range cr.Sandbox.Boot {
		t.Logf("  %-16s %v", p.Name, p.At.AsDuration())
	}
	sess, err := aci.Dial(ctx, cr.Endpoint.Url, cr.Endpoint.Token)
	if err != nil {
		t.Fatalf("ACI through the gateway: %v", err)
	}
	if rtt, err := sess.RTT(ctx); err != nil {
		t.Fatalf("ping: %v", err)
	} else {
		t.Logf("ACI ping through the gateway: %v", rtt)
	}
	// Keep the session open across the checkpoint: controld must drop it.
	start = time.Now()
	ck, err := ckc.CreateCheckpoint(ctx, &controldv1.CreateCheckpointRequest{SandboxId: cr.Sandbox.Id, Name: "it-golden"})
	if err != nil {
		t.Fatalf("checkpoint: %v", err)
	}
	sess.Close()
	ckID = ck.Checkpoint.Id
	t.Logf("checkpoint: %v (frozen %v, dump %v, layer %v; %d B memory, %d B layer)", time.Since(start),
		ck.Checkpoint.Timing.GetFrozen().AsDuration(), ck.Checkpoint.Timing.GetDump().AsDuration(),
		ck.Checkpoint.Timing.GetLayer().AsDuration(), ck.Checkpoint.MemoryBytes, ck.Checkpoint.LayerBytes)

	start = time.Now()
	fr, err := ckc.ForkCheckpoint(ctx, &controldv1.ForkCheckpointRequest{CheckpointId: ck.Checkpoint.Id, Count: 2})
	if err != nil {
		t.Fatalf("fork: %v", err)
	}
	t.Logf("fork x2 verified: %v", time.Since(start))
	for _, r := range fr.Replicas {
		if r.Sandbox != nil {
			created = append(created, r.Sandbox.Id)
		}
		if r.ErrorCode != 0 {
			t.Fatalf("replica failed (%d): %s", r.ErrorCode, r.ErrorMessage)
		}
		for _, v := range r.Verification {
			t.Logf("  %s %s ok=%v %s (%v)", r.Sandbox.Id, v.Level, v.Ok, v.Detail, v.Took.AsDuration())
		}
		rs, err := aci.Dial(ctx, r.Endpoint.Url, r.Endpoint.Token)
		if err != nil {
			t.Fatalf("replica ACI: %v", err)
		}
		if rs.Generation() != 1 {
			t.Errorf("replica generation %d, want 1", rs.Generation())
		}
		rs.Close()
		// CRIU does not restore the process-wide KSM opt-in: the private
		// CRIU's preload (deploy/criu/ksm.c) takes it before it forks the
		// restored processes, and guestd takes it again in restored.
		if out := notMerging(t, rt, r.Sandbox.Id); len(out) > 0 {
			t.Errorf("replica %s has processes not opted into KSM after its restore: %v", r.Sandbox.Id, out)
		}
		// The replica restored at 8 times its weight (fleet's
		// startupCPUWeight) and runs at its own once usable.
		if got, want := cpuWeightFile(t, rt, r.Sandbox.Id), defaultCPUWeightFile(rt); got != want {
			t.Errorf("replica %s's CPU weight after its fork: %s, want %s (its own, not the startup boost)", r.Sandbox.Id, got, want)
		}
	}

	// Disk tier: the fork boots fresh from the captured layer (marker only).
	start = time.Now()
	dck, err := ckc.CreateCheckpoint(ctx, &controldv1.CreateCheckpointRequest{SandboxId: cr.Sandbox.Id, Tier: controldv1.CheckpointTier_CHECKPOINT_TIER_DISK})
	if err != nil {
		t.Fatalf("disk checkpoint: %v", err)
	}
	diskCk = dck.Checkpoint.Id
	t.Logf("disk checkpoint: %v", time.Since(start))
	start = time.Now()
	dfr, err := ckc.ForkCheckpoint(ctx, &controldv1.ForkCheckpointRequest{CheckpointId: dck.Checkpoint.Id, Count: 1})
	if err != nil {
		t.Fatalf("disk fork: %v", err)
	}
	if r := dfr.Replicas[0]; r.ErrorCode != 0 {
		t.Fatalf("disk replica failed (%d): %s", r.ErrorCode, r.ErrorMessage)
	} else {
		created = append(created, r.Sandbox.Id)
		t.Logf("disk fork verified: %v (%s ok=%v)", time.Since(start), r.Verification[0].Level, r.Verification[0].Ok)
	}

	// Export and import through containerd's content store: a fork of the
	// imported checkpoint verifies like one of the original.
	xck, err := ckc.CreateCheckpoint(ctx, &controldv1.CreateCheckpointRequest{SandboxId: cr.Sandbox.Id})
	if err != nil {
		t.Fatalf("checkpoint to export: %v", err)
	}
	exportCks = append(exportCks, xck.Checkpoint.Id)
	exportRef = "localhost/forkfleet/controld-it-ck:" + xck.Checkpoint.Id
	start = time.Now()
	ex, err := ckc.ExportCheckpoint(ctx, &controldv1.ExportCheckpointRequest{Id: xck.Checkpoint.Id, Reference: exportRef})
	if err != nil {
		t.Fatalf("export: %v", err)
	}
	t.Logf("export: %v (%s, %d B)", time.Since(start), ex.Digest, ex.SizeBytes)
	start = time.Now()
	im, err := ckc.ImportCheckpoint(ctx, &controldv1.ImportCheckpointRequest{Reference: exportRef})
	if err != nil {
		t.Fatalf("import: %v", err)
	}
	exportCks = append([]string{im.Checkpoint.Id}, exportCks...)
	t.Logf("import: %v", time.Since(start))
	if im.Checkpoint.Id == xck.Checkpoint.Id || im.Checkpoint.Tier != xck.Checkpoint.Tier || im.Checkpoint.MemoryBytes != xck.Checkpoint.MemoryBytes {
		t.Errorf("imported %v, exported %v", im.Checkpoint, xck.Checkpoint)
	}
	ifr, err := ckc.ForkCheckpoint(ctx, &controldv1.ForkCheckpointRequest{CheckpointId: im.Checkpoint.Id, Count: 1})
	if err != nil {
		t.Fatalf("fork of the imported checkpoint: %v", err)
	}
	if r := ifr.Replicas[0]; r.ErrorCode != 0 {
		t.Fatalf("fork of the imported checkpoint failed (%d): %s", r.ErrorCode, r.ErrorMessage)
	} else {
		created = append(created, r.Sandbox.Id)
		for _, v := range r.Verification {
			if !v.Ok {
				t.Errorf("fork of the imported checkpoint: %s: %s", v.Level, v.Detail)
			}
		}
		if len(r.Verification) != 4 {
			t.Errorf("fork of the imported checkpoint verified %d levels, want 4 (marker, memory, pixels, network)", len(r.Verification))
		}
	}

	pl, err := plc.CreatePool(ctx, &controldv1.CreatePoolRequest{Source: &controldv1.CreatePoolRequest_CheckpointId{CheckpointId: ck.Checkpoint.Id}, Size: 1})
	if err != nil {
		t.Fatalf("pool: %v", err)
	}
	poolID = pl.Pool.Id
	deadline := time.Now().Add(2 * time.Minute)
	for {
		g, err := plc.GetPool(ctx, &controldv1.GetPoolRequest{Id: pl.Pool.Id})
		if err != nil {
			t.Fatal(err)
		}
		if g.Pool.Available == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("pool never warmed")
		}
		time.Sleep(50 * time.Millisecond)
	}
	cl, err := plc.ClaimPool(ctx, &controldv1.ClaimPoolRequest{PoolId: pl.Pool.Id})
	if err != nil {
		t.Fatalf("claim: %v", err)
	}
	created = append(created, cl.Sandbox.Id)
	t.Logf("frozen pool claim: hit=%v took=%v", cl.Hit, cl.Took.AsDuration())
	if !cl.Hit {
		t.Error("claim of a warm pool missed")
	}

	// A controld restart leaves sandboxes running and adopts them.
	stopControld()
	conn, stopControld = launch()
	clients(conn)
	g, err := sbc.GetSandbox(ctx, &controldv1.GetSandboxRequest{Id: cr.Sandbox.Id})
	if err != nil || g.Sandbox.State != controldv1.SandboxState_SANDBOX_STATE_READY {
		t.Fatalf("after restart: %v %v", g, err)
	}
	ep, err := sbc.GetSandboxEndpoint(ctx, &controldv1.GetSandboxEndpointRequest{Id: cr.Sandbox.Id})
	if err != nil {
		t.Fatal(err)
	}
	sess, err = aci.Dial(ctx, ep.Endpoint.Url, ep.Endpoint.Token)
	if err != nil {
		t.Fatalf("ACI after restart: %v", err)
	}
	if _, err := sess.Ping(ctx, nil); err != nil {
		t.Fatalf("ping after restart: %v", err)
	}
	sess.Close()

	// A replica nobody captured from since its verification gives its
	// capture segment back (guestd, aci.DefaultScratchIdle).
	idle := fr.Replicas[0].Sandbox.Id
	deadline = time.Now().Add(aciDefaultScratchIdle + 20*time.Second)
	for kb := guestdSysVResidentKB(t, rt, idle); kb != 0; kb = guestdSysVResidentKB(t, rt, idle) {
		if time.Now().After(deadline) {
			t.Fatalf("replica %s's guestd still holds %d KB of capture segments, %s after it could have let them go", idle, kb, aciDefaultScratchIdle+20*time.Second)
		}
		time.Sleep(250 * time.Millisecond)
	}
}

// cpuWeightFile reads sandbox id's CPU weight from its cgroup: cpu.shares
// (v1) or cpu.weight (v2).
func cpuWeightFile(t *testing.T, rt *containerdrt.Runtime, id string) string {
	t.Helper()
	c := rt.Config()
	path := filepath.Join(c.CgroupRoot, "cpu", c.CgroupParent, id, "cpu.shares")
	if _, err := os.Stat(path); errors.Is(err, fs.ErrNotExist) {
		path = filepath.Join(c.CgroupRoot, c.CgroupParent, id, "cpu.weight")
	}
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("CPU weight of %s: %v", id, err)
	}
	return strings.TrimSpace(string(b))
}

// defaultCPUWeightFile is what cpuWeightFile reads for the default weight
// (100): 1024 shares, or runc's conversion of them on cgroup v2.
func defaultCPUWeightFile(rt *containerdrt.Runtime) string {
	c := rt.Config()
	if _, err := os.Stat(filepath.Join(c.CgroupRoot, "cpu")); err == nil {
		return "1024"
	}
	return "39"
}

// aciDefaultScratchIdle is guestd's aci.DefaultScratchIdle (a guestd
// package controld's tests do not import).
const aciDefaultScratchIdle = 10 * time.Second

// guestdPid is the host pid of the guestd in sandbox id's cgroup.
func guestdPid(t *testing.T, rt *containerdrt.Runtime, id string) string {
	t.Helper()
	pids := sandboxPids(t, rt, id)
	for _, pid := range pids {
		if comm, err := os.ReadFile("/proc/" + pid + "/comm"); err == nil && strings.TrimSpace(string(comm)) == "guestd" {
			return pid
		}
	}
	t.Fatalf("no guestd among %s's processes %q", id, pids)
	return ""
}

// sandboxPids lists the processes of sandbox id (its pids cgroup).
func sandboxPids(t *testing.T, rt *containerdrt.Runtime, id string) []string {
	t.Helper()
	c := rt.Config()
	procs, err := os.ReadFile(filepath.Join(c.CgroupRoot, "pids", c.CgroupParent, id, "cgroup.procs"))
	if err != nil {
		t.Fatalf("processes of %s: %v", id, err)
	}
	return strings.Fields(string(procs))
}

// notMerging lists the processes of sandbox id that are not opted into KSM
// (/proc/<pid>/ksm_stat), as "comm(pid)"; nothing on a kernel without
// per-process KSM state.
func notMerging(t *testing.T, rt *containerdrt.Runtime, id string) []string {
	t.Helper()
	var out []string
	for _, pid := range sandboxPids(t, rt, id) {
		stat, err := os.ReadFile("/proc/" + pid + "/ksm_stat")
		if errors.Is(err, fs.ErrNotExist) {
			continue // exited, or a kernel without per-process KSM state
		}
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(string(stat), "ksm_merge_any: yes") {
			comm, _ := os.ReadFile("/proc/" + pid + "/comm")
			out = append(out, strings.TrimSpace(string(comm))+"("+pid+")")
		}
	}
	return out
}

// guestdSysVResidentKB sums the resident pages of the SysV shared memory
// sandbox id's guestd maps: its MIT-SHM capture segments.
func guestdSysVResidentKB(t *testing.T, rt *containerdrt.Runtime, id string) int {
	t.Helper()
	smaps, err := os.ReadFile("/proc/" + guestdPid(t, rt, id) + "/smaps")
	if err != nil {
		t.Fatal(err)
	}
	kb, sysv := 0, false
	for _, line := range strings.Split(string(smaps), "\n") {
		if f := strings.Fields(line); len(f) >= 5 && strings.Contains(f[0], "-") && !strings.HasSuffix(f[0], ":") {
			sysv = strings.Contains(line, "/SYSV")
			continue
		}
		if rest, ok := strings.CutPrefix(line, "Rss:"); ok && sysv {
			if f := strings.Fields(rest); len(f) > 0 {
				n, _ := strconv.Atoi(f[0])
				kb += n
			}
		}
	}
	return kb
}

// realStackConfig skips unless FORKFLEET_INTEGRATION=1, fails when the
// machine cannot run real-stack tests, and returns a test config on the
// containerd namespace testenv.Namespace(base): the real-stack tests' shared
// setup. Its runtime is made by realStackRuntime.
func realStackConfig(t *testing.T, base string) (cfg *config.Config, address, ns string) {
	t.Helper()
	testenv.RealStack(t)
	address, ns = testenv.Address(), testenv.Namespace(base)
	cfg = testConfig(t)
	cfg.Containerd.Address, cfg.Containerd.Namespace = address, ns
	cfg.BootTimeout = config.Duration(60 * time.Second)
	cfg.ShutdownTimeout = config.Duration(30 * time.Second)
	return cfg, address, ns
}

// realStackRuntime connects a runtime to cfg's namespace (state under
// stateDir) and brings the desktop image there, as cfg's default image.
func realStackRuntime(t *testing.T, ctx context.Context, cfg *config.Config, stateDir string) *containerdrt.Runtime {
	t.Helper()
	rt, err := containerdrt.New(ctx, containerdrt.Config{
		Address: cfg.Containerd.Address, Namespace: cfg.Containerd.Namespace,
		CheckpointRoot: cfg.CheckpointDir, StateDir: stateDir, LogWriter: testenv.LogWriter(t), NetHook: testenv.NetHook(t),
		LayersDir: testenv.LayersDir(), UserNamespaces: testenv.UserNamespaces(t, cfg.UserNS.Enabled),
		Registry: containerdrt.RegistryConfig{PartSize: int64(cfg.Registry.PartSize)},
	})
	if err != nil {
		t.Fatalf("runtime: %v", err)
	}
	// Checked after Close removed the precreated sandboxes (fork slots).
	testenv.NoLeakedShims(t, cfg.Containerd.Namespace)
	t.Cleanup(func() { rt.Close() })
	cfg.DefaultImage = testenv.Image(t, ctx, rt.Client(), cfg.Containerd.Namespace, testenv.Desktop)
	return rt
}
