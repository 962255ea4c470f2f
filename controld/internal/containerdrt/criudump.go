//go:build linux

package containerdrt

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"

	criu "github.com/checkpoint-restore/go-criu/v7"
	criurpc "github.com/checkpoint-restore/go-criu/v7/rpc"
	"golang.org/x/sys/unix"
	"google.golang.org/protobuf/proto"
)

// The direct dump runs `criu swrk` itself, with the request runc checkpoint
// --leave-running builds, and writes runc's descriptors.json beside the
// images, so `runc restore` (every fork) reads them as its own. It skips
// what runc adds around CRIU: runc's own start, a second CRIU start to ask
// CRIU's version, and the containerd and shim hops, 15 to 20 ms of every
// dump's frozen window here. What it needs comes from runc's state file of
// the container; without it (or without criu in controld's PATH) the dump
// goes through runc.

// CRIU log levels: warnings and errors, or everything (runc's).
const (
	criuLogWarnings = 2
	criuLogDebug    = 4
)

// criuLogLevel is the CRIU log level of controld's dumps: warnings and
// errors (what a failed dump reports), all of CRIU's lines (about 9000 a
// desktop dump, 25 ms of frozen time) only when controld logs at debug.
func criuLogLevel(ctx context.Context, log *slog.Logger) int32 {
	if log.Enabled(ctx, slog.LevelDebug) {
		return criuLogDebug
	}
	return criuLogWarnings
}

// criuRestoreLogLine is the CRIU config comment that sets the log level of
// restores: runc asks CRIU for level 4 on every restore, and the CRIU
// preload (deploy/criu/loglevel.c) lowers a restore's level to the one this
// line names in the restore's config file (to 2 without it). CRIU skips it.
// Written with criuLogLevel's level, restores log as controld's dumps do.
func criuRestoreLogLine(level int32) string {
	return "# forkfleet-restore-log-level " + strconv.Itoa(int(level))
}

// runcDefaultRoot is the shim's runc root when the task options name none;
// runc's state of container id lives in <root>/<namespace>/<id>.
const runcDefaultRoot = "/run/containerd/runc"

// runcState is the part of runc's state.json (libcontainer's State and
// configs.Config) a dump needs.
type runcState struct {
	InitPID             int               `json:"init_process_pid"`
	CgroupPaths         map[string]string `json:"cgroup_paths"`
	ExternalDescriptors []string          `json:"external_descriptors"`
	Config              struct {
		Rootfs string `json:"rootfs"`
		Mounts []struct {
			Device      string `json:"device"`
			Destination string `json:"destination"`
		} `json:"mounts"`
		MaskPaths []string `json:"mask_paths"`
		Devices   []struct {
			Path string `json:"path"`
		} `json:"devices"`
		Labels     []string `json:"labels"`
		Namespaces []struct {
			Type string `json:"type"`
			Path string `json:"path"`
		} `json:"namespaces"`
	} `json:"config"`
}

// errNoDirectDump says controld cannot run this dump itself (runc's state
// does not say enough, or there is no criu in its PATH); the caller dumps
// through runc instead.
var errNoDirectDump = errors.New("no direct dump")

func (r *Runtime) runcStatePath(id string) string {
	root := r.cfg.RuncRoot
	if root == "" {
		root = runcDefaultRoot
	}
	return filepath.Join(root, r.cfg.Namespace, id, "state.json")
}

func (r *Runtime) readRuncState(id string) (*runcState, error) {
	b, err := os.ReadFile(r.runcStatePath(id))
	if err != nil {
		return nil, fmt.Errorf("%w: %w", errNoDirectDump, err)
	}
	var st runcState
	if err := json.Unmarshal(b, &st); err != nil {
		return nil, fmt.Errorf("%w: %s: %w", errNoDirectDump, r.runcStatePath(id), err)
	}
	if st.InitPID <= 0 || st.Config.Rootfs == "" || len(st.ExternalDescriptors) == 0 {
		return nil, fmt.Errorf("%w: %s lacks the init pid, rootfs or stdio", errNoDirectDump, r.runcStatePath(id))
	}
	return &st, nil
}

// criuDumpRequest builds the options runc 1.1's checkpoint command gives
// CRIU for a leave-running dump with containerd's default checkpoint options
// (the rest comes from the CRIU config file named by the org.criu.config
// annotation), but for two: notify_scripts is off (runc answers CRIU's
// post-dump notification with a "checkpoint" marker in its state directory,
// which matters only for a container the dump stops), and logLevel is
// CRIU's: runc's 4 writes about 9000 lines per desktop dump, 25 ms of its
// frozen window here; 2 keeps warnings and errors. imageDir and workDir are
// open directories of this process.
func criuDumpRequest(st *runcState, imageDir, workDir *os.File, cgroupV2 bool, logLevel int32, devBind bool) (*criurpc.CriuOpts, error) {
	c := &st.Config
	opts := &criurpc.CriuOpts{
		ImagesDirFd:     proto.Int32(int32(imageDir.Fd())),
		WorkDirFd:       proto.Int32(int32(workDir.Fd())),
		LogLevel:        proto.Int32(logLevel),
		LogFile:         proto.String("dump.log"),
		Root:            proto.String(c.Rootfs),
		ManageCgroups:   proto.Bool(true),
		Pid:             proto.Int32(int32(st.InitPID)),
		LeaveRunning:    proto.Bool(true),
		OrphanPtsMaster: proto.Bool(true),
		ShellJob:        proto.Bool(false),
		// Also in the config file (DefaultCRIUOptions), which wins over
		// the RPC: connections within the sandbox survive into forks.
		TcpEstablished: proto.Bool(true),
		ExtUnixSk:      proto.Bool(false),
		FileLocks:      proto.Bool(false),
		// runc's checkpoint command always leaves the network namespace's
		// contents out: runc does not manage network devices.
		EmptyNs: proto.Uint32(unix.CLONE_NEWNET),
	}
	configFile, annotated := "/etc/criu/runc.conf", false
	for _, l := range c.Labels {
		if v, ok := strings.CutPrefix(l, "org.criu.config="); ok {
			configFile, annotated = eagerCRIUConfig(v), true
		}
	}
	if configFile != "" || !annotated {
		opts.ConfigFile = proto.String(configFile)
	}
	// Namespaces joined by path are external to the dump.
	hasCgroupNS := false
	for _, ns := range c.Namespaces {
		var name, key string
		switch ns.Type {
		case "NEWNET":
			name, key = "net", "extRootNetNS"
		case "NEWPID":
			name, key = "pid", "extRootPidNS"
		case "NEWCGROUP":
			hasCgroupNS = true
			continue
		default:
			continue
		}
		if ns.Path == "" {
			continue
		}
		var s unix.Stat_t
		if err := unix.Stat(ns.Path, &s); err != nil {
			return nil, fmt.Errorf("%s namespace %s: %w", name, ns.Path, err)
		}
		opts.External = append(opts.External, fmt.Sprintf("%s[%d]:%s", name, s.Ino, key))
	}
	freezer := st.CgroupPaths["freezer"]
	if cgroupV2 {
		freezer = st.CgroupPaths[""]
	}
	if freezer != "" {
		opts.FreezeCgroup = proto.String(freezer)
	}
	ext := func(dest, val string) {
		opts.ExtMnt = append(opts.ExtMnt, &criurpc.ExtMountMap{Key: proto.String(dest), Val: proto.String(val)})
	}
	for _, m := range c.Mounts {
		switch m.Device {
		case "bind":
			dest := strings.TrimPrefix(m.Destination, c.Rootfs)
			if dest == "/dev" {
				continue // a replica's: external only as devBind says
			}
			ext(dest, dest)
		case "cgroup":
			if !cgroupV2 && !hasCgroupNS {
				// runc expands a v1 cgroup mount into binds of the host's
				// hierarchies; sandboxes mount no cgroupfs.
				return nil, fmt.Errorf("%w: a cgroup v1 mount at %s", errNoDirectDump, m.Destination)
			}
		}
	}
	if devBind {
		// The template's /dev (devlayout.go): no tar, its replicas bind
		// their own.
		ext("/dev", "/dev")
	}
	// Masked files are binds of /dev/null (masked directories are tmpfs).
	for _, p := range c.MaskPaths {
		fst, err := statInSandbox(st.InitPID, p)
		if err != nil {
			if errors.Is(err, unix.ENOENT) {
				continue
			}
			return nil, fmt.Errorf("masked path %s: %w", p, err)
		}
		if fst.Mode&unix.S_IFMT != unix.S_IFDIR {
			ext(p, "/dev/null")
		}
	}
	for _, d := range c.Devices {
		dest := strings.TrimPrefix(d.Path, c.Rootfs)
		ext(dest, dest)
	}
	return opts, nil
}

// statInSandbox stats p inside the root of process pid as runc saw it when
// it masked p, with symlinks resolved inside that root only (a sandbox's
// files are hostile: no link may lead the host's lookup out of it) and no
// magic link followed.
func statInSandbox(pid int, p string) (unix.Stat_t, error) {
	var st unix.Stat_t
	root, err := unix.Open("/proc/"+strconv.Itoa(pid)+"/root", unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return st, err
	}
	defer unix.Close(root)
	fd, err := unix.Openat2(root, strings.TrimPrefix(p, "/"), &unix.OpenHow{
		Flags:   unix.O_PATH | unix.O_CLOEXEC,
		Resolve: unix.RESOLVE_IN_ROOT | unix.RESOLVE_NO_MAGICLINKS,
	})
	if err != nil {
		return st, err
	}
	defer unix.Close(fd)
	err = unix.Fstat(fd, &st)
	return st, err
}

// dumpCRIU is a direct dump's CRIU, started with runc's state read before
// the sandbox is frozen: CRIU's start (the wrapper's shell, then CRIU's own
// loader and libraries, deploy/host-setup.sh) took 6 ms on a quiet host and
// 20 under load, all of it inside the frozen window while the dump started
// it. Started ahead, it loads beside the first layer copy and waits on its
// socket for the one request.
type dumpCRIU struct {
	st *runcState
	c  *criu.Criu
}

// startDumpCRIU reads runc's state of sandbox id and starts the CRIU that
// dumps it. An error wrapping errNoDirectDump says the dump goes through
// runc.
func (r *Runtime) startDumpCRIU(id string, pid uint32) (*dumpCRIU, error) {
	if r.criuBinary == "" {
		return nil, fmt.Errorf("%w: no criu in controld's PATH", errNoDirectDump)
	}
	st, err := r.readRuncState(id)
	if err != nil {
		return nil, err
	}
	if uint32(st.InitPID) != pid {
		return nil, fmt.Errorf("%w: runc's init pid %d is not the task's %d", errNoDirectDump, st.InitPID, pid)
	}
	c := criu.MakeCriu()
	c.SetCriuPath(r.criuBinary)
	// go-criu makes CRIU's end of its socket pair inheritable until CRIU
	// has started: one dump at a time starts its CRIU, so a concurrent
	// dump's CRIU cannot inherit (and hold open) this one's socket.
	// The CRIU wrapper (deploy/criu/wrapper.c) waits for a client's first
	// request before it loads CRIU, to answer runc's version probe itself;
	// this CRIU is started ahead of its request so that it has loaded by
	// the freeze, and the variable has the wrapper load it at once. Set
	// around the start only (the lock orders the dumps' starts): any other
	// child started meanwhile inherits a variable only the wrapper reads.
	criuStartMu.Lock()
	os.Setenv(criuWrapperExecVar, "1")
	err = c.Prepare()
	os.Unsetenv(criuWrapperExecVar)
	criuStartMu.Unlock()
	if err != nil {
		return nil, fmt.Errorf("start criu: %w", err)
	}
	return &dumpCRIU{st: st, c: c}, nil
}

// close ends CRIU: it exits when its socket closes, dump or no dump.
func (d *dumpCRIU) close() error { return d.c.Cleanup() }

// dumpDirect dumps sandbox id's processes into imageDir, leaving them
// running (frozen, when the caller froze them), with CRIU's log in
// workDir/dump.log: warnings and errors, everything when the runtime's
// logger is at debug level. pre is the CRIU started for it before the
// freeze (startDumpCRIU), nil to start one now; dumpDirect ends it. It
// returns an error wrapping errNoDirectDump, before it makes any
// directory, when it cannot run the dump itself.
func (r *Runtime) dumpDirect(ctx context.Context, id string, pid uint32, imageDir, workDir string, pre *dumpCRIU, devBind bool) error {
	d := pre
	if d == nil {
		var err error
		if d, err = r.startDumpCRIU(id, pid); err != nil {
			return err
		}
	}
	defer func() {
		if cerr := d.close(); cerr != nil {
			r.log.WarnContext(ctx, "criu swrk did not exit cleanly after the dump", "sandbox", id, "err", cerr)
		}
	}()
	st := d.st
	for _, dir := range []string{imageDir, workDir} {
		if err := os.Mkdir(dir, 0o700); err != nil && !errors.Is(err, os.ErrExist) {
			return err
		}
	}
	img, err := os.Open(imageDir)
	if err != nil {
		return err
	}
	defer img.Close()
	work, err := os.Open(workDir)
	if err != nil {
		return err
	}
	defer work.Close()
	opts, err := criuDumpRequest(st, img, work, r.cgroupV2, criuLogLevel(ctx, r.log), devBind)
	if err != nil {
		return err
	}
	// runc restore re-plumbs the init's stdio from this list.
	fds, err := json.Marshal(st.ExternalDescriptors)
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(imageDir, "descriptors.json"), fds, 0o600); err != nil {
		return err
	}
	// Dump ignores ctx: a CRIU stopped half way would leave the tasks
	// seized with its parasite in them. It ends with the dump.
	return d.c.Dump(opts, nil)
}

var criuStartMu sync.Mutex

// criuWrapperExecVar tells the CRIU wrapper to exec CRIU at once (see
// startDumpCRIU).
const criuWrapperExecVar = "FORKFLEET_CRIU_WRAPPER_EXEC"
