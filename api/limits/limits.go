// Package limits holds the rules of a sandbox's resource limits
// (controldv1.Resources) that controld and its in-memory fake share: which
// values a request may ask for, what a sandbox gets for a field it leaves 0,
// the most one host grants, and when a host admits one more sandbox.
//
// Every sandbox has every limit: a field left 0 takes the host's default (for
// a fork, its checkpoint's value), never "unlimited". The one exception is
// cpu_millis, a hard CPU quota, which hosts leave off by default (0): the CPU
// weight already shares contended cores.
package limits

import (
	"errors"
	"fmt"
	"strconv"
	"strings"

	"google.golang.org/protobuf/proto"

	"github.com/forkfleet/forkfleet/api/errdefs"
	controldv1 "github.com/forkfleet/forkfleet/api/gen/forkfleet/controld/v1"
)

// Floors: below these a desktop sandbox cannot boot or a limit means nothing.
const (
	MinMemoryBytes = 64 << 20
	MinCPUMillis   = 10
	MinPids        = 64
	MinDiskBytes   = 16 << 20
	MinLogBytes    = 64 << 10
	MaxCPUWeight   = 10000 // cgroup v2's cpu.weight range is 1..10000
)

// Host is one host's limits: the defaults a sandbox gets and the most a
// request may ask for, per field of controldv1.Resources, and the admission
// limits of the host as a whole.
type Host struct {
	// Default fills the fields a request leaves 0.
	Default *controldv1.Resources
	// Max bounds what a request (or a checkpoint a fork inherits from) may
	// ask for. Max.CpuMillis 0 allows any quota up to 1024 cores.
	Max *controldv1.Resources
	// MaxSandboxes bounds the sandboxes the host holds at once (every
	// sandbox with a container: creating, booting, ready, suspended, pooled).
	MaxSandboxes int
	// MaxMemoryBytes bounds the sum of those sandboxes' memory limits.
	MaxMemoryBytes int64
}

// Default is the built-in host: what controld's default configuration and
// the fake use. controld's memory admission default depends on the host's
// RAM (see its config); here it is 64 GiB.
func Default() Host {
	return Host{
		Default: &controldv1.Resources{
			MemoryBytes: 1 << 30,
			CpuWeight:   100,
			PidsMax:     2048,
			DiskBytes:   4 << 30,
			LogBytes:    8 << 20,
		},
		Max: &controldv1.Resources{
			CpuMillis:   64_000,
			MemoryBytes: 16 << 30,
			CpuWeight:   MaxCPUWeight,
			PidsMax:     32768,
			DiskBytes:   64 << 30,
			LogBytes:    256 << 20,
		},
		MaxSandboxes:   128,
		MaxMemoryBytes: 64 << 30,
	}
}

// field is one limit of controldv1.Resources.
type field struct {
	name  string
	floor int64
	get   func(*controldv1.Resources) int64
	set   func(*controldv1.Resources, int64)
	// optional: 0 is a valid effective value (no limit of this kind).
	optional bool
}

var fields = []field{
	{"cpu_millis", MinCPUMillis, func(r *controldv1.Resources) int64 { return r.GetCpuMillis() },
		func(r *controldv1.Resources, v int64) { r.CpuMillis = v }, true},
	{"memory_bytes", MinMemoryBytes, func(r *controldv1.Resources) int64 { return r.GetMemoryBytes() },
		func(r *controldv1.Resources, v int64) { r.MemoryBytes = v }, false},
	{"cpu_weight", 1, func(r *controldv1.Resources) int64 { return int64(r.GetCpuWeight()) },
		func(r *controldv1.Resources, v int64) { r.CpuWeight = uint32(v) }, false},
	{"pids_max", MinPids, func(r *controldv1.Resources) int64 { return r.GetPidsMax() },
		func(r *controldv1.Resources, v int64) { r.PidsMax = v }, false},
	{"disk_bytes", MinDiskBytes, func(r *controldv1.Resources) int64 { return r.GetDiskBytes() },
		func(r *controldv1.Resources, v int64) { r.DiskBytes = v }, false},
	{"log_bytes", MinLogBytes, func(r *controldv1.Resources) int64 { return r.GetLogBytes() },
		func(r *controldv1.Resources, v int64) { r.LogBytes = v }, false},
}

// ceiling is the most any host grants for f, whatever its configuration.
func ceiling(f field) int64 {
	switch f.name {
	case "cpu_millis":
		return 1024 * 1000
	case "cpu_weight":
		return MaxCPUWeight
	}
	return 1 << 50
}

func (h Host) max(f field) int64 {
	if m := f.get(h.Max); m > 0 {
		return m
	}
	return ceiling(f)
}

// Resolve checks the limits a request asks for and returns the effective
// ones: each field left 0 takes base's value, base being the host's
// defaults for a new sandbox (Resolve(field, req, nil)) or the checkpoint's
// limits for a fork. Every effective value must lie within the host's
// maxima; an inherited one that does not (a checkpoint from a bigger host)
// is named so the caller can ask for less. Errors are InvalidArgument
// naming field.<limit>.
func (h Host) Resolve(prefix string, req, base *controldv1.Resources) (*controldv1.Resources, error) {
	if base == nil {
		base = h.Default
	}
	out := &controldv1.Resources{}
	for _, f := range fields {
		name := prefix + "." + f.name
		v := f.get(req)
		from := "requested"
		switch {
		case v < 0:
			return nil, errdefs.InvalidField(name, "%d is negative (0 means the default)", v)
		case v == 0:
			v, from = f.get(base), "inherited"
		}
		if v == 0 && !f.optional {
			// A base without this limit (a checkpoint recorded before the
			// limit existed): the host's default applies.
			v = f.get(h.Default)
		}
		if v != 0 && v < f.floor {
			return nil, errdefs.InvalidField(name, "%s %s below the floor %s", from, format(f, v), format(f, f.floor))
		}
		if m := h.max(f); v > m {
			if from == "inherited" {
				return nil, errdefs.InvalidField(name, "the inherited %s exceeds this host's maximum %s: ask for less", format(f, v), format(f, m))
			}
			return nil, errdefs.InvalidField(name, "%s exceeds this host's maximum %s", format(f, v), format(f, m))
		}
		f.set(out, v)
	}
	return out, nil
}

// Validate checks a host configuration: defaults within floors and maxima,
// admission limits positive.
func (h Host) Validate() error {
	if h.Default == nil || h.Max == nil {
		return errors.New("limits: defaults and maxima are required")
	}
	var errs []error
	for _, f := range fields {
		d, m := f.get(h.Default), f.get(h.Max)
		switch {
		case d < 0 || m < 0:
			errs = append(errs, fmt.Errorf("%s: must not be negative", f.name))
		case m != 0 && m < f.floor:
			errs = append(errs, fmt.Errorf("max %s: %s is below the floor %s", f.name, format(f, m), format(f, f.floor)))
		case m > ceiling(f):
			errs = append(errs, fmt.Errorf("max %s: %s is above %s", f.name, format(f, m), format(f, ceiling(f))))
		case d == 0 && !f.optional:
			errs = append(errs, fmt.Errorf("default %s: must be set (every sandbox has this limit)", f.name))
		case d != 0 && d < f.floor:
			errs = append(errs, fmt.Errorf("default %s: %s is below the floor %s", f.name, format(f, d), format(f, f.floor)))
		case d > h.max(f):
			errs = append(errs, fmt.Errorf("default %s: %s exceeds the maximum %s", f.name, format(f, d), format(f, h.max(f))))
		}
	}
	if h.MaxSandboxes < 1 {
		errs = append(errs, fmt.Errorf("max sandboxes: %d must be at least 1", h.MaxSandboxes))
	}
	if h.MaxMemoryBytes < h.Default.GetMemoryBytes() {
		errs = append(errs, fmt.Errorf("max memory: %s holds not even one sandbox of the default %s",
			Bytes(h.MaxMemoryBytes), Bytes(h.Default.GetMemoryBytes())))
	}
	return errors.Join(errs...)
}

// Usage is what a host holds, or what a request adds.
type Usage struct {
	Sandboxes   int
	MemoryBytes int64 // the sum of their memory limits
}

// Of is the usage of one sandbox with limits r.
func Of(r *controldv1.Resources) Usage {
	return Usage{Sandboxes: 1, MemoryBytes: r.GetMemoryBytes()}
}

// Add sums two usages.
func (u Usage) Add(v Usage) Usage {
	return Usage{Sandboxes: u.Sandboxes + v.Sandboxes, MemoryBytes: u.MemoryBytes + v.MemoryBytes}
}

// ReasonHostFull is the ErrorInfo reason of an admission refusal.
const ReasonHostFull = "HOST_AT_CAPACITY"

// Admit returns nil when the host, holding held, can take add as well, and
// otherwise a ResourceExhausted error saying which limit is reached.
func (h Host) Admit(held, add Usage) error {
	if n := held.Sandboxes + add.Sandboxes; n > h.MaxSandboxes {
		return errdefs.WithReason(errdefs.ErrResourceExhausted, ReasonHostFull,
			"host at capacity: it holds %d sandboxes and admits at most %d; delete sandboxes or pools, or retry later",
			held.Sandboxes, h.MaxSandboxes)
	}
	if m := held.MemoryBytes + add.MemoryBytes; m > h.MaxMemoryBytes {
		return errdefs.WithReason(errdefs.ErrResourceExhausted, ReasonHostFull,
			"host at capacity: its sandboxes' memory limits add up to %s, and %s more would pass the host's %s; ask for less memory (resources.memory_bytes), delete sandboxes, or retry later",
			Bytes(held.MemoryBytes), Bytes(add.MemoryBytes), Bytes(h.MaxMemoryBytes))
	}
	return nil
}

// Clone returns a deep copy of h.
func (h Host) Clone() Host {
	h.Default = proto.CloneOf(h.Default)
	h.Max = proto.CloneOf(h.Max)
	return h
}

func format(f field, v int64) string {
	switch f.name {
	case "memory_bytes", "disk_bytes", "log_bytes":
		return Bytes(v)
	}
	return fmt.Sprint(v)
}

// byteUnits are the suffixes ParseBytes takes, largest first.
var byteUnits = []struct {
	suffix string
	shift  uint
}{{"TiB", 40}, {"GiB", 30}, {"MiB", 20}, {"KiB", 10}, {"B", 0}}

// ParseBytes reads a size written as a whole number of B, KiB, MiB, GiB or
// TiB ("512MiB", "4GiB", "1048576B"): controld's configuration and
// forkfleetctl's flags write limits this way.
func ParseBytes(s string) (int64, error) {
	t := strings.TrimSpace(s)
	for _, u := range byteUnits {
		num, ok := strings.CutSuffix(t, u.suffix)
		if !ok {
			continue
		}
		n, err := strconv.ParseInt(strings.TrimSpace(num), 10, 64)
		if err != nil || n < 0 || n > (1<<62)>>u.shift {
			return 0, fmt.Errorf("size %q: want a non-negative whole number of B, KiB, MiB, GiB or TiB", t)
		}
		return n << u.shift, nil
	}
	return 0, fmt.Errorf("size %q: missing unit (B, KiB, MiB, GiB or TiB)", t)
}

// FormatBytes writes n in the largest unit of ParseBytes that keeps it
// whole ("4GiB"); ParseBytes reads it back.
func FormatBytes(n int64) string {
	for _, u := range byteUnits {
		if n != 0 && n%(1<<u.shift) == 0 {
			return strconv.FormatInt(n>>u.shift, 10) + u.suffix
		}
	}
	return strconv.FormatInt(n, 10) + "B"
}

// Bytes renders a byte count for messages: exact when small, otherwise in
// the largest binary unit that keeps a decimal.
func Bytes(n int64) string {
	const unit = 1024
	if n < unit {
		return fmt.Sprintf("%d B", n)
	}
	div, exp := int64(unit), 0
	for m := n / unit; m >= unit && exp < 4; m /= unit {
		div *= unit
		exp++
	}
	v := float64(n) / float64(div)
	suffix := "KMGTP"[exp : exp+1]
	if v == float64(int64(v)) {
		return fmt.Sprintf("%d %siB", int64(v), suffix)
	}
	return fmt.Sprintf("%.1f %siB", v, suffix)
}

// Status fills the admission fields of a host status (GetHostStatus) for a
// host holding held: controld and the fake report the same numbers Admit
// decides by.
func (h Host) Status(held Usage) *controldv1.GetHostStatusResponse {
	return &controldv1.GetHostStatusResponse{
		Sandboxes:           uint32(held.Sandboxes),
		MaxSandboxes:        uint32(h.MaxSandboxes),
		AdmittedMemoryBytes: held.MemoryBytes,
		MaxMemoryBytes:      h.MaxMemoryBytes,
		DefaultMemoryBytes:  h.Default.GetMemoryBytes(),
	}
}
