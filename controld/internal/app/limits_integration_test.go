package app_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	goruntime "runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/forkfleet/forkfleet/api/aci"
	"github.com/forkfleet/forkfleet/api/errdefs"
	"github.com/forkfleet/forkfleet/api/errdefs/errgrpc"
	aciv1 "github.com/forkfleet/forkfleet/api/gen/forkfleet/aci/v1"
	controldv1 "github.com/forkfleet/forkfleet/api/gen/forkfleet/controld/v1"
	"github.com/forkfleet/forkfleet/api/limits"
	"github.com/forkfleet/forkfleet/controld/internal/btrfs"
	"github.com/forkfleet/forkfleet/controld/internal/testenv"
)

// The limits tests attack a real sandbox from inside, as a model driving it
// could, and check the host: controld on the real stack in its own
// namespace (forkfleet-limits-it, see testenv).

// create boots a sandbox with res and returns it with an ACI session. Its
// agent runs as root (run_as_root): the strongest attacker a sandbox holds,
// and the one that can write anywhere in its layer and into guestd's stdio.
func (s *bootStack) create(res *controldv1.Resources) (*controldv1.Sandbox, *aci.Session) {
	s.t.Helper()
	cr, err := s.sbc.CreateSandbox(s.ctx, &controldv1.CreateSandboxRequest{WaitReady: true, Resources: res, RunAsRoot: true})
	if err != nil {
		s.t.Fatalf("create: %v", err)
	}
	s.t.Cleanup(func() { s.sbc.DeleteSandbox(context.Background(), &controldv1.DeleteSandboxRequest{Id: cr.Sandbox.Id}) })
	sess, err := aci.Dial(s.ctx, cr.Endpoint.Url, cr.Endpoint.Token)
	if err != nil {
		s.t.Fatalf("ACI of %s: %v", cr.Sandbox.Id, err)
	}
	s.t.Cleanup(func() { sess.Close() })
	return cr.Sandbox, sess
}

// dial opens a new ACI session to sandbox id (a checkpoint closes agents'
// sessions).
func (s *bootStack) dial(id string) *aci.Session {
	s.t.Helper()
	ep, err := s.sbc.GetSandboxEndpoint(s.ctx, &controldv1.GetSandboxEndpointRequest{Id: id})
	if err != nil {
		s.t.Fatalf("endpoint of %s: %v", id, err)
	}
	sess, err := aci.Dial(s.ctx, ep.Endpoint.Url, ep.Endpoint.Token)
	if err != nil {
		s.t.Fatalf("ACI of %s: %v", id, err)
	}
	s.t.Cleanup(func() { sess.Close() })
	return sess
}

// run executes a shell script in the sandbox and returns its result.
func run(t *testing.T, ctx context.Context, sess *aci.Session, script string, timeout time.Duration) *aciv1.ExecResponse {
	t.Helper()
	r, err := sess.Exec(ctx, &aciv1.ExecRequest{Argv: []string{"/bin/sh", "-c", script}, TimeoutMs: uint32(timeout.Milliseconds())})
	if err != nil {
		t.Fatalf("exec %q: %v", script, err)
	}
	return r
}

// A sandbox that prints without end never keeps more than its log budget on
// the host, and is not held up by its log. The flood goes where a sandbox's
// own output reaches the host: the output of a program guestd supervises
// (xterm's stdout, which the agent user can open: guestd itself is not
// dumpable, so its /proc/1/fd is closed to every sandbox process).
func TestRealStackLogFlood(t *testing.T) {
	s := newStackIn(t, "forkfleet-limits-it")
	s.launch(0)
	const budget = 256 << 10
	sb, sess := s.create(&controldv1.Resources{LogBytes: budget})
	if got := sb.GetResources().GetLogBytes(); got != budget {
		t.Fatalf("log budget %d", got)
	}
	// Two writers of 64 MiB of lines each, then a last line.
	start := time.Now()
	r := run(t, s.ctx, sess, `set -e
for p in /proc/[0-9]*; do [ "$(cat $p/comm 2>/dev/null)" = xterm ] && out=$p/fd/1 && break; done
[ -n "$out" ] || { echo no xterm >&2; exit 3; }
line=$(head -c 200 /dev/zero | tr '\0' x)
yes "$line" | head -c 67108864 >$out &
yes "${line}y" | head -c 67108864 >$out; wait; echo the-last-line >$out`, time.Minute)
	if r.ExitCode != 0 {
		t.Fatalf("flood: exit %d %s", r.ExitCode, r.Stderr)
	}
	t.Logf("128 MiB printed in %v", time.Since(start))
	logPath := filepath.Join(s.rt.Config().StateDir, "logs", sb.Id+".log")
	var total int64
	deadline := time.Now().Add(10 * time.Second)
	for {
		total = 0
		for _, p := range []string{logPath, logPath + ".1"} {
			if st, err := os.Stat(p); err == nil {
				total += st.Size()
			}
		}
		b, _ := os.ReadFile(logPath)
		if strings.Contains(string(b), "the-last-line") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the last line never reached the log (%d bytes kept)", total)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if total > budget {
		t.Fatalf("%d bytes of log on the host, budget %d", total, budget)
	}
	t.Logf("log on the host: %d bytes (budget %d)", total, budget)
	if _, err := sess.Ping(s.ctx, nil); err != nil {
		t.Fatalf("sandbox unresponsive after the flood: %v", err)
	}
}

// cgroupValue reads a sandbox's cgroup v1 file (controld's runtime puts
// every sandbox at /forkfleet/<id> in each hierarchy).
func cgroupValue(t *testing.T, controller, id, file string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("/sys/fs/cgroup", controller, "forkfleet", id, file))
	if err != nil {
		t.Fatalf("cgroup of %s: %v", id, err)
	}
	return strings.TrimSpace(string(b))
}

// limitReached waits until controld reports sandbox id at limit, and
// returns what it says.
func (s *bootStack) limitReached(id string, limit controldv1.SandboxLimit, done func(*controldv1.LimitReached) bool) *controldv1.LimitReached {
	s.t.Helper()
	deadline := time.Now().Add(90 * time.Second)
	for {
		g, err := s.sbc.GetSandbox(s.ctx, &controldv1.GetSandboxRequest{Id: id})
		if err != nil {
			s.t.Fatalf("get %s: %v", id, err)
		}
		for _, r := range g.Sandbox.GetLimitsReached() {
			if r.GetLimit() == limit && done(r) {
				return r
			}
		}
		if time.Now().After(deadline) {
			s.t.Fatalf("controld never reported %s on %s (limits reached: %v)", limit, id, g.Sandbox.GetLimitsReached())
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// The limits hold on the real stack against a sandbox attacking them: a
// fork bomb stops at pids_max, a memory hog is killed inside its sandbox
// while its guestd lives on, a disk filler stops at its quota and the
// host's disk is untouched; a sandbox next to them keeps working, and
// controld reports each limit reached. It runs attacks that load the
// machine: under make test they run like any test, by hand take the bench
// lock (flock /tmp/forkfleet-bench.lock) on a shared machine.
func TestRealStackLimits(t *testing.T) {
	s := newStackIn(t, "forkfleet-limits-it")
	s.launch(0)
	neighbour, nsess := s.create(nil)
	def := limits.Default().Default
	if got := cgroupValue(t, "pids", neighbour.Id, "pids.max"); got != strconv.FormatInt(def.GetPidsMax(), 10) {
		t.Errorf("default pids.max %s, want %d", got, def.GetPidsMax())
	}
	if got := cgroupValue(t, "memory", neighbour.Id, "memory.limit_in_bytes"); got != strconv.FormatInt(def.GetMemoryBytes(), 10) {
		t.Errorf("default memory limit %s, want %d", got, def.GetMemoryBytes())
	}
	if got := cgroupValue(t, "memory", neighbour.Id, "memory.memsw.limit_in_bytes"); got != strconv.FormatInt(def.GetMemoryBytes(), 10) {
		t.Errorf("memory+swap limit %s: the sandbox may swap", got)
	}
	if got := cgroupValue(t, "cpu", neighbour.Id, "cpu.shares"); got != "1024" {
		t.Errorf("default cpu.shares %s, want 1024 (weight 100)", got)
	}
	alive := func(what string) {
		t.Helper()
		if r := run(t, s.ctx, nsess, "echo ok", 30*time.Second); r.ExitCode != 0 || strings.TrimSpace(string(r.Stdout)) != "ok" {
			t.Fatalf("the neighbour sandbox after %s: %+v", what, r)
		}
		if out, err := exec.Command("/bin/true").CombinedOutput(); err != nil {
			t.Fatalf("the host cannot start a process after %s: %v %s", what, err, out)
		}
	}

	t.Run("fork bomb", func(t *testing.T) {
		sb, sess := s.create(&controldv1.Resources{PidsMax: 256, CpuMillis: 500, CpuWeight: 50})
		if got := cgroupValue(t, "pids", sb.Id, "pids.max"); got != "256" {
			t.Fatalf("pids.max %s", got)
		}
		if got := cgroupValue(t, "cpu", sb.Id, "cpu.shares"); got != "512" {
			t.Errorf("cpu.shares %s, want 512 (weight 50)", got)
		}
		if _, err := sess.Launch(s.ctx, &aciv1.LaunchRequest{Argv: []string{"/bin/sh", "-c", "b(){ b | b & }; b"}}); err != nil {
			t.Fatal(err)
		}
		// Sampled until the bomb presses on the limit, and a second more.
		peak := 0
		deadline, until := time.Now().Add(60*time.Second), time.Time{}
		for time.Now().Before(deadline) && (until.IsZero() || time.Now().Before(until)) {
			n, _ := strconv.Atoi(cgroupValue(t, "pids", sb.Id, "pids.current"))
			peak = max(peak, n)
			if peak >= 250 && until.IsZero() {
				until = time.Now().Add(time.Second)
			}
			time.Sleep(10 * time.Millisecond)
		}
		if peak < 250 || peak > 256 {
			t.Fatalf("fork bomb peaked at %d tasks, want it held at 256", peak)
		}
		r := s.limitReached(sb.Id, controldv1.SandboxLimit_SANDBOX_LIMIT_PIDS, func(r *controldv1.LimitReached) bool { return r.GetCount() > 0 })
		t.Logf("held at %d tasks; controld: %s", peak, r.GetMessage())
		alive("the fork bomb")
		start := time.Now()
		if _, err := s.sbc.DeleteSandbox(s.ctx, &controldv1.DeleteSandboxRequest{Id: sb.Id}); err != nil {
			t.Fatalf("delete the bombed sandbox: %v", err)
		}
		t.Logf("bombed sandbox deleted in %v", time.Since(start))
		if _, err := os.Stat(filepath.Join("/sys/fs/cgroup/pids/forkfleet", sb.Id)); !errors.Is(err, os.ErrNotExist) {
			t.Fatalf("its cgroup outlived it: %v", err)
		}
	})

	t.Run("memory hog", func(t *testing.T) {
		sb, sess := s.create(&controldv1.Resources{MemoryBytes: 256 << 20})
		if got := cgroupValue(t, "memory", sb.Id, "memory.limit_in_bytes"); got != strconv.Itoa(256<<20) {
			t.Fatalf("memory limit %s", got)
		}
		// dd's 1 GiB buffer, filled from /dev/zero: four times the limit.
		r := run(t, s.ctx, sess, "dd if=/dev/zero of=/dev/null bs=1G count=1", time.Minute)
		if r.ExitCode == 0 && r.Signal == "" {
			t.Fatalf("a 1 GiB buffer fit in a 256 MiB sandbox: %+v", r)
		}
		t.Logf("the hog: exit %d signal %q", r.ExitCode, r.Signal)
		if _, err := sess.Ping(s.ctx, nil); err != nil {
			t.Fatalf("guestd died with the hog: %v", err)
		}
		if r := run(t, s.ctx, sess, "echo still here", 30*time.Second); strings.TrimSpace(string(r.Stdout)) != "still here" {
			t.Fatalf("the sandbox after the hog: %+v", r)
		}
		lr := s.limitReached(sb.Id, controldv1.SandboxLimit_SANDBOX_LIMIT_MEMORY, func(r *controldv1.LimitReached) bool { return r.GetCount() > 0 })
		t.Logf("controld: %s", lr.GetMessage())
		g, err := s.sbc.GetSandbox(s.ctx, &controldv1.GetSandboxRequest{Id: sb.Id})
		if err != nil || g.Sandbox.State != controldv1.SandboxState_SANDBOX_STATE_READY {
			t.Fatalf("the hog's sandbox: %v %v", g, err)
		}
		alive("the memory hog")
	})

	t.Run("disk filler", func(t *testing.T) {
		const quota = 64 << 20
		sb, sess := s.create(&controldv1.Resources{DiskBytes: quota})
		layer := filepath.Join(testenv.LayersDir(), s.cfg.Containerd.Namespace, sb.Id)
		if u, err := btrfs.SubvolumeUsage(layer); err != nil || u.Limit != quota {
			t.Fatalf("the sandbox's layer %s: %+v %v", layer, u, err)
		}
		img := filepath.Join(filepath.Dir(testenv.LayersDir()), "layers.img")
		imgBlocks := func() int64 {
			var st syscall.Stat_t
			if err := syscall.Stat(img, &st); err != nil {
				t.Fatalf("the layers file: %v", err)
			}
			return st.Blocks
		}
		hostFree := func() int64 {
			var st syscall.Statfs_t
			if err := syscall.Statfs(filepath.Dir(img), &st); err != nil {
				t.Fatal(err)
			}
			return int64(st.Bavail) * st.Bsize
		}
		blocks, free := imgBlocks(), hostFree()
		// 2 GiB asked for, in a 64 MiB quota; then 100,000 empty files.
		r := run(t, s.ctx, sess, "dd if=/dev/urandom of=/fill bs=1M count=2048 conv=fsync; ls -l /fill | cut -d' ' -f5", 2*time.Minute)
		if !strings.Contains(string(r.Stderr), "Disk quota exceeded") {
			t.Fatalf("the filler was not stopped at its quota: %+v", r)
		}
		written, _ := strconv.ParseInt(strings.TrimSpace(string(r.Stdout)), 10, 64)
		if written < quota/2 || written > quota {
			t.Fatalf("the filler wrote %d bytes in a %d-byte quota", written, quota)
		}
		r = run(t, s.ctx, sess, `i=0; while [ $i -lt 100000 ]; do : >/f$i || break; i=$((i+1)); done; echo $i`, 2*time.Minute)
		if n, _ := strconv.Atoi(strings.TrimSpace(string(r.Stdout))); n >= 100000 {
			t.Fatalf("100,000 files fit in a full quota: %+v", r)
		}
		lr := s.limitReached(sb.Id, controldv1.SandboxLimit_SANDBOX_LIMIT_DISK, func(r *controldv1.LimitReached) bool { return r.GetCount() == 1 })
		t.Logf("stopped at %d bytes; controld: %s", written, lr.GetMessage())
		// The layers file is preallocated, so the filler's bytes land in
		// blocks it already has. What may still grow is the host file
		// system's extent tree: writing into preallocated (unwritten)
		// extents splits them, and st_blocks counts the tree's blocks
		// (24 blocks, 12 KiB, were seen). A MiB bounds that, far below the
		// filler's 64 MiB.
		if got := imgBlocks(); got-blocks > 2048 {
			t.Fatalf("the layers file grew on the host's disk: %d blocks, was %d", got, blocks)
		}
		// Others share this machine: only a write the size of the filler's
		// 2 GiB would show.
		if d := free - hostFree(); d > 512<<20 {
			t.Fatalf("the host's free space fell by %d bytes during the filler", d)
		}
		t.Logf("host free space changed by %d bytes; the layers file by 0 blocks", free-hostFree())
		// A checkpoint writes guestd's marker file into the sandbox's disk:
		// a full one answers RESOURCE_EXHAUSTED saying so (and the agents'
		// sessions are closed, as by any checkpoint).
		_, err := s.ckc.CreateCheckpoint(s.ctx, &controldv1.CreateCheckpointRequest{SandboxId: sb.Id})
		if !errors.Is(errgrpc.FromGRPC(err), errdefs.ErrResourceExhausted) || !strings.Contains(fmt.Sprint(err), "disk quota exceeded") {
			t.Fatalf("checkpoint of a full sandbox: %v", err)
		}
		sess = s.dial(sb.Id)
		// Freeing space lets the sandbox write again, and checkpoint.
		if r := run(t, s.ctx, sess, "rm -f /fill /f*; dd if=/dev/zero of=/again bs=1M count=8 conv=fsync", time.Minute); r.ExitCode != 0 {
			t.Fatalf("writes after freeing space: %+v", r)
		}
		ck, err := s.ckc.CreateCheckpoint(s.ctx, &controldv1.CreateCheckpointRequest{SandboxId: sb.Id})
		if err != nil {
			t.Fatalf("checkpoint after freeing space: %v", err)
		}
		s.ckc.DeleteCheckpoint(s.ctx, &controldv1.DeleteCheckpointRequest{Id: ck.Checkpoint.Id})
		alive("the disk filler")
	})

	t.Run("forks and pools keep their limits", func(t *testing.T) {
		res := &controldv1.Resources{PidsMax: 300, MemoryBytes: 512 << 20, DiskBytes: 48 << 20}
		src, _ := s.create(res)
		ck, err := s.ckc.CreateCheckpoint(s.ctx, &controldv1.CreateCheckpointRequest{SandboxId: src.Id})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			s.ckc.DeleteCheckpoint(context.Background(), &controldv1.DeleteCheckpointRequest{Id: ck.Checkpoint.Id})
		})
		fr, err := s.ckc.ForkCheckpoint(s.ctx, &controldv1.ForkCheckpointRequest{CheckpointId: ck.Checkpoint.Id, Count: 2,
			Resources: &controldv1.Resources{PidsMax: 200}})
		if err != nil {
			t.Fatal(err)
		}
		for _, rep := range fr.Replicas {
			if rep.ErrorCode != 0 {
				t.Fatalf("replica: %s", rep.ErrorMessage)
			}
			id := rep.Sandbox.Id
			t.Cleanup(func() { s.sbc.DeleteSandbox(context.Background(), &controldv1.DeleteSandboxRequest{Id: id}) })
			if got := cgroupValue(t, "pids", id, "pids.max"); got != "200" {
				t.Errorf("replica pids.max %s, want the fork's 200", got)
			}
			if got := cgroupValue(t, "memory", id, "memory.limit_in_bytes"); got != strconv.Itoa(512<<20) {
				t.Errorf("replica memory limit %s, want the checkpoint's", got)
			}
			sess, err := aci.Dial(s.ctx, rep.Endpoint.Url, rep.Endpoint.Token)
			if err != nil {
				t.Fatal(err)
			}
			r := run(t, s.ctx, sess, "dd if=/dev/zero of=/fill bs=1M count=512 conv=fsync", time.Minute)
			sess.Close()
			if r.ExitCode == 0 || !strings.Contains(string(r.Stderr), "Disk quota exceeded") {
				t.Fatalf("a replica's disk is not held to the checkpoint's 48 MiB: %+v", r)
			}
		}
		pl, err := s.plc.CreatePool(s.ctx, &controldv1.CreatePoolRequest{
			Source: &controldv1.CreatePoolRequest_CheckpointId{CheckpointId: ck.Checkpoint.Id}, Size: 1,
			Resources: &controldv1.Resources{PidsMax: 128}})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { s.plc.DeletePool(context.Background(), &controldv1.DeletePoolRequest{Id: pl.Pool.Id}) })
		deadline := time.Now().Add(2 * time.Minute)
		for {
			g, err := s.plc.GetPool(s.ctx, &controldv1.GetPoolRequest{Id: pl.Pool.Id})
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
		cl, err := s.plc.ClaimPool(s.ctx, &controldv1.ClaimPoolRequest{PoolId: pl.Pool.Id})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { s.sbc.DeleteSandbox(context.Background(), &controldv1.DeleteSandboxRequest{Id: cl.Sandbox.Id}) })
		if got := cgroupValue(t, "pids", cl.Sandbox.Id, "pids.max"); got != "128" {
			t.Errorf("claimed sandbox pids.max %s, want the pool's 128", got)
		}
		if got := cl.Sandbox.GetResources().GetDiskBytes(); got != 48<<20 {
			t.Errorf("claimed sandbox disk %d, want the checkpoint's", got)
		}
	})
}

// The host admits sandboxes up to its limits on the real stack too: past
// them a create fails with RESOURCE_EXHAUSTED and nothing is left behind.
func TestRealStackAdmission(t *testing.T) {
	s := newStackIn(t, "forkfleet-limits-it")
	s.cfg.Admission.MaxSandboxes = 2
	s.launch(1) // a warm slot must not count against a full host
	s.create(nil)
	s.create(nil)
	before, err := s.rt.List(s.ctx)
	if err != nil {
		t.Fatal(err)
	}
	_, err = s.sbc.CreateSandbox(s.ctx, &controldv1.CreateSandboxRequest{WaitReady: true})
	if !errors.Is(errgrpc.FromGRPC(err), errdefs.ErrResourceExhausted) || !strings.Contains(fmt.Sprint(err), "admits at most 2") {
		t.Fatalf("a third sandbox on a host admitting 2: %v", err)
	}
	after, err := s.rt.List(s.ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(after) > len(before) {
		t.Fatalf("the refused create left %d containers", len(after)-len(before))
	}
}

// A sandbox's processes make system calls through the host's native ABI
// only: a 32-bit one (int 0x80 on amd64) kills its process with SIGSYS, in
// a booted sandbox and in a replica, whose filter CRIU restored from the
// checkpoint's images. Native calls go through as before.
func TestRealStackNativeSyscallsOnly(t *testing.T) {
	if goruntime.GOARCH != "amd64" {
		t.Skipf("compatprobe is written for amd64, not %s", goruntime.GOARCH)
	}
	bin := filepath.Join(t.TempDir(), "compatprobe")
	cmd := exec.Command("gcc", "-O2", "-Wall", "-Werror", "-static", "-nostdlib", "-no-pie", "-fno-pie", "-ffreestanding",
		"-fno-stack-protector", "-o", bin, "testdata/compatprobe.c")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("build compatprobe: %v\n%s", err, out)
	}
	probe, err := os.ReadFile(bin)
	if err != nil {
		t.Fatal(err)
	}
	// A kernel without the i386 entry (some VMs') faults int 0x80 itself,
	// filter or not: there the sandbox's call must fail the same way, and
	// the filter is not what stops it.
	want := "SIGSYS"
	out, err := exec.Command(bin).Output()
	var exit *exec.ExitError
	switch {
	case err == nil && string(out) == "native\ni386\n":
	case errors.As(err, &exit) && string(out) == "native\n" && exit.Sys().(syscall.WaitStatus).Signal() == syscall.SIGSEGV:
		want = "SIGSEGV"
		t.Logf("this kernel has no i386 syscall entry (int 0x80 faults on the host too): the filter is not exercised")
	default:
		t.Fatalf("compatprobe on the host: stdout %q, %v", out, err)
	}
	s := newStackIn(t, "forkfleet-limits-it")
	s.launch(0)
	sb, sess := s.create(nil)
	check := func(name string, sess *aci.Session) {
		t.Helper()
		if err := sess.PutFile(s.ctx, "/tmp/compatprobe", probe, aci.FileMode(0o755)); err != nil {
			t.Fatalf("%s: put compatprobe: %v", name, err)
		}
		r, err := sess.Exec(s.ctx, &aciv1.ExecRequest{Argv: []string{"/tmp/compatprobe"}, TimeoutMs: 10_000})
		if err != nil {
			t.Fatalf("%s: exec compatprobe: %v", name, err)
		}
		out := string(r.GetStdout())
		if out != "native\n" && out != "native\ni386\n" {
			t.Fatalf("%s: the native call: stdout %q, stderr %q", name, out, r.GetStderr())
		}
		if out != "native\n" || r.GetSignal() != want {
			t.Fatalf("%s: the i386 call: stdout %q, exit %d, signal %q; want the process killed by %s", name, out, r.GetExitCode(), r.GetSignal(), want)
		}
	}
	check("booted sandbox", sess)
	check("replica", s.forkOne(sb.Id))
}
