package aci

import (
	"context"
	"slices"
	"time"

	aciv1 "github.com/forkfleet/forkfleet/api/gen/forkfleet/aci/v1"
	"github.com/forkfleet/forkfleet/guestd/internal/a11y"
	"github.com/forkfleet/forkfleet/guestd/internal/acierr"
	"github.com/forkfleet/forkfleet/guestd/internal/desktop"
	"github.com/forkfleet/forkfleet/guestd/internal/fscred"
	"github.com/forkfleet/forkfleet/guestd/internal/screencast"
)

const clipboardTimeout = 2 * time.Second

// handle runs one request on the executor and returns its reply.
func (ss *session) handle(j *job) *aciv1.ServerMessage {
	m := j.msg
	id := m.GetId()
	if j.ctx.Err() != nil {
		return errReply(id, acierr.New(aciv1.ErrorCode_ERROR_CODE_CANCELED, "", "canceled before it started").Proto())
	}
	if _, hello := m.GetRequest().(*aciv1.ClientMessage_Hello); !hello && !ss.helloDone() {
		return errReply(id, acierr.New(aciv1.ErrorCode_ERROR_CODE_FAILED_PRECONDITION, "", "the first request of a session must be hello").Proto())
	}
	if drawsOnScreen(m) {
		ss.srv.damage.touch()
	}
	out := &aciv1.ServerMessage{Id: id}
	var err error
	switch r := m.GetRequest().(type) {
	case *aciv1.ClientMessage_Hello:
		var v *aciv1.HelloResponse
		if v, err = ss.hello(r.Hello); err == nil {
			out.Reply = &aciv1.ServerMessage_Hello{Hello: v}
		}
	case *aciv1.ClientMessage_Ping:
		out.Reply = &aciv1.ServerMessage_Ping{Ping: &aciv1.PingResponse{Payload: r.Ping.GetPayload()}}
	case *aciv1.ClientMessage_Step:
		var v *aciv1.StepResponse
		if v, err = ss.step(j.ctx, r.Step); err == nil {
			out.Reply = &aciv1.ServerMessage_Step{Step: v}
		}
	case *aciv1.ClientMessage_Screenshot:
		var v *aciv1.ScreenshotResponse
		if v, err = ss.screenshot(j.ctx, r.Screenshot, "screenshot"); err == nil {
			out.Reply = &aciv1.ServerMessage_Screenshot{Screenshot: v}
		}
	case *aciv1.ClientMessage_Ready:
		out.Reply = &aciv1.ServerMessage_Ready{Ready: ss.srv.readyState(j.ctx)}
	case *aciv1.ClientMessage_CursorPosition:
		var d Desktop
		if d, err = ss.srv.desktop(); err == nil {
			var x, y int
			if x, y, err = d.CursorPosition(); err == nil {
				out.Reply = &aciv1.ServerMessage_CursorPosition{CursorPosition: &aciv1.CursorPositionResponse{
					Position: &aciv1.Point{X: int32(x), Y: int32(y)}}}
			}
		}
	case *aciv1.ClientMessage_ScreenSize:
		var v *aciv1.ScreenSizeResponse
		if v, err = ss.srv.screenSize(); err == nil {
			out.Reply = &aciv1.ServerMessage_ScreenSize{ScreenSize: v}
		}
	case *aciv1.ClientMessage_ListWindows:
		var v *aciv1.ListWindowsResponse
		if v, err = ss.srv.listWindows(); err == nil {
			out.Reply = &aciv1.ServerMessage_ListWindows{ListWindows: v}
		}
	case *aciv1.ClientMessage_WindowAction:
		if err = ss.srv.windowAction(r.WindowAction); err == nil {
			out.Reply = &aciv1.ServerMessage_WindowAction{WindowAction: &aciv1.WindowActionResponse{}}
		}
	case *aciv1.ClientMessage_ClipboardGet:
		var d Desktop
		if d, err = ss.srv.desktop(); err == nil {
			ctx, cancel := context.WithTimeout(j.ctx, clipboardTimeout)
			var text string
			text, err = d.ClipboardGet(ctx)
			cancel()
			if err == nil {
				out.Reply = &aciv1.ServerMessage_ClipboardGet{ClipboardGet: &aciv1.ClipboardGetResponse{Text: text}}
			}
		}
	case *aciv1.ClientMessage_ClipboardSet:
		var d Desktop
		if d, err = ss.srv.desktop(); err == nil {
			if err = d.ClipboardSet(r.ClipboardSet.GetText()); err == nil {
				out.Reply = &aciv1.ServerMessage_ClipboardSet{ClipboardSet: &aciv1.ClipboardSetResponse{}}
			}
		}
	case *aciv1.ClientMessage_Launch:
		if ss.srv.opts.Runner == nil {
			return unimplemented(id, "launch")
		}
		var v *aciv1.LaunchResponse
		if v, err = ss.srv.opts.Runner.Launch(r.Launch); err == nil {
			out.Reply = &aciv1.ServerMessage_Launch{Launch: v}
		}
	case *aciv1.ClientMessage_Exec:
		if ss.srv.opts.Runner == nil {
			return unimplemented(id, "exec")
		}
		var v *aciv1.ExecResponse
		if v, err = ss.srv.opts.Runner.Exec(j.ctx, r.Exec); err == nil {
			out.Reply = &aciv1.ServerMessage_Exec{Exec: v}
		}
	case *aciv1.ClientMessage_FilePut, *aciv1.ClientMessage_FileGet, *aciv1.ClientMessage_FileStat,
		*aciv1.ClientMessage_FileList, *aciv1.ClientMessage_FileMkdir, *aciv1.ClientMessage_FileDelete:
		if ss.srv.opts.Files == nil {
			return unimplemented(id, "files")
		}
		cred := ss.srv.opts.AgentFiles
		if ss.role == RoleAdmin {
			cred = fscred.Root
		}
		err = fscred.Do(cred, func() error { return ss.srv.fileOp(m, out) })
	case *aciv1.ClientMessage_MemoryMark:
		if ss.role != RoleAdmin {
			return errReply(id, denied("memory_mark"))
		}
		var v *aciv1.MemoryMarkResponse
		if v, err = ss.srv.memoryMark(r.MemoryMark); err == nil {
			out.Reply = &aciv1.ServerMessage_MemoryMark{MemoryMark: v}
		}
	case *aciv1.ClientMessage_MemoryChallenge:
		var v *aciv1.MemoryChallengeResponse
		if v, err = ss.srv.memoryChallenge(r.MemoryChallenge); err == nil {
			out.Reply = &aciv1.ServerMessage_MemoryChallenge{MemoryChallenge: v}
		}
	case *aciv1.ClientMessage_NetProbeListen:
		if ss.role != RoleAdmin {
			return errReply(id, denied("net_probe_listen"))
		}
		var v *aciv1.NetProbeListenResponse
		if v, err = ss.srv.netProbeListen(r.NetProbeListen); err == nil {
			out.Reply = &aciv1.ServerMessage_NetProbeListen{NetProbeListen: v}
		}
	case *aciv1.ClientMessage_NetProbe:
		if ss.role != RoleAdmin {
			return errReply(id, denied("net_probe"))
		}
		var v *aciv1.NetProbeResponse
		if v, err = ss.srv.netProbeDial(j.ctx, r.NetProbe); err == nil {
			out.Reply = &aciv1.ServerMessage_NetProbe{NetProbe: v}
		}
	case *aciv1.ClientMessage_Restored:
		if ss.role != RoleAdmin {
			return errReply(id, denied("restored"))
		}
		var v *aciv1.RestoredResponse
		if v, err = ss.srv.restored(j.ctx, ss, r.Restored); err == nil {
			out.Reply = &aciv1.ServerMessage_Restored{Restored: v}
		}
	case *aciv1.ClientMessage_CheckpointPrepare:
		if ss.role != RoleAdmin {
			return errReply(id, denied("checkpoint_prepare"))
		}
		var v *aciv1.CheckpointPrepareResponse
		if v, err = ss.srv.checkpointPrepare(j.ctx, ss, r.CheckpointPrepare); err == nil {
			out.Reply = &aciv1.ServerMessage_CheckpointPrepare{CheckpointPrepare: v}
		}
	case *aciv1.ClientMessage_CheckpointDone:
		if ss.role != RoleAdmin {
			return errReply(id, denied("checkpoint_done"))
		}
		ss.srv.checkpointDone()
		out.Reply = &aciv1.ServerMessage_CheckpointDone{CheckpointDone: &aciv1.CheckpointDoneResponse{}}
	case *aciv1.ClientMessage_ReleaseScratch:
		if ss.role != RoleAdmin {
			return errReply(id, denied("release_scratch"))
		}
		out.Reply = &aciv1.ServerMessage_ReleaseScratch{ReleaseScratch: &aciv1.ReleaseScratchResponse{
			ReleasedBytes: uint64(ss.srv.releaseScratch())}}
	case *aciv1.ClientMessage_ResumeApps:
		if ss.role != RoleAdmin {
			return errReply(id, denied("resume_apps"))
		}
		out.Reply = &aciv1.ServerMessage_ResumeApps{ResumeApps: &aciv1.ResumeAppsResponse{
			Resumed: uint32(ss.srv.resumeApps())}}
	case *aciv1.ClientMessage_ScreencastStart:
		return ss.screencastStart(id, r.ScreencastStart)
	case *aciv1.ClientMessage_ScreencastStop:
		err = ss.screencastStop(r.ScreencastStop.GetStreamId())
		if err == nil {
			out.Reply = &aciv1.ServerMessage_ScreencastStop{ScreencastStop: &aciv1.ScreencastStopResponse{}}
		}
	case *aciv1.ClientMessage_ScreencastKeyframe:
		err = ss.screencastKeyframe(r.ScreencastKeyframe.GetStreamId())
		if err == nil {
			out.Reply = &aciv1.ServerMessage_ScreencastKeyframe{ScreencastKeyframe: &aciv1.ScreencastKeyframeResponse{}}
		}
	case *aciv1.ClientMessage_A11YTree:
		if ss.srv.opts.A11y == nil {
			return unimplemented(id, "a11y_tree")
		}
		var v *aciv1.A11YTreeResponse
		if v, err = ss.srv.a11yTree(j.ctx, r.A11YTree, "a11y_tree"); err == nil {
			out.Reply = &aciv1.ServerMessage_A11YTree{A11YTree: v}
		}
	case *aciv1.ClientMessage_A11YAction:
		if ss.srv.opts.A11y == nil {
			return unimplemented(id, "a11y_action")
		}
		if err = a11y.ValidateAction(r.A11YAction); err == nil {
			// SET_TEXT types into an element without EditableText.
			var kb a11y.Keyboard
			if d, derr := ss.srv.desktop(); derr == nil {
				kb = d
			}
			if err = ss.srv.opts.A11y.Action(j.ctx, r.A11YAction, kb); err == nil {
				out.Reply = &aciv1.ServerMessage_A11YAction{A11YAction: &aciv1.A11YActionResponse{}}
			}
		}
	case *aciv1.ClientMessage_Cancel:
		// The read loop answers cancels; reaching here means a bug.
		return errReply(id, acierr.New(aciv1.ErrorCode_ERROR_CODE_INTERNAL, "", "cancel reached the executor").Proto())
	default:
		// An empty oneof: a request kind from a newer protocol revision.
		return errReply(id, acierr.New(aciv1.ErrorCode_ERROR_CODE_UNIMPLEMENTED, "request",
			"unknown request kind; this server speaks protocol %d with capabilities %v", ProtocolVersion, ss.srv.caps).Proto())
	}
	if err != nil {
		return errReply(id, toError(err, ""))
	}
	return out
}

// drawsOnScreen reports requests whose effect may reach the screen after
// they return (an app repaints in its own time).
func drawsOnScreen(m *aciv1.ClientMessage) bool {
	switch m.GetRequest().(type) {
	case *aciv1.ClientMessage_Step, *aciv1.ClientMessage_WindowAction, *aciv1.ClientMessage_ClipboardSet,
		*aciv1.ClientMessage_Launch, *aciv1.ClientMessage_Exec, *aciv1.ClientMessage_A11YAction:
		return true
	}
	return false
}

func unimplemented(id uint64, what string) *aciv1.ServerMessage {
	return errReply(id, acierr.New(aciv1.ErrorCode_ERROR_CODE_UNIMPLEMENTED, what,
		"%s is not supported by this server (not in its capabilities)", what).Proto())
}

func denied(what string) *aciv1.Error {
	return acierr.New(aciv1.ErrorCode_ERROR_CODE_PERMISSION_DENIED, what, "%s needs the admin token", what).Proto()
}

func (ss *session) helloDone() bool { return ss.exec.hello }

func (ss *session) hello(r *aciv1.HelloRequest) (*aciv1.HelloResponse, error) {
	if ss.exec.hello {
		return nil, acierr.New(aciv1.ErrorCode_ERROR_CODE_FAILED_PRECONDITION, "hello", "hello was already sent on this session")
	}
	v := r.GetProtocolVersion()
	if v == 0 {
		// Clients predating the field: they speak version 1.
		v = 1
	}
	v = min(v, ProtocolVersion)
	// An empty list is a client from before capability negotiation: it gets
	// the whole v1 baseline, ReadyEvent included. Otherwise only what both
	// sides list is used.
	caps := r.GetCapabilities()
	ss.exec.wantsReady = len(caps) == 0 || slices.Contains(caps, "events.ready")
	ss.exec.zlibTiles = slices.Contains(caps, screencast.CapabilityZlib)
	ss.exec.hello = true
	s := ss.srv
	resp := &aciv1.HelloResponse{
		ProtocolVersion: v,
		ServerVersion:   s.opts.ServerVersion,
		Capabilities:    s.caps,
		SessionId:       ss.id,
		Generation:      s.generation.Load(),
		SandboxId:       *s.sandboxID.Load(),
		MaxMessageBytes: uint64(s.opts.MaxMessageBytes),
		BootId:          s.bootID,
	}
	if d, err := s.desktop(); err == nil {
		w, h := d.ScreenSize()
		resp.Screen = &aciv1.ScreenSizeResponse{Width: uint32(w), Height: uint32(h)}
	}
	s.log.Debug("session hello", "session", ss.id, "role", ss.role, "client", r.GetClientName(), "protocol", v)
	return resp, nil
}

func (s *Server) screenSize() (*aciv1.ScreenSizeResponse, error) {
	d, err := s.desktop()
	if err != nil {
		return nil, err
	}
	w, h := d.ScreenSize()
	return &aciv1.ScreenSizeResponse{Width: uint32(w), Height: uint32(h)}, nil
}

func (s *Server) listWindows() (*aciv1.ListWindowsResponse, error) {
	d, err := s.desktop()
	if err != nil {
		return nil, err
	}
	ws, err := d.ListWindows()
	if err != nil {
		return nil, err
	}
	out := make([]*aciv1.Window, len(ws))
	for i, w := range ws {
		out[i] = &aciv1.Window{
			Id: w.ID, Title: w.Title, Class: w.Class, Instance: w.Instance, Pid: int32(w.PID),
			Geometry: &aciv1.Rect{X: int32(w.X), Y: int32(w.Y), Width: int32(w.Width), Height: int32(w.Height)},
			Focused:  w.Focused, Minimized: w.Minimized, Maximized: w.Maximized, Desktop: int32(w.Desktop),
		}
	}
	return &aciv1.ListWindowsResponse{Windows: out}, nil
}

func (s *Server) windowAction(r *aciv1.WindowActionRequest) error {
	d, err := s.desktop()
	if err != nil {
		return err
	}
	if r.GetWindowId() == 0 {
		return errInvalid("window_action.window_id", "window_id is required")
	}
	id := r.GetWindowId()
	var werr error
	switch r.GetOp() {
	case aciv1.WindowOp_WINDOW_OP_ACTIVATE:
		werr = d.ActivateWindow(id)
	case aciv1.WindowOp_WINDOW_OP_CLOSE:
		werr = d.CloseWindow(id)
	case aciv1.WindowOp_WINDOW_OP_MOVE_RESIZE:
		g := r.GetGeometry()
		if g == nil || g.GetWidth() <= 0 || g.GetHeight() <= 0 {
			return errInvalid("window_action.geometry", "move_resize needs a geometry with positive size")
		}
		werr = d.MoveResizeWindow(id, int(g.GetX()), int(g.GetY()), int(g.GetWidth()), int(g.GetHeight()))
	case aciv1.WindowOp_WINDOW_OP_MAXIMIZE:
		werr = d.SetWindowState(id, desktop.WindowMaximize)
	case aciv1.WindowOp_WINDOW_OP_MINIMIZE:
		werr = d.SetWindowState(id, desktop.WindowMinimize)
	case aciv1.WindowOp_WINDOW_OP_RESTORE:
		werr = d.SetWindowState(id, desktop.WindowRestore)
	case aciv1.WindowOp_WINDOW_OP_FULLSCREEN:
		werr = d.SetWindowState(id, desktop.WindowFullscreen)
	default:
		return errInvalid("window_action.op", "unknown window op %v", r.GetOp())
	}
	if werr != nil {
		return acierr.WithField(mapped(werr), "window_action.window_id")
	}
	return nil
}

// mapped converts a desktop error to an *acierr.Error with its typed code.
func mapped(err error) *acierr.Error {
	p := toError(err, "")
	return &acierr.Error{Code: p.Code, Message: p.Message, Field: p.Field}
}

func (s *Server) fileOp(m *aciv1.ClientMessage, out *aciv1.ServerMessage) error {
	f := s.opts.Files
	switch r := m.GetRequest().(type) {
	case *aciv1.ClientMessage_FilePut:
		v, err := f.Put(r.FilePut)
		if err != nil {
			return err
		}
		out.Reply = &aciv1.ServerMessage_FilePut{FilePut: v}
	case *aciv1.ClientMessage_FileGet:
		v, err := f.Get(r.FileGet)
		if err != nil {
			return err
		}
		out.Reply = &aciv1.ServerMessage_FileGet{FileGet: v}
	case *aciv1.ClientMessage_FileStat:
		v, err := f.Stat(r.FileStat)
		if err != nil {
			return err
		}
		out.Reply = &aciv1.ServerMessage_FileStat{FileStat: v}
	case *aciv1.ClientMessage_FileList:
		v, err := f.List(r.FileList)
		if err != nil {
			return err
		}
		out.Reply = &aciv1.ServerMessage_FileList{FileList: v}
	case *aciv1.ClientMessage_FileMkdir:
		v, err := f.Mkdir(r.FileMkdir)
		if err != nil {
			return err
		}
		out.Reply = &aciv1.ServerMessage_FileMkdir{FileMkdir: v}
	case *aciv1.ClientMessage_FileDelete:
		v, err := f.Delete(r.FileDelete)
		if err != nil {
			return err
		}
		out.Reply = &aciv1.ServerMessage_FileDelete{FileDelete: v}
	}
	return nil
}
