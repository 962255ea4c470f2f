package fleet_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"

	controldv1 "github.com/forkfleet/forkfleet/api/gen/forkfleet/controld/v1"
	"github.com/forkfleet/forkfleet/api/limits"
	"github.com/forkfleet/forkfleet/controld/internal/fleet"
	"github.com/forkfleet/forkfleet/controld/internal/runtime"
)

// Every sandbox gets the host's limits without asking; a request may ask
// for other values within the maxima, and a fork keeps its checkpoint's
// unless it asks too.
func TestLimitsDefaultsAndOverrides(t *testing.T) {
	e := newEnv(t, nil)
	ctx := context.Background()
	def := limits.Default().Default
	s := e.ready(nil)
	if r := s.GetResources(); r.GetMemoryBytes() != def.GetMemoryBytes() || r.GetPidsMax() != def.GetPidsMax() ||
		r.GetDiskBytes() != def.GetDiskBytes() || r.GetLogBytes() != def.GetLogBytes() || r.GetCpuWeight() != def.GetCpuWeight() {
		t.Fatalf("effective limits %v, want the defaults %v", r, def)
	}
	spec, ok := e.rt.Spec(s.Id)
	if !ok || spec.MemoryBytes != def.GetMemoryBytes() || spec.PidsMax != def.GetPidsMax() || spec.DiskBytes != def.GetDiskBytes() ||
		spec.LogBytes != def.GetLogBytes() || spec.CPUWeight != def.GetCpuWeight() {
		t.Fatalf("runtime spec %+v", spec)
	}

	_, _, err := e.m.CreateSandbox(ctx, &controldv1.CreateSandboxRequest{Resources: &controldv1.Resources{DiskBytes: 1 << 45}})
	wantCode(t, err, codes.InvalidArgument, "resources.disk_bytes")

	src, _, err := e.m.CreateSandbox(ctx, &controldv1.CreateSandboxRequest{WaitReady: true,
		Resources: &controldv1.Resources{MemoryBytes: 512 << 20, PidsMax: 300}})
	if err != nil {
		t.Fatal(err)
	}
	ck, err := e.m.CreateCheckpoint(ctx, &controldv1.CreateCheckpointRequest{SandboxId: src.Id})
	if err != nil {
		t.Fatal(err)
	}
	reps, err := replicasOf(e.m.ForkCheckpoint(ctx, &controldv1.ForkCheckpointRequest{CheckpointId: ck.Id, Count: 1,
		Resources: &controldv1.Resources{PidsMax: 200}}))
	if err != nil || reps[0].GetErrorMessage() != "" {
		t.Fatalf("fork: %v %v", reps, err)
	}
	if r := reps[0].GetSandbox().GetResources(); r.GetMemoryBytes() != 512<<20 || r.GetPidsMax() != 200 || r.GetDiskBytes() != def.GetDiskBytes() {
		t.Fatalf("replica limits %v: want the checkpoint's memory, its own pids", r)
	}
	_, err = e.m.ForkCheckpoint(ctx, &controldv1.ForkCheckpointRequest{CheckpointId: ck.Id, Count: 1,
		Resources: &controldv1.Resources{LogBytes: 1 << 40}})
	wantCode(t, err, codes.InvalidArgument, "resources.log_bytes")

	// A checkpoint pool takes limits too; its members carry them.
	p, err := e.m.CreatePool(ctx, &controldv1.CreatePoolRequest{Source: &controldv1.CreatePoolRequest_CheckpointId{CheckpointId: ck.Id},
		Size: 1, Resources: &controldv1.Resources{PidsMax: 128}})
	if err != nil {
		t.Fatal(err)
	}
	if r := p.GetResources(); r.GetPidsMax() != 128 || r.GetMemoryBytes() != 512<<20 {
		t.Fatalf("pool limits %v", r)
	}
	eventually(t, "pool filled", func() bool { got, _ := e.m.GetPool(ctx, p.Id); return got.Available == 1 })
	claimed, _, _, _, err := e.m.ClaimPool(ctx, &controldv1.ClaimPoolRequest{PoolId: p.Id})
	if err != nil || claimed.GetResources().GetPidsMax() != 128 {
		t.Fatalf("claimed %v %v", claimed.GetResources(), err)
	}
}

// A replica of an on-demand fork starts with 8 times its CPU weight (its
// restore and verification outweigh running sandboxes) and has its own
// once usable; boots and pool refills start at their own weight.
func TestForkStartupCPUBoost(t *testing.T) {
	e := newEnv(t, nil)
	ctx := context.Background()
	src := e.ready(nil)
	if spec, _ := e.rt.Spec(src.Id); spec.StartupCPUWeight != 0 {
		t.Fatalf("a boot starts boosted: %+v", spec)
	}
	ck, err := e.m.CreateCheckpoint(ctx, &controldv1.CreateCheckpointRequest{SandboxId: src.Id})
	if err != nil {
		t.Fatal(err)
	}
	reps, err := replicasOf(e.m.ForkCheckpoint(ctx, &controldv1.ForkCheckpointRequest{CheckpointId: ck.Id, Count: 2,
		Resources: &controldv1.Resources{CpuWeight: 50}}))
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range reps {
		id := r.GetSandbox().GetId()
		spec, ok := e.rt.Spec(id)
		if !ok || spec.CPUWeight != 50 || spec.StartupCPUWeight != 400 {
			t.Fatalf("replica %s spec %+v: want weight 50, starting at 400", id, spec)
		}
		if w, ok := e.rt.CPUWeight(id); !ok || w != 50 {
			t.Fatalf("replica %s: weight set to %d (%v) once usable, want 50", id, w, ok)
		}
	}
	// The boost is capped at the kernel's range.
	reps, err = replicasOf(e.m.ForkCheckpoint(ctx, &controldv1.ForkCheckpointRequest{CheckpointId: ck.Id, Count: 1,
		Resources: &controldv1.Resources{CpuWeight: 5000}}))
	if err != nil {
		t.Fatal(err)
	}
	if spec, _ := e.rt.Spec(reps[0].GetSandbox().GetId()); spec.StartupCPUWeight != limits.MaxCPUWeight {
		t.Fatalf("boost of weight 5000: %+v", spec)
	}
	p, err := e.m.CreatePool(ctx, &controldv1.CreatePoolRequest{Source: &controldv1.CreatePoolRequest_CheckpointId{CheckpointId: ck.Id}, Size: 1})
	if err != nil {
		t.Fatal(err)
	}
	eventually(t, "pool filled", func() bool { got, _ := e.m.GetPool(ctx, p.Id); return got.Available == 1 })
	claimed, _, _, _, err := e.m.ClaimPool(ctx, &controldv1.ClaimPoolRequest{PoolId: p.Id})
	if err != nil {
		t.Fatal(err)
	}
	if spec, _ := e.rt.Spec(claimed.Id); spec.StartupCPUWeight != 0 {
		t.Fatalf("a pool refill starts boosted: %+v", spec)
	}
	if _, ok := e.rt.CPUWeight(claimed.Id); ok {
		t.Fatal("a pool member's weight was set")
	}
}

// The host admits sandboxes up to its limits: creates, every fork replica
// and pool fills are refused past them with RESOURCE_EXHAUSTED, and a
// delete makes room again.
func TestAdmission(t *testing.T) {
	e := newEnv(t, func(o *fleet.Options) {
		o.Limits = limits.Default()
		o.Limits.MaxSandboxes = 3
		o.Limits.MaxMemoryBytes = 3 << 30
	})
	ctx := context.Background()
	a := e.ready(nil)
	_, _, err := e.m.CreateSandbox(ctx, &controldv1.CreateSandboxRequest{Resources: &controldv1.Resources{MemoryBytes: 3 << 30}})
	wantCode(t, err, codes.ResourceExhausted, "")
	if !strings.Contains(err.Error(), "memory limits add up to 1 GiB, and 3 GiB more would pass the host's 3 GiB") {
		t.Fatalf("message: %v", err)
	}
	ck, err := e.m.CreateCheckpoint(ctx, &controldv1.CreateCheckpointRequest{SandboxId: a.Id})
	if err != nil {
		t.Fatal(err)
	}
	reps, err := replicasOf(e.m.ForkCheckpoint(ctx, &controldv1.ForkCheckpointRequest{CheckpointId: ck.Id, Count: 4}))
	if err != nil {
		t.Fatal(err)
	}
	var ok, refused int
	for _, r := range reps {
		switch codes.Code(r.GetErrorCode()) {
		case codes.OK:
			ok++
		case codes.ResourceExhausted:
			refused++
		default:
			t.Fatalf("replica: %v", r)
		}
	}
	if ok != 2 || refused != 2 {
		t.Fatalf("fork of 4 on a host with room for 2: %d made, %d refused", ok, refused)
	}
	_, _, err = e.m.CreateSandbox(ctx, &controldv1.CreateSandboxRequest{})
	wantCode(t, err, codes.ResourceExhausted, "")
	if !strings.Contains(err.Error(), "holds 3 sandboxes and admits at most 3") {
		t.Fatalf("message: %v", err)
	}
	// A pool fills only as far as the host admits.
	p, err := e.m.CreatePool(ctx, &controldv1.CreatePoolRequest{Source: &controldv1.CreatePoolRequest_Image{Image: "img:latest"}, Size: 1})
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(50 * time.Millisecond)
	if got, _ := e.m.GetPool(ctx, p.Id); got.Available != 0 {
		t.Fatalf("pool filled past the host's limit: %v", got)
	}
	if err := e.m.DeleteSandbox(ctx, a.Id); err != nil {
		t.Fatal(err)
	}
	eventually(t, "pool filled once a sandbox went", func() bool { got, _ := e.m.GetPool(ctx, p.Id); return got.Available == 1 })
}

// Warm slots never let the host pass its admission limits: none is made
// while the sandboxes and the slots fill it, and the slots go when creates
// that took none fill it.
func TestWarmSlotsRespectAdmission(t *testing.T) {
	e := newEnv(t, func(o *fleet.Options) {
		o.WarmSlots = 1
		o.Limits = limits.Default()
		o.Limits.MaxSandboxes = 2
	})
	ctx := context.Background()
	eventually(t, "a warm slot", func() bool { return len(e.rt.Precreated()) == 1 })
	other := &controldv1.Resources{PidsMax: 100} // not the slots' spec
	if _, _, err := e.m.CreateSandbox(ctx, &controldv1.CreateSandboxRequest{Resources: other, WaitReady: true}); err != nil {
		t.Fatal(err)
	}
	if _, _, err := e.m.CreateSandbox(ctx, &controldv1.CreateSandboxRequest{Resources: other, WaitReady: true}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the slot discarded at capacity", func() bool { return len(e.rt.Precreated()) == 0 })
	time.Sleep(30 * time.Millisecond)
	if n := len(e.rt.Precreated()); n != 0 {
		t.Fatalf("%d slots precreated on a full host", n)
	}
}

// What the kernel enforced shows in the sandbox's record and as LIMIT
// events; a sandbox whose init the memory limit killed says so.
func TestLimitsReached(t *testing.T) {
	e := newEnv(t, func(o *fleet.Options) { o.LimitPoll = 5 * time.Millisecond })
	ctx := context.Background()
	w, err := e.m.WatchSandboxes(ctx, &controldv1.WatchSandboxesRequest{})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	s := e.ready(nil)
	disk := limits.Default().Default.GetDiskBytes()
	e.rt.SetLimitHits(s.Id, runtime.LimitHits{OOMKills: 2, PidsRefused: 7, DiskUsed: disk - 4096, DiskLimit: disk})
	var got []*controldv1.LimitReached
	eventually(t, "limits reached", func() bool {
		g, _ := e.m.GetSandbox(ctx, s.Id)
		got = g.GetLimitsReached()
		return len(got) == 3
	})
	want := map[controldv1.SandboxLimit]string{
		controldv1.SandboxLimit_SANDBOX_LIMIT_MEMORY: "killed 2 process(es) of the sandbox at its memory limit of 1 GiB",
		controldv1.SandboxLimit_SANDBOX_LIMIT_PIDS:   "7 fork(s) refused at the limit of 2048",
		controldv1.SandboxLimit_SANDBOX_LIMIT_DISK:   "disk full: 4.0 GiB of 4 GiB used; writes fail with EDQUOT",
	}
	for _, r := range got {
		if !strings.Contains(r.GetMessage(), want[r.GetLimit()]) || r.GetCount() == 0 || r.GetFirstAt() == nil {
			t.Errorf("%v: %q, want %q", r.GetLimit(), r.GetMessage(), want[r.GetLimit()])
		}
	}
	sawEvent := false
	for !sawEvent {
		select {
		case ev := <-w.C:
			sawEvent = ev.GetType() == controldv1.SandboxEventType_SANDBOX_EVENT_TYPE_LIMIT && ev.GetSandbox().GetId() == s.Id
		case <-time.After(5 * time.Second):
			t.Fatal("no LIMIT event")
		}
	}
	// Space freed: the disk entry stays, its count drops to 0.
	e.rt.SetLimitHits(s.Id, runtime.LimitHits{OOMKills: 2, PidsRefused: 7, DiskUsed: 1 << 20, DiskLimit: disk})
	eventually(t, "disk no longer full", func() bool {
		g, _ := e.m.GetSandbox(ctx, s.Id)
		for _, r := range g.GetLimitsReached() {
			if r.GetLimit() == controldv1.SandboxLimit_SANDBOX_LIMIT_DISK {
				return r.GetCount() == 0 && strings.Contains(r.GetMessage(), "no longer full")
			}
		}
		return false
	})
	// The init killed at the memory limit: the exit says why.
	e.rt.SetLimitHits(s.Id, runtime.LimitHits{OOMKills: 3})
	e.rt.Exit(s.Id, 137)
	eventually(t, "stopped with the reason", func() bool {
		g, _ := e.m.GetSandbox(ctx, s.Id)
		return g.GetState() == controldv1.SandboxState_SANDBOX_STATE_STOPPED &&
			strings.Contains(g.GetStatusMessage(), "the kernel killed 3 process(es) at the memory limit of 1 GiB")
	})
}
