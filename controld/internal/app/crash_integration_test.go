package app_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/containerd/containerd/v2/core/snapshots"
	"github.com/containerd/containerd/v2/pkg/namespaces"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/forkfleet/forkfleet/api/aci"
	"github.com/forkfleet/forkfleet/api/errdefs"
	"github.com/forkfleet/forkfleet/api/errdefs/errgrpc"
	aciv1 "github.com/forkfleet/forkfleet/api/gen/forkfleet/aci/v1"
	controldv1 "github.com/forkfleet/forkfleet/api/gen/forkfleet/controld/v1"
	"github.com/forkfleet/forkfleet/controld/internal/config"
	"github.com/forkfleet/forkfleet/controld/internal/containerdrt"
	"github.com/forkfleet/forkfleet/controld/internal/testenv"
)

// procStack runs the controld binary as its own process (so it can be
// SIGKILLed like a crash) on the real containerd, in its own namespace
// (forkfleet-crash-it, see testenv), with its own
// state dir, checkpoint dir and sockets. rt is the test's own view of that
// namespace, for inspection.
type procStack struct {
	t       *testing.T
	ctx     context.Context
	cfg     *config.Config
	ns      string
	address string
	bin     string
	cfgPath string
	logPath string
	rt      *containerdrt.Runtime
	// wrap, when set, runs controld through this command (controld's
	// command line appended), e.g. to apply the systemd unit's hardening.
	wrap []string
	// env is added to controld's environment (e.g. WATCHDOG_USEC).
	env []string
	// watchdogPings counts the WATCHDOG=1 controld sent, over all its
	// starts.
	watchdogPings atomic.Int32

	// Set by start.
	cmd    *exec.Cmd
	exited chan struct{}
	conn   *grpc.ClientConn
	sbc    controldv1.SandboxServiceClient
	ckc    controldv1.CheckpointServiceClient
}

func newProcStack(t *testing.T) *procStack {
	t.Helper()
	cfg, address, ns := realStackConfig(t, "forkfleet-crash-it")
	cfg.Boot.Precreate = 0 // every container in the namespace is one the test made
	cfg.GRPC.TCPAddress = ""
	cfg.Metrics.Listen = "127.0.0.1:0"
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	t.Cleanup(cancel)
	dir := filepath.Dir(cfg.StateDir)
	// The test's own view of the namespace, beside the controld it runs;
	// it brings the desktop image there and names it in cfg.
	rt := realStackRuntime(t, ctx, cfg, filepath.Join(dir, "test-runtime"))
	s := &procStack{t: t, ctx: ctx, cfg: cfg, ns: ns, address: address,
		bin: filepath.Join(t.TempDir(), "controld"), cfgPath: filepath.Join(dir, "controld.toml"),
		logPath: filepath.Join(dir, "controld.log"), rt: rt}

	goBin, err := exec.LookPath("go")
	if err != nil {
		t.Fatalf("FORKFLEET_INTEGRATION=1 but the go tool is not on PATH to build controld: %v", err)
	}
	start := time.Now()
	build := exec.CommandContext(ctx, goBin, "build", "-o", s.bin, "github.com/forkfleet/forkfleet/controld/cmd/controld")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("build controld: %v\n%s", err, out)
	}
	// controld finds its helpers beside its binary, as when installed.
	if err := testenv.BuildHelpers(filepath.Dir(s.bin)); err != nil {
		t.Fatal(err)
	}
	t.Logf("built controld and its helpers in %v", time.Since(start))
	b, err := cfg.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(s.cfgPath, b, 0o600); err != nil {
		t.Fatal(err)
	}

	t.Cleanup(func() {
		if t.Failed() {
			if b, err := os.ReadFile(s.logPath); err == nil {
				if len(b) > 16<<10 {
					b = b[len(b)-16<<10:]
				}
				t.Logf("controld log (tail):\n%s", b)
			}
		}
	})
	return s
}

// start runs controld and waits until it is READY.
func (s *procStack) start() {
	s.t.Helper()
	s.await(s.launch())
}

// launch starts controld; the channel reports READY=1 on its notification
// socket (sent once reconciliation is done and every listener serves).
func (s *procStack) launch() <-chan error {
	s.t.Helper()
	notifyPath := filepath.Join(filepath.Dir(s.cfg.StateDir), "notify.sock")
	os.Remove(notifyPath)
	notify, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: notifyPath, Net: "unixgram"})
	if err != nil {
		s.t.Fatal(err)
	}
	logf, err := os.OpenFile(s.logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		notify.Close()
		s.t.Fatal(err)
	}
	defer logf.Close()
	fmt.Fprintf(logf, "=== controld start %s\n", time.Now().Format(time.RFC3339Nano))

	argv := append(slices.Clone(s.wrap), s.bin, "--config", s.cfgPath)
	cmd := exec.Command(argv[0], argv[1:]...)
	// The environment overrides the file: name this test's namespace and
	// containerd explicitly, whatever the caller's environment says.
	for _, kv := range os.Environ() {
		k, _, _ := strings.Cut(kv, "=")
		if k == "NOTIFY_SOCKET" || strings.HasPrefix(k, "FORKFLEET_CONTAINERD_") || strings.HasPrefix(k, "OTEL_") {
			continue
		}
		cmd.Env = append(cmd.Env, kv)
	}
	cmd.Env = append(cmd.Env, "NOTIFY_SOCKET="+notifyPath,
		"FORKFLEET_CONTAINERD_NAMESPACE="+s.ns, "FORKFLEET_CONTAINERD_ADDRESS="+s.address)
	cmd.Env = append(cmd.Env, s.env...)
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		notify.Close()
		s.t.Fatalf("start controld: %v", err)
	}
	exited := make(chan struct{})
	go func() { cmd.Wait(); close(exited) }()
	s.cmd, s.exited, s.conn = cmd, exited, nil

	ready := make(chan error, 1)
	go func() {
		// Reads until controld exits: READY=1 once, then its watchdog
		// pings.
		defer notify.Close()
		buf := make([]byte, 4096)
		isReady := false
		for {
			n, err := notify.Read(buf)
			if err != nil {
				if !isReady {
					ready <- err
				}
				return
			}
			for _, m := range bytes.Split(buf[:n], []byte("\n")) {
				switch string(m) {
				case "READY=1":
					if !isReady {
						isReady = true
						ready <- nil
					}
				case "WATCHDOG=1":
					s.watchdogPings.Add(1)
				}
			}
		}
	}()
	go func() {
		// A controld that exits unblocks the reader.
		<-exited
		notify.SetReadDeadline(time.Now())
	}()
	return ready
}

// await waits for a launched controld to be READY and connects to it.
func (s *procStack) await(ready <-chan error) {
	s.t.Helper()
	// Reconciliation may wait for a dump the killed controld left running.
	select {
	case err := <-ready:
		if err != nil {
			s.t.Fatalf("controld not READY (%v): %v", s.cmd.ProcessState, err)
		}
	case <-time.After(3 * time.Minute):
		s.kill()
		s.t.Fatal("controld not READY after 3m")
	}
	conn, err := grpc.NewClient("unix://"+s.cfg.GRPC.UnixSocket, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		s.t.Fatal(err)
	}
	s.conn = conn
	s.sbc = controldv1.NewSandboxServiceClient(conn)
	s.ckc = controldv1.NewCheckpointServiceClient(conn)
}

func (s *procStack) running() bool {
	if s.cmd == nil {
		return false
	}
	select {
	case <-s.exited:
		return false
	default:
		return true
	}
}

// kill is the crash: SIGKILL, no shutdown sequence.
func (s *procStack) kill() {
	if !s.running() {
		return
	}
	s.cmd.Process.Signal(syscall.SIGKILL)
	<-s.exited
	if s.conn != nil {
		s.conn.Close()
	}
}

// stop is the orderly shutdown (SIGTERM).
func (s *procStack) stop() {
	s.t.Helper()
	if !s.running() {
		return
	}
	if s.conn != nil {
		s.conn.Close()
	}
	s.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-s.exited:
		if !s.cmd.ProcessState.Success() {
			s.t.Errorf("controld shutdown: %v", s.cmd.ProcessState)
		}
	case <-time.After(time.Minute):
		s.kill()
		s.t.Error("controld did not stop within 1m of SIGTERM")
	}
}

// cleanupAll deletes every sandbox and checkpoint controld has (through a
// running controld) and stops it. Registered first, it runs last.
func (s *procStack) cleanupAll() {
	s.t.Cleanup(func() {
		if !s.running() {
			if !s.t.Failed() {
				return // the test cleaned up and stopped controld itself
			}
			s.start()
		}
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
		defer cancel()
		if l, err := s.sbc.ListSandboxes(ctx, &controldv1.ListSandboxesRequest{}); err == nil {
			for _, sb := range l.Sandboxes {
				if _, err := s.sbc.DeleteSandbox(ctx, &controldv1.DeleteSandboxRequest{Id: sb.Id}); err != nil {
					s.t.Errorf("cleanup: delete sandbox %s: %v", sb.Id, err)
				}
			}
		}
		if l, err := s.ckc.ListCheckpoints(ctx, &controldv1.ListCheckpointsRequest{}); err == nil {
			for _, ck := range l.Checkpoints {
				if ck.ParentCheckpointId != "" {
					continue
				}
				if _, err := s.ckc.DeleteCheckpoint(ctx, &controldv1.DeleteCheckpointRequest{Id: ck.Id, Cascade: true}); err != nil {
					s.t.Errorf("cleanup: delete checkpoint %s: %v", ck.Id, err)
				}
			}
		}
		s.stop()
	})
}

// logWarnings logs the warnings and errors of controld's latest start
// (what reconciliation found and did).
func (s *procStack) logWarnings() {
	s.t.Helper()
	b, err := os.ReadFile(s.logPath)
	if err != nil {
		s.t.Fatal(err)
	}
	if i := bytes.LastIndex(b, []byte("=== controld start")); i >= 0 {
		b = b[i:]
	}
	for line := range strings.Lines(string(b)) {
		if strings.Contains(line, "level=WARN") || strings.Contains(line, "level=ERROR") {
			s.t.Logf("controld: %s", strings.TrimSpace(line))
		}
	}
}

func (s *procStack) nsCtx() context.Context { return namespaces.WithNamespace(s.ctx, s.ns) }

func (s *procStack) freezerState(id string) string {
	s.t.Helper()
	c := s.rt.Config()
	b, err := os.ReadFile(filepath.Join(c.CgroupRoot, "freezer", c.CgroupParent, id, "freezer.state"))
	if err != nil {
		s.t.Fatalf("freezer state of %s: %v", id, err)
	}
	return string(bytes.TrimSpace(b))
}

// checkpointLayers returns the committed snapshots marked as checkpoint
// layers, and every snapshot whose name marks it as a checkpoint's (in
// progress or committed).
func (s *procStack) checkpointLayers() (committed, all []string) {
	s.t.Helper()
	err := s.rt.Client().SnapshotService("overlayfs").Walk(s.nsCtx(), func(_ context.Context, info snapshots.Info) error {
		if strings.HasPrefix(info.Name, "forkfleet-checkpoint-") || strings.HasPrefix(info.Name, "forkfleet-export-") {
			all = append(all, info.Name)
		}
		if info.Kind == snapshots.KindCommitted && info.Labels["forkfleet.checkpoint"] != "" {
			committed = append(committed, info.Name)
		}
		return nil
	})
	if err != nil {
		s.t.Fatal(err)
	}
	slices.Sort(committed)
	slices.Sort(all)
	return committed, all
}

// leasedCheckpointLayers returns the leases holding a checkpoint's layer.
func (s *procStack) leasedCheckpointLayers() []string {
	s.t.Helper()
	ls := s.rt.Client().LeasesService()
	all, err := ls.List(s.nsCtx())
	if err != nil {
		s.t.Fatal(err)
	}
	var out []string
	for _, l := range all {
		res, err := ls.ListResources(s.nsCtx(), l)
		if err != nil {
			continue
		}
		for _, r := range res {
			if strings.HasPrefix(r.ID, "forkfleet-checkpoint-") {
				out = append(out, l.ID+":"+r.ID)
			}
		}
	}
	return out
}

func (s *procStack) containerIDs() []string {
	s.t.Helper()
	insts, err := s.rt.List(s.ctx)
	if err != nil {
		s.t.Fatal(err)
	}
	var ids []string
	for _, in := range insts {
		ids = append(ids, in.ID)
	}
	slices.Sort(ids)
	return ids
}

func (s *procStack) checkpointDirEntries() []string {
	s.t.Helper()
	entries, err := os.ReadDir(s.cfg.CheckpointDir)
	if err != nil {
		s.t.Fatal(err)
	}
	var names []string
	for _, e := range entries {
		names = append(names, e.Name())
	}
	return names
}

// dumpWorkDirs returns the runtime's CRIU work directories of sandbox id.
func (s *procStack) dumpWorkDirs(id string) []string {
	s.t.Helper()
	m, err := filepath.Glob(filepath.Join(s.rt.Config().StateDir, "work", id+"-dump-*"))
	if err != nil {
		s.t.Fatal(err)
	}
	return m
}

// runcCheckpointPid returns the pid of a runc checkpoint of id, or 0.
func runcCheckpointPid(id string) int {
	procs, _ := filepath.Glob("/proc/[0-9]*/cmdline")
	for _, p := range procs {
		b, err := os.ReadFile(p)
		if err != nil || len(b) == 0 {
			continue
		}
		argv := strings.Split(strings.TrimRight(string(b), "\x00"), "\x00")
		if filepath.Base(argv[0]) == "runc" && slices.Contains(argv, "checkpoint") && argv[len(argv)-1] == id {
			pid, _ := strconv.Atoi(filepath.Base(filepath.Dir(p)))
			return pid
		}
	}
	return 0
}

// runcCheckpointRunning reports whether a runc checkpoint of id runs.
func runcCheckpointRunning(id string) bool { return runcCheckpointPid(id) != 0 }

func tracerOf(pid uint32) int {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0
	}
	for line := range strings.Lines(string(b)) {
		if v, ok := strings.CutPrefix(line, "TracerPid:"); ok {
			n, _ := strconv.Atoi(strings.TrimSpace(v))
			return n
		}
	}
	return 0
}

// dialACI opens an agent session through the gateway, retrying while the
// sandbox is not answering yet (a guestd checkpoint hold, a thaw): up to
// 30 s on a loaded machine.
func (s *procStack) dialACI(id string) *aci.Session {
	s.t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		ep, err := s.sbc.GetSandboxEndpoint(s.ctx, &controldv1.GetSandboxEndpointRequest{Id: id})
		if err != nil {
			s.t.Fatalf("endpoint of %s: %v", id, err)
		}
		dctx, cancel := context.WithTimeout(s.ctx, 5*time.Second)
		sess, err := aci.Dial(dctx, ep.Endpoint.Url, ep.Endpoint.Token)
		if err == nil {
			_, err = sess.Ping(dctx, nil)
			if err != nil {
				sess.Close()
			}
		}
		cancel()
		if err == nil {
			return sess
		}
		if time.Now().After(deadline) {
			s.t.Fatalf("ACI of %s does not answer: %v", id, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// shell executes a shell command in the sandbox and returns its stdout.
func shell(t *testing.T, ctx context.Context, sess *aci.Session, script string) string {
	t.Helper()
	r, err := sess.Exec(ctx, &aciv1.ExecRequest{Argv: []string{"/bin/sh", "-c", script}, TimeoutMs: 60_000})
	if err != nil {
		t.Fatalf("exec %q: %v", script, err)
	}
	if r.ExitCode != 0 {
		t.Fatalf("exec %q: exit %d: %s", script, r.ExitCode, r.Stderr)
	}
	return strings.TrimSpace(string(r.Stdout))
}

// launchHolder starts a detached program in the sandbox that prepares
// something and then touches ready; it waits for ready and returns the pid.
func launchHolder(t *testing.T, ctx context.Context, sess *aci.Session, script, ready string) int {
	t.Helper()
	pid, err := sess.Launch(ctx, &aciv1.LaunchRequest{Argv: []string{"/bin/sh", "-c", script}})
	if err != nil {
		t.Fatalf("launch %q: %v", script, err)
	}
	deadline := time.Now().Add(time.Minute)
	for {
		r, err := sess.Exec(ctx, &aciv1.ExecRequest{Argv: []string{"/bin/test", "-e", ready}})
		if err != nil {
			t.Fatal(err)
		}
		if r.ExitCode == 0 {
			return pid
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s never appeared (script %q)", ready, script)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// startWithSandbox starts controld on a clean namespace and boots the
// sandbox (labelled test=label) a real-stack checkpoint test starts from.
func (s *procStack) startWithSandbox(label string) string {
	s.t.Helper()
	s.start()
	s.cleanupAll()
	cr, err := s.sbc.CreateSandbox(s.ctx, &controldv1.CreateSandboxRequest{WaitReady: true, Labels: map[string]string{"test": label}})
	if err != nil {
		s.t.Fatalf("create: %v", err)
	}
	return cr.Sandbox.Id
}

// assertNoHalfCheckpoint checks that no checkpoint is listed, the
// checkpoint dir is empty and containerd holds no checkpoint layer, lease
// or dump work directory for src.
func (s *procStack) assertNoHalfCheckpoint(src string, layersBefore []string) {
	s.t.Helper()
	l, err := s.ckc.ListCheckpoints(s.ctx, &controldv1.ListCheckpointsRequest{})
	if err != nil {
		s.t.Fatal(err)
	}
	if len(l.Checkpoints) != 0 {
		s.t.Errorf("checkpoints listed: %v", l.Checkpoints)
	}
	if e := s.checkpointDirEntries(); len(e) != 0 {
		s.t.Errorf("checkpoint dir %s holds %v", s.cfg.CheckpointDir, e)
	}
	if _, all := s.checkpointLayers(); !slices.Equal(all, layersBefore) {
		s.t.Errorf("checkpoint snapshots in containerd: %v, before the checkpoint %v", all, layersBefore)
	}
	if l := s.leasedCheckpointLayers(); len(l) != 0 {
		s.t.Errorf("leases still hold checkpoint layers: %v", l)
	}
	if w := s.dumpWorkDirs(src); len(w) != 0 {
		s.t.Errorf("dump work dirs left: %v", w)
	}
}

// checkpointForkDelete checkpoints src, forks one verified replica,
// deletes it and the checkpoint, and checks the checkpoint's directory and
// committed layer are gone (garbage collection of what nothing references).
func (s *procStack) checkpointForkDelete(src string) {
	s.t.Helper()
	ctx := s.ctx
	committedBefore, _ := s.checkpointLayers()
	ck, err := s.ckc.CreateCheckpoint(ctx, &controldv1.CreateCheckpointRequest{SandboxId: src})
	if err != nil {
		s.t.Fatalf("checkpoint of the recovered source: %v", err)
	}
	s.t.Logf("checkpoint %s: frozen %v, dump %v, total %v", ck.Checkpoint.Id, ck.Checkpoint.Timing.GetFrozen().AsDuration(),
		ck.Checkpoint.Timing.GetDump().AsDuration(), ck.Checkpoint.Timing.GetTotal().AsDuration())
	if st := s.freezerState(src); st != "THAWED" {
		s.t.Errorf("source freezer after a checkpoint: %s", st)
	}
	committed, _ := s.checkpointLayers()
	added := slices.DeleteFunc(slices.Clone(committed), func(n string) bool { return slices.Contains(committedBefore, n) })
	if len(added) != 1 {
		s.t.Fatalf("committed checkpoint layers %v (before %v): want one more", committed, committedBefore)
	}
	ckDir := filepath.Join(s.cfg.CheckpointDir, ck.Checkpoint.Id)
	if _, err := os.Stat(ckDir); err != nil {
		s.t.Fatalf("checkpoint dir: %v", err)
	}

	fr, err := s.ckc.ForkCheckpoint(ctx, &controldv1.ForkCheckpointRequest{CheckpointId: ck.Checkpoint.Id, Count: 1})
	if err != nil {
		s.t.Fatalf("fork: %v", err)
	}
	r := fr.Replicas[0]
	if r.ErrorCode != 0 {
		s.t.Fatalf("replica failed (%d): %s", r.ErrorCode, r.ErrorMessage)
	}
	for _, v := range r.Verification {
		if !v.Ok {
			s.t.Errorf("replica %s: %s: %s", r.Sandbox.Id, v.Level, v.Detail)
		}
	}
	if len(r.Verification) != 4 {
		s.t.Errorf("replica verified %d levels, want 4 (marker, memory, pixels, network)", len(r.Verification))
	}
	if _, err := s.sbc.DeleteSandbox(ctx, &controldv1.DeleteSandboxRequest{Id: r.Sandbox.Id}); err != nil {
		s.t.Fatal(err)
	}
	if _, err := s.ckc.DeleteCheckpoint(ctx, &controldv1.DeleteCheckpointRequest{Id: ck.Checkpoint.Id}); err != nil {
		s.t.Fatalf("delete checkpoint: %v", err)
	}
	if _, err := os.Stat(ckDir); !errors.Is(err, os.ErrNotExist) {
		s.t.Errorf("deleted checkpoint's dir: %v", err)
	}
	if committed, _ := s.checkpointLayers(); !slices.Equal(committed, committedBefore) {
		s.t.Errorf("committed checkpoint layers after delete: %v, want %v", committed, committedBefore)
	}
}

// TestRealStackCrashDuringCheckpoint kills controld (SIGKILL, a separate
// process) while CRIU dumps a memory-tier checkpoint of a live desktop, with
// the source frozen, and restarts it on the same state: the source is READY,
// thawed and answers over the ACI, no checkpoint is listed, and nothing of
// the interrupted one is left (temporary directory, layers, leases, CRIU
// work directory); a new checkpoint and a verified fork of the source work,
// and deleting that checkpoint removes its directory and layer. Opt in with
// FORKFLEET_INTEGRATION=1.
func TestRealStackCrashDuringCheckpoint(t *testing.T) {
	probe := testenv.Tool(t, "grpc-health-probe")
	s := newProcStack(t)
	ctx := s.ctx
	src := s.startWithSandbox("crash")
	inst, err := s.rt.Get(ctx, src)
	if err != nil {
		t.Fatal(err)
	}
	// Ballast: 64 MB in a process's heap stretches the dump (the window the
	// kill must hit).
	sess := s.dialACI(src)
	launchHolder(t, ctx, sess, `x=$(head -c 67108864 /dev/zero | tr '\0' x); : > /tmp/ballast.ready; sleep 1000000`, "/tmp/ballast.ready")
	shell(t, ctx, sess, "echo before-crash > /tmp/crash-marker")
	sess.Close()
	_, layersBefore := s.checkpointLayers()

	// Checkpoint, and kill controld once the source was frozen and CRIU
	// has seized its init: the dump is in flight. A dump too quick for the
	// poll completes; its checkpoint is deleted and the round repeated.
	var killedAt time.Time
	var paused int // the paused process of the dump
	for attempt := 1; killedAt.IsZero(); attempt++ {
		if attempt > 8 {
			t.Fatal("no dump window caught in 8 checkpoints")
		}
		res := make(chan error, 1)
		var ck *controldv1.CreateCheckpointResponse
		go func() {
			var err error
			ck, err = s.ckc.CreateCheckpoint(ctx, &controldv1.CreateCheckpointRequest{SandboxId: src, Name: "crash-victim"})
			res <- err
		}()
		frozen := false
	poll:
		for {
			select {
			case err := <-res:
				if err != nil {
					t.Fatalf("checkpoint attempt %d failed before the kill: %v", attempt, err)
				}
				t.Logf("attempt %d: checkpoint completed before the dump was seen (frozen seen: %v); again", attempt, frozen)
				if _, err := s.ckc.DeleteCheckpoint(ctx, &controldv1.DeleteCheckpointRequest{Id: ck.Checkpoint.Id}); err != nil {
					t.Fatal(err)
				}
				break poll
			default:
			}
			// controld freezes the sandbox before it starts CRIU; CRIU
			// seizes every task with ptrace while the cgroup is frozen,
			// thaws the cgroup (the tasks stay stopped under ptrace),
			// dumps, and at its end restores the FROZEN state it found.
			if !frozen && s.freezerState(src) == "FROZEN" {
				frozen = true
			}
			if tracer := tracerOf(inst.PID); frozen && tracer != 0 {
				// Pause the dump so the restart below surely meets it still
				// running, however fast this machine is: runc when the dump
				// goes through runc (CRIU then blocks at its next
				// notification), else CRIU itself, a child of controld
				// that outlives it (its tasks stay seized and stopped).
				pid := runcCheckpointPid(src)
				if pid == 0 {
					pid = tracer
				}
				if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
					t.Logf("attempt %d: pause the dump (pid %d): %v; it ended", attempt, pid, err)
					continue
				}
				paused = pid
				// Should the test stop before resuming it, never leave the
				// dump (and the sandbox) hanging.
				t.Cleanup(func() {
					if paused != 0 {
						syscall.Kill(paused, syscall.SIGCONT)
					}
				})
				s.kill()
				killedAt = time.Now()
				if err := <-res; status.Code(err) != codes.Unavailable {
					t.Logf("checkpoint call at the kill: %v", err)
				}
				t.Logf("attempt %d: SIGKILLed controld while CRIU (pid %d) dumps the frozen source (pid %d paused)", attempt, tracer, paused)
				break poll
			}
			time.Sleep(200 * time.Microsecond)
		}
	}
	// What the crash left: the source frozen, the dump still running
	// (paused), a temporary checkpoint directory.
	dumpRunning := func() bool { return tracerOf(inst.PID) != 0 || runcCheckpointRunning(src) }
	t.Logf("after the kill: freezer %s, dump running %v, checkpoint dir %v",
		s.freezerState(src), dumpRunning(), s.checkpointDirEntries())

	// Restart with the dump still running: reconciliation must wait for it
	// (thawing now would be undone by the FROZEN state CRIU restores at its
	// end, and removing its directory would fail it half way).
	restart := time.Now()
	ready := s.launch()
	select {
	case err := <-ready:
		if err != nil {
			t.Fatalf("controld did not start: %v", err)
		}
		t.Fatal("controld served while the interrupted dump was still running")
	case <-time.After(2 * time.Second):
	}
	// Its listeners answer, and say so: not serving while it reconciles.
	unixAddr := "unix://" + s.cfg.GRPC.UnixSocket
	if code, out := healthProbe(t, probe, "-addr", unixAddr); code != 4 || !strings.Contains(out, "NOT_SERVING") {
		t.Errorf("grpc-health-probe while reconciliation waits for the dump: exit %d %q, want 4 NOT_SERVING", code, out)
	}
	if e := s.checkpointDirEntries(); len(e) != 1 {
		t.Errorf("checkpoint dir while the interrupted dump runs: %v, want its temporary dir untouched", e)
	}
	if err := syscall.Kill(paused, syscall.SIGCONT); err != nil {
		t.Fatalf("resume the dump: %v", err)
	}
	paused = 0
	resumed := time.Now()
	s.await(ready)
	t.Logf("controld READY %v after the dump resumed (%v after the restart)", time.Since(resumed), time.Since(restart))
	if code, out := healthProbe(t, probe, "-addr", unixAddr); code != 0 {
		t.Errorf("grpc-health-probe once READY: exit %d %q, want SERVING", code, out)
	}
	if dumpRunning() {
		t.Error("controld served before the interrupted dump ended")
	}
	s.logWarnings()
	g, err := s.sbc.GetSandbox(ctx, &controldv1.GetSandboxRequest{Id: src})
	if err != nil {
		t.Fatal(err)
	}
	if g.Sandbox.State != controldv1.SandboxState_SANDBOX_STATE_READY {
		t.Errorf("source after the restart: %s (%s), want READY", g.Sandbox.State, g.Sandbox.StatusMessage)
	}
	if st := s.freezerState(src); st != "THAWED" {
		t.Fatalf("source freezer after the restart: %s, want THAWED", st)
	}
	sess = s.dialACI(src)
	if got := shell(t, ctx, sess, "cat /tmp/crash-marker"); got != "before-crash" {
		t.Errorf("source marker after the restart: %q", got)
	}
	sess.Close()
	if _, err := s.ckc.GetCheckpoint(ctx, &controldv1.GetCheckpointRequest{Id: "crash-victim"}); status.Code(err) != codes.NotFound {
		t.Errorf("the interrupted checkpoint by name: %v, want NotFound", err)
	}
	s.assertNoHalfCheckpoint(src, layersBefore)
	if ids := s.containerIDs(); !slices.Equal(ids, []string{src}) {
		t.Errorf("containers in %s: %v, want only the source %s", s.ns, ids, src)
	}
	// Still thawed once everything settled (a dump ending late would
	// restore the FROZEN state it found).
	time.Sleep(500 * time.Millisecond)
	if st := s.freezerState(src); st != "THAWED" {
		t.Fatalf("source freezer a moment after the restart: %s, want THAWED", st)
	}

	s.checkpointForkDelete(src)
	if _, err := s.sbc.DeleteSandbox(ctx, &controldv1.DeleteSandboxRequest{Id: src}); err != nil {
		t.Fatal(err)
	}
	s.stop()
	if ids := s.containerIDs(); len(ids) != 0 {
		t.Errorf("containers left in %s: %v", s.ns, ids)
	}
}

// TestRealStackCheckpointDumpFailure makes CRIU fail half way through a
// dump, on a real and deterministic cause: a process in the sandbox holds a
// 16 MiB file it deleted (CRIU refuses ghost files over its 1 MiB limit, and
// it finds out only while dumping the frozen tree's files). The checkpoint
// fails with a typed error naming the cause, the source stays READY, thawed
// and answering, and nothing is listed or left behind. Once the holder
// exits, the same source checkpoints and forks. Opt in with
// FORKFLEET_INTEGRATION=1.
func TestRealStackCheckpointDumpFailure(t *testing.T) {
	s := newProcStack(t)
	ctx := s.ctx
	src := s.startWithSandbox("dump-failure")
	sess := s.dialACI(src)
	holder := launchHolder(t, ctx, sess,
		`exec 3<>/tmp/ghost; head -c 16777216 /dev/zero >&3; rm /tmp/ghost; : > /tmp/ghost.ready; exec sleep 1000000`, "/tmp/ghost.ready")
	sess.Close()
	_, layersBefore := s.checkpointLayers()

	start := time.Now()
	_, err := s.ckc.CreateCheckpoint(ctx, &controldv1.CreateCheckpointRequest{SandboxId: src, Name: "undumpable"})
	if err == nil {
		t.Fatal("checkpoint of a sandbox holding a 16 MiB deleted file succeeded; want a CRIU failure")
	}
	t.Logf("expected failure after %v: %.600s", time.Since(start), err)
	st, _ := status.FromError(err)
	if c := st.Code(); c != codes.FailedPrecondition && c != codes.Internal {
		t.Errorf("code %v, want FAILED_PRECONDITION or INTERNAL", c)
	}
	if cls := errgrpc.FromGRPC(err); !errors.Is(cls, errdefs.ErrFailedPrecondition) && !errors.Is(cls, errdefs.ErrInternal) {
		t.Errorf("error class of %v: not one of forkfleet's", cls)
	}
	if msg := st.Message(); !strings.Contains(msg, "criu dump") || !strings.Contains(msg, "ghost file") {
		t.Errorf("message does not name the dump and CRIU's cause: %q", msg)
	}

	g, err := s.sbc.GetSandbox(ctx, &controldv1.GetSandboxRequest{Id: src})
	if err != nil || g.Sandbox.State != controldv1.SandboxState_SANDBOX_STATE_READY {
		t.Fatalf("source after the failed dump: %v %v, want READY", g, err)
	}
	if fs := s.freezerState(src); fs != "THAWED" {
		t.Fatalf("source freezer after the failed dump: %s, want THAWED", fs)
	}
	sess = s.dialACI(src)
	shell(t, ctx, sess, fmt.Sprintf("kill -0 %d", holder)) // the holder lives on
	s.assertNoHalfCheckpoint(src, layersBefore)

	// The cause gone, the source checkpoints and forks.
	shell(t, ctx, sess, fmt.Sprintf("kill %d", holder))
	sess.Close()
	s.checkpointForkDelete(src)
	if _, err := s.sbc.DeleteSandbox(ctx, &controldv1.DeleteSandboxRequest{Id: src}); err != nil {
		t.Fatal(err)
	}
	s.stop()
	if ids := s.containerIDs(); len(ids) != 0 {
		t.Errorf("containers left in %s: %v", s.ns, ids)
	}
}
