package fleet_test

import (
	"context"
	"errors"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"
	"google.golang.org/grpc/codes"

	"github.com/forkfleet/forkfleet/api/errdefs"
	"github.com/forkfleet/forkfleet/api/errdefs/errgrpc"
	controldv1 "github.com/forkfleet/forkfleet/api/gen/forkfleet/controld/v1"
	"github.com/forkfleet/forkfleet/controld/internal/fleet"
	"github.com/forkfleet/forkfleet/controld/internal/fleet/fleettest"
	"github.com/forkfleet/forkfleet/controld/internal/runtime"
)

// slotEnv is an env with n warm slots, checked for leaked goroutines after
// the manager closes. tweak runs before the manager starts (set the fake's
// hooks there: its background work reads them).
func slotEnv(t *testing.T, n int, tweak func(*fleet.Options, *fleettest.Runtime)) *env {
	t.Helper()
	t.Cleanup(func() { goleak.VerifyNone(t) }) // runs after the env's cleanup
	return newEnv(t, func(o *fleet.Options) {
		o.WarmSlots = n
		if tweak != nil {
			tweak(o, o.Runtime.(*fleettest.Runtime))
		}
	})
}

// waitSlots waits until exactly n slots are precreated and returns them.
func waitSlots(t *testing.T, e *env, n int) []string {
	t.Helper()
	var ids []string
	eventually(t, "warm slots", func() bool {
		ids = e.rt.Precreated()
		return len(ids) == n
	})
	return ids
}

func TestWarmSlotTakenAndReplenished(t *testing.T) {
	e := slotEnv(t, 1, nil)
	slot := waitSlots(t, e, 1)[0]
	if _, err := e.m.GetSandbox(context.Background(), slot); errgrpc.Code(err) != codes.NotFound {
		t.Fatalf("a slot is visible through Get: %v", err)
	}
	if l, _, _ := e.m.ListSandboxes(context.Background(), &controldv1.ListSandboxesRequest{}); len(l) != 0 {
		t.Fatalf("slots listed: %v", l)
	}

	s, ep, err := e.m.CreateSandbox(context.Background(), &controldv1.CreateSandboxRequest{WaitReady: true, Labels: map[string]string{"a": "b"}})
	if err != nil {
		t.Fatal(err)
	}
	if s.Id != slot {
		t.Fatalf("created %s, want the slot %s", s.Id, slot)
	}
	if got := e.rt.Calls("boot_precreated"); got != 1 {
		t.Fatalf("precreated boots %d, want 1", got)
	}
	// The guestd got the tokens the record holds.
	if g := e.rt.Guest(s.Id); g == nil || g.ACIToken() != ep.Token {
		t.Fatal("slot sandbox does not hold the endpoint's token")
	}
	if s.State != controldv1.SandboxState_SANDBOX_STATE_READY || s.Labels["a"] != "b" {
		t.Fatalf("sandbox %+v", s)
	}
	// Its create happened before the request.
	if len(s.Boot) == 0 || s.Boot[0].Name != fleet.PhaseCreate || s.Boot[0].At.AsDuration() != 0 {
		t.Fatalf("boot phases %v", s.Boot)
	}

	// Replenished with a new identity.
	next := waitSlots(t, e, 1)[0]
	if next == slot {
		t.Fatal("slot not replaced")
	}
	s2, _, err := e.m.CreateSandbox(context.Background(), &controldv1.CreateSandboxRequest{WaitReady: true})
	if err != nil || s2.Id != next {
		t.Fatalf("second create %v %v, want slot %s", s2, err, next)
	}
	if l, _, _ := e.m.ListSandboxes(context.Background(), &controldv1.ListSandboxesRequest{}); len(l) != 2 {
		t.Fatalf("listed %d sandboxes, want 2", len(l))
	}
	// Deleting a slot-born sandbox deletes it like any other.
	if err := e.m.DeleteSandbox(context.Background(), s.Id); err != nil {
		t.Fatal(err)
	}
	if e.rt.Has(s.Id) {
		t.Fatal("delete left the sandbox")
	}
}

func TestWarmSlotMismatchBootsCold(t *testing.T) {
	e := slotEnv(t, 1, nil)
	slot := waitSlots(t, e, 1)[0]
	for name, req := range map[string]*controldv1.CreateSandboxRequest{
		"screen":    {Screen: &controldv1.Screen{Width: 1024, Height: 768}},
		"image":     {Image: "other:latest"},
		"env":       {Env: map[string]string{"K": "v"}},
		"resources": {Resources: &controldv1.Resources{CpuMillis: 500}},
	} {
		req.WaitReady = true
		s, _, err := e.m.CreateSandbox(context.Background(), req)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if s.Id == slot {
			t.Fatalf("%s: a non-matching request took the slot", name)
		}
	}
	if got := e.rt.Precreated(); !slices.Equal(got, []string{slot}) {
		t.Fatalf("slots %v, want %v untouched", got, slot)
	}
	if got := e.rt.Calls("boot_precreated"); got != 0 {
		t.Fatalf("precreated boots %d", got)
	}
	// The default screen spelled out matches, as it boots the same thing.
	s, _, err := e.m.CreateSandbox(context.Background(), &controldv1.CreateSandboxRequest{
		Image: "img:latest", Screen: &controldv1.Screen{Width: 1280, Height: 800}, WaitReady: true,
	})
	if err != nil || s.Id != slot {
		t.Fatalf("explicit default spec: %v %v, want slot %s", s, err, slot)
	}
}

func TestWarmSlotEmptyBootsColdAndRetries(t *testing.T) {
	var fail atomic.Bool
	fail.Store(true)
	e := slotEnv(t, 1, func(_ *fleet.Options, rt *fleettest.Runtime) {
		rt.PrecreateErr = func(runtime.BootSpec) error {
			if fail.Load() {
				return errdefs.WithReason(errdefs.ErrUnavailable, "TEST", "containerd down")
			}
			return nil
		}
	})
	// Retried with backoff (10, 20, 40 ms ...).
	eventually(t, "failing precreates", func() bool { return e.rt.Calls("precreate") >= 3 })
	s, _, err := e.m.CreateSandbox(context.Background(), &controldv1.CreateSandboxRequest{WaitReady: true})
	if err != nil || s.State != controldv1.SandboxState_SANDBOX_STATE_READY {
		t.Fatalf("cold boot without a slot: %v %v", s, err)
	}
	if slices.Contains(e.rt.Precreated(), s.Id) {
		t.Fatal("booted sandbox still listed as precreated")
	}
	fail.Store(false)
	waitSlots(t, e, 1)
}

func TestWarmSlotStartFailureBootsCold(t *testing.T) {
	e := slotEnv(t, 1, func(_ *fleet.Options, rt *fleettest.Runtime) {
		rt.StartErr = func(string) error { return errors.New("runc init died") }
	})
	slot := waitSlots(t, e, 1)[0]
	s, _, err := e.m.CreateSandbox(context.Background(), &controldv1.CreateSandboxRequest{WaitReady: true})
	if err != nil {
		t.Fatalf("a failed slot failed the create: %v", err)
	}
	if s.Id != slot || s.State != controldv1.SandboxState_SANDBOX_STATE_READY {
		t.Fatalf("sandbox %+v", s)
	}
	if got := e.rt.Calls("boot"); got != 2 {
		t.Fatalf("boots %d, want the slot's and a cold one", got)
	}
}

func TestWarmSlotsDiscardedOnClose(t *testing.T) {
	e := slotEnv(t, 3, nil)
	slots := waitSlots(t, e, 3)
	s := e.ready(nil)
	if !slices.Contains(slots, s.Id) {
		t.Fatalf("create did not take a slot: %s not in %v", s.Id, slots)
	}
	waitSlots(t, e, 3)
	e.stop()
	if left := e.rt.Precreated(); len(left) != 0 {
		t.Fatalf("slots survived Close: %v", left)
	}
	if got := e.rt.Calls("discard"); got != 3 {
		t.Fatalf("discards %d, want 3", got)
	}
	if !e.rt.Has(s.Id) {
		t.Fatal("Close removed a sandbox")
	}
	// The restarted manager adopts the sandbox and fills new slots.
	e.start()
	if _, err := e.m.GetSandbox(context.Background(), s.Id); err != nil {
		t.Fatal(err)
	}
	for _, id := range waitSlots(t, e, 3) {
		if slices.Contains(slots, id) {
			t.Fatalf("slot %s reused across a restart", id)
		}
	}
}

func TestWarmSlotLeftoverReconciled(t *testing.T) {
	e := slotEnv(t, 0, nil)
	e.stop()
	// A crashed controld's slot: precreated, managed labels, no record.
	leftover := "sb-leftoverleftove"
	if err := e.rt.Precreate(context.Background(), runtime.BootSpec{
		ID: leftover, Image: "img:latest",
		Labels: map[string]string{fleet.LabelManaged: "controld", fleet.LabelSandboxID: leftover},
	}); err != nil {
		t.Fatal(err)
	}
	e.tweak = func(o *fleet.Options) { o.WarmSlots = 1 }
	e.start()
	slots := waitSlots(t, e, 1)
	if slots[0] == leftover {
		t.Fatal("leftover slot survived reconciliation")
	}
	if got := e.rt.Calls("delete"); got != 1 {
		t.Fatalf("deletes %d, want the leftover's", got)
	}
}

func TestWarmSlotRecycled(t *testing.T) {
	e := slotEnv(t, 1, func(o *fleet.Options, _ *fleettest.Runtime) { o.WarmSlotMaxAge = 40 * time.Millisecond })
	first := waitSlots(t, e, 1)[0]
	eventually(t, "recycled slot", func() bool {
		ids := e.rt.Precreated()
		return len(ids) == 1 && ids[0] != first
	})
	if e.rt.Calls("discard") == 0 {
		t.Fatal("old slot not discarded")
	}
}

// A slot boots the build it was precreated from: once the default image's
// name names another build, the slots of the old one are made again.
func TestWarmSlotOfMovedImageRemade(t *testing.T) {
	e := slotEnv(t, 1, nil)
	first := waitSlots(t, e, 1)[0]
	const newBuild = "sha256:1111111111111111111111111111111111111111111111111111111111111111"
	e.rt.SetImageDigest("img:latest", newBuild)
	var next string
	eventually(t, "slot of the new build", func() bool {
		ids := e.rt.Precreated()
		if len(ids) == 1 && ids[0] != first {
			next = ids[0]
			return true
		}
		return false
	})
	s, _, err := e.m.CreateSandbox(context.Background(), &controldv1.CreateSandboxRequest{WaitReady: true})
	if err != nil {
		t.Fatal(err)
	}
	if s.Id != next || e.rt.RunningDigest(s.Id) != newBuild {
		t.Fatalf("created %s running %q, want the slot %s of %s", s.Id, e.rt.RunningDigest(s.Id), next, newBuild)
	}
}

func TestWarmSlotsOffWithoutPrecreator(t *testing.T) {
	t.Cleanup(func() { goleak.VerifyNone(t) })
	e := newEnv(t, func(o *fleet.Options) {
		o.WarmSlots = 2
		o.Runtime = plainRuntime{o.Runtime}
	})
	s := e.ready(nil)
	if s.State != controldv1.SandboxState_SANDBOX_STATE_READY || e.rt.Calls("precreate") != 0 {
		t.Fatalf("sandbox %+v, precreates %d", s, e.rt.Calls("precreate"))
	}
}

// plainRuntime hides the fake's Precreator.
type plainRuntime struct{ runtime.Runtime }

func TestWarmSlotRefillNotBlockedByHungBoot(t *testing.T) {
	e := slotEnv(t, 1, func(_ *fleet.Options, rt *fleettest.Runtime) { rt.NeverReady = true })
	slot := waitSlots(t, e, 1)[0]
	s, _, err := e.m.CreateSandbox(context.Background(), &controldv1.CreateSandboxRequest{})
	if err != nil || s.Id != slot {
		t.Fatalf("create %v %v, want slot %s", s, err, slot)
	}
	// The refill holds while the slot-born boot comes up, but not forever.
	start := time.Now()
	next := waitSlots(t, e, 1)[0]
	if next == slot {
		t.Fatal("slot not replaced")
	}
	if d := time.Since(start); d > 3*time.Second {
		t.Fatalf("refill took %v", d)
	}
}

func TestWarmSlotMissEndsHold(t *testing.T) {
	e := slotEnv(t, 1, func(_ *fleet.Options, rt *fleettest.Runtime) { rt.NeverReady = true })
	waitSlots(t, e, 1)
	if _, _, err := e.m.CreateSandbox(context.Background(), &controldv1.CreateSandboxRequest{}); err != nil {
		t.Fatal(err)
	}
	// No slot now, and the refill is holding for the hung boot: a second
	// matching create boots cold and makes the refill go at once.
	start := time.Now()
	if _, _, err := e.m.CreateSandbox(context.Background(), &controldv1.CreateSandboxRequest{}); err != nil {
		t.Fatal(err)
	}
	waitSlots(t, e, 1)
	if d := time.Since(start); d > 500*time.Millisecond {
		t.Fatalf("refill after a miss took %v (held)", d)
	}
}
