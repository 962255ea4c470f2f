package aci

import (
	"testing"

	aciv1 "github.com/forkfleet/forkfleet/api/gen/forkfleet/aci/v1"
)

// TestScreencastWiring checks the session side of the screencast: the
// start reply precedes the stream's keyframe, streams belong to their
// session, and stop ends them. The caster itself is tested in
// internal/screencast.
func TestScreencastWiring(t *testing.T) {
	h := newHarness(t)
	c := h.session(aciToken)
	id, err := c.Send(tctx(t), &aciv1.ClientMessage{Request: &aciv1.ClientMessage_ScreencastStart{
		ScreencastStart: &aciv1.ScreencastStartRequest{Fps: 30, Delta: true}}})
	if err != nil {
		t.Fatal(err)
	}
	var sid uint32
	for {
		m, err := c.Recv(tctx(t))
		if err != nil {
			t.Fatal(err)
		}
		if f := m.GetEvent().GetFrame(); f != nil {
			if sid == 0 {
				t.Fatal("frame before the start reply")
			}
			if !f.GetKeyframe() || f.GetStreamId() != sid || f.GetSeq() != 1 || len(f.GetTiles()) != 1 {
				t.Fatalf("first frame: %v", f)
			}
			break
		}
		if m.GetId() == id {
			if m.GetScreencastStart() == nil {
				t.Fatalf("start: %v", m)
			}
			sid = m.GetScreencastStart().GetStreamId()
		}
	}
	// Another session cannot touch the stream.
	other := h.session(aciToken)
	stop := func(sid uint32) *aciv1.ClientMessage {
		return &aciv1.ClientMessage{Request: &aciv1.ClientMessage_ScreencastStop{ScreencastStop: &aciv1.ScreencastStopRequest{StreamId: sid}}}
	}
	kf := &aciv1.ClientMessage{Request: &aciv1.ClientMessage_ScreencastKeyframe{ScreencastKeyframe: &aciv1.ScreencastKeyframeRequest{StreamId: sid}}}
	wantCode(t, call(t, other, stop(sid)), aciv1.ErrorCode_ERROR_CODE_NOT_FOUND)
	wantCode(t, call(t, other, kf), aciv1.ErrorCode_ERROR_CODE_NOT_FOUND)
	if r := call(t, c, kf); r.GetScreencastKeyframe() == nil {
		t.Fatalf("keyframe: %v", r)
	}
	if r := call(t, c, stop(sid)); r.GetScreencastStop() == nil {
		t.Fatalf("stop: %v", r)
	}
	wantCode(t, call(t, c, stop(sid)), aciv1.ErrorCode_ERROR_CODE_NOT_FOUND)
	bad := &aciv1.ClientMessage{Request: &aciv1.ClientMessage_ScreencastStart{ScreencastStart: &aciv1.ScreencastStartRequest{Fps: 1000}}}
	r := call(t, c, bad)
	wantCode(t, r, aciv1.ErrorCode_ERROR_CODE_INVALID_ARGUMENT)
	if r.GetError().GetField() != "screencast_start.fps" {
		t.Errorf("field = %q", r.GetError().GetField())
	}
}
