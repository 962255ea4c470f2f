package app_test

import (
	"bufio"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/forkfleet/forkfleet/controld/internal/testenv"
)

const unitDir = "../../../deploy/systemd"

// unitKey is one "Key=Value" line of a unit file's section.
type unitKey struct{ section, key, value string }

func parseUnit(t *testing.T, path string) []unitKey {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var out []unitKey
	section := ""
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		switch {
		case line == "" || strings.HasPrefix(line, "#"):
		case strings.HasPrefix(line, "["):
			section = strings.Trim(line, "[]")
		default:
			k, v, ok := strings.Cut(line, "=")
			if !ok {
				t.Fatalf("%s: not Key=Value: %q", path, line)
			}
			out = append(out, unitKey{section, k, v})
		}
	}
	return out
}

// controld's [Service] settings: those that only say how systemd starts,
// stops and watches it, and those that confine it, which
// TestRealStackUnitHardening applies to a real controld (hardeningWrapper).
// A setting in neither list fails TestUnitFiles: a new hardening option
// must be tried against a real dump before it goes into the unit.
var (
	lifecycleKeys = map[string]bool{
		"Type": true, "NotifyAccess": true, "WatchdogSec": true, "EnvironmentFile": true, "Environment": true,
		"ExecStart": true, "Restart": true, "RestartSec": true, "KillMode": true, "KillSignal": true,
		"TimeoutStartSec": true, "TimeoutStopSec": true,
	}
	confinementKeys = map[string]bool{
		"NoNewPrivileges": true, "CapabilityBoundingSet": true, "UMask": true, "LimitNOFILE": true, "OOMScoreAdjust": true,
		"DevicePolicy": true, "DeviceAllow": true,
		"LockPersonality": true, "RestrictRealtime": true, "MemoryDenyWriteExecute": true, "RestrictSUIDSGID": true,
		"SystemCallArchitectures": true,
	}
)

// hardeningWrapper returns the command that applies the unit's
// confinement to what it runs, as systemd would: umask, resource limit and
// OOM score from a shell, setpriv for no_new_privs and the capability
// bounding set, then systemd's seccomp filters for the seccomp-based
// settings (seccompExec).
func hardeningWrapper(t *testing.T, keys []unitKey) []string {
	t.Helper()
	var script, setpriv, seccomp, allow []string
	for _, k := range keys {
		if k.section == "Service" && k.key == "DeviceAllow" {
			allow = append(allow, deviceRule(t, k.value))
		}
	}
	for _, k := range keys {
		if k.section != "Service" || lifecycleKeys[k.key] {
			continue
		}
		switch k.key {
		case "NoNewPrivileges":
			if k.value == "yes" {
				setpriv = append(setpriv, "--no-new-privs")
			}
		case "CapabilityBoundingSet":
			drop, ok := strings.CutPrefix(k.value, "~")
			if !ok {
				t.Fatalf("CapabilityBoundingSet=%s: the test applies only ~ (drop) lists", k.value)
			}
			var caps []string
			for _, c := range strings.Fields(drop) {
				caps = append(caps, "-"+strings.ToLower(strings.TrimPrefix(c, "CAP_")))
			}
			setpriv = append(setpriv, "--bounding-set", strings.Join(caps, ","))
		case "DevicePolicy":
			if k.value != "closed" {
				t.Fatalf("%s=%s: the test applies only closed", k.key, k.value)
			}
			script = append(script, devicePolicyClosed(t, allow)...)
		case "DeviceAllow": // with DevicePolicy
		case "UMask":
			script = append(script, "umask "+k.value)
		case "LimitNOFILE":
			// Up to the hard limit in hand: raising it takes
			// CAP_SYS_RESOURCE, which root on these VMs lacks (systemd, as
			// PID 1, has it).
			script = append(script, "n="+k.value+"; h=$(ulimit -Hn)",
				`if [ "$h" != unlimited ] && [ "$n" -gt "$h" ]; then n=$h; fi`, `ulimit -n "$n"`)
		case "OOMScoreAdjust":
			// Lowering it takes CAP_SYS_RESOURCE too: applied where it can
			// be (it does not concern CRIU).
			script = append(script, "{ echo "+k.value+" > /proc/self/oom_score_adj; } 2>/dev/null || :")
		case "LockPersonality", "RestrictRealtime", "MemoryDenyWriteExecute", "RestrictSUIDSGID":
			if k.value != "yes" {
				t.Fatalf("%s=%s: the test applies only yes", k.key, k.value)
			}
			seccomp = append(seccomp, k.key)
		case "SystemCallArchitectures":
			if k.value != "native" {
				t.Fatalf("%s=%s: the test applies only native", k.key, k.value)
			}
			seccomp = append(seccomp, archNative)
		default:
			t.Fatalf("unit setting %s=%s: not applied by the hardening test", k.key, k.value)
		}
	}
	script = append(script, `exec "$@"`)
	wrap := append([]string{"/bin/sh", "-ec", strings.Join(script, "; "), "sh", "setpriv"}, setpriv...)
	if len(seccomp) > 0 {
		wrap = append(wrap, seccompExec(t, seccomp)...)
	}
	return wrap
}

// systemdClosedDevices are the devices DevicePolicy=closed allows
// (systemd 252, src/core/cgroup.c): the pseudo devices, and the 0:0 nodes
// of /run/systemd/inaccessible.
var systemdClosedDevices = []string{
	"c 1:3 rwm", "c 1:5 rwm", "c 1:7 rwm", "c 1:8 rwm", "c 1:9 rwm", // null, zero, full, random, urandom
	"c 5:0 rwm", "c 5:2 rwm", // tty, ptmx
	"c 0:0 rwm", "b 0:0 rwm", // inaccessible chr, blk
}

var deviceCgroups atomic.Int32

// deviceRule turns a DeviceAllow value ("/dev/x rw") into a devices.allow
// line for the device's node on this host.
func deviceRule(t *testing.T, v string) string {
	path, perm, _ := strings.Cut(v, " ")
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		t.Fatalf("DeviceAllow=%s: %v", v, err)
	}
	kind := "c"
	if st.Mode&unix.S_IFMT == unix.S_IFBLK {
		kind = "b"
	}
	return fmt.Sprintf("%s %d:%d %s", kind, unix.Major(st.Rdev), unix.Minor(st.Rdev), perm)
}

// devicePolicyClosed returns the shell lines that put the wrapper (and
// what it execs) in a devices cgroup of its own allowing what systemd's
// DevicePolicy=closed allows. cgroup v1 only (these hosts): on v2 systemd
// attaches a BPF program instead, which a shell cannot.
func devicePolicyClosed(t *testing.T, allow []string) []string {
	cg := fmt.Sprintf("/sys/fs/cgroup/devices/forkfleet-unit-test-%d-%d", os.Getpid(), deviceCgroups.Add(1))
	t.Cleanup(func() {
		// After the test's controld stopped (cleanups run last first).
		if err := os.Remove(cg); err != nil && !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("remove devices cgroup: %v", err)
		}
	})
	lines := []string{
		`[ -d /sys/fs/cgroup/devices ] || { echo "DevicePolicy: the hardening test applies it with cgroup v1's devices controller only" >&2; exit 1; }`,
		"mkdir -p " + cg, "echo a > " + cg + "/devices.deny",
	}
	for _, d := range append(slices.Clone(systemdClosedDevices), allow...) {
		lines = append(lines, "echo '"+d+"' > "+cg+"/devices.allow")
	}
	return append(lines, "echo $$ > "+cg+"/cgroup.procs")
}

// The units pass systemd-analyze verify, and every setting of controld's is
// either lifecycle or confinement the hardening test applies.
func TestUnitFiles(t *testing.T) {
	keys := parseUnit(t, filepath.Join(unitDir, "forkfleet-controld.service"))
	seen := map[string]bool{}
	for _, k := range keys {
		seen[k.key] = true
		if k.section == "Service" && !lifecycleKeys[k.key] && !confinementKeys[k.key] {
			t.Errorf("[Service] %s=%s: neither lifecycle nor a confinement TestRealStackUnitHardening applies", k.key, k.value)
		}
	}
	for _, want := range []string{"WatchdogSec", "NoNewPrivileges", "CapabilityBoundingSet"} {
		if !seen[want] {
			t.Errorf("controld's unit lacks %s", want)
		}
	}
	hardeningWrapper(t, keys) // every confinement key has a translation

	analyze, err := exec.LookPath("systemd-analyze")
	if err != nil {
		if testenv.Enabled() {
			t.Fatalf("FORKFLEET_INTEGRATION=1 but systemd-analyze is missing (Debian package systemd): %v", err)
		}
		t.Skip("systemd-analyze not installed")
	}
	// verify checks that ExecStart names an executable: point both units
	// at one that exists here.
	dir := t.TempDir()
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	var units []string
	for _, u := range []string{"forkfleet-controld.service", "forkfleet-containerd.service"} {
		b, err := os.ReadFile(filepath.Join(unitDir, u))
		if err != nil {
			t.Fatal(err)
		}
		var lines []string
		for line := range strings.Lines(string(b)) {
			if rest, ok := strings.CutPrefix(line, "ExecStart="); ok {
				_, args, _ := strings.Cut(strings.TrimSpace(rest), " ")
				line = "ExecStart=" + self + " " + args + "\n"
			}
			lines = append(lines, line)
		}
		p := filepath.Join(dir, u)
		if err := os.WriteFile(p, []byte(strings.Join(lines, "")), 0o644); err != nil {
			t.Fatal(err)
		}
		units = append(units, p)
	}
	out, err := exec.Command(analyze, append([]string{"verify"}, units...)...).CombinedOutput()
	if err != nil || len(strings.TrimSpace(string(out))) > 0 {
		t.Fatalf("systemd-analyze verify: %v\n%s", err, out)
	}
	out, err = exec.Command(analyze, "security", "--offline=true", units[0]).CombinedOutput()
	if err != nil {
		t.Fatalf("systemd-analyze security: %v\n%s", err, out)
	}
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	t.Logf("systemd-analyze security: %s", lines[len(lines)-1])
}
