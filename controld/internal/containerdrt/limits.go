//go:build linux

package containerdrt

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"

	"github.com/forkfleet/forkfleet/api/errdefs"
	"github.com/forkfleet/forkfleet/controld/internal/btrfs"
	"github.com/forkfleet/forkfleet/controld/internal/runtime"
)

var (
	_ runtime.LimitProbe  = (*Runtime)(nil)
	_ runtime.UsageProbe  = (*Runtime)(nil)
	_ runtime.CPUWeighter = (*Runtime)(nil)
)

// SetCPUWeight implements runtime.CPUWeighter: one write of the sandbox's
// cgroup file (cpu.shares on cgroup v1; cpu.weight on v2, converted from
// the shares as runc converts a spec's).
func (r *Runtime) SetCPUWeight(_ context.Context, id string, weight uint32) error {
	if err := validateID(id); err != nil {
		return err
	}
	if weight > maxCPUWeight {
		return errdefs.InvalidField("cpu_weight", "%d is above %d", weight, maxCPUWeight)
	}
	if weight == 0 {
		weight = 100
	}
	path, value := filepath.Join(r.cfg.CgroupRoot, "cpu", r.cgroupsPath(id), "cpu.shares"), cpuShares(weight)
	if r.cgroupV2 {
		path, value = filepath.Join(r.cfg.CgroupRoot, r.cgroupsPath(id), "cpu.weight"), cgroupV2Weight(value)
	}
	f, err := os.OpenFile(path, os.O_WRONLY, 0)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("sandbox %s: %w: no cgroup file %s", id, errdefs.ErrNotFound, path)
		}
		return fmt.Errorf("sandbox %s: %w: %w", id, errdefs.ErrInternal, err)
	}
	_, err = f.WriteString(strconv.FormatUint(value, 10))
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("sandbox %s: cpu weight: %w: %w", id, errdefs.ErrInternal, err)
	}
	return nil
}

// cgroupV2Weight is runc's conversion of cpu.shares to cgroup v2's
// cpu.weight (what the sandbox got at start from the spec's shares).
func cgroupV2Weight(shares uint64) uint64 {
	return 1 + (shares-minCPUShares)*(maxCPUWeight-1)/(maxCPUShares-minCPUShares)
}

// Usage implements runtime.UsageProbe from the sandbox's cgroups: CPU time
// (cpuacct.usage, or cpu.stat's usage_usec on cgroup v2) and memory charged
// (memory.usage_in_bytes, or memory.current). Two small file reads.
func (r *Runtime) Usage(_ context.Context, id string) (runtime.Usage, error) {
	if err := validateID(id); err != nil {
		return runtime.Usage{}, err
	}
	var u runtime.Usage
	if r.cgroupV2 {
		dir := filepath.Join(r.cfg.CgroupRoot, r.cgroupsPath(id))
		usec, err := keyedValue(filepath.Join(dir, "cpu.stat"), "usage_usec")
		if err != nil {
			return u, fmt.Errorf("sandbox %s: %w", id, err)
		}
		mem, err := singleValue(filepath.Join(dir, "memory.current"))
		if err != nil {
			return u, fmt.Errorf("sandbox %s: %w", id, err)
		}
		return runtime.Usage{CPUSeconds: float64(usec) / 1e6, MemoryBytes: int64(mem)}, nil
	}
	ns, err := singleValue(filepath.Join(r.cfg.CgroupRoot, "cpuacct", r.cgroupsPath(id), "cpuacct.usage"))
	if err != nil {
		return u, fmt.Errorf("sandbox %s: %w", id, err)
	}
	mem, err := singleValue(filepath.Join(r.cfg.CgroupRoot, "memory", r.cgroupsPath(id), "memory.usage_in_bytes"))
	if err != nil {
		return u, fmt.Errorf("sandbox %s: %w", id, err)
	}
	return runtime.Usage{CPUSeconds: float64(ns) / 1e9, MemoryBytes: int64(mem)}, nil
}

// singleValue reads a cgroup file holding one number.
func singleValue(path string) (uint64, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return 0, fmt.Errorf("%w: no cgroup file %s", errdefs.ErrNotFound, path)
		}
		return 0, fmt.Errorf("%w: %w", errdefs.ErrInternal, err)
	}
	n, err := strconv.ParseUint(string(bytes.TrimSpace(b)), 10, 64)
	if err != nil {
		return 0, fmt.Errorf("%w: %s: %w", errdefs.ErrInternal, path, err)
	}
	return n, nil
}

// LimitHits implements runtime.LimitProbe from the sandbox's cgroups (the
// OOM kills of its memory cgroup, the forks its pids cgroup refused) and
// its writable layer's quota group. It reads files only: cheap enough to
// poll every sandbox every second.
func (r *Runtime) LimitHits(_ context.Context, id string) (runtime.LimitHits, error) {
	if err := validateID(id); err != nil {
		return runtime.LimitHits{}, err
	}
	var h runtime.LimitHits
	memFile, memKey := filepath.Join(r.cfg.CgroupRoot, "memory", r.cgroupsPath(id), "memory.oom_control"), "oom_kill"
	pidsFile := filepath.Join(r.cfg.CgroupRoot, "pids", r.cgroupsPath(id), "pids.events")
	if r.cgroupV2 {
		memFile = filepath.Join(r.cfg.CgroupRoot, r.cgroupsPath(id), "memory.events")
		pidsFile = filepath.Join(r.cfg.CgroupRoot, r.cgroupsPath(id), "pids.events")
	}
	var err error
	if h.OOMKills, err = keyedValue(memFile, memKey); err != nil {
		return h, fmt.Errorf("sandbox %s: %w", id, err)
	}
	if h.PidsRefused, err = keyedValue(pidsFile, "max"); err != nil {
		return h, fmt.Errorf("sandbox %s: %w", id, err)
	}
	if dir := r.layerDir(id); r.cfg.LayersDir != "" && btrfs.IsSubvolume(dir) {
		u, err := btrfs.SubvolumeUsage(dir)
		if err != nil {
			return h, fmt.Errorf("sandbox %s: %w: writable layer usage: %w", id, errdefs.ErrInternal, err)
		}
		h.DiskUsed, h.DiskLimit = int64(u.Used()), int64(u.Limit)
	}
	return h, nil
}

// keyedValue reads "key value" lines (memory.oom_control, pids.events).
func keyedValue(path, key string) (uint64, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return 0, fmt.Errorf("%w: no cgroup file %s", errdefs.ErrNotFound, path)
		}
		return 0, fmt.Errorf("%w: %w", errdefs.ErrInternal, err)
	}
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		k, v, ok := bytes.Cut(sc.Bytes(), []byte(" "))
		if ok && string(k) == key {
			n, err := strconv.ParseUint(string(bytes.TrimSpace(v)), 10, 64)
			if err != nil {
				return 0, fmt.Errorf("%w: %s: %w", errdefs.ErrInternal, path, err)
			}
			return n, nil
		}
	}
	return 0, nil // an older kernel without the counter
}
