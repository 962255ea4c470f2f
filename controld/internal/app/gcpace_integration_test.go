package app_test

import (
	"os"
	"path/filepath"
	"regexp"
	"testing"
	"time"

	"github.com/forkfleet/forkfleet/api/aci"
	controldv1 "github.com/forkfleet/forkfleet/api/gen/forkfleet/controld/v1"
)

// TestRealStackThawedGuestdDoesNotCollect checks guestd's collector pacing
// (guestd/internal/gcpace) on the real stack: a sandbox frozen for more
// than Go's two-minute forced-collection period does not collect when it
// is thawed (the runtime's clock trigger is off; its heap still paces it).
// guestd runs with GODEBUG=gctrace=1, so every collection is a line of its
// stderr in the sandbox's log. A checkpoint's prepare collects
// (FreeOSMemory): that line proves the trace reaches the log, and starts
// the two minutes. Takes about 2.5 minutes.
func TestRealStackThawedGuestdDoesNotCollect(t *testing.T) {
	s := newStackIn(t, "forkfleet-gc-it")
	s.launch(0)
	cr, err := s.sbc.CreateSandbox(s.ctx, &controldv1.CreateSandboxRequest{Env: map[string]string{"GODEBUG": "gctrace=1"}, WaitReady: true})
	if err != nil {
		t.Fatal(err)
	}
	id := cr.Sandbox.Id
	s.deleteSandboxAtEnd(id)
	logPath := filepath.Join(s.cfg.StateDir, "runtime", "logs", id+".log")
	gcLine := regexp.MustCompile(`(?m)^gc \d+ @`)
	collections := func() int {
		b, err := os.ReadFile(logPath)
		if err != nil {
			t.Fatalf("sandbox log: %v", err)
		}
		return len(gcLine.FindAll(b, -1))
	}

	before := collections()
	ck, err := s.ckc.CreateCheckpoint(s.ctx, &controldv1.CreateCheckpointRequest{SandboxId: id})
	if err != nil {
		t.Fatal(err)
	}
	s.deleteCheckpointAtEnd(ck.Checkpoint.Id)
	var prepared int
	eventuallyWithin(t, 5*time.Second, "a collection in "+logPath+" after a checkpoint's prepare (FreeOSMemory): guestd's gctrace in the log",
		func() bool { prepared = collections(); return prepared > before })

	if _, err := s.sbc.SuspendSandbox(s.ctx, &controldv1.SuspendSandboxRequest{Id: id}); err != nil {
		t.Fatal(err)
	}
	// Go forces a collection once two minutes passed since the last one.
	time.Sleep(2*time.Minute + 5*time.Second)
	if _, err := s.sbc.ResumeSandbox(s.ctx, &controldv1.ResumeSandboxRequest{Id: id}); err != nil {
		t.Fatal(err)
	}
	ep, err := s.sbc.GetSandboxEndpoint(s.ctx, &controldv1.GetSandboxEndpointRequest{Id: id})
	if err != nil {
		t.Fatal(err)
	}
	sess, err := aci.Dial(s.ctx, ep.Endpoint.Url, ep.Endpoint.Token)
	if err != nil {
		t.Fatal(err)
	}
	defer sess.Close()
	if _, err := sess.Ping(s.ctx, []byte("thawed")); err != nil {
		t.Fatal(err)
	}
	// sysmon looks at the clock within 10 ms of running again.
	time.Sleep(time.Second)
	if n := collections(); n != prepared {
		b, _ := os.ReadFile(logPath)
		t.Fatalf("guestd collected %d times after its thaw (its clock trigger is on):\n%s", n-prepared, b)
	}
}
