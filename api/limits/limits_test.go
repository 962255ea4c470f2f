package limits_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/forkfleet/forkfleet/api/errdefs"
	"github.com/forkfleet/forkfleet/api/errdefs/errgrpc"
	controldv1 "github.com/forkfleet/forkfleet/api/gen/forkfleet/controld/v1"
	"github.com/forkfleet/forkfleet/api/limits"
)

func TestResolveDefaults(t *testing.T) {
	h := limits.Default()
	got, err := h.Resolve("resources", nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	want := h.Default
	if got.GetMemoryBytes() != want.GetMemoryBytes() || got.GetPidsMax() != want.GetPidsMax() ||
		got.GetDiskBytes() != want.GetDiskBytes() || got.GetLogBytes() != want.GetLogBytes() ||
		got.GetCpuWeight() != want.GetCpuWeight() || got.GetCpuMillis() != 0 {
		t.Fatalf("nothing asked: %v, want the defaults %v", got, want)
	}
	// Asked fields win, the others are filled; a fork inherits its base.
	base := &controldv1.Resources{MemoryBytes: 512 << 20, PidsMax: 100, DiskBytes: 1 << 30, LogBytes: 1 << 20, CpuWeight: 50, CpuMillis: 500}
	got, err = h.Resolve("resources", &controldv1.Resources{PidsMax: 300}, base)
	if err != nil {
		t.Fatal(err)
	}
	if got.GetPidsMax() != 300 || got.GetMemoryBytes() != 512<<20 || got.GetCpuMillis() != 500 || got.GetCpuWeight() != 50 {
		t.Fatalf("fork: %v", got)
	}
	// A base recorded before a limit existed gets the host's default.
	got, err = h.Resolve("resources", nil, &controldv1.Resources{MemoryBytes: 256 << 20})
	if err != nil || got.GetDiskBytes() != h.Default.GetDiskBytes() || got.GetMemoryBytes() != 256<<20 {
		t.Fatalf("old base: %v %v", got, err)
	}
}

func TestResolveRejects(t *testing.T) {
	h := limits.Default()
	for _, tc := range []struct {
		name      string
		req, base *controldv1.Resources
		field     string
		says      string
	}{
		{"negative", &controldv1.Resources{DiskBytes: -1}, nil, "resources.disk_bytes", "negative"},
		{"below floor", &controldv1.Resources{MemoryBytes: 1 << 20}, nil, "resources.memory_bytes", "floor"},
		{"above max", &controldv1.Resources{PidsMax: 1 << 20}, nil, "resources.pids_max", "maximum 32768"},
		{"weight", &controldv1.Resources{CpuWeight: 20000}, nil, "resources.cpu_weight", "maximum"},
		{"inherited above max", nil, &controldv1.Resources{MemoryBytes: 1 << 40}, "resources.memory_bytes", "inherited 1 TiB exceeds this host's maximum 16 GiB: ask for less"},
	} {
		_, err := h.Resolve("resources", tc.req, tc.base)
		if !errors.Is(err, errdefs.ErrInvalidArgument) || errdefs.Field(err) != tc.field || !strings.Contains(err.Error(), tc.says) {
			t.Errorf("%s: %v (field %q)", tc.name, err, errdefs.Field(err))
		}
	}
	// Asking for less than an inherited value over the maximum works.
	if _, err := h.Resolve("resources", &controldv1.Resources{MemoryBytes: 1 << 30}, &controldv1.Resources{MemoryBytes: 1 << 40}); err != nil {
		t.Fatal(err)
	}
}

func TestAdmit(t *testing.T) {
	h := limits.Default()
	h.MaxSandboxes, h.MaxMemoryBytes = 2, 3<<30
	one := limits.Of(&controldv1.Resources{MemoryBytes: 1 << 30})
	if err := h.Admit(limits.Usage{}, one); err != nil {
		t.Fatal(err)
	}
	err := h.Admit(limits.Usage{Sandboxes: 2, MemoryBytes: 2 << 30}, one)
	if !errors.Is(err, errdefs.ErrResourceExhausted) || !strings.Contains(err.Error(), "holds 2 sandboxes and admits at most 2") {
		t.Fatalf("count: %v", err)
	}
	err = h.Admit(limits.Usage{Sandboxes: 1, MemoryBytes: 2 << 30}, limits.Of(&controldv1.Resources{MemoryBytes: 2 << 30}))
	if !errors.Is(err, errdefs.ErrResourceExhausted) || !strings.Contains(err.Error(), "add up to 2 GiB, and 2 GiB more would pass the host's 3 GiB") {
		t.Fatalf("memory: %v", err)
	}
	if errgrpc.Code(err).String() != "ResourceExhausted" {
		t.Fatal(errgrpc.Code(err))
	}
}

func TestValidate(t *testing.T) {
	if err := limits.Default().Validate(); err != nil {
		t.Fatal(err)
	}
	h := limits.Default().Clone()
	h.Default.DiskBytes = 0
	h.Max.PidsMax = 10
	h.Default.LogBytes = 1 << 40
	err := h.Validate()
	for _, want := range []string{"default disk_bytes: must be set", "max pids_max: 10 is below the floor 64", "default log_bytes: 1 TiB exceeds the maximum 256 MiB"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("Validate = %v, want %q", err, want)
		}
	}
	if limits.Default().Default == h.Default {
		t.Fatal("Clone shares the defaults")
	}
}

func TestBytes(t *testing.T) {
	for n, want := range map[int64]string{0: "0 B", 1000: "1000 B", 1 << 20: "1 MiB", 3 << 29: "1.5 GiB", 1 << 40: "1 TiB"} {
		if got := limits.Bytes(n); got != want {
			t.Errorf("Bytes(%d) = %q, want %q", n, got, want)
		}
	}
}

func TestParseFormatBytes(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want int64
	}{{"512MiB", 512 << 20}, {"4GiB", 4 << 30}, {" 1 TiB", 1 << 40}, {"1048576B", 1 << 20}, {"0B", 0}} {
		got, err := limits.ParseBytes(tc.in)
		if err != nil || got != tc.want {
			t.Errorf("limits.ParseBytes(%q) = %d, %v; want %d", tc.in, got, err, tc.want)
		}
		if back, _ := limits.ParseBytes(limits.FormatBytes(tc.want)); back != tc.want {
			t.Errorf("limits.FormatBytes(%d) = %q does not read back", tc.want, limits.FormatBytes(tc.want))
		}
	}
	for _, bad := range []string{"", "2G", "-1MiB", "1.5GiB", "9999999999TiB"} {
		if _, err := limits.ParseBytes(bad); err == nil {
			t.Errorf("limits.ParseBytes(%q) accepted", bad)
		}
	}
}
