package aci

import (
	"testing"

	"github.com/forkfleet/forkfleet/api/aci/wire"
	aciv1 "github.com/forkfleet/forkfleet/api/gen/forkfleet/aci/v1"
)

// The network verifier: an admin sets the listener up; a probe from inside
// (guestd itself) gets the HMAC of its nonce under the value; agents may
// do neither; the listener is kept, its value replaced.
func TestNetProbe(t *testing.T) {
	h := newHarness(t)
	listen := func(v string) *aciv1.ClientMessage {
		return &aciv1.ClientMessage{Request: &aciv1.ClientMessage_NetProbeListen{NetProbeListen: &aciv1.NetProbeListenRequest{Value: []byte(v)}}}
	}
	probe := func(port uint32, nonce string) *aciv1.ClientMessage {
		return &aciv1.ClientMessage{Request: &aciv1.ClientMessage_NetProbe{NetProbe: &aciv1.NetProbeRequest{Port: port, Nonce: []byte(nonce)}}}
	}
	agent := h.session(aciToken)
	wantCode(t, call(t, agent, listen("v")), aciv1.ErrorCode_ERROR_CODE_PERMISSION_DENIED)
	wantCode(t, call(t, agent, probe(1, "n")), aciv1.ErrorCode_ERROR_CODE_PERMISSION_DENIED)

	admin := h.session(adminToken)
	wantCode(t, call(t, admin, listen("")), aciv1.ErrorCode_ERROR_CODE_INVALID_ARGUMENT)
	port := call(t, admin, listen("first")).GetNetProbeListen().GetPort()
	if port == 0 {
		t.Fatal("no port")
	}
	if again := call(t, admin, listen("second")).GetNetProbeListen().GetPort(); again != port {
		t.Errorf("a second listen moved the listener from %d to %d", port, again)
	}
	mac := call(t, admin, probe(port, "nonce")).GetNetProbe().GetMac()
	if !wire.ProofOK([]byte("second"), []byte("nonce"), mac) {
		t.Errorf("probe answered %x", mac)
	}
	wantCode(t, call(t, admin, probe(0, "n")), aciv1.ErrorCode_ERROR_CODE_INVALID_ARGUMENT)
}
