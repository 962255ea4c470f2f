package app_test

import (
	"bytes"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	controldv1 "github.com/forkfleet/forkfleet/api/gen/forkfleet/controld/v1"
)

// TestRealStackUnitHardening runs controld under its systemd unit's
// confinement (NoNewPrivileges, the capability bounding set, DevicePolicy,
// UMask, LimitNOFILE, OOMScoreAdjust, read from the unit file and applied
// with a shell, a devices cgroup and setpriv, since these hosts have no
// systemd as PID 1) and takes
// what the confinement could break: a boot, a live checkpoint (controld
// runs CRIU's dump itself), a verified fork, deletes. Then it tries each
// seccomp-based setting the unit leaves out on a dump of that sandbox, and
// a mount namespace of controld's own on boots, a checkpoint and a fork.
func TestRealStackUnitHardening(t *testing.T) {
	keys := parseUnit(t, filepath.Join(unitDir, "forkfleet-controld.service"))
	s := newProcStack(t)
	s.wrap = hardeningWrapper(t, keys)
	// systemd's watchdog as the unit sets it: WATCHDOG_USEC from
	// WatchdogSec.
	for _, k := range keys {
		if k.key == "WatchdogSec" {
			d, err := time.ParseDuration(k.value)
			if err != nil {
				t.Fatalf("WatchdogSec=%s: %v", k.value, err)
			}
			s.env = append(s.env, "WATCHDOG_USEC="+strconv.FormatInt(d.Microseconds(), 10))
		}
	}
	t.Logf("controld runs as: %s ...", strings.Join(s.wrap, " "))
	src := s.startWithSandbox("unit-hardening")

	// The confinement reached controld.
	status, err := os.ReadFile("/proc/" + strconv.Itoa(s.cmd.Process.Pid) + "/status")
	if err != nil {
		t.Fatal(err)
	}
	fields := map[string]string{}
	for line := range strings.Lines(string(status)) {
		k, v, _ := strings.Cut(line, ":")
		fields[k] = strings.TrimSpace(v)
	}
	if fields["NoNewPrivs"] != "1" {
		t.Errorf("NoNewPrivs %q", fields["NoNewPrivs"])
	}
	if fields["Umask"] != "0077" {
		t.Errorf("Umask %q", fields["Umask"])
	}
	for _, k := range keys {
		if _, ok := seccompSettings[k.key]; ok || k.key == archNative {
			if fields["Seccomp"] != "2" {
				t.Errorf("%s=%s in the unit, but Seccomp %q (want 2, filtered)", k.key, k.value, fields["Seccomp"])
			}
			break
		}
	}
	if cg, err := os.ReadFile("/proc/" + strconv.Itoa(s.cmd.Process.Pid) + "/cgroup"); err != nil || !strings.Contains(string(cg), ":devices:/forkfleet-unit-test-") {
		t.Errorf("DevicePolicy=closed: controld not in the test's devices cgroup: %v\n%s", err, cg)
	}
	bnd, err := strconv.ParseUint(fields["CapBnd"], 16, 64)
	if err != nil {
		t.Fatal(err)
	}
	const capSysModule, capSysTime = 16, 25
	if bnd&(1<<capSysModule) != 0 || bnd&(1<<capSysTime) != 0 {
		t.Errorf("CapBnd %s still holds CAP_SYS_MODULE or CAP_SYS_TIME", fields["CapBnd"])
	}

	// A file of the image deleted: the checkpoint's layer copy makes its
	// whiteout (a 0:0 character device) under the unit's device policy.
	sess := s.dialACI(src)
	gone := shell(t, s.ctx, sess, `for f in ~/.bash_logout ~/.bashrc ~/.profile; do if [ -e "$f" ]; then rm "$f"; echo "$f"; break; fi; done`)
	sess.Close()
	if gone == "" {
		t.Fatal("no file of the image's agent home to delete")
	}
	s.checkpointForkDelete(src)
	// A lazy fork: controld opens /dev/userfaultfd for the restore's CRIU
	// under the unit's device policy (DeviceAllow).
	ck, err := s.ckc.CreateCheckpoint(s.ctx, &controldv1.CreateCheckpointRequest{SandboxId: src})
	if err != nil {
		t.Fatalf("checkpoint for a lazy fork: %v", err)
	}
	fr, err := s.ckc.ForkCheckpoint(s.ctx, &controldv1.ForkCheckpointRequest{CheckpointId: ck.Checkpoint.Id, Count: 1,
		RestoreMode: controldv1.RestoreMode_RESTORE_MODE_LAZY})
	if err != nil {
		t.Fatalf("lazy fork: %v", err)
	}
	if r := fr.Replicas[0]; r.ErrorCode != 0 {
		t.Errorf("lazy replica failed under the unit's confinement: %s", r.ErrorMessage)
	} else if _, err := s.sbc.DeleteSandbox(s.ctx, &controldv1.DeleteSandboxRequest{Id: r.Sandbox.Id}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.ckc.DeleteCheckpoint(s.ctx, &controldv1.DeleteCheckpointRequest{Id: ck.Checkpoint.Id}); err != nil {
		t.Fatal(err)
	}
	// An egress sandbox: controld pins its namespace, wires its veth and
	// loads its nft rules under the same confinement.
	eg, err := s.sbc.CreateSandbox(s.ctx, &controldv1.CreateSandboxRequest{WaitReady: true, Labels: map[string]string{"test": "unit-hardening"},
		Network: &controldv1.Network{Mode: controldv1.NetworkMode_NETWORK_MODE_EGRESS}})
	if err != nil {
		t.Fatalf("egress sandbox: %v", err)
	}
	if _, err := s.sbc.DeleteSandbox(s.ctx, &controldv1.DeleteSandboxRequest{Id: eg.Sandbox.Id}); err != nil {
		t.Fatal(err)
	}
	// Its health check passed under the confinement through all that:
	// it pinged systemd's watchdog and never withheld a ping.
	if n := s.watchdogPings.Load(); n == 0 {
		t.Error("no WATCHDOG=1 from controld")
	} else {
		t.Logf("%d WATCHDOG=1 from controld", n)
	}
	if b, err := os.ReadFile(s.logPath); err != nil || bytes.Contains(b, []byte("controld is not alive")) || !bytes.Contains(b, []byte("systemd watchdog on")) {
		t.Errorf("controld's log: the watchdog not on, or a ping withheld (%v)", err)
	}

	// The seccomp-based settings, each tried on its own against a dump of
	// the same sandbox: every one breaks it. The kernel refuses
	// PTRACE_O_SUSPEND_SECCOMP to a tracer under any seccomp filter, and
	// CRIU needs it to dump processes that have one (runc gives every
	// sandbox containerd's profile); RestrictSUIDSGID refuses openat2,
	// with which controld reaches guestd's socket, before that. So the
	// unit has none of them (deploy/README.md, "Hardening").
	hardened := s.wrap
	layersBefore, _ := s.checkpointLayers()
	for _, setting := range append(slices.Sorted(maps.Keys(seccompSettings)), archNative) {
		want := "suspending seccomp failed: Operation not permitted"
		if setting == "RestrictSUIDSGID" {
			want = "operation not permitted"
		}
		s.stop()
		s.wrap = append(slices.Clone(hardened), seccompExec(t, []string{setting})...)
		s.start()
		_, err := s.ckc.CreateCheckpoint(s.ctx, &controldv1.CreateCheckpointRequest{SandboxId: src})
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("checkpoint under %s: %v, want an error with %q", seccompSettingLine(setting), err, want)
		} else {
			t.Logf("%s breaks a dump: %s", seccompSettingLine(setting), firstLine(err.Error()))
		}
		if st := s.freezerState(src); st != "THAWED" {
			t.Errorf("source freezer after the refused checkpoint under %s: %s", setting, st)
		}
		s.assertNoHalfCheckpoint(src, layersBefore)
	}
	s.stop()
	s.wrap = hardened
	s.start()

	if _, err := s.sbc.DeleteSandbox(s.ctx, &controldv1.DeleteSandboxRequest{Id: src}); err != nil {
		t.Fatal(err)
	}

	// PrivateMounts=yes: the mount namespace of its own (mounts from the
	// host propagate in, none out) that ProtectSystem, ProtectHome,
	// PrivateTmp, ReadWritePaths and the other file-system settings are
	// made in. A sandbox's own network namespace is made by runc and bound
	// by runc's network hook in the host's mount namespace, which controld
	// sees: a boot in mode none, its checkpoint and a verified fork work.
	// The router namespace controld makes and pins for an egress sandbox
	// by a bind mount is then its alone: the hook, run by runc in the
	// host's mount namespace, finds an empty file at that path and the
	// sandbox does not start. Tried with no sandbox left, so that nothing
	// controld pins there outlives the try.
	s.stop()
	s.wrap = append([]string{"unshare", "--mount", "--propagation", "slave"}, hardened...)
	s.start()
	labels := map[string]string{"test": "unit-hardening"}
	cr, err := s.sbc.CreateSandbox(s.ctx, &controldv1.CreateSandboxRequest{WaitReady: true, Labels: labels})
	if err != nil {
		t.Fatalf("boot in mode none under PrivateMounts=yes: %v", err)
	}
	s.checkpointForkDelete(cr.Sandbox.Id)
	if _, err := s.sbc.DeleteSandbox(s.ctx, &controldv1.DeleteSandboxRequest{Id: cr.Sandbox.Id}); err != nil {
		t.Fatal(err)
	}
	_, err = s.sbc.CreateSandbox(s.ctx, &controldv1.CreateSandboxRequest{WaitReady: true, Labels: labels,
		Network: &controldv1.Network{Mode: controldv1.NetworkMode_NETWORK_MODE_EGRESS}})
	if want := "runc create failed"; err == nil || !strings.Contains(err.Error(), want) {
		t.Errorf("egress boot under PrivateMounts=yes: %v, want an error with %q", err, want)
	} else {
		t.Logf("PrivateMounts=yes breaks an egress boot: %s", firstLine(err.Error()))
	}
	s.stop()
	if ids := s.containerIDs(); len(ids) != 0 {
		t.Errorf("containers left in %s: %v", s.ns, ids)
	}
}

func firstLine(s string) string {
	line, _, _ := strings.Cut(s, "\n")
	return line
}

// seccompSettingLine is the unit line of a seccomp-based setting.
func seccompSettingLine(setting string) string {
	if setting == archNative {
		return setting + "=native"
	}
	return setting + "=yes"
}
