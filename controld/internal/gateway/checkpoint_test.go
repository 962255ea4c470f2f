package gateway_test

import (
	"context"
	"io"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/forkfleet/forkfleet/api/aci"
	aciv1 "github.com/forkfleet/forkfleet/api/gen/forkfleet/aci/v1"
)

// nopSink is a recording that keeps nothing: it makes the hub hold a
// session.
type nopSink struct{}

func (nopSink) Frame(*aciv1.ScreencastFrame, time.Time) bool                    { return true }
func (nopSink) Cursor(int32, int32)                                             {}
func (nopSink) TapACI() (io.Writer, io.Writer, func())                          { return io.Discard, io.Discard, func() {} }
func (nopSink) ViewStep([]*aciv1.Action, time.Time, *aciv1.StepResponse, error) {}
func (nopSink) SandboxGone()                                                    {}

// TestCheckpointDropsConnectionsBeingMade: a checkpoint that starts while a
// connection to the sandbox is being made (its route taken, the connection
// not yet where DropSandbox looks) still finds no gateway connection open
// at the dump: CRIU cannot dump a unix socket whose peer is outside the
// sandbox. Both the hub's screencast session and an agent's proxied
// session are covered; after the checkpoint the hub streams again.
func TestCheckpointDropsConnectionsBeingMade(t *testing.T) {
	t.Cleanup(func() { goleak.VerifyNone(t) })
	f := setupView(t)
	setCheckpointing := func(v bool) {
		f.vr.mu.Lock()
		f.vr.checkpointing = v
		f.vr.mu.Unlock()
	}

	// The hub: its first Route is followed by the checkpoint's drop. A
	// second Route means the first session is over.
	f.beginCheckpointAfterNextRoute()
	detach := f.gw.Record(viewSB, nopSink{})
	waitFor(t, func() bool { return f.routeCount() >= 2 })
	waitFor(t, func() bool { return f.guest.Open() == 0 })
	if startedScreencast(f.guest) {
		t.Fatal("the hub streamed during the checkpoint")
	}
	setCheckpointing(false)
	waitFor(t, func() bool { return startedScreencast(f.guest) })
	detach()
	waitFor(t, func() bool { return f.guest.Open() == 0 })

	// An agent through the gateway whose route was taken just before the
	// checkpoint began: its session closes before the dump.
	f.beginCheckpointAfterNextRoute()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	url := "ws" + f.base[len("http"):] + "/v1/sandboxes/" + viewSB + "/aci"
	if s, err := aci.Dial(ctx, url, token); err == nil {
		s.Close()
		t.Fatal("an agent's session opened during the checkpoint")
	}
	waitFor(t, func() bool { return f.guest.Open() == 0 })
}
