//go:build linux

package containerdrt

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"golang.org/x/sys/unix"
)

func TestReadRuncState(t *testing.T) {
	root := t.TempDir()
	r := &Runtime{cfg: Config{RuncRoot: root, Namespace: "ns"}}
	if _, err := r.readRuncState("missing"); !errors.Is(err, errNoDirectDump) {
		t.Errorf("missing state: %v", err)
	}
	write := func(id, body string) {
		t.Helper()
		dir := filepath.Join(root, "ns", id)
		if err := os.MkdirAll(dir, 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, "state.json"), []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write("garbled", "{")
	write("partial", `{"init_process_pid": 12, "config": {}}`)
	write("ok", `{"init_process_pid": 12, "external_descriptors": ["/dev/null", "pipe:[1]", "pipe:[2]"],
		"cgroup_paths": {"freezer": "/sys/fs/cgroup/freezer/x"}, "config": {"rootfs": "/bundle/rootfs"}}`)
	for _, id := range []string{"garbled", "partial"} {
		if _, err := r.readRuncState(id); !errors.Is(err, errNoDirectDump) {
			t.Errorf("%s: %v, want errNoDirectDump", id, err)
		}
	}
	st, err := r.readRuncState("ok")
	if err != nil || st.InitPID != 12 || st.Config.Rootfs != "/bundle/rootfs" || len(st.ExternalDescriptors) != 3 {
		t.Fatalf("ok: %+v, %v", st, err)
	}
}

// The request matches what runc's checkpoint command sends for a
// leave-running dump (see criuDumpRequest).
func TestCriuDumpRequest(t *testing.T) {
	var st runcState
	st.InitPID = os.Getpid() // masked paths are looked up under /proc/<pid>/root
	st.CgroupPaths = map[string]string{"freezer": "/sys/fs/cgroup/freezer/fl/sb", "": "/sys/fs/cgroup/fl/sb"}
	c := &st.Config
	c.Rootfs = "/bundle/rootfs"
	c.Mounts = append(c.Mounts,
		struct {
			Device      string `json:"device"`
			Destination string `json:"destination"`
		}{"proc", "/proc"},
		struct {
			Device      string `json:"device"`
			Destination string `json:"destination"`
		}{"bind", "/sys/firmware"})
	c.MaskPaths = []string{"/proc/version", "/proc/self", "/proc/no-such-file"}
	c.Devices = append(c.Devices, struct {
		Path string `json:"path"`
	}{"/dev/null"})
	c.Labels = []string{"bundle=/bundle", "org.criu.config=/state/criu.conf"}
	c.Namespaces = append(c.Namespaces, struct {
		Type string `json:"type"`
		Path string `json:"path"`
	}{"NEWNET", "/proc/self/ns/net"}, struct {
		Type string `json:"type"`
		Path string `json:"path"`
	}{"NEWPID", ""})
	dir, err := os.Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	defer dir.Close()

	opts, err := criuDumpRequest(&st, dir, dir, false, criuLogWarnings, false)
	if err != nil {
		t.Fatal(err)
	}
	if opts.GetPid() != int32(st.InitPID) || opts.GetRoot() != c.Rootfs || !opts.GetLeaveRunning() || !opts.GetManageCgroups() ||
		!opts.GetOrphanPtsMaster() || opts.GetEmptyNs() != unix.CLONE_NEWNET || opts.GetLogFile() != "dump.log" ||
		opts.GetLogLevel() != criuLogWarnings || opts.GetImagesDirFd() != int32(dir.Fd()) {
		t.Errorf("options %v", opts)
	}
	if opts.GetConfigFile() != "/state/criu.conf" || opts.GetFreezeCgroup() != "/sys/fs/cgroup/freezer/fl/sb" {
		t.Errorf("config file %q, freezer %q", opts.GetConfigFile(), opts.GetFreezeCgroup())
	}
	var ns unix.Stat_t
	if err := unix.Stat("/proc/self/ns/net", &ns); err != nil {
		t.Fatal(err)
	}
	if want := []string{fmt.Sprintf("net[%d]:extRootNetNS", ns.Ino)}; !slices.Equal(opts.GetExternal(), want) {
		t.Errorf("external %v, want %v", opts.GetExternal(), want)
	}
	got := map[string]string{}
	for _, m := range opts.GetExtMnt() {
		got[m.GetKey()] = m.GetVal()
	}
	// Binds and devices map to themselves, masked files to /dev/null;
	// masked directories (runc's tmpfs) and missing paths are left out.
	want := map[string]string{"/sys/firmware": "/sys/firmware", "/proc/version": "/dev/null", "/dev/null": "/dev/null"}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("ext mounts %v, want %v", got, want)
	}

	// A replica's /dev is a bind in its spec: external only when the dump
	// says its /dev is the template's (devlayout.go), then under its own key.
	c.Mounts = append(c.Mounts, struct {
		Device      string `json:"device"`
		Destination string `json:"destination"`
	}{"bind", "/dev"})
	for _, devBind := range []bool{false, true} {
		opts, err := criuDumpRequest(&st, dir, dir, false, criuLogWarnings, devBind)
		if err != nil {
			t.Fatal(err)
		}
		n := 0
		for _, m := range opts.GetExtMnt() {
			if m.GetKey() == "/dev" {
				n++
				if m.GetVal() != "/dev" {
					t.Errorf("/dev external as %q", m.GetVal())
				}
			}
		}
		if want := map[bool]int{false: 0, true: 1}[devBind]; n != want {
			t.Errorf("devBind %v: /dev external %d times, want %d", devBind, n, want)
		}
	}
	c.Mounts = c.Mounts[:len(c.Mounts)-1]

	// cgroup v2: the unified path freezes.
	if opts, err = criuDumpRequest(&st, dir, dir, true, criuLogDebug, false); err != nil || opts.GetFreezeCgroup() != "/sys/fs/cgroup/fl/sb" || opts.GetLogLevel() != criuLogDebug {
		t.Errorf("v2: freezer %q, log level %d, %v", opts.GetFreezeCgroup(), opts.GetLogLevel(), err)
	}
	// An annotation naming no file means no config file; no annotation
	// means runc's default.
	c.Labels = []string{"org.criu.config="}
	if opts, _ = criuDumpRequest(&st, dir, dir, false, criuLogWarnings, false); opts.ConfigFile != nil {
		t.Errorf("empty annotation: config file %q", opts.GetConfigFile())
	}
	c.Labels = nil
	if opts, _ = criuDumpRequest(&st, dir, dir, false, criuLogWarnings, false); opts.GetConfigFile() != "/etc/criu/runc.conf" {
		t.Errorf("no annotation: config file %q", opts.GetConfigFile())
	}
	// A v1 cgroupfs mount (runc would expand it) is not handled here.
	c.Mounts = append(c.Mounts, struct {
		Device      string `json:"device"`
		Destination string `json:"destination"`
	}{"cgroup", "/sys/fs/cgroup"})
	if _, err := criuDumpRequest(&st, dir, dir, false, criuLogWarnings, false); !errors.Is(err, errNoDirectDump) {
		t.Errorf("cgroup v1 mount: %v", err)
	}
}

// CRIU's dump and restore logs follow controld's log level: verbose only at
// debug (the level's cost is frozen time in a dump, CPU in every replica).
func TestCRIULogLevelFollowsControld(t *testing.T) {
	ctx := context.Background()
	for _, tc := range []struct {
		level slog.Level
		want  int32
	}{{slog.LevelDebug, criuLogDebug}, {slog.LevelInfo, criuLogWarnings}, {slog.LevelError, criuLogWarnings}} {
		log := slog.New(slog.NewTextHandler(io.Discard, &slog.HandlerOptions{Level: tc.level}))
		if got := criuLogLevel(ctx, log); got != tc.want {
			t.Errorf("controld at %v: CRIU level %d, want %d", tc.level, got, tc.want)
		}
		// Restores: the runtime's CRIU config names the level for the CRIU
		// preload, after the configured options.
		lines := runtimeCRIUOptions(Config{CRIUOptions: DefaultCRIUOptions, CgroupRoot: t.TempDir(), Logger: log})
		want := append(slices.Clone(DefaultCRIUOptions), fmt.Sprintf("# forkfleet-restore-log-level %d", tc.want))
		if !slices.Equal(lines, want) {
			t.Errorf("controld at %v: CRIU config lines %q, want %q", tc.level, lines, want)
		}
	}
}
