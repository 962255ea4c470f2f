package config

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"strconv"
	"strings"

	controldv1 "github.com/forkfleet/forkfleet/api/gen/forkfleet/controld/v1"
	"github.com/forkfleet/forkfleet/api/limits"
)

// Limits are the per-sandbox limits: the defaults, and under Max the most a
// request may ask for.
type Limits struct {
	SandboxLimits
	Max SandboxLimits `toml:"max"`
}

// SandboxLimits is one set of limits (controldv1.Resources in TOML).
type SandboxLimits struct {
	Memory    Size   `toml:"memory"`
	CPUWeight uint32 `toml:"cpu_weight"`
	CPUMillis int64  `toml:"cpu_millis"`
	Pids      int64  `toml:"pids"`
	Disk      Size   `toml:"disk"`
	Log       Size   `toml:"log"`
}

func (l SandboxLimits) resources() *controldv1.Resources {
	return &controldv1.Resources{
		MemoryBytes: int64(l.Memory), CpuWeight: l.CPUWeight, CpuMillis: l.CPUMillis,
		PidsMax: l.Pids, DiskBytes: int64(l.Disk), LogBytes: int64(l.Log),
	}
}

// Admission bounds what the host holds at once.
type Admission struct {
	MaxSandboxes int `toml:"max_sandboxes"`
	// MaxMemory bounds the sum of the sandboxes' memory limits: a size or a
	// percentage of the host's RAM.
	MaxMemory Share `toml:"max_memory"`
}

// HostLimits turns the configuration into the host's limits; ramBytes is
// the host's RAM, which a percentage in admission.max_memory refers to.
func (c *Config) HostLimits(ramBytes int64) limits.Host {
	return limits.Host{
		Default:        c.Limits.resources(),
		Max:            c.Limits.Max.resources(),
		MaxSandboxes:   c.Admission.MaxSandboxes,
		MaxMemoryBytes: c.Admission.MaxMemory.Of(ramBytes),
	}
}

// HostRAM returns the host's RAM (MemTotal of /proc/meminfo).
func HostRAM() (int64, error) {
	b, err := os.ReadFile("/proc/meminfo")
	if err != nil {
		return 0, err
	}
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) >= 2 && f[0] == "MemTotal:" {
			kb, err := strconv.ParseInt(f[1], 10, 64)
			if err != nil {
				return 0, fmt.Errorf("/proc/meminfo: %w", err)
			}
			return kb << 10, nil
		}
	}
	return 0, fmt.Errorf("/proc/meminfo: no MemTotal")
}

// Size is a byte count written as "512MiB", "4GiB" or "1048576B" in TOML.
type Size int64

// MarshalText writes the largest unit that keeps the value whole.
func (s Size) MarshalText() ([]byte, error) { return []byte(limits.FormatBytes(int64(s))), nil }

// UnmarshalText implements encoding.TextUnmarshaler (limits.ParseBytes).
func (s *Size) UnmarshalText(b []byte) error {
	n, err := limits.ParseBytes(string(b))
	if err != nil {
		return err
	}
	*s = Size(n)
	return nil
}

// Share is a size or a percentage of something the host has ("200%").
type Share struct {
	Percent int64 // used when Bytes is 0
	Bytes   Size
}

// Of resolves the share against total.
func (s Share) Of(total int64) int64 {
	if s.Bytes != 0 {
		return int64(s.Bytes)
	}
	return total/100*s.Percent + total%100*s.Percent/100
}

// MarshalText implements encoding.TextMarshaler.
func (s Share) MarshalText() ([]byte, error) {
	if s.Bytes != 0 {
		return s.Bytes.MarshalText()
	}
	return []byte(strconv.FormatInt(s.Percent, 10) + "%"), nil
}

// UnmarshalText implements encoding.TextUnmarshaler.
func (s *Share) UnmarshalText(b []byte) error {
	t := strings.TrimSpace(string(b))
	if num, ok := strings.CutSuffix(t, "%"); ok {
		n, err := strconv.ParseInt(num, 10, 64)
		if err != nil || n <= 0 || n > 100_000 {
			return fmt.Errorf("share %q: want a percentage in 1..100000", t)
		}
		*s = Share{Percent: n}
		return nil
	}
	var sz Size
	if err := sz.UnmarshalText(b); err != nil {
		return fmt.Errorf("%w, or a percentage such as 200%%", err)
	}
	*s = Share{Bytes: sz}
	return nil
}
