package app_test

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	controldv1 "github.com/forkfleet/forkfleet/api/gen/forkfleet/controld/v1"
)

// TestRealStackUnitHardening runs controld under its systemd unit's
// confinement (NoNewPrivileges, the capability bounding set, UMask,
// LimitNOFILE, OOMScoreAdjust, read from the unit file and applied with a
// shell and setpriv, since these hosts have no systemd as PID 1) and takes
// what the confinement could break: a boot, a live checkpoint (controld
// runs CRIU's dump itself), a verified fork, deletes.
func TestRealStackUnitHardening(t *testing.T) {
	keys := parseUnit(t, filepath.Join(unitDir, "forkfleet-controld.service"))
	s := newProcStack(t)
	s.wrap = hardeningWrapper(t, keys)
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
	bnd, err := strconv.ParseUint(fields["CapBnd"], 16, 64)
	if err != nil {
		t.Fatal(err)
	}
	const capSysModule, capSysTime = 16, 25
	if bnd&(1<<capSysModule) != 0 || bnd&(1<<capSysTime) != 0 {
		t.Errorf("CapBnd %s still holds CAP_SYS_MODULE or CAP_SYS_TIME", fields["CapBnd"])
	}

	s.checkpointForkDelete(src)
	if _, err := s.sbc.DeleteSandbox(s.ctx, &controldv1.DeleteSandboxRequest{Id: src}); err != nil {
		t.Fatal(err)
	}
	s.stop()
	if ids := s.containerIDs(); len(ids) != 0 {
		t.Errorf("containers left in %s: %v", s.ns, ids)
	}
}
