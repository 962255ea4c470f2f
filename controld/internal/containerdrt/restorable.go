//go:build linux

package containerdrt

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/forkfleet/forkfleet/api/errdefs"
)

// A memory-tier checkpoint restores processes that ran on the dumping
// host's CPU and kernel: instructions the CPU offered them (CRIU's cpuinfo
// image: the CPU's feature words) and kernel interfaces they used. Its
// image records both (hostInfo, in the metadata blob), and a host pulling
// or importing it checks them before any work: `criu cpuinfo check` of the
// recorded CPU, and a kernel at least as new as the dumping one (the
// kernel's interfaces only grow). An imported checkpoint keeps its
// origin's record (hostInfoFile), so exporting it again passes on the CPU
// and kernel its processes really ran on.

// hostInfo is where a memory-tier checkpoint's processes were dumped.
type hostInfo struct {
	// Kernel is the release (uname -r) of the dumping host.
	Kernel string `json:"kernel"`
	// CPUInfo is `criu cpuinfo dump`'s cpuinfo.img there.
	CPUInfo []byte `json:"cpuinfo"`
}

const (
	hostInfoFile = "host.json"
	// criuCheckTimeout bounds a criu cpuinfo run.
	criuCheckTimeout = 30 * time.Second
	// maxCPUInfoBytes bounds the recorded cpuinfo image (128 bytes on x86).
	maxCPUInfoBytes = 64 << 10
)

// checkpointHostInfo is the hostInfo of the checkpoint in dir: its
// origin's when it was imported, else this host's.
func checkpointHostInfo(ctx context.Context, dir string) (*hostInfo, error) {
	b, err := os.ReadFile(filepath.Join(dir, hostInfoFile))
	if err == nil {
		hi := &hostInfo{}
		if err := json.Unmarshal(b, hi); err != nil {
			return nil, fmt.Errorf("checkpoint %s: %s: %w: %v", dir, hostInfoFile, errdefs.ErrInternal, err)
		}
		return hi, nil
	}
	if !errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("checkpoint %s: %w: %w", dir, errdefs.ErrInternal, err)
	}
	return thisHostInfo(ctx)
}

// thisHostInfo dumps this host's CPU with criu and reads its kernel release.
func thisHostInfo(ctx context.Context) (*hostInfo, error) {
	tmp, err := os.MkdirTemp("", "forkfleet-cpuinfo-")
	if err != nil {
		return nil, fmt.Errorf("cpuinfo: %w: %w", errdefs.ErrInternal, err)
	}
	defer os.RemoveAll(tmp)
	if out, err := runCRIUCPUInfo(ctx, "dump", tmp); err != nil {
		return nil, fmt.Errorf("criu cpuinfo dump: %w: %v: %s", errdefs.ErrInternal, err, out)
	}
	img, err := os.ReadFile(filepath.Join(tmp, "cpuinfo.img"))
	if err != nil {
		return nil, fmt.Errorf("criu cpuinfo dump: %w: %w", errdefs.ErrInternal, err)
	}
	return &hostInfo{Kernel: kernelRelease(), CPUInfo: img}, nil
}

func runCRIUCPUInfo(ctx context.Context, verb, dir string) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, criuCheckTimeout)
	defer cancel()
	var out bytes.Buffer
	cmd := exec.CommandContext(ctx, "criu", "cpuinfo", verb, "-D", dir, "-v1")
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	return strings.TrimSpace(out.String()), err
}

func kernelRelease() string {
	var u unix.Utsname
	if err := unix.Uname(&u); err != nil {
		return ""
	}
	return unix.ByteSliceToString(u.Release[:])
}

// checkRestorable refuses, with FailedPrecondition naming why, a
// checkpoint image this host cannot restore. Disk-tier checkpoints hold no
// processes; images written before hostInfo existed carry nothing to check.
func checkRestorable(ctx context.Context, name string, ck *checkpointImage) error {
	hi := ck.exported.Host
	if len(ck.criu) == 0 || hi == nil {
		return nil
	}
	if err := kernelCanRestore(hi.Kernel, kernelRelease()); err != nil {
		return errdefs.WithReason(errdefs.ErrFailedPrecondition, "KERNEL_INCOMPATIBLE", "%s: %v", name, err)
	}
	if len(hi.CPUInfo) == 0 || len(hi.CPUInfo) > maxCPUInfoBytes {
		return notCheckpointImage(name, "cpuinfo image of %d bytes", len(hi.CPUInfo))
	}
	tmp, err := os.MkdirTemp("", "forkfleet-cpuinfo-")
	if err != nil {
		return fmt.Errorf("cpuinfo: %w: %w", errdefs.ErrInternal, err)
	}
	defer os.RemoveAll(tmp)
	if err := os.WriteFile(filepath.Join(tmp, "cpuinfo.img"), hi.CPUInfo, 0o600); err != nil {
		return fmt.Errorf("cpuinfo: %w: %w", errdefs.ErrInternal, err)
	}
	out, err := runCRIUCPUInfo(ctx, "check", tmp)
	if err != nil {
		var ee *exec.ExitError
		if !errors.As(err, &ee) {
			return fmt.Errorf("criu cpuinfo check: %w: %v", errdefs.ErrInternal, err)
		}
		return errdefs.WithReason(errdefs.ErrFailedPrecondition, "CPU_INCOMPATIBLE",
			"%s: this host's CPU cannot run the checkpoint's processes (criu cpuinfo check against the dumping host's CPU failed): %s", name, lastLines(out, 3))
	}
	return nil
}

// kernelCanRestore compares kernel releases by major.minor: a host may
// restore a dump of its own kernel series or an older one.
func kernelCanRestore(source, here string) error {
	if source == "" {
		return nil
	}
	sMaj, sMin, ok := kernelVersion(source)
	if !ok {
		return fmt.Errorf("checkpoint records kernel %q, not a kernel release", source)
	}
	hMaj, hMin, ok := kernelVersion(here)
	if !ok {
		return fmt.Errorf("this host's kernel release %q is unreadable", here)
	}
	if hMaj < sMaj || (hMaj == sMaj && hMin < sMin) {
		return fmt.Errorf("checkpoint was dumped on kernel %s; this host runs %s, an older series that may lack what its processes use", source, here)
	}
	return nil
}

// kernelVersion parses the major and minor numbers of a release such as
// "6.18.44-fc-v1045".
func kernelVersion(rel string) (int, int, bool) {
	parts := strings.SplitN(rel, ".", 3)
	if len(parts) < 2 {
		return 0, 0, false
	}
	maj, err1 := strconv.Atoi(parts[0])
	minor := parts[1]
	if i := strings.IndexFunc(minor, func(r rune) bool { return r < '0' || r > '9' }); i >= 0 {
		minor = minor[:i]
	}
	min, err2 := strconv.Atoi(minor)
	if err1 != nil || err2 != nil || maj < 0 || min < 0 {
		return 0, 0, false
	}
	return maj, min, true
}

func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "; ")
}
