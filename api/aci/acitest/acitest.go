// Package acitest is an in-process ACI server for tests of ACI clients: it
// speaks the real framing (both subprotocols, the Hello handshake, in-order
// execution with out-of-band cancel, pushed events, frame-hash dedup) over a
// real loopback WebSocket, with an in-memory desktop: a settable frame, a
// pointer, a clipboard, windows and a file tree.
package acitest

import (
	"bytes"
	"context"
	"crypto/sha256"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"path"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/coder/websocket"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	"github.com/forkfleet/forkfleet/api/aci/wire"
	"github.com/forkfleet/forkfleet/api/connlimit"
	aciv1 "github.com/forkfleet/forkfleet/api/gen/forkfleet/aci/v1"
)

// Server is a fake guestd. Configure the exported fields before the first
// connection; use the methods at any time.
type Server struct {
	// Token, when set, is required as "Authorization: Bearer <token>";
	// AdminToken, when set, is accepted too. Restored replaces both, as
	// guestd does.
	Token      string
	AdminToken string
	// Capabilities advertised in the HelloResponse (DefaultCapabilities
	// when nil).
	Capabilities []string
	SandboxID    string
	// MaxMessageBytes is advertised and enforced (64 MiB when 0).
	MaxMessageBytes uint64
	// Handle, when set, answers requests before the built-in handlers; return
	// nil to fall through to them.
	Handle func(ctx context.Context, m *aciv1.ClientMessage) *aciv1.ServerMessage

	httpSrv *httptest.Server
	bootID  string
	serving sync.WaitGroup // hijacked connections outlive httptest's tracking

	mu         sync.Mutex
	generation uint64
	frame      []byte
	frameHash  []byte
	width      uint32
	height     uint32
	cursor     *aciv1.Point
	clipboard  string
	files      map[string][]byte
	uploads    map[string][]byte
	mark       []byte
	conns      map[*serverConn]struct{}
	ready      bool
	requests   []*aciv1.ClientMessage
	a11y       *aciv1.A11YTreeResponse

	fullFrames  atomic.Uint64
	notModified atomic.Uint64
	canceled    atomic.Uint64
	conCount    atomic.Uint64
	open        atomic.Int64
}

// DefaultCapabilities is what the fake advertises by default.
var DefaultCapabilities = []string{"codec.png", "codec.jpeg", "codec.none", "dedup", "settle", "input", "windows",
	"clipboard", "events.ready", "cancel", "memory", "exec", "launch", "files", "files.chunked", "restored.admin_token", "a11y"}

// NewServer starts a fake guestd on a loopback port. Close it when done.
func NewServer() *Server {
	s := newServer()
	s.httpSrv = httptest.NewUnstartedServer(s)
	connlimit.Apply(s.httpSrv.Config, connlimit.Limits{}) // guestd's bounds before the upgrade
	s.httpSrv.Start()
	return s
}

// NewUnixServer starts a fake guestd on a unix socket at socketPath.
func NewUnixServer(socketPath string) (*Server, error) {
	ln, err := net.Listen("unix", socketPath)
	if err != nil {
		return nil, err
	}
	s := newServer()
	s.httpSrv = httptest.NewUnstartedServer(s)
	s.httpSrv.Listener.Close()
	s.httpSrv.Listener = ln
	connlimit.Apply(s.httpSrv.Config, connlimit.Limits{})
	s.httpSrv.Start()
	return s, nil
}

func newServer() *Server {
	s := &Server{
		bootID:  fmt.Sprintf("boot-%d", time.Now().UnixNano()),
		width:   1280,
		height:  800,
		cursor:  &aciv1.Point{},
		files:   make(map[string][]byte),
		uploads: make(map[string][]byte),
		conns:   make(map[*serverConn]struct{}),
		ready:   true,
		a11y:    SampleA11yTree(),
	}
	s.SetFrame(bytes.Repeat([]byte{0x42}, 1024))
	return s
}

// URL is the ws:// URL of the ACI endpoint.
func (s *Server) URL() string { return "ws" + strings.TrimPrefix(s.httpSrv.URL, "http") + "/aci" }

// Close drops every connection and stops the server.
func (s *Server) Close() {
	s.httpSrv.Close()
	s.DropConnections()
	s.serving.Wait()
}

// SetFrame sets the screen's encoded image; its frame hash is derived from
// the bytes.
func (s *Server) SetFrame(data []byte) {
	h := sha256.Sum256(data)
	s.mu.Lock()
	s.frame = data
	s.frameHash = h[:16]
	s.mu.Unlock()
}

// FrameHash returns the current frame's hash.
func (s *Server) FrameHash() []byte {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]byte(nil), s.frameHash...)
}

// SetGeneration sets the restore generation reported to new connections.
func (s *Server) SetGeneration(g uint64) {
	s.mu.Lock()
	s.generation = g
	s.mu.Unlock()
}

// SetReady sets readiness and pushes a ReadyEvent to every connection.
func (s *Server) SetReady(ready bool) {
	s.mu.Lock()
	s.ready = ready
	s.mu.Unlock()
	s.Push(&aciv1.Event{Event: &aciv1.Event_Ready{Ready: &aciv1.ReadyEvent{State: s.readyState()}}})
}

// Push sends an event to every connected session.
func (s *Server) Push(ev *aciv1.Event) {
	s.mu.Lock()
	conns := make([]*serverConn, 0, len(s.conns))
	for c := range s.conns {
		conns = append(conns, c)
	}
	s.mu.Unlock()
	for _, c := range conns {
		c.send(&aciv1.ServerMessage{Reply: &aciv1.ServerMessage_Event{Event: ev}})
	}
}

// DropConnections closes every connection abruptly (a crash or a restore).
func (s *Server) DropConnections() {
	s.mu.Lock()
	for c := range s.conns {
		c.ws.CloseNow()
	}
	s.mu.Unlock()
}

// Connections is how many connections completed a handshake so far.
func (s *Server) Connections() uint64 { return s.conCount.Load() }

// Open is how many WebSocket connections are open now, handshake done or
// not (what a checkpoint of a real guestd would find).
func (s *Server) Open() int64 { return s.open.Load() }

// FullFrames and NotModified count screenshot replies by kind.
func (s *Server) FullFrames() uint64  { return s.fullFrames.Load() }
func (s *Server) NotModified() uint64 { return s.notModified.Load() }

// Canceled counts requests cut short by a CancelRequest.
func (s *Server) Canceled() uint64 { return s.canceled.Load() }

// File returns a stored file.
func (s *Server) File(p string) ([]byte, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	b, ok := s.files[p]
	return b, ok
}

// Requests returns every request received so far, in order.
func (s *Server) Requests() []*aciv1.ClientMessage {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]*aciv1.ClientMessage(nil), s.requests...)
}

func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	s.mu.Lock()
	tok, admin := s.Token, s.AdminToken
	s.mu.Unlock()
	if auth := r.Header.Get("Authorization"); tok != "" && auth != "Bearer "+tok && (admin == "" || auth != "Bearer "+admin) {
		http.Error(w, "unauthorized", http.StatusUnauthorized)
		return
	}
	s.serving.Add(1)
	defer s.serving.Done()
	ws, err := websocket.Accept(w, r, &websocket.AcceptOptions{
		Subprotocols: []string{"forkfleet.aci.v1", "forkfleet.aci.v1+json"},
	})
	if err != nil {
		return
	}
	s.open.Add(1)
	defer s.open.Add(-1)
	maxMsg := s.MaxMessageBytes
	if maxMsg == 0 {
		maxMsg = 64 << 20
	}
	ws.SetReadLimit(int64(maxMsg))
	c := &serverConn{
		s:       s,
		ws:      ws,
		json:    ws.Subprotocol() == "forkfleet.aci.v1+json",
		work:    make(chan *job, 1024),
		running: make(map[uint64]context.CancelFunc),
		maxMsg:  maxMsg,
	}
	if ws.Subprotocol() == "" {
		ws.Close(websocket.StatusPolicyViolation, "subprotocol required")
		return
	}
	c.serve(r.Context())
}

type job struct {
	m      *aciv1.ClientMessage
	ctx    context.Context
	cancel context.CancelFunc
}

type serverConn struct {
	s      *Server
	ws     *websocket.Conn
	json   bool
	maxMsg uint64
	wmu    sync.Mutex
	work   chan *job

	rmu     sync.Mutex
	running map[uint64]context.CancelFunc
}

func (c *serverConn) send(m *aciv1.ServerMessage) {
	var (
		b   []byte
		err error
		typ = websocket.MessageBinary
	)
	if c.json {
		typ = websocket.MessageText
		b, err = protojson.Marshal(m)
	} else {
		b, err = proto.Marshal(m)
	}
	if err != nil {
		panic(err)
	}
	c.wmu.Lock()
	defer c.wmu.Unlock()
	_ = c.ws.Write(context.Background(), typ, b)
}

func (c *serverConn) read() (*aciv1.ClientMessage, error) {
	_, b, err := c.ws.Read(context.Background())
	if err != nil {
		return nil, err
	}
	m := &aciv1.ClientMessage{}
	if c.json {
		err = protojson.Unmarshal(b, m)
	} else {
		err = proto.Unmarshal(b, m)
	}
	return m, err
}

func (c *serverConn) serve(ctx context.Context) {
	s := c.s
	defer c.ws.CloseNow()
	first, err := c.read()
	if err != nil {
		return
	}
	s.mu.Lock()
	s.requests = append(s.requests, first)
	s.mu.Unlock()
	if first.GetHello() == nil {
		c.send(errReply(first.GetId(), aciv1.ErrorCode_ERROR_CODE_FAILED_PRECONDITION, "", "hello must come first"))
		return
	}
	s.mu.Lock()
	caps := s.Capabilities
	if caps == nil {
		caps = DefaultCapabilities
	}
	hello := &aciv1.HelloResponse{
		ProtocolVersion: 1, ServerVersion: "acitest", Capabilities: caps,
		SessionId: fmt.Sprintf("s-%d", s.conCount.Load()+1), Generation: s.generation,
		SandboxId: s.SandboxID, Screen: &aciv1.ScreenSizeResponse{Width: s.width, Height: s.height},
		MaxMessageBytes: c.maxMsg, BootId: s.bootID,
	}
	s.conns[c] = struct{}{}
	s.mu.Unlock()
	s.conCount.Add(1)
	defer func() {
		s.mu.Lock()
		delete(s.conns, c)
		s.mu.Unlock()
	}()
	c.send(&aciv1.ServerMessage{Id: first.GetId(), Reply: &aciv1.ServerMessage_Hello{Hello: hello}})

	// One executor runs requests in arrival order; the reader handles
	// cancels out of band so they can reach a running request.
	ctx, cancelAll := context.WithCancel(ctx)
	var wg sync.WaitGroup
	defer wg.Wait()
	defer cancelAll()
	wg.Add(1)
	go func() {
		defer wg.Done()
		for j := range c.work {
			reply := s.handle(j.ctx, c, j.m)
			j.cancel()
			c.rmu.Lock()
			delete(c.running, j.m.GetId())
			c.rmu.Unlock()
			reply.Id = j.m.GetId()
			c.send(reply)
		}
	}()
	defer close(c.work)
	for {
		m, err := c.read()
		if err != nil {
			return
		}
		s.mu.Lock()
		s.requests = append(s.requests, m)
		s.mu.Unlock()
		if cr := m.GetCancel(); cr != nil {
			c.rmu.Lock()
			cancel, found := c.running[cr.GetTargetId()]
			c.rmu.Unlock()
			if found {
				cancel()
			}
			c.send(&aciv1.ServerMessage{Id: m.GetId(), Reply: &aciv1.ServerMessage_Cancel{Cancel: &aciv1.CancelResponse{Found: found}}})
			continue
		}
		jctx, jcancel := context.WithCancel(ctx)
		c.rmu.Lock()
		c.running[m.GetId()] = jcancel
		c.rmu.Unlock()
		c.work <- &job{m: m, ctx: jctx, cancel: jcancel}
	}
}

func errReply(id uint64, code aciv1.ErrorCode, field, format string, args ...any) *aciv1.ServerMessage {
	return &aciv1.ServerMessage{Id: id, Reply: &aciv1.ServerMessage_Error{Error: &aciv1.Error{
		Code: code, Message: fmt.Sprintf(format, args...), Field: field,
	}}}
}

func (s *Server) readyState() *aciv1.ReadyResponse {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.ready {
		return &aciv1.ReadyResponse{XUp: true}
	}
	return &aciv1.ReadyResponse{Ready: true, XUp: true, WmUp: true, RootPainted: true, XUpMs: 10, WmUpMs: 20, PaintedMs: 30}
}

func (s *Server) screenshot(ctx context.Context, req *aciv1.ScreenshotRequest, dedup bool) (*aciv1.ScreenshotResponse, *aciv1.Error) {
	if q := req.GetQuality(); q > 100 {
		return nil, &aciv1.Error{Code: aciv1.ErrorCode_ERROR_CODE_INVALID_ARGUMENT, Field: "quality", Message: "quality must be 1..100"}
	}
	if req.GetSettleMs() > 0 {
		select {
		case <-time.After(time.Duration(req.GetSettleMs()) * time.Millisecond):
		case <-ctx.Done():
			return nil, &aciv1.Error{Code: aciv1.ErrorCode_ERROR_CODE_CANCELED, Message: "canceled"}
		}
	}
	s.mu.Lock()
	frame, hash, w, h := s.frame, s.frameHash, s.width, s.height
	s.mu.Unlock()
	format := req.GetFormat()
	if format == aciv1.ImageFormat_IMAGE_FORMAT_UNSPECIFIED {
		format = aciv1.ImageFormat_IMAGE_FORMAT_PNG
	}
	r := &aciv1.ScreenshotResponse{Format: format, Width: w, Height: h, FrameHash: hash,
		Region: &aciv1.Rect{Width: int32(w), Height: int32(h)}, CapturedAtNs: uint64(time.Now().UnixNano())}
	switch {
	case format == aciv1.ImageFormat_IMAGE_FORMAT_NONE:
	case dedup && bytes.Equal(req.GetIfNoneMatch(), hash):
		r.NotModified = true
		s.notModified.Add(1)
	default:
		r.Data = frame
		s.fullFrames.Add(1)
	}
	return r, nil
}

func ok(r *aciv1.ServerMessage) *aciv1.ServerMessage { return r }

func (s *Server) hasCap(name string) bool {
	caps := s.Capabilities
	if caps == nil {
		caps = DefaultCapabilities
	}
	for _, c := range caps {
		if c == name {
			return true
		}
	}
	return false
}

func (s *Server) handle(ctx context.Context, c *serverConn, m *aciv1.ClientMessage) *aciv1.ServerMessage {
	if s.Handle != nil {
		if r := s.Handle(ctx, m); r != nil {
			return r
		}
	}
	id := m.GetId()
	dedup := s.hasCap("dedup")
	switch req := m.GetRequest().(type) {
	case *aciv1.ClientMessage_Hello:
		return errReply(id, aciv1.ErrorCode_ERROR_CODE_FAILED_PRECONDITION, "hello", "hello already done")
	case *aciv1.ClientMessage_Ping:
		return ok(&aciv1.ServerMessage{Reply: &aciv1.ServerMessage_Ping{Ping: &aciv1.PingResponse{Payload: req.Ping.GetPayload()}}})
	case *aciv1.ClientMessage_Step:
		out := &aciv1.StepResponse{}
		failed := false
		for i, a := range req.Step.GetActions() {
			o := &aciv1.ActionOutcome{}
			switch {
			case failed && req.Step.GetStopOnError():
				o.Error = &aciv1.Error{Code: aciv1.ErrorCode_ERROR_CODE_CANCELED, Message: "an earlier action failed"}
			case a.GetKeyPress() != nil && a.GetKeyPress().GetKey() == "":
				o.Error = &aciv1.Error{Code: aciv1.ErrorCode_ERROR_CODE_INVALID_ARGUMENT, Message: "empty key",
					Field: fmt.Sprintf("step.actions[%d].key_press.key", i)}
				failed = true
			case a.GetWait() != nil:
				select {
				case <-time.After(time.Duration(a.GetWait().GetMilliseconds()) * time.Millisecond):
				case <-ctx.Done():
					s.canceled.Add(1)
					return errReply(id, aciv1.ErrorCode_ERROR_CODE_CANCELED, "", "step canceled")
				}
			default:
				s.applyAction(a)
			}
			out.Outcomes = append(out.Outcomes, o)
		}
		if obs := req.Step.GetObserve(); obs != nil {
			r, e := s.screenshot(ctx, obs, dedup)
			out.Observation, out.ObservationError = r, e
		}
		if obs := req.Step.GetObserveTree(); obs != nil {
			out.Tree, out.TreeError = s.a11yTree(obs, "step.observe_tree")
		}
		return ok(&aciv1.ServerMessage{Reply: &aciv1.ServerMessage_Step{Step: out}})
	case *aciv1.ClientMessage_Screenshot:
		r, e := s.screenshot(ctx, req.Screenshot, dedup)
		if e != nil {
			if e.GetCode() == aciv1.ErrorCode_ERROR_CODE_CANCELED {
				s.canceled.Add(1)
			}
			e.Field = strings.TrimPrefix("screenshot."+e.GetField(), ".")
			return &aciv1.ServerMessage{Reply: &aciv1.ServerMessage_Error{Error: e}}
		}
		return ok(&aciv1.ServerMessage{Reply: &aciv1.ServerMessage_Screenshot{Screenshot: r}})
	case *aciv1.ClientMessage_A11YTree:
		r, e := s.a11yTree(req.A11YTree, "a11y_tree")
		if e != nil {
			return &aciv1.ServerMessage{Reply: &aciv1.ServerMessage_Error{Error: e}}
		}
		return ok(&aciv1.ServerMessage{Reply: &aciv1.ServerMessage_A11YTree{A11YTree: r}})
	case *aciv1.ClientMessage_A11YAction:
		if e := s.a11yAction(req.A11YAction); e != nil {
			return &aciv1.ServerMessage{Reply: &aciv1.ServerMessage_Error{Error: e}}
		}
		return ok(&aciv1.ServerMessage{Reply: &aciv1.ServerMessage_A11YAction{A11YAction: &aciv1.A11YActionResponse{}}})
	case *aciv1.ClientMessage_Ready:
		return ok(&aciv1.ServerMessage{Reply: &aciv1.ServerMessage_Ready{Ready: s.readyState()}})
	case *aciv1.ClientMessage_CursorPosition:
		s.mu.Lock()
		p := proto.CloneOf(s.cursor)
		s.mu.Unlock()
		return ok(&aciv1.ServerMessage{Reply: &aciv1.ServerMessage_CursorPosition{CursorPosition: &aciv1.CursorPositionResponse{Position: p}}})
	case *aciv1.ClientMessage_ScreenSize:
		return ok(&aciv1.ServerMessage{Reply: &aciv1.ServerMessage_ScreenSize{ScreenSize: &aciv1.ScreenSizeResponse{Width: s.width, Height: s.height}}})
	case *aciv1.ClientMessage_ListWindows:
		return ok(&aciv1.ServerMessage{Reply: &aciv1.ServerMessage_ListWindows{ListWindows: &aciv1.ListWindowsResponse{Windows: []*aciv1.Window{
			{Id: 0x400001, Title: "xterm", Class: "XTerm", Instance: "xterm", Pid: 42, Focused: true,
				Geometry: &aciv1.Rect{X: 10, Y: 10, Width: 640, Height: 480}},
		}}}})
	case *aciv1.ClientMessage_WindowAction:
		if req.WindowAction.GetWindowId() != 0x400001 {
			return errReply(id, aciv1.ErrorCode_ERROR_CODE_NOT_FOUND, "window_action.window_id", "no window 0x%x", req.WindowAction.GetWindowId())
		}
		return ok(&aciv1.ServerMessage{Reply: &aciv1.ServerMessage_WindowAction{WindowAction: &aciv1.WindowActionResponse{}}})
	case *aciv1.ClientMessage_Launch:
		if len(req.Launch.GetArgv()) == 0 {
			return errReply(id, aciv1.ErrorCode_ERROR_CODE_INVALID_ARGUMENT, "launch.argv", "argv is empty")
		}
		return ok(&aciv1.ServerMessage{Reply: &aciv1.ServerMessage_Launch{Launch: &aciv1.LaunchResponse{Pid: 4242}}})
	case *aciv1.ClientMessage_ClipboardGet:
		s.mu.Lock()
		t := s.clipboard
		s.mu.Unlock()
		return ok(&aciv1.ServerMessage{Reply: &aciv1.ServerMessage_ClipboardGet{ClipboardGet: &aciv1.ClipboardGetResponse{Text: t}}})
	case *aciv1.ClientMessage_ClipboardSet:
		s.mu.Lock()
		s.clipboard = req.ClipboardSet.GetText()
		s.mu.Unlock()
		return ok(&aciv1.ServerMessage{Reply: &aciv1.ServerMessage_ClipboardSet{ClipboardSet: &aciv1.ClipboardSetResponse{}}})
	case *aciv1.ClientMessage_Exec:
		return s.exec(ctx, id, req.Exec)
	case *aciv1.ClientMessage_FilePut:
		return s.filePut(id, req.FilePut)
	case *aciv1.ClientMessage_FileGet:
		return s.fileGet(id, c, req.FileGet)
	case *aciv1.ClientMessage_FileStat:
		s.mu.Lock()
		b, found := s.files[req.FileStat.GetPath()]
		s.mu.Unlock()
		if !found {
			return errReply(id, aciv1.ErrorCode_ERROR_CODE_NOT_FOUND, "file_stat.path", "%s: no such file", req.FileStat.GetPath())
		}
		return ok(&aciv1.ServerMessage{Reply: &aciv1.ServerMessage_FileStat{FileStat: &aciv1.FileStatResponse{Info: &aciv1.FileInfo{
			Name: path.Base(req.FileStat.GetPath()), Size: uint64(len(b)), Mode: 0o644}}}})
	case *aciv1.ClientMessage_FileList:
		dir := strings.TrimSuffix(req.FileList.GetPath(), "/") + "/"
		var entries []*aciv1.FileInfo
		s.mu.Lock()
		for p, b := range s.files {
			if strings.HasPrefix(p, dir) && !strings.Contains(p[len(dir):], "/") {
				entries = append(entries, &aciv1.FileInfo{Name: p[len(dir):], Size: uint64(len(b)), Mode: 0o644})
			}
		}
		s.mu.Unlock()
		sort.Slice(entries, func(i, j int) bool { return entries[i].Name < entries[j].Name })
		return ok(&aciv1.ServerMessage{Reply: &aciv1.ServerMessage_FileList{FileList: &aciv1.FileListResponse{Entries: entries}}})
	case *aciv1.ClientMessage_FileMkdir:
		return ok(&aciv1.ServerMessage{Reply: &aciv1.ServerMessage_FileMkdir{FileMkdir: &aciv1.FileMkdirResponse{}}})
	case *aciv1.ClientMessage_FileDelete:
		s.mu.Lock()
		_, found := s.files[req.FileDelete.GetPath()]
		delete(s.files, req.FileDelete.GetPath())
		s.mu.Unlock()
		if !found {
			return errReply(id, aciv1.ErrorCode_ERROR_CODE_NOT_FOUND, "file_delete.path", "%s: no such file", req.FileDelete.GetPath())
		}
		return ok(&aciv1.ServerMessage{Reply: &aciv1.ServerMessage_FileDelete{FileDelete: &aciv1.FileDeleteResponse{}}})
	case *aciv1.ClientMessage_MemoryMark:
		s.mu.Lock()
		s.mark = append([]byte(nil), req.MemoryMark.GetValue()...)
		s.mu.Unlock()
		return ok(&aciv1.ServerMessage{Reply: &aciv1.ServerMessage_MemoryMark{MemoryMark: &aciv1.MemoryMarkResponse{}}})
	case *aciv1.ClientMessage_MemoryChallenge:
		s.mu.Lock()
		mark := s.mark
		s.mu.Unlock()
		if mark == nil {
			return errReply(id, aciv1.ErrorCode_ERROR_CODE_FAILED_PRECONDITION, "", "no memory mark set")
		}
		return ok(&aciv1.ServerMessage{Reply: &aciv1.ServerMessage_MemoryChallenge{MemoryChallenge: &aciv1.MemoryChallengeResponse{Mac: wire.ProofMAC(mark, req.MemoryChallenge.GetNonce())}}})
	case *aciv1.ClientMessage_Restored:
		if req.Restored.GetToken() == "" || req.Restored.GetAdminToken() == "" {
			return errReply(id, aciv1.ErrorCode_ERROR_CODE_INVALID_ARGUMENT, "restored.token", "both tokens are required")
		}
		s.mu.Lock()
		s.generation = req.Restored.GetGeneration()
		s.Token, s.AdminToken = req.Restored.GetToken(), req.Restored.GetAdminToken()
		s.mu.Unlock()
		return ok(&aciv1.ServerMessage{Reply: &aciv1.ServerMessage_Restored{Restored: &aciv1.RestoredResponse{}}})
	}
	return errReply(id, aciv1.ErrorCode_ERROR_CODE_UNIMPLEMENTED, "", "request %T not implemented by acitest", m.GetRequest())
}

func (s *Server) applyAction(a *aciv1.Action) {
	s.mu.Lock()
	defer s.mu.Unlock()
	switch {
	case a.GetMove() != nil:
		s.cursor = proto.CloneOf(a.GetMove().GetTo())
	case a.GetClick() != nil && a.GetClick().GetAt() != nil:
		s.cursor = proto.CloneOf(a.GetClick().GetAt())
	case a.GetDrag() != nil:
		s.cursor = proto.CloneOf(a.GetDrag().GetTo())
	}
}

// exec understands two commands: "echo args..." and "sleep <ms>".
func (s *Server) exec(ctx context.Context, id uint64, req *aciv1.ExecRequest) *aciv1.ServerMessage {
	argv := req.GetArgv()
	if len(argv) == 0 {
		return errReply(id, aciv1.ErrorCode_ERROR_CODE_INVALID_ARGUMENT, "exec.argv", "argv is empty")
	}
	start := time.Now()
	switch argv[0] {
	case "echo":
		return ok(&aciv1.ServerMessage{Reply: &aciv1.ServerMessage_Exec{Exec: &aciv1.ExecResponse{
			Stdout: []byte(strings.Join(argv[1:], " ") + "\n"), DurationNs: uint64(time.Since(start))}}})
	case "sleep":
		var ms int
		fmt.Sscanf(argv[len(argv)-1], "%d", &ms)
		select {
		case <-time.After(time.Duration(ms) * time.Millisecond):
			return ok(&aciv1.ServerMessage{Reply: &aciv1.ServerMessage_Exec{Exec: &aciv1.ExecResponse{DurationNs: uint64(time.Since(start))}}})
		case <-ctx.Done():
			s.canceled.Add(1)
			return errReply(id, aciv1.ErrorCode_ERROR_CODE_CANCELED, "", "exec canceled")
		}
	}
	return ok(&aciv1.ServerMessage{Reply: &aciv1.ServerMessage_Exec{Exec: &aciv1.ExecResponse{ExitCode: 127,
		Stderr: []byte(argv[0] + ": command not found\n")}}})
}

func (s *Server) filePut(id uint64, req *aciv1.FilePutRequest) *aciv1.ServerMessage {
	if req.GetPath() == "" || !strings.HasPrefix(req.GetPath(), "/") {
		return errReply(id, aciv1.ErrorCode_ERROR_CODE_INVALID_ARGUMENT, "file_put.path", "path must be absolute")
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if req.GetUploadId() == "" {
		s.files[req.GetPath()] = append([]byte(nil), req.GetData()...)
		return ok(&aciv1.ServerMessage{Reply: &aciv1.ServerMessage_FilePut{FilePut: &aciv1.FilePutResponse{Size: uint64(len(req.GetData())), Published: true}}})
	}
	buf := s.uploads[req.GetUploadId()]
	if uint64(len(buf)) != req.GetOffset() {
		return errReply(id, aciv1.ErrorCode_ERROR_CODE_INVALID_ARGUMENT, "file_put.offset", "offset %d, have %d bytes", req.GetOffset(), len(buf))
	}
	buf = append(buf, req.GetData()...)
	if req.GetLast() {
		delete(s.uploads, req.GetUploadId())
		s.files[req.GetPath()] = buf
		return ok(&aciv1.ServerMessage{Reply: &aciv1.ServerMessage_FilePut{FilePut: &aciv1.FilePutResponse{Size: uint64(len(buf)), Published: true}}})
	}
	s.uploads[req.GetUploadId()] = buf
	return ok(&aciv1.ServerMessage{Reply: &aciv1.ServerMessage_FilePut{FilePut: &aciv1.FilePutResponse{Size: uint64(len(buf))}}})
}

func (s *Server) fileGet(id uint64, c *serverConn, req *aciv1.FileGetRequest) *aciv1.ServerMessage {
	s.mu.Lock()
	b, found := s.files[req.GetPath()]
	s.mu.Unlock()
	if !found {
		return errReply(id, aciv1.ErrorCode_ERROR_CODE_NOT_FOUND, "file_get.path", "%s: no such file", req.GetPath())
	}
	off := min(req.GetOffset(), uint64(len(b)))
	n := uint64(len(b)) - off
	if l := req.GetLength(); l > 0 && l < n {
		n = l
	}
	if lim := c.maxMsg / 2; n > lim {
		n = lim
	}
	return ok(&aciv1.ServerMessage{Reply: &aciv1.ServerMessage_FileGet{FileGet: &aciv1.FileGetResponse{
		Data: b[off : off+n], Size: uint64(len(b)), Eof: off+n == uint64(len(b))}}})
}
