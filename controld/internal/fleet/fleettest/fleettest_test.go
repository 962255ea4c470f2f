package fleettest_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/forkfleet/forkfleet/controld/internal/fleet/fleettest"
	"github.com/forkfleet/forkfleet/controld/internal/runtime"
)

// A request on an open session of a frozen guestd waits until the thaw,
// as it waits in a real guestd's socket; a delete ends the wait.
func TestFrozenSessionWaitsForThaw(t *testing.T) {
	rt := fleettest.NewRuntime()
	ctx := context.Background()
	spec := runtime.BootSpec{ID: "sb-frozen", AdminToken: "admin", ACIToken: "aci"}
	inst, err := rt.Boot(ctx, spec)
	if err != nil {
		t.Fatal(err)
	}
	g, err := fleettest.Dialer{R: rt}.DialGuest(ctx, inst.ACISocket, "admin")
	if err != nil {
		t.Fatal(err)
	}
	if err := rt.Freeze(ctx, spec.ID); err != nil {
		t.Fatal(err)
	}
	short, cancel := context.WithTimeout(ctx, 20*time.Millisecond)
	defer cancel()
	if err := g.Ping(short); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("ping of a frozen guestd: %v, want a deadline", err)
	}
	done := make(chan error, 1)
	go func() { done <- g.ResumeApps(ctx) }()
	select {
	case err := <-done:
		t.Fatalf("resume answered while frozen: %v", err)
	case <-time.After(20 * time.Millisecond):
	}
	if err := rt.Thaw(ctx, spec.ID); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatalf("resume after the thaw: %v", err)
	}

	if err := rt.Freeze(ctx, spec.ID); err != nil {
		t.Fatal(err)
	}
	go func() { done <- g.Ping(ctx) }()
	if err := rt.Delete(ctx, spec.ID); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err == nil {
		t.Fatal("ping of a deleted frozen guestd answered")
	}
}
