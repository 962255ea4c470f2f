package aci

import (
	"net/http"
	"testing"
	"time"

	"github.com/coder/websocket"

	aciv1 "github.com/forkfleet/forkfleet/api/gen/forkfleet/aci/v1"
	"github.com/forkfleet/forkfleet/guestd/internal/aciclient"
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
	if _, resp, err := aciclient.Dial(tctx(t), h.url, aciclient.Options{Token: aciToken}); err == nil || resp == nil || resp.StatusCode != http.StatusServiceUnavailable {
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
