package aci

import (
	"context"
	"errors"
	"fmt"
	"image"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	aciv1 "github.com/forkfleet/forkfleet/api/gen/forkfleet/aci/v1"
	"github.com/forkfleet/forkfleet/api/screencast"
	"github.com/forkfleet/forkfleet/guestd/internal/reaper"
	"github.com/forkfleet/forkfleet/guestd/internal/sysops"
)

func fuzzSeeds() []*aciv1.ClientMessage {
	pt := func(x, y int32) *aciv1.Point { return &aciv1.Point{X: x, Y: y} }
	return []*aciv1.ClientMessage{
		{Id: 1, Request: &aciv1.ClientMessage_Hello{Hello: &aciv1.HelloRequest{ProtocolVersion: 1, Capabilities: []string{"dedup"}}}},
		{Id: 2, Request: &aciv1.ClientMessage_Ping{Ping: &aciv1.PingRequest{Payload: []byte("p")}}},
		{Id: 3, Request: &aciv1.ClientMessage_Step{Step: &aciv1.StepRequest{Actions: []*aciv1.Action{
			{Action: &aciv1.Action_Move{Move: &aciv1.MoveAction{To: pt(3, 4)}}},
			{Action: &aciv1.Action_Click{Click: &aciv1.ClickAction{At: pt(1, 1), Count: 2}}},
			{Action: &aciv1.Action_Drag{Drag: &aciv1.DragAction{From: pt(1, 1), To: pt(9, 9), Steps: 3}}},
			{Action: &aciv1.Action_Scroll{Scroll: &aciv1.ScrollAction{Dy: 3}}},
			{Action: &aciv1.Action_KeyCombo{KeyCombo: &aciv1.KeyComboAction{Keys: []string{"ctrl", "a"}}}},
			{Action: &aciv1.Action_TypeText{TypeText: &aciv1.TypeTextAction{Text: "héllo"}}},
			{Action: &aciv1.Action_Wait{Wait: &aciv1.WaitAction{Milliseconds: 1}}},
		}, Observe: &aciv1.ScreenshotRequest{MaxLongEdge: 16}}}},
		{Id: 4, Request: &aciv1.ClientMessage_Screenshot{Screenshot: &aciv1.ScreenshotRequest{Format: aciv1.ImageFormat_IMAGE_FORMAT_JPEG,
			Region: &aciv1.Rect{X: 1, Y: 2, Width: 30, Height: 20}, IncludeCursor: true, IfNoneMatch: make([]byte, 16)}}},
		{Id: 5, Request: &aciv1.ClientMessage_WindowAction{WindowAction: &aciv1.WindowActionRequest{WindowId: 7, Op: aciv1.WindowOp_WINDOW_OP_MOVE_RESIZE,
			Geometry: &aciv1.Rect{Width: 5, Height: 5}}}},
		{Id: 6, Request: &aciv1.ClientMessage_MemoryChallenge{MemoryChallenge: &aciv1.MemoryChallengeRequest{Nonce: []byte("n")}}},
		{Id: 7, Request: &aciv1.ClientMessage_ClipboardSet{ClipboardSet: &aciv1.ClipboardSetRequest{Text: "x"}}},
		{Id: 8, Request: &aciv1.ClientMessage_Exec{Exec: &aciv1.ExecRequest{Argv: []string{"true"}}}},
		{Id: 9, Request: &aciv1.ClientMessage_MemoryMark{MemoryMark: &aciv1.MemoryMarkRequest{Value: []byte("v")}}},
		// exec, launch and files (confined by fuzzConfine)
		{Id: 10, Request: &aciv1.ClientMessage_Exec{Exec: &aciv1.ExecRequest{Argv: []string{"cat"}, Stdin: []byte("in"),
			Env: map[string]string{"A": "b"}, Cwd: "/", TimeoutMs: 5, MaxOutputBytes: 4}}},
		{Id: 11, Request: &aciv1.ClientMessage_Exec{Exec: &aciv1.ExecRequest{Argv: []string{"echo", "a", "b"}}}},
		{Id: 12, Request: &aciv1.ClientMessage_Launch{Launch: &aciv1.LaunchRequest{Argv: []string{"true"}, Cwd: "/"}}},
		{Id: 13, Request: &aciv1.ClientMessage_FilePut{FilePut: &aciv1.FilePutRequest{Path: "/d/f", Data: []byte("data"), Mode: 0o600, MakeParents: true}}},
		{Id: 14, Request: &aciv1.ClientMessage_FilePut{FilePut: &aciv1.FilePutRequest{Path: "/d/g", Data: []byte("ab"), UploadId: "u", Offset: 0}}},
		{Id: 15, Request: &aciv1.ClientMessage_FileGet{FileGet: &aciv1.FileGetRequest{Path: "/d/f", Offset: 1, Length: 2}}},
		{Id: 16, Request: &aciv1.ClientMessage_FileGet{FileGet: &aciv1.FileGetRequest{Path: "/fifo"}}},
		{Id: 17, Request: &aciv1.ClientMessage_FileStat{FileStat: &aciv1.FileStatRequest{Path: "/d/f"}}},
		{Id: 18, Request: &aciv1.ClientMessage_FileList{FileList: &aciv1.FileListRequest{Path: "/d"}}},
		{Id: 19, Request: &aciv1.ClientMessage_FileMkdir{FileMkdir: &aciv1.FileMkdirRequest{Path: "/d/e/f", Parents: true, Mode: 0o700}}},
		{Id: 20, Request: &aciv1.ClientMessage_FileDelete{FileDelete: &aciv1.FileDeleteRequest{Path: "/d", Recursive: true}}},
		// the admin role
		{Id: 21, Request: &aciv1.ClientMessage_Restored{Restored: &aciv1.RestoredRequest{Token: "t", SandboxId: "sb-2", Generation: 1,
			Entropy: make([]byte, 32)}}},
		{Id: 22, Request: &aciv1.ClientMessage_CheckpointPrepare{CheckpointPrepare: &aciv1.CheckpointPrepareRequest{HoldMs: 1, SettleMs: 1}}},
		{Id: 23, Request: &aciv1.ClientMessage_CheckpointDone{CheckpointDone: &aciv1.CheckpointDoneRequest{}}},
		{Id: 24, Request: &aciv1.ClientMessage_ReleaseScratch{ReleaseScratch: &aciv1.ReleaseScratchRequest{}}},
		{Id: 29, Request: &aciv1.ClientMessage_ResumeApps{ResumeApps: &aciv1.ResumeAppsRequest{}}},
		// screencast
		{Id: 25, Request: &aciv1.ClientMessage_ScreencastStart{ScreencastStart: &aciv1.ScreencastStartRequest{Fps: 60, Delta: true,
			Format: screencast.FormatZlib, Cursor: aciv1.CursorMode_CURSOR_MODE_EVENTS, FrameHashes: true}}},
		{Id: 26, Request: &aciv1.ClientMessage_ScreencastStart{ScreencastStart: &aciv1.ScreencastStartRequest{Format: aciv1.ImageFormat_IMAGE_FORMAT_JPEG,
			Quality: 50, MaxLongEdge: 32, Region: &aciv1.Rect{X: 2, Y: 2, Width: 20, Height: 10}, KeyframeIntervalMs: 1}}},
		{Id: 27, Request: &aciv1.ClientMessage_ScreencastKeyframe{ScreencastKeyframe: &aciv1.ScreencastKeyframeRequest{StreamId: 1}}},
		{Id: 28, Request: &aciv1.ClientMessage_ScreencastStop{ScreencastStop: &aciv1.ScreencastStopRequest{StreamId: 1}}},
	}
}

// fuzzEnv is the server the fuzz targets drive: the real dispatcher, the
// real screencast caster, the real exec runner and file server, on a fake
// desktop, with one session per role. Fuzz inputs are hostile and this
// runs as root, so exec/launch and files are confined (fuzzConfine): file
// paths live under a temporary root, and only harmless programs run.
type fuzzEnv struct {
	srv        *Server
	desk       *fakeDesktop
	root       string // file requests' "/"
	bin        string // the programs exec may run
	agent, adm *fuzzSession

	mu      sync.Mutex
	failure error // what a session's writer found wrong
}

// fuzzSession is a session past its hello without a connection: the
// writer's place is taken by one that checks every message decodes, feeds
// screencast frames to the reference client (api/screencast) and hands
// replies over.
type fuzzSession struct {
	*session
	replies chan *aciv1.ServerMessage
}

// fuzzPrograms exec may run (launch: those that exit at once). Anything
// else in argv[0] is replaced by a name that does not exist.
var (
	fuzzExec   = []string{"true", "false", "echo", "cat", "sleep"}
	fuzzLaunch = []string{"true", "false", "echo"}
)

func newFuzzEnv(tb testing.TB) *fuzzEnv {
	tb.Helper()
	dir := tb.TempDir()
	e := &fuzzEnv{root: filepath.Join(dir, "root"), bin: filepath.Join(dir, "bin")}
	if err := os.MkdirAll(e.bin, 0o755); err != nil {
		tb.Fatal(err)
	}
	for _, p := range fuzzExec {
		target, err := exec.LookPath(p)
		if err != nil {
			tb.Fatal(err)
		}
		if err := os.Symlink(target, filepath.Join(e.bin, p)); err != nil {
			tb.Fatal(err)
		}
	}
	rp, err := reaper.New(reaper.Own)
	if err != nil {
		tb.Fatal(err)
	}
	files := sysops.NewFiles(sysops.FileLimits{MaxFileBytes: 1 << 20, MaxReadBytes: 1 << 16, MaxUploads: 4, UploadIdle: time.Minute})
	sink := filepath.Join(dir, "entropy")
	if err := os.WriteFile(sink, nil, 0o600); err != nil {
		tb.Fatal(err)
	}
	runner := &sysops.Runner{Reaper: rp, Env: []string{"PATH=" + e.bin}, Log: slog.New(slog.DiscardHandler)}
	e.srv, err = New(Options{
		ACIToken: "agent", AdminToken: "admin", MaxMessageBytes: 1 << 20,
		Runner: runner, Files: files, EntropySink: sink, Log: slog.New(slog.DiscardHandler),
	})
	if err != nil {
		tb.Fatal(err)
	}
	e.desk = newFakeDesktop(64, 48)
	e.srv.SetDesktop(e.desk)
	e.agent, e.adm = e.session(RoleAgent), e.session(RoleAdmin)
	e.agent.exec.zlibTiles = true
	tb.Cleanup(func() {
		for _, ss := range []*fuzzSession{e.agent, e.adm} {
			ss.cancel()
		}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		e.srv.Shutdown(ctx)
		runner.StopLaunched(time.Second)
		files.Close()
		rp.Close()
	})
	return e
}

func (e *fuzzEnv) session(role Role) *fuzzSession {
	ctx, cancel := context.WithCancel(context.Background())
	ss := &fuzzSession{replies: make(chan *aciv1.ServerMessage, 4), session: &session{
		srv: e.srv, role: role, id: e.srv.rng.id(), ctx: ctx, cancel: cancel,
		out: make(chan outMsg, replyQueue), streams: map[uint32]struct{}{}, inflight: map[uint64]*job{},
		closeDone: make(chan struct{}),
		inBytes:   byteBudget{max: DefaultMaxSessionBytes}, outBytes: byteBudget{max: DefaultMaxSessionBytes}}}
	ss.exec.hello = true
	go e.writer(ss)
	return ss
}

func (e *fuzzEnv) fail(err error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.failure == nil {
		e.failure = err
	}
}

// fuzzConfine rewrites what m may do to the machine: file paths into the
// temporary root, programs into the allowed ones, and no environment that
// steers the dynamic loader or the program search.
func (e *fuzzEnv) fuzzConfine(m *aciv1.ClientMessage) {
	path := func(p *string) {
		if filepath.IsAbs(*p) {
			*p = e.root + filepath.Clean("/"+*p)
		}
	}
	program := func(argv []string, allowed []string, env map[string]string) {
		if len(argv) > 0 && argv[0] != "" {
			if strings.Contains(argv[0], "/") {
				argv[0] = filepath.Join(e.bin, filepath.Base(argv[0]))
			}
			if base := filepath.Base(argv[0]); !contains(allowed, base) {
				argv[0] = strings.Replace(argv[0], base, "forkfleet-fuzz-no-such-program", 1)
			}
		}
		for k := range env {
			if k == "PATH" || strings.HasPrefix(k, "LD_") || strings.HasPrefix(k, "GCONV") || strings.HasSuffix(k, "PATH") {
				delete(env, k)
			}
		}
	}
	switch r := m.GetRequest().(type) {
	case *aciv1.ClientMessage_Exec:
		program(r.Exec.Argv, fuzzExec, r.Exec.Env)
	case *aciv1.ClientMessage_Launch:
		program(r.Launch.Argv, fuzzLaunch, r.Launch.Env)
	case *aciv1.ClientMessage_FilePut:
		path(&r.FilePut.Path)
	case *aciv1.ClientMessage_FileGet:
		path(&r.FileGet.Path)
	case *aciv1.ClientMessage_FileStat:
		path(&r.FileStat.Path)
	case *aciv1.ClientMessage_FileList:
		path(&r.FileList.Path)
	case *aciv1.ClientMessage_FileMkdir:
		path(&r.FileMkdir.Path)
	case *aciv1.ClientMessage_FileDelete:
		path(&r.FileDelete.Path)
	}
}

// prepare restores the file root (a FIFO in it: file_get must not block on
// it) that an earlier input may have deleted.
func (e *fuzzEnv) prepare(tb testing.TB) {
	if err := os.MkdirAll(e.root, 0o755); err != nil {
		tb.Fatal(err)
	}
	if err := syscall.Mkfifo(filepath.Join(e.root, "fifo"), 0o644); err != nil && !errors.Is(err, os.ErrExist) {
		tb.Fatal(err)
	}
}

// run dispatches msg on both sessions: no panic, exactly one reply with
// the request's id, and a reply that marshals.
func (e *fuzzEnv) run(t *testing.T, msg *aciv1.ClientMessage) {
	if _, ok := msg.GetRequest().(*aciv1.ClientMessage_Cancel); ok || msg.GetId() == 0 {
		return // answered by the read loop, not the dispatcher
	}
	e.prepare(t)
	e.fuzzConfine(msg)
	// Something changes on screen, so open streams send delta frames (the
	// reference client checks them as they arrive).
	id := int(msg.GetId())
	e.desk.fill(image.Rect(id%60, id/60%44, id%60+4, id/60%44+4), byte(id), byte(id>>8), 0x80)
	for _, ss := range []*fuzzSession{e.agent, e.adm} {
		ss.dispatch(t, proto.Clone(msg).(*aciv1.ClientMessage))
		// Keep the session past its handshake whatever the input was. Its
		// streams live on for later inputs' frames, up to a few (the
		// display takes 16).
		ss.exec.hello = true
		if len(ss.streams) > 4 {
			for sid := range ss.streams {
				if err := ss.screencastStop(sid); err != nil {
					t.Fatalf("stop stream %d: %v", sid, err)
				}
			}
		}
	}
	// A restore may have replaced the tokens and a checkpoint_prepare left
	// a hold; neither matters to sessions without connections.
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.failure != nil {
		t.Fatalf("after %v: %v", msg, e.failure)
	}
}

func (ss *fuzzSession) dispatch(t *testing.T, msg *aciv1.ClientMessage) {
	// Bound sleeps, exec and settle waits so one input cannot stall the
	// fuzzer.
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	reply := ss.handle(&job{msg: msg, ctx: ctx})
	if reply == nil {
		// Screencast start emits its reply itself, ahead of the stream's
		// first frame.
		if msg.GetScreencastStart() == nil {
			t.Fatalf("no reply for %v", msg)
		}
		select {
		case reply = <-ss.replies:
		case <-time.After(5 * time.Second):
			t.Fatalf("no screencast_start reply for %v", msg)
		}
	}
	if reply.GetId() != msg.GetId() || reply.GetReply() == nil {
		t.Fatalf("bad reply %v for %v", reply, msg)
	}
	if _, err := proto.Marshal(reply); err != nil {
		t.Fatalf("reply does not marshal: %v", err)
	}
}

// writer stands in for the session's: every message must decode and
// screencast frames must apply on the reference client.
func (e *fuzzEnv) writer(ss *fuzzSession) {
	comps := map[uint32]*screencast.Compositor{}
	for {
		var m outMsg
		select {
		case m = <-ss.out:
		case <-ss.ctx.Done():
			return
		}
		sm := &aciv1.ServerMessage{}
		err := proto.Unmarshal(*m.b, sm)
		ss.outBytes.release(m.cost)
		if m.done != nil {
			close(m.done)
		}
		if err != nil {
			e.fail(fmt.Errorf("guestd sent an undecodable message: %w", err))
			continue
		}
		if sm.GetId() != 0 {
			ss.replies <- sm
			continue
		}
		if f := sm.GetEvent().GetFrame(); f != nil {
			c := comps[f.GetStreamId()]
			if c == nil {
				c = screencast.NewCompositor(screencast.RGBA)
				comps[f.GetStreamId()] = c
			}
			if err := c.Apply(f); err != nil && !errors.Is(err, screencast.ErrAwaitingKeyframe) {
				e.fail(fmt.Errorf("the reference client refuses a guestd frame: %w", err))
			}
		}
	}
}

// FuzzDispatch decodes arbitrary bytes as a ClientMessage and runs whatever
// decodes through the dispatcher, as an agent and as admin.
func FuzzDispatch(f *testing.F) {
	for _, m := range fuzzSeeds() {
		b, err := proto.Marshal(m)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	f.Add([]byte{0xff, 0x01})
	f.Add([]byte{0x08, 0x05, 0xfa, 0x06, 0x00})
	e := newFuzzEnv(f)
	f.Fuzz(func(t *testing.T, data []byte) {
		msg := &aciv1.ClientMessage{}
		if err := proto.Unmarshal(data, msg); err != nil {
			return
		}
		e.run(t, msg)
	})
}

// FuzzDispatchJSON is the same through the debug protojson framing.
func FuzzDispatchJSON(f *testing.F) {
	for _, m := range fuzzSeeds() {
		b, err := protojson.Marshal(m)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	f.Add([]byte(`{"id":"1","unknownKind":{}}`))
	e := newFuzzEnv(f)
	f.Fuzz(func(t *testing.T, data []byte) {
		msg := &aciv1.ClientMessage{}
		if err := (protojson.UnmarshalOptions{DiscardUnknown: true}).Unmarshal(data, msg); err != nil {
			return
		}
		e.run(t, msg)
	})
}
