package aci

import (
	aciv1 "github.com/forkfleet/forkfleet/api/gen/forkfleet/aci/v1"
	"github.com/forkfleet/forkfleet/guestd/internal/acierr"
	"github.com/forkfleet/forkfleet/guestd/internal/screencast"
)

// screencastStart starts a stream on the current display's caster. The
// reply goes out before the stream's first frame (the gate), and frames are
// sent with sendWait so a slow client holds one frame per stream while the
// caster coalesces damage behind it.
func (ss *session) screencastStart(id uint64, req *aciv1.ScreencastStartRequest) *aciv1.ServerMessage {
	b := ss.srv.desk.Load()
	if b == nil {
		return errReply(id, toError(errNoDesktop, "screencast_start"))
	}
	gate := make(chan struct{})
	opts := []screencast.StartOption{
		screencast.WithGate(gate),
		screencast.WithCursorEvents(func(ev *aciv1.CursorEvent) error {
			return ss.sendWait(&aciv1.ServerMessage{Reply: &aciv1.ServerMessage_Event{Event: &aciv1.Event{Event: &aciv1.Event_Cursor{Cursor: ev}}}})
		}),
	}
	if ss.exec.zlibTiles {
		opts = append(opts, screencast.WithZlib())
	}
	sid, err := b.caster.Start(ss.ctx, req, func(f *aciv1.ScreencastFrame) error {
		return ss.sendWait(&aciv1.ServerMessage{Reply: &aciv1.ServerMessage_Event{Event: &aciv1.Event{Event: &aciv1.Event_Frame{Frame: f}}}})
	}, opts...)
	if err != nil {
		close(gate)
		return errReply(id, toError(err, "screencast_start"))
	}
	ss.streams[sid] = struct{}{}
	ss.emit(&aciv1.ServerMessage{Id: id, Reply: &aciv1.ServerMessage_ScreencastStart{
		ScreencastStart: &aciv1.ScreencastStartResponse{StreamId: sid}}})
	close(gate)
	return nil
}

func (ss *session) ownStream(sid uint32, field string) (*screencast.Caster, error) {
	b := ss.srv.desk.Load()
	if _, ok := ss.streams[sid]; !ok || b == nil {
		return nil, acierr.New(aciv1.ErrorCode_ERROR_CODE_NOT_FOUND, field, "no screencast stream %d on this session", sid)
	}
	return b.caster, nil
}

func (ss *session) screencastStop(sid uint32) error {
	c, err := ss.ownStream(sid, "screencast_stop.stream_id")
	if err != nil {
		return err
	}
	delete(ss.streams, sid)
	return c.Stop(sid)
}

func (ss *session) screencastKeyframe(sid uint32) error {
	c, err := ss.ownStream(sid, "screencast_keyframe.stream_id")
	if err != nil {
		return err
	}
	return c.Keyframe(sid)
}
