package aci

import (
	"bytes"
	"context"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/coder/websocket"

	aciclient "github.com/forkfleet/forkfleet/api/aci"
	aciv1 "github.com/forkfleet/forkfleet/api/gen/forkfleet/aci/v1"
)

func TestCheckpointHold(t *testing.T) {
	h := newHarness(t)
	agent := h.session(aciToken)
	admin := h.session(adminToken)
	prepare := &aciv1.ClientMessage{Request: &aciv1.ClientMessage_CheckpointPrepare{CheckpointPrepare: &aciv1.CheckpointPrepareRequest{}}}
	done := &aciv1.ClientMessage{Request: &aciv1.ClientMessage_CheckpointDone{CheckpointDone: &aciv1.CheckpointDoneRequest{}}}

	wantCode(t, call(t, agent, prepare), aciv1.ErrorCode_ERROR_CODE_PERMISSION_DENIED)
	wantCode(t, call(t, agent, done), aciv1.ErrorCode_ERROR_CODE_PERMISSION_DENIED)

	t0 := time.Now()
	r := call(t, admin, prepare)
	t.Logf("prepare took %v", time.Since(t0))
	if r.GetCheckpointPrepare().GetClosedSessions() != 1 {
		t.Fatalf("prepare: %v", r)
	}
	err := readUntilClosed(tctx(t), agent)
	t.Logf("closed after %v: %v", time.Since(t0), err)
	if websocket.CloseStatus(err) != StatusCheckpoint {
		t.Fatalf("agent session after prepare: %v", err)
	}
	// Agents are refused while the hold lasts; controld (admin) is not.
	if _, resp, err := aciclient.DialWire(tctx(t), h.url, aciToken); err == nil || resp == nil || resp.StatusCode != http.StatusServiceUnavailable {
		t.Fatalf("agent during hold: err %v resp %v", err, resp)
	}
	admin2 := h.session(adminToken)
	if r := call(t, admin2, done); r.GetCheckpointDone() == nil {
		t.Fatalf("done: %v", r)
	}
	if r := call(t, h.session(aciToken), ping(nil)); r.GetPing() == nil {
		t.Fatalf("agent after done: %v", r)
	}

	big := &aciv1.ClientMessage{Request: &aciv1.ClientMessage_CheckpointPrepare{CheckpointPrepare: &aciv1.CheckpointPrepareRequest{HoldMs: 61000}}}
	wantCode(t, call(t, admin2, big), aciv1.ErrorCode_ERROR_CODE_INVALID_ARGUMENT)
}

// TestCheckpointPrepareFrameHash checks that prepare reports the frame a
// replica is born with: the hash a screenshot of the same screen reports.
func TestCheckpointPrepareFrameHash(t *testing.T) {
	h := newHarness(t)
	admin := h.session(adminToken)
	shot := call(t, admin, &aciv1.ClientMessage{Request: &aciv1.ClientMessage_Screenshot{Screenshot: &aciv1.ScreenshotRequest{
		Format: aciv1.ImageFormat_IMAGE_FORMAT_NONE}}}).GetScreenshot()
	if len(shot.GetFrameHash()) == 0 {
		t.Fatalf("screenshot: no frame hash: %v", shot)
	}
	r := call(t, admin, &aciv1.ClientMessage{Request: &aciv1.ClientMessage_CheckpointPrepare{CheckpointPrepare: &aciv1.CheckpointPrepareRequest{
		SettleMs: 20, SettleTimeoutMs: 5000}}}).GetCheckpointPrepare()
	if r == nil || !r.GetSettled() || !bytes.Equal(r.GetFrameHash(), shot.GetFrameHash()) {
		t.Fatalf("prepare: %v, want settled with frame hash %x", r, shot.GetFrameHash())
	}
	over := &aciv1.ClientMessage{Request: &aciv1.ClientMessage_CheckpointPrepare{CheckpointPrepare: &aciv1.CheckpointPrepareRequest{SettleMs: 61000}}}
	wantCode(t, call(t, admin, over), aciv1.ErrorCode_ERROR_CODE_INVALID_ARGUMENT)
}

// TestStillFor checks the quiet period counts from the last damage or
// drawing request, not from the call.
func TestStillFor(t *testing.T) {
	tr := &damageTracker{base: time.Now().Add(-time.Hour)}
	tr.active.Store(true)
	tr.last.Store(tr.now() - int64(time.Minute))
	// Still for a minute: a 30 s quiet period is already over, so this
	// returns at once rather than when ctx ends.
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if ok, err := tr.stillFor(ctx, 30*time.Second, time.Minute, nil); !ok || err != nil {
		t.Fatalf("still desktop: settled %v, err %v", ok, err)
	}
	// A drawing request just now restarts the quiet period: the bound ends
	// the wait unsettled.
	tr.touch()
	if ok, err := tr.stillFor(ctx, 30*time.Second, 10*time.Millisecond, nil); ok || err != nil {
		t.Fatalf("after input: settled %v, err %v; want the bound to end it", ok, err)
	}
	// So does damage.
	tr.lastInput.Store(0)
	tr.last.Store(tr.now())
	if ok, err := tr.stillFor(ctx, 30*time.Second, 10*time.Millisecond, nil); ok || err != nil {
		t.Fatalf("after damage: settled %v, err %v; want the bound to end it", ok, err)
	}
	if ok, err := tr.stillFor(ctx, 5*time.Millisecond, time.Second, nil); !ok || err != nil {
		t.Fatalf("short quiet after damage: settled %v, err %v", ok, err)
	}
}

// TestStillForCPU checks that a busy sandbox is not still, whatever the
// damage says, and an idle one is.
func TestStillForCPU(t *testing.T) {
	tr := &damageTracker{base: time.Now().Add(-time.Hour)}
	tr.active.Store(true)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	var used time.Duration
	busy := func() (time.Duration, error) { used += time.Millisecond; return used, nil }
	if ok, err := tr.stillFor(ctx, time.Millisecond, 50*time.Millisecond, busy); ok || err != nil {
		t.Fatalf("busy sandbox: settled %v, err %v; want the bound to end it", ok, err)
	}
	idle := func() (time.Duration, error) { return time.Second, nil }
	if ok, err := tr.stillFor(ctx, time.Millisecond, time.Minute, idle); !ok || err != nil {
		t.Fatalf("idle sandbox: settled %v, err %v", ok, err)
	}
}

func TestReleaseScratchAdminOnly(t *testing.T) {
	h := newHarness(t)
	rel := &aciv1.ClientMessage{Request: &aciv1.ClientMessage_ReleaseScratch{ReleaseScratch: &aciv1.ReleaseScratchRequest{}}}
	wantCode(t, call(t, h.session(aciToken), rel), aciv1.ErrorCode_ERROR_CODE_PERMISSION_DENIED)
	if r := call(t, h.session(adminToken), rel); r.GetReleaseScratch() == nil {
		t.Fatalf("release_scratch: %v", r)
	}
}

// TestIdleScratchRelease checks that guestd asks its desktop to give back
// capture buffers idle for Options.ScratchIdle, over and over, and never
// when that is negative; release_scratch gives back the shared buffers.
func TestIdleScratchRelease(t *testing.T) {
	const idle = 20 * time.Millisecond
	h := newHarness(t, func(o *Options) { o.ScratchIdle = idle })
	deadline := time.Now().Add(5 * time.Second)
	for n := 0; n < 2; {
		n = 0
		for _, d := range h.desk.scratchReleases() {
			if d != idle {
				t.Fatalf("idle release asked for buffers unused for %s, want %s", d, idle)
			}
			n++
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d idle releases in 5 s with ScratchIdle %s, want at least 2", n, idle)
		}
		time.Sleep(idle)
	}
	rel := &aciv1.ClientMessage{Request: &aciv1.ClientMessage_ReleaseScratch{ReleaseScratch: &aciv1.ReleaseScratchRequest{}}}
	call(t, h.session(adminToken), rel)
	h.desk.mu.Lock()
	shared := h.desk.sharedReleases
	h.desk.mu.Unlock()
	if shared != 1 {
		t.Fatalf("release_scratch made %d shared releases, want 1", shared)
	}

	off := newHarness(t, func(o *Options) { o.ScratchIdle = -1 })
	time.Sleep(10 * idle)
	if got := off.desk.scratchReleases(); len(got) != 0 {
		t.Fatalf("ScratchIdle < 0 still released scratch: %v", got)
	}
}

// TestCheckpointGrab checks the X server grab a checkpoint holds from the
// frame prepare proves until checkpoint_done (source) or restored (replica),
// and that restored reports the frame it captured under the grab.
func TestCheckpointGrab(t *testing.T) {
	h := newHarness(t)
	admin := h.session(adminToken)
	prepare := &aciv1.ClientMessage{Request: &aciv1.ClientMessage_CheckpointPrepare{CheckpointPrepare: &aciv1.CheckpointPrepareRequest{}}}
	done := &aciv1.ClientMessage{Request: &aciv1.ClientMessage_CheckpointDone{CheckpointDone: &aciv1.CheckpointDoneRequest{}}}

	first := call(t, admin, prepare).GetCheckpointPrepare()
	if !h.desk.isGrabbed() || len(first.GetFrameHash()) == 0 {
		t.Fatalf("after prepare: grabbed %v, frame hash %x", h.desk.isGrabbed(), first.GetFrameHash())
	}
	if r := call(t, admin, done); r.GetCheckpointDone() == nil || h.desk.isGrabbed() {
		t.Fatalf("done: %v, still grabbed %v", r, h.desk.isGrabbed())
	}

	// A replica: restored answers the frame captured while still grabbed,
	// then releases the grab.
	second := call(t, admin, prepare).GetCheckpointPrepare()
	restored := call(t, admin, &aciv1.ClientMessage{Request: &aciv1.ClientMessage_Restored{Restored: &aciv1.RestoredRequest{
		SandboxId: "sb-2", Token: "new-token", AdminToken: "new-admin", Generation: 1, Entropy: bytes.Repeat([]byte{7}, 32)}}}).GetRestored()
	if !bytes.Equal(restored.GetFrameHash(), second.GetFrameHash()) || h.desk.isGrabbed() {
		t.Fatalf("restored frame %x (checkpoint %x), still grabbed %v", restored.GetFrameHash(), second.GetFrameHash(), h.desk.isGrabbed())
	}

	// A hold that lapses in the process that grabbed releases the grab
	// (controld gone); the same process start time says it is the source.
	short := &aciv1.ClientMessage{Request: &aciv1.ClientMessage_CheckpointPrepare{CheckpointPrepare: &aciv1.CheckpointPrepareRequest{HoldMs: 30}}}
	call(t, h.session("new-admin"), short) // restored replaced the admin token
	deadline := time.Now().Add(5 * time.Second)
	for h.desk.isGrabbed() {
		if time.Now().After(deadline) {
			t.Fatal("grab outlived its hold")
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func TestProcessStart(t *testing.T) {
	a, b := processStart(), processStart()
	if a == "" || a != b {
		t.Fatalf("process start %q then %q", a, b)
	}
}

// appsStub stands in for supervise.StopOthers: it counts the holds and
// the continues.
type appsStub struct {
	mu            sync.Mutex
	held, resumes int
}

func (a *appsStub) hold() func() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.held++
	return func() int {
		a.mu.Lock()
		defer a.mu.Unlock()
		a.resumes++
		return 3
	}
}

func (a *appsStub) counts() (held, resumes int) {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.held, a.resumes
}

// TestRestoredHoldApps checks that restored stops the apps only with
// hold_apps, and resume_apps (admin only) continues them once.
func TestRestoredHoldApps(t *testing.T) {
	apps := &appsStub{}
	h := newHarness(t, func(o *Options) { o.StopApps = apps.hold })
	admin := h.session(adminToken)
	resume := &aciv1.ClientMessage{Request: &aciv1.ClientMessage_ResumeApps{ResumeApps: &aciv1.ResumeAppsRequest{}}}
	restored := func(token, admin string, gen uint64, hold bool) *aciv1.ClientMessage {
		return &aciv1.ClientMessage{Request: &aciv1.ClientMessage_Restored{Restored: &aciv1.RestoredRequest{
			SandboxId: "sb-2", Token: token, AdminToken: admin, Generation: gen, Entropy: bytes.Repeat([]byte{7}, 32), HoldApps: hold}}}
	}

	// A replica restored to run holds nothing.
	if r := call(t, admin, restored("t1", "a1", 1, false)); r.GetRestored() == nil {
		t.Fatalf("restored: %v", r)
	}
	if held, _ := apps.counts(); held != 0 {
		t.Fatalf("restored without hold_apps held the apps %d times", held)
	}
	if r := call(t, h.session("a1"), resume).GetResumeApps(); r == nil || r.GetResumed() != 0 {
		t.Fatalf("resume_apps with nothing held: %v", r)
	}

	// A pool's replica: held until resume_apps, which agents may not send.
	call(t, h.session("a1"), restored("t2", "a2", 2, true))
	if held, resumes := apps.counts(); held != 1 || resumes != 0 {
		t.Fatalf("after restored with hold_apps: held %d, resumed %d", held, resumes)
	}
	wantCode(t, call(t, h.session("t2"), resume), aciv1.ErrorCode_ERROR_CODE_PERMISSION_DENIED)
	a2 := h.session("a2")
	if r := call(t, a2, resume).GetResumeApps(); r.GetResumed() != 3 {
		t.Fatalf("resume_apps: %v", r)
	}
	if r := call(t, a2, resume).GetResumeApps(); r == nil || r.GetResumed() != 0 {
		t.Fatalf("second resume_apps: %v", r)
	}
	if _, resumes := apps.counts(); resumes != 1 {
		t.Fatalf("apps continued %d times, want 1", resumes)
	}
}
