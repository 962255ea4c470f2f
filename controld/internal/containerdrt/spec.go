//go:build linux

package containerdrt

import (
	"context"
	"fmt"
	"maps"
	goruntime "runtime"
	"slices"
	"sort"
	"strconv"
	"strings"

	"github.com/containerd/containerd/v2/contrib/seccomp"
	"github.com/containerd/containerd/v2/core/containers"
	"github.com/containerd/containerd/v2/pkg/oci"
	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/forkfleet/forkfleet/api/errdefs"
	"github.com/forkfleet/forkfleet/controld/internal/network"
	"github.com/forkfleet/forkfleet/controld/internal/runtime"
	"github.com/forkfleet/forkfleet/controld/internal/userns"
)

// Environment variables guestd reads.
const (
	EnvACIToken   = "FORKFLEET_ACI_TOKEN"
	EnvAdminToken = "FORKFLEET_ADMIN_TOKEN"
	EnvSandboxID  = "FORKFLEET_SANDBOX_ID"
	EnvScreen     = "FORKFLEET_SCREEN"
	// EnvRunAsRoot=1 tells guestd to run the agent's processes as root.
	EnvRunAsRoot = "FORKFLEET_RUN_AS_ROOT"
)

// ACISocketInSandbox is where guestd listens inside the sandbox (guestd
// creates the directory and removes a stale socket at start).
const ACISocketInSandbox = "/run/forkfleet/aci.sock"

// criuConfigAnnotation makes runc hand a CRIU config file to CRIU on
// checkpoint and restore.
const criuConfigAnnotation = "org.criu.config"

// runLayoutAnnotation records in a sandbox's spec where its /run lives.
// runLayoutRootfs: on the writable layer, no mount. CRIU tars every tmpfs
// of a container on dump and again on every restore (3 to 8 ms each), and
// /run holds a few small files (guestd's socket), so new sandboxes keep it
// on the overlay like /tmp. A spec without the annotation (a checkpoint
// taken before) keeps a tmpfs /run: its CRIU images hold that mount.
const (
	runLayoutAnnotation = "forkfleet.dev/run"
	runLayoutRootfs     = "rootfs"
	runLayoutTmpfs      = "tmpfs"
)

// droppedCaps are removed from containerd's default set: a desktop sandbox
// needs neither raw sockets, device nodes, chroot, file capabilities, audit
// nor privileged ports.
var droppedCaps = []string{
	"CAP_MKNOD",
	"CAP_NET_RAW",
	"CAP_SETFCAP",
	"CAP_SYS_CHROOT",
	"CAP_AUDIT_WRITE",
	"CAP_NET_BIND_SERVICE",
}

const cpuPeriod = 100_000 // µs

// netHookTimeout bounds the network hook (seconds): runc fails the create
// or restore past it. The hook takes about a millisecond.
const netHookTimeout = 10

// CPU weight (cgroup v2's cpu.weight, 1..10000, 100 an ordinary process) as
// cgroup v1 cpu.shares (2..262144, 1024 an ordinary process): linear, so
// weight 100 is the kernel's default share.
const (
	maxCPUWeight = 10000
	sharesPer100 = 1024
	minCPUShares = 2
	maxCPUShares = 262144
)

func cpuShares(weight uint32) uint64 {
	return min(max(uint64(weight)*sharesPer100/100, minCPUShares), maxCPUShares)
}

func validateBootSpec(spec runtime.BootSpec) error {
	if err := validateID(spec.ID); err != nil {
		return err
	}
	if spec.CPUMillis < 0 {
		return errdefs.InvalidField("cpu_millis", "must not be negative")
	}
	if spec.MemoryBytes < 0 {
		return errdefs.InvalidField("memory_bytes", "must not be negative")
	}
	if spec.MemoryBytes > 0 && spec.MemoryBytes < 16<<20 {
		return errdefs.InvalidField("memory_bytes", "%d is below the 16 MiB floor", spec.MemoryBytes)
	}
	if spec.PidsMax < 0 || spec.DiskBytes < 0 || spec.LogBytes < 0 {
		return errdefs.InvalidField("resources", "limits must not be negative (pids %d, disk %d, log %d)", spec.PidsMax, spec.DiskBytes, spec.LogBytes)
	}
	if spec.CPUWeight > maxCPUWeight {
		return errdefs.InvalidField("cpu_weight", "%d is above %d", spec.CPUWeight, maxCPUWeight)
	}
	if spec.StartupCPUWeight > maxCPUWeight {
		return errdefs.InvalidField("startup_cpu_weight", "%d is above %d", spec.StartupCPUWeight, maxCPUWeight)
	}
	for k := range spec.Env {
		if k == "" || strings.ContainsAny(k, "=\x00") {
			return errdefs.InvalidField("env", "invalid variable name %q", k)
		}
		if strings.HasPrefix(k, "FORKFLEET_") {
			return errdefs.InvalidField("env", "%q: FORKFLEET_* variables are set by the runtime", k)
		}
	}
	for k, v := range spec.Labels {
		if k == "" || len(labelUserPrefix)+len(k)+len(v) > 4096 {
			return errdefs.InvalidField("labels", "label %q is empty or too long", k)
		}
	}
	return nil
}

func screenOf(spec runtime.BootSpec) string {
	w, h, d := spec.Width, spec.Height, spec.Depth
	if w == 0 || h == 0 {
		w, h = 1280, 800
	}
	if d == 0 {
		d = 24
	}
	return fmt.Sprintf("%dx%dx%d", w, h, d)
}

// sandboxEnv is what the runtime adds to the image's environment.
func sandboxEnv(spec runtime.BootSpec) []string {
	env := []string{
		EnvACIToken + "=" + spec.ACIToken,
		EnvAdminToken + "=" + spec.AdminToken,
		EnvSandboxID + "=" + spec.ID,
		EnvScreen + "=" + screenOf(spec),
	}
	if spec.RunAsRoot {
		env = append(env, EnvRunAsRoot+"=1")
	}
	keys := slices.Sorted(maps.Keys(spec.Env))
	for _, k := range keys {
		env = append(env, k+"="+spec.Env[k])
	}
	return env
}

// mergeEnv sets every KEY=value of add on base (replacing same keys).
func mergeEnv(base, add []string) []string {
	out := make([]string, 0, len(base)+len(add))
	set := map[string]bool{}
	for _, kv := range add {
		k, _, _ := strings.Cut(kv, "=")
		set[k] = true
	}
	for _, kv := range base {
		k, _, _ := strings.Cut(kv, "=")
		if !set[k] {
			out = append(out, kv)
		}
	}
	return append(out, add...)
}

// stripSandboxEnv removes what sandboxEnv added from a spec's environment,
// leaving the image's own variables (used when a disk-tier fork boots
// fresh with its own identity).
func stripSandboxEnv(env []string, userKeys []string) []string {
	drop := map[string]bool{}
	for _, k := range userKeys {
		drop[k] = true
	}
	out := make([]string, 0, len(env))
	for _, kv := range env {
		k, _, _ := strings.Cut(kv, "=")
		if strings.HasPrefix(k, "FORKFLEET_") || drop[k] {
			continue
		}
		out = append(out, kv)
	}
	return out
}

// networkAnnotation records a sandbox's network mode in its spec, so a
// fork (which must keep its source's in-sandbox network) can check it.
const networkAnnotation = "forkfleet.dev/network"

// resolvConfPath is where an egress sandbox's resolver file is mounted.
const resolvConfPath = "/etc/resolv.conf"

// withSandbox applies what every sandbox (booted or forked) gets: its own
// cgroup, limits, tmpfs sizes, capabilities, the CRIU config annotation and
// its network: a namespace of its own, made by runc (or CRIU) and finished
// by the network hook (in mode egress with the resolver file of the
// sandbox's DNS stub). Its steps run in this order: the mounts are
// filtered before /run and the mask binds are added, the resolver file
// last.
func (r *Runtime) withSandbox(spec runtime.BootSpec, nsb network.Sandbox) oci.SpecOpts {
	return oci.Compose(
		r.withOwnCgroup(spec),
		withLimits(spec),
		r.withNetworkNamespace(nsb),
		r.withSandboxTmpfs,
		r.withMaskBinds,
		withResolvConf(nsb),
		r.withCRIUConfig(spec),
	)
}

// withOwnCgroup sets the hostname and the sandbox's own cgroup. A fork
// built from its source's spec would otherwise join the source's cgroup
// (and deleting the fork would kill the source).
func (r *Runtime) withOwnCgroup(spec runtime.BootSpec) oci.SpecOpts {
	return func(_ context.Context, _ oci.Client, _ *containers.Container, s *oci.Spec) error {
		if s.Linux == nil {
			s.Linux = &specs.Linux{}
		}
		if s.Process == nil {
			s.Process = &specs.Process{}
		}
		s.Hostname = r.cfg.Hostname
		s.Linux.CgroupsPath = r.cgroupsPath(spec.ID)
		return nil
	}
}

// withLimits sets the limits, on every spec built for a sandbox (a fork's
// comes from its source's and gets its own): what the kernel enforces.
func withLimits(spec runtime.BootSpec) oci.SpecOpts {
	return func(_ context.Context, _ oci.Client, _ *containers.Container, s *oci.Spec) error {
		res := &specs.LinuxResources{}
		if spec.MemoryBytes > 0 {
			// Swap equal to the limit: memory+swap is capped at the
			// memory limit, so the sandbox never swaps.
			limit := spec.MemoryBytes
			res.Memory = &specs.LinuxMemory{Limit: &limit, Swap: &limit}
		}
		weight := spec.CPUWeight
		if spec.StartupCPUWeight > 0 {
			weight = spec.StartupCPUWeight // until SetCPUWeight
		}
		if spec.CPUMillis > 0 || weight > 0 {
			res.CPU = &specs.LinuxCPU{}
		}
		if spec.CPUMillis > 0 {
			quota := spec.CPUMillis * cpuPeriod / 1000
			period := uint64(cpuPeriod)
			res.CPU.Quota, res.CPU.Period = &quota, &period
		}
		if weight > 0 {
			shares := cpuShares(weight)
			res.CPU.Shares = &shares
		}
		if spec.PidsMax > 0 {
			pids := spec.PidsMax
			res.Pids = &specs.LinuxPids{Limit: &pids}
		}
		// Keep the device cgroup rules of the default spec.
		if s.Linux.Resources != nil {
			res.Devices = s.Linux.Resources.Devices
		}
		s.Linux.Resources = res
		return nil
	}
}

// withNetworkNamespace gives the sandbox a network namespace of its own,
// made by runc at a boot and by CRIU at a restore, inside the sandbox's
// user namespace; runc then runs the network hook (createRuntime: after
// the namespaces exist, before the sandbox's process runs; on CRIU's
// setup-namespaces notification at a restore), which pins it and finishes
// the network controld prepared (network.Attach). No other hook runs.
func (r *Runtime) withNetworkNamespace(nsb network.Sandbox) oci.SpecOpts {
	return func(_ context.Context, _ oci.Client, _ *containers.Container, s *oci.Spec) error {
		nss := s.Linux.Namespaces[:0]
		for _, ns := range s.Linux.Namespaces {
			if ns.Type != specs.NetworkNamespace {
				nss = append(nss, ns)
			}
		}
		s.Linux.Namespaces = append(nss, specs.LinuxNamespace{Type: specs.NetworkNamespace})
		timeout := netHookTimeout
		s.Hooks = &specs.Hooks{CreateRuntime: []specs.Hook{{
			Path:    r.cfg.NetHook,
			Args:    append([]string{NetHookName}, nsb.HookArgs...),
			Timeout: &timeout,
		}}}
		return nil
	}
}

// withSandboxTmpfs sizes the /run and /dev tmpfs, drops /dev/shm and the
// resolver file (withResolvConf adds its own), and mounts a tmpfs on /run
// unless the layout keeps /run on the rootfs.
func (r *Runtime) withSandboxTmpfs(_ context.Context, _ oci.Client, _ *containers.Container, s *oci.Spec) error {
	mounts := s.Mounts[:0]
	for _, m := range s.Mounts {
		switch m.Destination {
		case resolvConfPath:
			continue // added by withResolvConf for egress
		case "/run":
			m.Options = setSizeOption(m.Options, r.cfg.RunTmpfsBytes)
		case "/dev":
			m.Options = setSizeOption(m.Options, r.cfg.DevShmBytes)
		case "/dev/shm":
			// CRIU tars every tmpfs on each dump and restore (about 4
			// ms each): POSIX shared memory lives in /dev's tmpfs, in a
			// /dev/shm directory guestd makes at start.
			continue
		}
		mounts = append(mounts, m)
	}
	s.Mounts = mounts
	if s.Annotations[runLayoutAnnotation] != runLayoutRootfs &&
		!slices.ContainsFunc(s.Mounts, func(m specs.Mount) bool { return m.Destination == "/run" }) {
		s.Mounts = append(s.Mounts, specs.Mount{
			Destination: "/run", Type: "tmpfs", Source: "tmpfs",
			Options: setSizeOption([]string{"nosuid", "nodev", "mode=755"}, r.cfg.RunTmpfsBytes),
		})
	}
	return nil
}

// withMaskBinds masks directories with a read-only bind of an empty
// directory. runc masks them with a read-only tmpfs each, and CRIU tars
// every tmpfs on dump and restore (5 to 10 ms each); a bind masks as well
// and is an external mount to CRIU: nothing to tar. runc refuses binds
// inside /proc; the /proc directories that are empty on this kernel are
// not masked at all.
func (r *Runtime) withMaskBinds(_ context.Context, _ oci.Client, _ *containers.Container, s *oci.Spec) error {
	if r.emptyDir == "" {
		return nil
	}
	masked := s.Linux.MaskedPaths[:0]
	for _, p := range s.Linux.MaskedPaths {
		if r.unmaskDirs[p] {
			continue
		}
		if !r.maskDirs[p] {
			masked = append(masked, p)
			continue
		}
		if !slices.ContainsFunc(s.Mounts, func(m specs.Mount) bool { return m.Destination == p }) {
			s.Mounts = append(s.Mounts, specs.Mount{
				Destination: p, Type: "bind", Source: r.emptyDir,
				Options: []string{"rbind", "ro", "nosuid", "nodev", "noexec"},
			})
		}
	}
	s.Linux.MaskedPaths = masked
	// A source spec may come from a runtime with another state dir.
	for i, m := range s.Mounts {
		if m.Type == "bind" && r.maskDirs[m.Destination] {
			s.Mounts[i].Source = r.emptyDir
		}
	}
	return nil
}

// withResolvConf mounts the resolver file of an egress sandbox's DNS stub.
func withResolvConf(nsb network.Sandbox) oci.SpecOpts {
	return func(_ context.Context, _ oci.Client, _ *containers.Container, s *oci.Spec) error {
		if nsb.ResolvConf != "" {
			s.Mounts = append(s.Mounts, specs.Mount{
				Destination: resolvConfPath, Type: "bind", Source: nsb.ResolvConf,
				Options: []string{"rbind", "ro", "nosuid", "nodev", "noexec"},
			})
		}
		return nil
	}
}

// withCRIUConfig records the CRIU configuration of the sandbox's image
// options and its network mode in the spec's annotations.
func (r *Runtime) withCRIUConfig(spec runtime.BootSpec) oci.SpecOpts {
	return func(_ context.Context, _ oci.Client, _ *containers.Container, s *oci.Spec) error {
		if s.Annotations == nil {
			s.Annotations = map[string]string{}
		}
		imageOpts, err := parseCRIUOptions(s.Annotations[criuOptionsAnnotation])
		if err != nil {
			return err
		}
		conf, err := r.criuConfigFor(imageOpts)
		if err != nil {
			return err
		}
		s.Annotations[criuConfigAnnotation] = conf
		s.Annotations[networkAnnotation] = spec.Network.Mode.String()
		return nil
	}
}

func setSizeOption(opts []string, size int64) []string {
	out := make([]string, 0, len(opts)+1)
	for _, o := range opts {
		if !strings.HasPrefix(o, "size=") {
			out = append(out, o)
		}
	}
	return append(out, "size="+strconv.FormatInt(size, 10))
}

// sandboxSpecOpts builds the OCI spec of a sandbox from this host's policy,
// its image and its user namespace range (nil: the host's) alone: a fresh boot (image: oci.WithImageConfig) and every
// restore (image: withImageProcess; a checkpoint's spec is never reused: an
// imported one is whatever its writer wanted, capabilities and host mounts
// included). Only runLayout comes from a checkpoint, and it picks between
// two local layouts. The seccomp profile comes last: containerd's default
// profile depends on the capabilities.
func (r *Runtime) sandboxSpecOpts(image oci.SpecOpts, spec runtime.BootSpec, criuOpts []string, nsb network.Sandbox, rng *userns.Range, runLayout string) []oci.SpecOpts {
	opts := []oci.SpecOpts{
		image,
		withImageCRIUOptions(criuOpts),
		withMergedEnv(sandboxEnv(spec)),
		oci.WithDroppedCapabilities(droppedCaps),
		oci.WithNoNewPrivileges,
	}
	if runLayout == runLayoutRootfs {
		opts = append(opts, withRunOnRootfs)
	}
	opts = append(opts, r.withSandbox(spec, nsb), withUserNamespace(rng))
	return append(opts, seccomp.WithDefaultProfile(), withNativeSyscallsOnly)
}

// nativeSeccompArch is the seccomp architecture of this host's own ABI.
var nativeSeccompArch = map[string]specs.Arch{"amd64": specs.ArchX86_64, "arm64": specs.ArchAARCH64}[goruntime.GOARCH]

// withNativeSyscallsOnly keeps only the host's native ABI in the seccomp
// profile. containerd's default also admits the 32-bit ones (i386 and x32
// on amd64, arm on arm64): no app of a desktop sandbox needs them, and
// their compat system call paths are kernel surface a sandbox should not
// reach. A system call of another ABI now kills its thread (SIGSYS, the
// filter's bad-arch action as runc builds it). The filter is a third of the size, and that
// is paid per process: CRIU installs a restored process's filter anew, and
// the kernel simulates the filter for every system call number at each
// install (forks.md, "The seccomp filter").
func withNativeSyscallsOnly(_ context.Context, _ oci.Client, _ *containers.Container, s *oci.Spec) error {
	if s.Linux == nil || s.Linux.Seccomp == nil || nativeSeccompArch == "" {
		return nil
	}
	s.Linux.Seccomp.Architectures = []specs.Arch{nativeSeccompArch}
	return nil
}

// withRunOnRootfs drops the default tmpfs on /run (see runLayoutAnnotation)
// and records that in the spec, so forks and disk-tier boots built from it
// keep the same layout.
func withRunOnRootfs(_ context.Context, _ oci.Client, _ *containers.Container, s *oci.Spec) error {
	s.Mounts = slices.DeleteFunc(s.Mounts, func(m specs.Mount) bool { return m.Destination == "/run" })
	if s.Annotations == nil {
		s.Annotations = map[string]string{}
	}
	s.Annotations[runLayoutAnnotation] = runLayoutRootfs
	return nil
}

func withMergedEnv(env []string) oci.SpecOpts {
	return func(_ context.Context, _ oci.Client, _ *containers.Container, s *oci.Spec) error {
		if s.Process == nil {
			s.Process = &specs.Process{}
		}
		s.Process.Env = mergeEnv(s.Process.Env, env)
		return nil
	}
}

// userEnvKeys returns the sorted keys of the caller's env, stored so a
// disk-tier fork can strip the source's variables.
func userEnvKeys(env map[string]string) string {
	keys := make([]string, 0, len(env))
	for k := range env {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return strings.Join(keys, ",")
}
