package aci

import (
	"bytes"
	"context"
	"errors"
	"image"
	"image/png"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"runtime/pprof"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"
	"go.uber.org/goleak"
	"golang.org/x/sys/unix"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	aciclient "github.com/forkfleet/forkfleet/api/aci"
	aciv1 "github.com/forkfleet/forkfleet/api/gen/forkfleet/aci/v1"
	"github.com/forkfleet/forkfleet/guestd/internal/reaper"
	"github.com/forkfleet/forkfleet/guestd/internal/sysops"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m,
		// The reaper's signal.Notify keeps the runtime's signal loop alive.
		goleak.IgnoreTopFunction("os/signal.signal_recv"),
		goleak.IgnoreTopFunction("os/signal.loop"))
}

const (
	aciToken   = "agent-token"
	adminToken = "admin-token"
)

type harness struct {
	t    *testing.T
	srv  *Server
	hs   *httptest.Server
	desk *fakeDesktop
	url  string
}

type hopt func(*Options)

func newHarness(t *testing.T, opts ...hopt) *harness {
	t.Helper()
	rp, err := reaper.New(reaper.Own)
	if err != nil {
		t.Fatal(err)
	}
	o := Options{
		ACIToken: aciToken, AdminToken: adminToken, SandboxID: "sb-1", ServerVersion: "test",
		MaxMessageBytes: 1 << 20,
		Runner:          &sysops.Runner{Reaper: rp, Env: []string{"PATH=/usr/bin:/bin"}, Log: slog.New(slog.DiscardHandler)},
		Files:           sysops.NewFiles(sysops.FileLimits{MaxFileBytes: 1 << 20, MaxReadBytes: 1 << 19, MaxUploads: 4, UploadIdle: time.Minute}),
		EntropySink:     filepath.Join(t.TempDir(), "entropy"),
		Log:             slog.New(slog.DiscardHandler),
	}
	if err := os.WriteFile(o.EntropySink, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	for _, f := range opts {
		f(&o)
	}
	srv, err := New(o)
	if err != nil {
		t.Fatal(err)
	}
	h := &harness{t: t, srv: srv, desk: newFakeDesktop(64, 48)}
	srv.SetDesktop(h.desk)
	h.hs = httptest.NewUnstartedServer(srv)
	h.hs.Config.ConnContext = WithRawConn
	h.hs.Start()
	h.url = "ws" + strings.TrimPrefix(h.hs.URL, "http")
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := srv.Shutdown(ctx); err != nil {
			t.Errorf("shutdown: %v", err)
		}
		h.hs.Close()
		o.Files.Close()
		rp.Close()
	})
	return h
}

func (h *harness) dial(token string) *aciclient.WireConn {
	h.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	c, _, err := aciclient.DialWire(ctx, h.url, token)
	if err != nil {
		h.t.Fatalf("dial: %v", err)
	}
	h.t.Cleanup(func() { c.Conn.CloseNow() })
	return c
}

func (h *harness) session(token string) *aciclient.WireConn {
	h.t.Helper()
	c := h.dial(token)
	if _, err := c.Hello(tctx(h.t), "events.ready", "codec.png", "dedup"); err != nil {
		h.t.Fatal(err)
	}
	return c
}

func tctx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func call(t *testing.T, c *aciclient.WireConn, m *aciv1.ClientMessage) *aciv1.ServerMessage {
	t.Helper()
	r, err := c.Call(tctx(t), m)
	if err != nil {
		t.Fatalf("call: %v", err)
	}
	return r
}

func wantCode(t *testing.T, r *aciv1.ServerMessage, code aciv1.ErrorCode) {
	t.Helper()
	if r.GetError().GetCode() != code {
		t.Fatalf("got %v, want error %v", r, code)
	}
}

func TestHandshake(t *testing.T) {
	h := newHarness(t)
	c := h.dial(aciToken)
	hello, err := c.Hello(tctx(t), "events.ready", "codec.png", "some.future.thing")
	if err != nil {
		t.Fatal(err)
	}
	if hello.GetProtocolVersion() != 1 || hello.GetMaxMessageBytes() != 1<<20 || hello.GetSandboxId() != "sb-1" ||
		hello.GetBootId() == "" || hello.GetSessionId() == "" || hello.GetScreen().GetWidth() != 64 {
		t.Fatalf("hello: %v", hello)
	}
	for _, want := range []string{"codec.png", "dedup", "exec", "files", "events.ready"} {
		if !contains(hello.GetCapabilities(), want) {
			t.Errorf("capability %q missing from %v", want, hello.GetCapabilities())
		}
	}
	if !contains(hello.GetCapabilities(), "screencast") {
		t.Error("screencast not advertised")
	}
	// Already ready: the ReadyEvent follows the HelloResponse.
	st, err := c.WaitReady(tctx(t))
	if err != nil || !st.GetReady() {
		t.Fatalf("ready event: %v %v", st, err)
	}
	// A second hello is refused.
	r := call(t, c, &aciv1.ClientMessage{Request: &aciv1.ClientMessage_Hello{Hello: &aciv1.HelloRequest{}}})
	wantCode(t, r, aciv1.ErrorCode_ERROR_CODE_FAILED_PRECONDITION)
}

func contains(l []string, s string) bool {
	for _, x := range l {
		if x == s {
			return true
		}
	}
	return false
}

func TestOldClientAndNewerProtocol(t *testing.T) {
	h := newHarness(t)
	// An old client: no version, no capabilities: v1 baseline incl. events.
	c := h.dial(aciToken)
	r := call(t, c, &aciv1.ClientMessage{Request: &aciv1.ClientMessage_Hello{Hello: &aciv1.HelloRequest{}}})
	if r.GetHello().GetProtocolVersion() != 1 {
		t.Fatalf("old client: %v", r)
	}
	if _, err := c.WaitReady(tctx(t)); err != nil {
		t.Fatal(err)
	}
	// A newer client (version 7) gets version 1; it did not list
	// events.ready, so it receives no event: its next message is its reply.
	c2 := h.dial(aciToken)
	r = call(t, c2, &aciv1.ClientMessage{Request: &aciv1.ClientMessage_Hello{Hello: &aciv1.HelloRequest{ProtocolVersion: 7, Capabilities: []string{"codec.png"}}}})
	if r.GetHello().GetProtocolVersion() != 1 {
		t.Fatalf("newer client: %v", r)
	}
	r = call(t, c2, ping(nil))
	if r.GetPing() == nil || len(c2.Events) != 0 {
		t.Fatalf("unexpected events %v / reply %v", c2.Events, r)
	}
}

func ping(p []byte) *aciv1.ClientMessage {
	return &aciv1.ClientMessage{Request: &aciv1.ClientMessage_Ping{Ping: &aciv1.PingRequest{Payload: p}}}
}

func TestHelloFirst(t *testing.T) {
	h := newHarness(t)
	c := h.dial(aciToken)
	wantCode(t, call(t, c, ping(nil)), aciv1.ErrorCode_ERROR_CODE_FAILED_PRECONDITION)
	if _, err := c.Hello(tctx(t)); err != nil {
		t.Fatal(err)
	}
}

func TestUnknownRequestKind(t *testing.T) {
	h := newHarness(t)
	c := h.session(aciToken)
	// id=5 plus field 99 (a request kind from the future).
	b := protowire.AppendTag(nil, 1, protowire.VarintType)
	b = protowire.AppendVarint(b, 5)
	b = protowire.AppendTag(b, 99, protowire.BytesType)
	b = protowire.AppendBytes(b, []byte{0x08, 0x01})
	if err := c.Conn.Write(tctx(t), websocket.MessageBinary, b); err != nil {
		t.Fatal(err)
	}
	r := recvReply(t, c)
	if r.GetId() != 5 {
		t.Fatalf("id %d", r.GetId())
	}
	wantCode(t, r, aciv1.ErrorCode_ERROR_CODE_UNIMPLEMENTED)
	// The session survives.
	if r := call(t, c, ping([]byte("x"))); string(r.GetPing().GetPayload()) != "x" {
		t.Fatalf("ping after unknown kind: %v", r)
	}
	// id 0 is refused.
	if _, err := c.Send(tctx(t), &aciv1.ClientMessage{Id: 0, Request: &aciv1.ClientMessage_Ping{Ping: &aciv1.PingRequest{}}}); err != nil {
		t.Fatal(err)
	}
}

func recvReply(t *testing.T, c *aciclient.WireConn) *aciv1.ServerMessage {
	t.Helper()
	for {
		m, err := c.Recv(tctx(t))
		if err != nil {
			t.Fatal(err)
		}
		if m.GetEvent() == nil {
			return m
		}
	}
}

func TestPipeliningOrder(t *testing.T) {
	h := newHarness(t)
	c := h.session(aciToken)
	ctx := tctx(t)
	const n = 1000
	errc := make(chan error, 1)
	go func() {
		for i := 1; i <= n; i++ {
			var m *aciv1.ClientMessage
			switch i % 3 {
			case 0:
				m = ping([]byte{byte(i)})
			case 1:
				m = &aciv1.ClientMessage{Request: &aciv1.ClientMessage_Step{Step: &aciv1.StepRequest{
					Actions: []*aciv1.Action{{Action: &aciv1.Action_Move{Move: &aciv1.MoveAction{To: &aciv1.Point{X: int32(i % 64), Y: 1}}}}}}}}
			default:
				m = &aciv1.ClientMessage{Request: &aciv1.ClientMessage_CursorPosition{CursorPosition: &aciv1.CursorPositionRequest{}}}
			}
			m.Id = uint64(1000 + i)
			if _, err := c.Send(ctx, m); err != nil {
				errc <- err
				return
			}
		}
		errc <- nil
	}()
	for i := 1; i <= n; i++ {
		r := recvReply(t, c)
		if r.GetId() != uint64(1000+i) {
			t.Fatalf("reply %d has id %d", i, r.GetId())
		}
		if i%3 == 2 {
			// The cursor query sees the move queued just before it.
			if got := r.GetCursorPosition().GetPosition().GetX(); got != int32((i-1)%64) {
				t.Fatalf("cursor x %d after move to %d", got, (i-1)%64)
			}
		}
	}
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
}

func keyPress(k string) *aciv1.Action {
	return &aciv1.Action{Action: &aciv1.Action_KeyPress{KeyPress: &aciv1.KeyAction{Key: k}}}
}

func TestStepFailingActionKeepsObservation(t *testing.T) {
	h := newHarness(t)
	c := h.session(aciToken)
	for _, stop := range []bool{false, true} {
		r := call(t, c, &aciv1.ClientMessage{Request: &aciv1.ClientMessage_Step{Step: &aciv1.StepRequest{
			StopOnError: stop,
			Actions: []*aciv1.Action{
				{Action: &aciv1.Action_Move{Move: &aciv1.MoveAction{To: &aciv1.Point{X: 3, Y: 4}}}},
				keyPress("bogus_key"),
				{Action: &aciv1.Action_Click{Click: &aciv1.ClickAction{Button: aciv1.MouseButton_MOUSE_BUTTON_RIGHT, Count: 2}}},
				{}, // an action kind from the future
			},
			Observe: &aciv1.ScreenshotRequest{Format: aciv1.ImageFormat_IMAGE_FORMAT_PNG},
		}}})
		st := r.GetStep()
		if st == nil || len(st.GetOutcomes()) != 4 {
			t.Fatalf("step: %v", r)
		}
		o := st.GetOutcomes()
		if o[0].GetError() != nil || o[1].GetError().GetCode() != aciv1.ErrorCode_ERROR_CODE_INVALID_ARGUMENT ||
			o[1].GetError().GetField() != "step.actions[1]" {
			t.Fatalf("outcomes: %v", o)
		}
		if stop {
			if o[2].GetError().GetCode() != aciv1.ErrorCode_ERROR_CODE_CANCELED || o[3].GetError().GetCode() != aciv1.ErrorCode_ERROR_CODE_CANCELED {
				t.Fatalf("stop_on_error outcomes: %v", o)
			}
		} else if o[2].GetError() != nil || o[3].GetError().GetCode() != aciv1.ErrorCode_ERROR_CODE_UNIMPLEMENTED {
			t.Fatalf("outcomes: %v", o)
		}
		if st.GetObservation() == nil || len(st.GetObservation().GetData()) == 0 {
			t.Fatalf("observation missing: %v", st)
		}
	}
	calls := strings.Join(h.desk.Calls(), ",")
	if !strings.Contains(calls, "move 3 4") || !strings.Contains(calls, "click 3 2") {
		t.Fatalf("calls: %s", calls)
	}
	// An off-screen point is INVALID_ARGUMENT with the field named.
	r := call(t, c, &aciv1.ClientMessage{Request: &aciv1.ClientMessage_Step{Step: &aciv1.StepRequest{
		Actions: []*aciv1.Action{{Action: &aciv1.Action_Move{Move: &aciv1.MoveAction{To: &aciv1.Point{X: 640, Y: 4}}}}}}}})
	if e := r.GetStep().GetOutcomes()[0].GetError(); e.GetField() != "step.actions[0].move.to" {
		t.Fatalf("off-screen move: %v", e)
	}
}

func shot(req *aciv1.ScreenshotRequest) *aciv1.ClientMessage {
	return &aciv1.ClientMessage{Request: &aciv1.ClientMessage_Screenshot{Screenshot: req}}
}

func TestScreenshotDedupAndPixels(t *testing.T) {
	h := newHarness(t)
	c := h.session(aciToken)
	r := call(t, c, shot(&aciv1.ScreenshotRequest{}))
	s := r.GetScreenshot()
	if s == nil || s.GetFormat() != aciv1.ImageFormat_IMAGE_FORMAT_PNG || len(s.GetFrameHash()) != 16 || s.GetWidth() != 64 {
		t.Fatalf("screenshot: %v", r)
	}
	img, err := png.Decode(bytes.NewReader(s.GetData()))
	if err != nil {
		t.Fatal(err)
	}
	if rr, g, b, _ := img.At(10, 10).RGBA(); rr>>8 != 0x50 || g>>8 != 0x40 || b>>8 != 0x30 {
		t.Fatalf("pixel %x %x %x", rr>>8, g>>8, b>>8)
	}
	hash := s.GetFrameHash()
	// Unchanged: not_modified, no image.
	r = call(t, c, shot(&aciv1.ScreenshotRequest{IfNoneMatch: hash}))
	if !r.GetScreenshot().GetNotModified() || len(r.GetScreenshot().GetData()) != 0 {
		t.Fatalf("want not_modified: %v", r)
	}
	// Format NONE: hash only, the same hash.
	r = call(t, c, shot(&aciv1.ScreenshotRequest{Format: aciv1.ImageFormat_IMAGE_FORMAT_NONE}))
	if !bytes.Equal(r.GetScreenshot().GetFrameHash(), hash) || len(r.GetScreenshot().GetData()) != 0 {
		t.Fatalf("NONE: %v", r)
	}
	// A change: a full frame with a new hash.
	h.desk.fill(image.Rect(5, 5, 9, 9), 0xff, 0, 0)
	r = call(t, c, shot(&aciv1.ScreenshotRequest{IfNoneMatch: hash}))
	if r.GetScreenshot().GetNotModified() || len(r.GetScreenshot().GetData()) == 0 || bytes.Equal(r.GetScreenshot().GetFrameHash(), hash) {
		t.Fatalf("after change: %v", r)
	}
	// Region + downscale + JPEG.
	r = call(t, c, shot(&aciv1.ScreenshotRequest{Format: aciv1.ImageFormat_IMAGE_FORMAT_JPEG, Quality: 90,
		Region: &aciv1.Rect{X: 4, Y: 4, Width: 40, Height: 20}, MaxLongEdge: 20}))
	if s := r.GetScreenshot(); s.GetWidth() != 20 || s.GetHeight() != 10 || s.GetRegion().GetX() != 4 || len(s.GetData()) < 100 {
		t.Fatalf("region jpeg: %v", r)
	}
	// Settle: returns after the quiet period.
	t0 := time.Now()
	r = call(t, c, shot(&aciv1.ScreenshotRequest{Format: aciv1.ImageFormat_IMAGE_FORMAT_NONE, SettleMs: 30}))
	if r.GetScreenshot() == nil || time.Since(t0) < 30*time.Millisecond {
		t.Fatalf("settle: %v after %v", r, time.Since(t0))
	}
	// Bad arguments.
	wantCode(t, call(t, c, shot(&aciv1.ScreenshotRequest{IfNoneMatch: []byte{1, 2}})), aciv1.ErrorCode_ERROR_CODE_INVALID_ARGUMENT)
	wantCode(t, call(t, c, shot(&aciv1.ScreenshotRequest{Region: &aciv1.Rect{X: 100, Y: 100, Width: 5, Height: 5}})), aciv1.ErrorCode_ERROR_CODE_INVALID_ARGUMENT)
	wantCode(t, call(t, c, shot(&aciv1.ScreenshotRequest{Quality: 101, Format: aciv1.ImageFormat_IMAGE_FORMAT_JPEG})), aciv1.ErrorCode_ERROR_CODE_INVALID_ARGUMENT)
}

func TestBadAndOversizedMessages(t *testing.T) {
	h := newHarness(t)
	for name, tc := range map[string]struct {
		typ  websocket.MessageType
		data []byte
		code websocket.StatusCode
	}{
		"garbage":   {websocket.MessageBinary, []byte{0xff, 0xff, 0xff}, websocket.StatusInvalidFramePayloadData},
		"text":      {websocket.MessageText, []byte("{}"), websocket.StatusUnsupportedData},
		"oversized": {websocket.MessageBinary, make([]byte, 2<<20), websocket.StatusMessageTooBig},
	} {
		t.Run(name, func(t *testing.T) {
			c := h.session(aciToken)
			ctx := tctx(t)
			if err := c.Conn.Write(ctx, tc.typ, tc.data); err != nil && name != "oversized" {
				t.Fatal(err)
			}
			err := readUntilClosed(ctx, c)
			if got := websocket.CloseStatus(err); got != tc.code {
				t.Fatalf("close status %v (%v), want %v", got, err, tc.code)
			}
		})
	}
}

func TestAuth(t *testing.T) {
	h := newHarness(t)
	for _, tok := range []string{"", "wrong", aciToken + "x"} {
		_, resp, err := aciclient.DialWire(tctx(t), h.url, tok)
		if err == nil || resp == nil || resp.StatusCode != http.StatusUnauthorized {
			t.Fatalf("token %q: err %v resp %v", tok, err, resp)
		}
	}
	agent := h.session(aciToken)
	mark := &aciv1.ClientMessage{Request: &aciv1.ClientMessage_MemoryMark{MemoryMark: &aciv1.MemoryMarkRequest{Value: []byte("secret")}}}
	wantCode(t, call(t, agent, mark), aciv1.ErrorCode_ERROR_CODE_PERMISSION_DENIED)
	restored := &aciv1.ClientMessage{Request: &aciv1.ClientMessage_Restored{Restored: &aciv1.RestoredRequest{
		Token: "new-token", AdminToken: "new-admin", Generation: 3, SandboxId: "sb-2", Entropy: bytes.Repeat([]byte{7}, 32)}}}
	wantCode(t, call(t, agent, restored), aciv1.ErrorCode_ERROR_CODE_PERMISSION_DENIED)
	challenge := &aciv1.ClientMessage{Request: &aciv1.ClientMessage_MemoryChallenge{MemoryChallenge: &aciv1.MemoryChallengeRequest{Nonce: []byte("n")}}}
	wantCode(t, call(t, agent, challenge), aciv1.ErrorCode_ERROR_CODE_FAILED_PRECONDITION)

	admin := h.session(adminToken)
	noAdmin := proto.Clone(restored).(*aciv1.ClientMessage)
	noAdmin.GetRestored().AdminToken = ""
	wantCode(t, call(t, admin, noAdmin), aciv1.ErrorCode_ERROR_CODE_INVALID_ARGUMENT)
	if r := call(t, admin, mark); r.GetMemoryMark() == nil {
		t.Fatalf("admin mark: %v", r)
	}
	r := call(t, agent, challenge)
	if len(r.GetMemoryChallenge().GetMac()) != 32 {
		t.Fatalf("challenge: %v", r)
	}
	// CRIU does not restore the KSM opt-in (PR_SET_MEMORY_MERGE): restored
	// takes it again.
	ksm := unix.Prctl(unix.PR_SET_MEMORY_MERGE, 0, 0, 0, 0) == nil
	defer unix.Prctl(unix.PR_SET_MEMORY_MERGE, 0, 0, 0, 0)
	if r := call(t, admin, restored); r.GetRestored() == nil {
		t.Fatalf("restored: %v", r)
	}
	if merged, err := sysops.MemoryMerged(); ksm && (err != nil || !merged) {
		t.Fatalf("KSM opt-in after restored: %v, %v; want on", merged, err)
	}
	if b, _ := os.ReadFile(h.srv.opts.EntropySink); len(b) != 32 {
		t.Fatalf("entropy sink got %d bytes", len(b))
	}
	// The old tokens of both roles no longer open sessions; the new ones
	// do, and report the new generation and sandbox.
	for _, old := range []string{aciToken, adminToken} {
		if _, resp, err := aciclient.DialWire(tctx(t), h.url, old); err == nil || resp.StatusCode != http.StatusUnauthorized {
			t.Fatalf("old token %q after restore: %v", old, err)
		}
	}
	for _, tok := range []string{"new-token", "new-admin"} {
		c := h.dial(tok)
		hello, err := c.Hello(tctx(t))
		if err != nil || hello.GetGeneration() != 3 || hello.GetSandboxId() != "sb-2" {
			t.Fatalf("hello after restore: %v %v", hello, err)
		}
	}
	// A session opened with the old tokens is closed; the caller's stays.
	if err := readUntilClosed(tctx(t), agent); websocket.CloseStatus(err) != StatusTokensReplaced {
		t.Fatalf("old agent session after restore: %v, want closed with %v", err, StatusTokensReplaced)
	}
	if r := call(t, admin, ping(nil)); r.GetPing() == nil {
		t.Fatalf("the restoring session: %v", r)
	}
	// An older generation is refused.
	restored.GetRestored().Generation = 2
	wantCode(t, call(t, admin, restored), aciv1.ErrorCode_ERROR_CODE_FAILED_PRECONDITION)
}

func TestExecCancelOrder(t *testing.T) {
	h := newHarness(t)
	c := h.session(aciToken)
	ctx := tctx(t)
	execID, err := c.Send(ctx, &aciv1.ClientMessage{Request: &aciv1.ClientMessage_Exec{Exec: &aciv1.ExecRequest{Argv: []string{"sleep", "30"}}}})
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(50 * time.Millisecond)
	cancelID, err := c.Send(ctx, &aciv1.ClientMessage{Request: &aciv1.ClientMessage_Cancel{Cancel: &aciv1.CancelRequest{TargetId: execID}}})
	if err != nil {
		t.Fatal(err)
	}
	r := recvReply(t, c)
	if r.GetId() != execID {
		t.Fatalf("first reply %d, want the exec %d", r.GetId(), execID)
	}
	wantCode(t, r, aciv1.ErrorCode_ERROR_CODE_CANCELED)
	r = recvReply(t, c)
	if r.GetId() != cancelID || !r.GetCancel().GetFound() {
		t.Fatalf("cancel reply: %v", r)
	}
	r = call(t, c, &aciv1.ClientMessage{Request: &aciv1.ClientMessage_Cancel{Cancel: &aciv1.CancelRequest{TargetId: 12345}}})
	if r.GetCancel() == nil || r.GetCancel().GetFound() {
		t.Fatalf("cancel of unknown: %v", r)
	}
	r = call(t, c, &aciv1.ClientMessage{Request: &aciv1.ClientMessage_Exec{Exec: &aciv1.ExecRequest{Argv: []string{"sh", "-c", "echo hi; exit 3"}}}})
	if r.GetExec().GetExitCode() != 3 || string(r.GetExec().GetStdout()) != "hi\n" {
		t.Fatalf("exec: %v", r)
	}
}

func TestDesktopRequests(t *testing.T) {
	h := newHarness(t)
	c := h.session(aciToken)
	r := call(t, c, &aciv1.ClientMessage{Request: &aciv1.ClientMessage_ListWindows{ListWindows: &aciv1.ListWindowsRequest{}}})
	if len(r.GetListWindows().GetWindows()) != 1 || r.GetListWindows().GetWindows()[0].GetClass() != "XTerm" {
		t.Fatalf("windows: %v", r)
	}
	wa := func(id uint32, op aciv1.WindowOp, g *aciv1.Rect) *aciv1.ServerMessage {
		return call(t, c, &aciv1.ClientMessage{Request: &aciv1.ClientMessage_WindowAction{WindowAction: &aciv1.WindowActionRequest{WindowId: id, Op: op, Geometry: g}}})
	}
	if r := wa(7, aciv1.WindowOp_WINDOW_OP_MAXIMIZE, nil); r.GetWindowAction() == nil {
		t.Fatalf("maximize: %v", r)
	}
	wantCode(t, wa(8, aciv1.WindowOp_WINDOW_OP_CLOSE, nil), aciv1.ErrorCode_ERROR_CODE_NOT_FOUND)
	wantCode(t, wa(7, aciv1.WindowOp_WINDOW_OP_MOVE_RESIZE, nil), aciv1.ErrorCode_ERROR_CODE_INVALID_ARGUMENT)
	wantCode(t, wa(7, aciv1.WindowOp_WINDOW_OP_UNSPECIFIED, nil), aciv1.ErrorCode_ERROR_CODE_INVALID_ARGUMENT)
	call(t, c, &aciv1.ClientMessage{Request: &aciv1.ClientMessage_ClipboardSet{ClipboardSet: &aciv1.ClipboardSetRequest{Text: "päste"}}})
	r = call(t, c, &aciv1.ClientMessage{Request: &aciv1.ClientMessage_ClipboardGet{ClipboardGet: &aciv1.ClipboardGetRequest{}}})
	if r.GetClipboardGet().GetText() != "päste" {
		t.Fatalf("clipboard: %v", r)
	}
	r = call(t, c, &aciv1.ClientMessage{Request: &aciv1.ClientMessage_Ready{Ready: &aciv1.ReadyRequest{}}})
	if !r.GetReady().GetReady() || r.GetReady().GetXUpMs() == 0 {
		t.Fatalf("ready: %v", r)
	}
	// Without a desktop: UNAVAILABLE, and the ReadyEvent arrives once one
	// is installed.
	h.srv.SetDesktop(nil)
	wantCode(t, call(t, c, shot(&aciv1.ScreenshotRequest{})), aciv1.ErrorCode_ERROR_CODE_UNAVAILABLE)
}

func TestReadyEventPushedOnTransition(t *testing.T) {
	h := newHarness(t)
	h.srv.SetDesktop(nil)
	h.srv.mu.Lock()
	h.srv.ready = nil
	h.srv.mu.Unlock()
	c := h.session(aciToken)
	r := call(t, c, &aciv1.ClientMessage{Request: &aciv1.ClientMessage_Ready{Ready: &aciv1.ReadyRequest{}}})
	if r.GetReady().GetReady() {
		t.Fatalf("ready without desktop: %v", r)
	}
	h.srv.SetDesktop(h.desk)
	st, err := c.WaitReady(tctx(t))
	if err != nil || !st.GetReady() {
		t.Fatalf("ready event: %v %v", st, err)
	}
}

func TestJSONSubprotocol(t *testing.T) {
	h := newHarness(t)
	c, _, err := aciclient.DialWire(tctx(t), h.url, aciToken, aciclient.WithJSON())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Conn.CloseNow()
	if _, err := c.Hello(tctx(t)); err != nil {
		t.Fatal(err)
	}
	if r := call(t, c, ping([]byte("json"))); string(r.GetPing().GetPayload()) != "json" {
		t.Fatalf("json ping: %v", r)
	}
	// Unknown fields (a request kind from the future) are UNIMPLEMENTED.
	if err := c.Conn.Write(tctx(t), websocket.MessageText, []byte(`{"id":"9","futureThing":{}}`)); err != nil {
		t.Fatal(err)
	}
	wantCode(t, recvReply(t, c), aciv1.ErrorCode_ERROR_CODE_UNIMPLEMENTED)
}

func TestShutdownClosesSessions(t *testing.T) {
	h := newHarness(t)
	c := h.session(aciToken)
	// Shutdown gives peers closeHandshakeGrace, then cuts them off; the
	// deadline only bounds a hang (a loaded CI host once took over 5 s), and
	// a hang says where it is stuck.
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := h.srv.Shutdown(ctx); err != nil {
		var stacks strings.Builder
		_ = pprof.Lookup("goroutine").WriteTo(&stacks, 1)
		t.Fatalf("shutdown: %v\n%s", err, stacks.String())
	}
	err := readUntilClosed(tctx(t), c)
	if websocket.CloseStatus(err) != websocket.StatusGoingAway && !errors.Is(err, io.EOF) {
		t.Fatalf("after shutdown: %v", err)
	}
}

// readUntilClosed skips events and returns the error that ends the read side.
func readUntilClosed(ctx context.Context, c *aciclient.WireConn) error {
	for {
		if _, _, err := c.Conn.Read(ctx); err != nil {
			return err
		}
	}
}
