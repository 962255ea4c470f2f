package aci

import (
	"context"
	"fmt"
	"time"

	aciv1 "github.com/forkfleet/forkfleet/api/gen/forkfleet/aci/v1"
)

// unexpected reports a reply of the wrong kind.
func unexpected(want string, m *aciv1.ServerMessage) error {
	return fmt.Errorf("%w: want a %s reply, got %T", ErrProtocol, want, m.GetReply())
}

// Ping round-trips payload through the server.
func (s *Session) Ping(ctx context.Context, payload []byte) (*aciv1.PingResponse, error) {
	m, err := s.Do(ctx, &aciv1.ClientMessage{Request: &aciv1.ClientMessage_Ping{Ping: &aciv1.PingRequest{Payload: payload}}})
	if err != nil {
		return nil, err
	}
	if r := m.GetPing(); r != nil {
		return r, nil
	}
	return nil, unexpected("ping", m)
}

// RTT measures one empty ping round trip.
func (s *Session) RTT(ctx context.Context) (time.Duration, error) {
	t := time.Now()
	if _, err := s.Ping(ctx, nil); err != nil {
		return 0, err
	}
	return time.Since(t), nil
}

// Step runs actions in order and then the observation (none when observe is
// nil) in one round trip. Per-action failures are in the outcomes, not the
// error; an observation served from the session's FrameCache carries
// NotModified with Data filled in (see FromCache).
func (s *Session) Step(ctx context.Context, actions []*aciv1.Action, observe *aciv1.ScreenshotRequest) (*aciv1.StepResponse, error) {
	return s.StepRequest(ctx, &aciv1.StepRequest{Actions: actions, Observe: observe})
}

// StepRequest is Step with the full request (stop_on_error).
func (s *Session) StepRequest(ctx context.Context, req *aciv1.StepRequest) (*aciv1.StepResponse, error) {
	obsReq, ob := s.prepareObserve(req.GetObserve())
	if obsReq != req.GetObserve() {
		req = &aciv1.StepRequest{Actions: req.GetActions(), StopOnError: req.GetStopOnError(), Observe: obsReq, ObserveTree: req.GetObserveTree()}
	}
	m, err := s.Do(ctx, &aciv1.ClientMessage{Request: &aciv1.ClientMessage_Step{Step: req}})
	if err != nil {
		return nil, err
	}
	r := m.GetStep()
	if r == nil {
		return nil, unexpected("step", m)
	}
	s.finishObserve(ob, r.GetObservation())
	if t := r.GetTree(); t != nil {
		if err := checkTree(t); err != nil {
			return nil, err
		}
	}
	return r, nil
}

// Screenshot captures the screen. With a FrameCache and a server that does
// dedup, an unchanged screen costs a not_modified reply and the image comes
// from the cache (FromCache reports it).
func (s *Session) Screenshot(ctx context.Context, req *aciv1.ScreenshotRequest) (*aciv1.ScreenshotResponse, error) {
	if req == nil {
		req = PNG()
	}
	send, ob := s.prepareObserve(req)
	m, err := s.Do(ctx, &aciv1.ClientMessage{Request: &aciv1.ClientMessage_Screenshot{Screenshot: send}})
	if err != nil {
		return nil, err
	}
	r := m.GetScreenshot()
	if r == nil {
		return nil, unexpected("screenshot", m)
	}
	s.finishObserve(ob, r)
	return r, nil
}

// Ready returns the desktop's readiness now.
func (s *Session) Ready(ctx context.Context) (*aciv1.ReadyResponse, error) {
	m, err := s.Do(ctx, &aciv1.ClientMessage{Request: &aciv1.ClientMessage_Ready{Ready: &aciv1.ReadyRequest{}}})
	if err != nil {
		return nil, err
	}
	if r := m.GetReady(); r != nil {
		return r, nil
	}
	return nil, unexpected("ready", m)
}

// WaitReady returns once the desktop is ready. It listens for the pushed
// ReadyEvent and, for servers that do not push, re-asks with a growing
// interval (up to 1 s).
func (s *Session) WaitReady(ctx context.Context) (*aciv1.ReadyResponse, error) {
	// Subscribe before asking so an event pushed in between is not missed.
	evctx, cancel := context.WithCancel(ctx)
	defer cancel()
	events := s.Events(evctx)
	poll := 50 * time.Millisecond
	t := time.NewTimer(0)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case ev, ok := <-events:
			if !ok {
				if err := ctx.Err(); err != nil {
					return nil, err
				}
				return nil, ErrClosed
			}
			if st := ev.GetReady().GetState(); st.GetReady() {
				return st, nil
			}
		case <-t.C:
			r, err := s.Ready(ctx)
			if err != nil {
				return nil, err
			}
			if r.GetReady() {
				return r, nil
			}
			t.Reset(poll)
			poll = min(poll*2, time.Second)
		}
	}
}

// CursorPosition returns the pointer position.
func (s *Session) CursorPosition(ctx context.Context) (*aciv1.Point, error) {
	m, err := s.Do(ctx, &aciv1.ClientMessage{Request: &aciv1.ClientMessage_CursorPosition{CursorPosition: &aciv1.CursorPositionRequest{}}})
	if err != nil {
		return nil, err
	}
	if r := m.GetCursorPosition(); r != nil {
		return r.GetPosition(), nil
	}
	return nil, unexpected("cursor_position", m)
}

// ScreenSize returns the screen geometry.
func (s *Session) ScreenSize(ctx context.Context) (*aciv1.ScreenSizeResponse, error) {
	m, err := s.Do(ctx, &aciv1.ClientMessage{Request: &aciv1.ClientMessage_ScreenSize{ScreenSize: &aciv1.ScreenSizeRequest{}}})
	if err != nil {
		return nil, err
	}
	if r := m.GetScreenSize(); r != nil {
		return r, nil
	}
	return nil, unexpected("screen_size", m)
}

// ListWindows returns the top-level windows.
func (s *Session) ListWindows(ctx context.Context) ([]*aciv1.Window, error) {
	m, err := s.Do(ctx, &aciv1.ClientMessage{Request: &aciv1.ClientMessage_ListWindows{ListWindows: &aciv1.ListWindowsRequest{}}})
	if err != nil {
		return nil, err
	}
	if r := m.GetListWindows(); r != nil {
		return r.GetWindows(), nil
	}
	return nil, unexpected("list_windows", m)
}

// WindowAction activates, closes, moves, resizes, maximizes... a window.
func (s *Session) WindowAction(ctx context.Context, req *aciv1.WindowActionRequest) error {
	m, err := s.Do(ctx, &aciv1.ClientMessage{Request: &aciv1.ClientMessage_WindowAction{WindowAction: req}})
	if err != nil {
		return err
	}
	if m.GetWindowAction() == nil {
		return unexpected("window_action", m)
	}
	return nil
}

// Launch starts a program detached on the desktop and returns its pid.
func (s *Session) Launch(ctx context.Context, req *aciv1.LaunchRequest) (int, error) {
	m, err := s.Do(ctx, &aciv1.ClientMessage{Request: &aciv1.ClientMessage_Launch{Launch: req}})
	if err != nil {
		return 0, err
	}
	if r := m.GetLaunch(); r != nil {
		return int(r.GetPid()), nil
	}
	return 0, unexpected("launch", m)
}

// ClipboardGet returns the clipboard text.
func (s *Session) ClipboardGet(ctx context.Context) (string, error) {
	m, err := s.Do(ctx, &aciv1.ClientMessage{Request: &aciv1.ClientMessage_ClipboardGet{ClipboardGet: &aciv1.ClipboardGetRequest{}}})
	if err != nil {
		return "", err
	}
	if r := m.GetClipboardGet(); r != nil {
		return r.GetText(), nil
	}
	return "", unexpected("clipboard_get", m)
}

// ClipboardSet sets the clipboard text.
func (s *Session) ClipboardSet(ctx context.Context, text string) error {
	m, err := s.Do(ctx, &aciv1.ClientMessage{Request: &aciv1.ClientMessage_ClipboardSet{ClipboardSet: &aciv1.ClipboardSetRequest{Text: text}}})
	if err != nil {
		return err
	}
	if m.GetClipboardSet() == nil {
		return unexpected("clipboard_set", m)
	}
	return nil
}

// Exec runs a command to completion. A nonzero exit status is not an error:
// check ExitCode, Signal and TimedOut. Canceling ctx kills the command.
func (s *Session) Exec(ctx context.Context, req *aciv1.ExecRequest) (*aciv1.ExecResponse, error) {
	if len(req.GetArgv()) == 0 {
		return nil, fmt.Errorf("aci: exec: %w: empty argv", ErrInvalidArgument)
	}
	m, err := s.Do(ctx, &aciv1.ClientMessage{Request: &aciv1.ClientMessage_Exec{Exec: req}})
	if err != nil {
		return nil, err
	}
	if r := m.GetExec(); r != nil {
		return r, nil
	}
	return nil, unexpected("exec", m)
}

// Run executes argv with default limits; a shorthand for Exec.
func (s *Session) Run(ctx context.Context, argv ...string) (*aciv1.ExecResponse, error) {
	return s.Exec(ctx, &aciv1.ExecRequest{Argv: argv})
}

// Cancel asks the server to abandon the in-flight request target (see
// Call.ID); found reports whether it was still running. Wait on a canceled
// context does this by itself.
func (s *Session) Cancel(ctx context.Context, target uint64) (found bool, err error) {
	m, err := s.Do(ctx, &aciv1.ClientMessage{Request: &aciv1.ClientMessage_Cancel{Cancel: &aciv1.CancelRequest{TargetId: target}}})
	if err != nil {
		return false, err
	}
	if r := m.GetCancel(); r != nil {
		return r.GetFound(), nil
	}
	return false, unexpected("cancel", m)
}

// ScreencastStart starts pushing ScreencastFrame events; read them with
// Events or OnEvent.
func (s *Session) ScreencastStart(ctx context.Context, req *aciv1.ScreencastStartRequest) (streamID uint32, err error) {
	m, err := s.Do(ctx, &aciv1.ClientMessage{Request: &aciv1.ClientMessage_ScreencastStart{ScreencastStart: req}})
	if err != nil {
		return 0, err
	}
	if r := m.GetScreencastStart(); r != nil {
		return r.GetStreamId(), nil
	}
	return 0, unexpected("screencast_start", m)
}

// ScreencastStop stops a screencast.
func (s *Session) ScreencastStop(ctx context.Context, streamID uint32) error {
	m, err := s.Do(ctx, &aciv1.ClientMessage{Request: &aciv1.ClientMessage_ScreencastStop{ScreencastStop: &aciv1.ScreencastStopRequest{StreamId: streamID}}})
	if err != nil {
		return err
	}
	if m.GetScreencastStop() == nil {
		return unexpected("screencast_stop", m)
	}
	return nil
}

// ScreencastKeyframe asks for a keyframe on a screencast (after a seq gap).
func (s *Session) ScreencastKeyframe(ctx context.Context, streamID uint32) error {
	m, err := s.Do(ctx, &aciv1.ClientMessage{Request: &aciv1.ClientMessage_ScreencastKeyframe{ScreencastKeyframe: &aciv1.ScreencastKeyframeRequest{StreamId: streamID}}})
	if err != nil {
		return err
	}
	if m.GetScreencastKeyframe() == nil {
		return unexpected("screencast_keyframe", m)
	}
	return nil
}

// MemoryMark stores value in guestd's heap for the fork memory verifier
// (admin token only).
func (s *Session) MemoryMark(ctx context.Context, value []byte) error {
	m, err := s.Do(ctx, &aciv1.ClientMessage{Request: &aciv1.ClientMessage_MemoryMark{MemoryMark: &aciv1.MemoryMarkRequest{Value: value}}})
	if err != nil {
		return err
	}
	if m.GetMemoryMark() == nil {
		return unexpected("memory_mark", m)
	}
	return nil
}

// MemoryChallenge returns HMAC-SHA256(key = the marked value, nonce).
func (s *Session) MemoryChallenge(ctx context.Context, nonce []byte) ([]byte, error) {
	m, err := s.Do(ctx, &aciv1.ClientMessage{Request: &aciv1.ClientMessage_MemoryChallenge{MemoryChallenge: &aciv1.MemoryChallengeRequest{Nonce: nonce}}})
	if err != nil {
		return nil, err
	}
	if r := m.GetMemoryChallenge(); r != nil {
		return r.GetMac(), nil
	}
	return nil, unexpected("memory_challenge", m)
}

// NetProbeListen makes guestd hold a TCP listener on its sandbox's
// loopback answering nonces with HMAC-SHA256 under value, and returns its
// port (the fork network verifier; admin token only).
func (s *Session) NetProbeListen(ctx context.Context, value []byte) (uint32, error) {
	m, err := s.Do(ctx, &aciv1.ClientMessage{Request: &aciv1.ClientMessage_NetProbeListen{NetProbeListen: &aciv1.NetProbeListenRequest{Value: value}}})
	if err != nil {
		return 0, err
	}
	if r := m.GetNetProbeListen(); r != nil {
		return r.GetPort(), nil
	}
	return 0, unexpected("net_probe_listen", m)
}

// NetProbe makes guestd connect to 127.0.0.1:port inside its sandbox and
// returns the listener's answer to nonce (admin token only).
func (s *Session) NetProbe(ctx context.Context, port uint32, nonce []byte) ([]byte, error) {
	m, err := s.Do(ctx, &aciv1.ClientMessage{Request: &aciv1.ClientMessage_NetProbe{NetProbe: &aciv1.NetProbeRequest{Port: port, Nonce: nonce}}})
	if err != nil {
		return nil, err
	}
	if r := m.GetNetProbe(); r != nil {
		return r.GetMac(), nil
	}
	return nil, unexpected("net_probe", m)
}

// Restored tells a freshly restored replica its identity, its own tokens of
// both roles (token and admin_token, both required: the restored ones are
// refused afterwards), generation and fresh entropy (controld, admin token
// only; capability "restored.admin_token"). The response carries the hash of
// the frame the replica was restored with.
func (s *Session) Restored(ctx context.Context, req *aciv1.RestoredRequest) (*aciv1.RestoredResponse, error) {
	m, err := s.Do(ctx, &aciv1.ClientMessage{Request: &aciv1.ClientMessage_Restored{Restored: req}})
	if err != nil {
		return nil, err
	}
	if r := m.GetRestored(); r != nil {
		return r, nil
	}
	return nil, unexpected("restored", m)
}
