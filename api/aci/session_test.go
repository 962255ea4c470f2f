package aci_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/forkfleet/forkfleet/api/aci"
	"github.com/forkfleet/forkfleet/api/aci/acitest"
	"github.com/forkfleet/forkfleet/api/errdefs"
	aciv1 "github.com/forkfleet/forkfleet/api/gen/forkfleet/aci/v1"
)

// cleanups run once after all tests (the guestd build directory).
var cleanups []func()

func TestMain(m *testing.M) {
	if maybeRunPeer() {
		return
	}
	code := m.Run()
	for _, fn := range cleanups {
		fn()
	}
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintln(os.Stderr, "goleak:", err)
			code = 1
		}
	}
	os.Exit(code)
}

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func startServer(t *testing.T, configure func(*acitest.Server)) *acitest.Server {
	t.Helper()
	srv := acitest.NewServer()
	if configure != nil {
		configure(srv)
	}
	t.Cleanup(srv.Close)
	return srv
}

func dial(t *testing.T, srv *acitest.Server, opts ...aci.DialOption) *aci.Session {
	t.Helper()
	s, err := aci.Dial(ctxT(t), srv.URL(), srv.Token, opts...)
	if err != nil {
		t.Fatalf("Dial: %v", err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

func TestHandshake(t *testing.T) {
	srv := startServer(t, func(s *acitest.Server) {
		s.Token = "secret"
		s.SandboxID = "sb-1"
		s.SetGeneration(3)
	})
	s := dial(t, srv, aci.WithClientName("test"), aci.WithCapabilities("dedup", "exec"))
	w := s.Welcome()
	if w.GetProtocolVersion() != 1 || w.GetSandboxId() != "sb-1" || w.GetGeneration() != 3 || w.GetBootId() == "" {
		t.Fatalf("welcome = %v", w)
	}
	if w.GetScreen().GetWidth() != 1280 {
		t.Fatalf("screen = %v", w.GetScreen())
	}
	if !s.HasCapability("dedup") || !s.HasCapability("exec") {
		t.Error("dedup/exec should be negotiated")
	}
	if s.HasCapability("files") {
		t.Error("files was not offered by the client; it must not be in use")
	}
	hello := srv.Requests()[0].GetHello()
	if hello.GetClientName() != "test" || hello.GetProtocolVersion() != aci.ProtocolVersion {
		t.Errorf("hello = %v", hello)
	}
}

func TestDialErrors(t *testing.T) {
	srv := startServer(t, func(s *acitest.Server) { s.Token = "secret" })
	ctx := ctxT(t)
	_, err := aci.Dial(ctx, srv.URL(), "wrong")
	if !errors.Is(err, aci.ErrPermissionDenied) || !errors.Is(err, errdefs.ErrPermissionDenied) {
		t.Errorf("wrong token: err = %v, want ErrPermissionDenied", err)
	}
	if _, err := aci.Dial(ctx, "http//bad", "x"); err == nil {
		t.Error("bad URL accepted")
	}
	_, err = aci.Dial(ctx, "ws://127.0.0.1:1/aci", "x")
	if !errors.Is(err, aci.ErrUnavailable) {
		t.Errorf("refused: err = %v, want ErrUnavailable", err)
	}
}

func TestTypedMethods(t *testing.T) {
	srv := startServer(t, nil)
	s := dial(t, srv)
	ctx := ctxT(t)

	if p, err := s.Ping(ctx, []byte("x")); err != nil || string(p.GetPayload()) != "x" {
		t.Fatalf("Ping = %v, %v", p, err)
	}
	if _, err := s.RTT(ctx); err != nil {
		t.Fatal(err)
	}
	step, err := s.Step(ctx, []*aciv1.Action{aci.Click(10, 20), aci.Type("hi"), aci.Key("ctrl", "c"), aci.Key(""),
		aci.Scroll(1, 2, 0, 3), aci.Drag(1, 1, 50, 60, 4), aci.Move(7, 8), aci.Wait(time.Millisecond)}, aci.PNG())
	if err != nil {
		t.Fatal(err)
	}
	if len(step.GetOutcomes()) != 8 {
		t.Fatalf("outcomes = %d", len(step.GetOutcomes()))
	}
	if e := aci.FromProto(step.GetOutcomes()[3].GetError()); !errors.Is(e, aci.ErrInvalidArgument) {
		t.Errorf("outcome[3] = %v, want invalid argument", e)
	}
	if len(step.GetObservation().GetData()) == 0 {
		t.Error("no observation")
	}
	if p, err := s.CursorPosition(ctx); err != nil || p.GetX() != 7 || p.GetY() != 8 {
		t.Errorf("CursorPosition = %v, %v", p, err)
	}
	if sz, err := s.ScreenSize(ctx); err != nil || sz.GetHeight() != 800 {
		t.Errorf("ScreenSize = %v, %v", sz, err)
	}
	if r, err := s.Ready(ctx); err != nil || !r.GetReady() {
		t.Errorf("Ready = %v, %v", r, err)
	}
	wins, err := s.ListWindows(ctx)
	if err != nil || len(wins) != 1 {
		t.Fatalf("ListWindows = %v, %v", wins, err)
	}
	if err := s.WindowAction(ctx, &aciv1.WindowActionRequest{WindowId: wins[0].GetId(), Op: aciv1.WindowOp_WINDOW_OP_ACTIVATE}); err != nil {
		t.Error(err)
	}
	if pid, err := s.Launch(ctx, &aciv1.LaunchRequest{Argv: []string{"xterm"}}); err != nil || pid == 0 {
		t.Errorf("Launch = %d, %v", pid, err)
	}
	if err := s.ClipboardSet(ctx, "clip"); err != nil {
		t.Error(err)
	}
	if txt, err := s.ClipboardGet(ctx); err != nil || txt != "clip" {
		t.Errorf("ClipboardGet = %q, %v", txt, err)
	}
	if r, err := s.Run(ctx, "echo", "a", "b"); err != nil || string(r.GetStdout()) != "a b\n" {
		t.Errorf("Run = %v, %v", r, err)
	}
	if _, err := s.Exec(ctx, &aciv1.ExecRequest{}); !errors.Is(err, aci.ErrInvalidArgument) {
		t.Errorf("empty exec: %v", err)
	}
	if err := s.PutFile(ctx, "/tmp/a.txt", []byte("hello"), aci.FileMode(0o600)); err != nil {
		t.Fatal(err)
	}
	if b, err := s.GetFile(ctx, "/tmp/a.txt"); err != nil || string(b) != "hello" {
		t.Errorf("GetFile = %q, %v", b, err)
	}
	if fi, err := s.Stat(ctx, "/tmp/a.txt"); err != nil || fi.GetSize() != 5 {
		t.Errorf("Stat = %v, %v", fi, err)
	}
	if l, err := s.List(ctx, "/tmp"); err != nil || len(l) != 1 || l[0].GetName() != "a.txt" {
		t.Errorf("List = %v, %v", l, err)
	}
	if err := s.Mkdir(ctx, "/tmp/d", true, 0o755); err != nil {
		t.Error(err)
	}
	if err := s.Delete(ctx, "/tmp/a.txt", false); err != nil {
		t.Error(err)
	}
	if err := s.MemoryMark(ctx, []byte("k")); err != nil {
		t.Error(err)
	}
	if mac, err := s.MemoryChallenge(ctx, []byte("n")); err != nil || len(mac) != 32 {
		t.Errorf("MemoryChallenge = %x, %v", mac, err)
	}
	if found, err := s.Cancel(ctx, 999999); err != nil || found {
		t.Errorf("Cancel = %v, %v", found, err)
	}
	if _, err := s.Restored(ctx, &aciv1.RestoredRequest{SandboxId: "sb-2", Token: "t2", AdminToken: "a2", Generation: 5}); err != nil {
		t.Error(err)
	}
	if _, err := s.ScreencastStart(ctx, &aciv1.ScreencastStartRequest{}); !errors.Is(err, aci.ErrUnimplemented) {
		t.Errorf("screencast on a server without it: %v", err)
	}
}

func TestErrorMapping(t *testing.T) {
	srv := startServer(t, nil)
	s := dial(t, srv)
	ctx := ctxT(t)
	_, err := s.GetFile(ctx, "/nope")
	if !errors.Is(err, aci.ErrNotFound) || !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("err = %v, want not found", err)
	}
	var ae *aci.Error
	if !errors.As(err, &ae) || ae.Field != "file_get.path" || ae.Code != aciv1.ErrorCode_ERROR_CODE_NOT_FOUND {
		t.Fatalf("aci.Error = %+v", ae)
	}
	if aci.Code(err) != aciv1.ErrorCode_ERROR_CODE_NOT_FOUND {
		t.Errorf("Code = %v", aci.Code(err))
	}
	_, err = s.Screenshot(ctx, &aciv1.ScreenshotRequest{Format: aciv1.ImageFormat_IMAGE_FORMAT_JPEG, Quality: 200})
	if !errors.Is(err, aci.ErrInvalidArgument) || !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Errorf("quality 200: %v", err)
	}
	for code, want := range map[aciv1.ErrorCode]error{
		aciv1.ErrorCode_ERROR_CODE_TIMEOUT:             aci.ErrTimeout,
		aciv1.ErrorCode_ERROR_CODE_UNAVAILABLE:         errdefs.ErrUnavailable,
		aciv1.ErrorCode_ERROR_CODE_RESOURCE_EXHAUSTED:  errdefs.ErrResourceExhausted,
		aciv1.ErrorCode_ERROR_CODE_UNIMPLEMENTED:       aci.ErrUnimplemented,
		aciv1.ErrorCode_ERROR_CODE_CANCELED:            errdefs.ErrCanceled,
		aciv1.ErrorCode_ERROR_CODE_ALREADY_EXISTS:      errdefs.ErrAlreadyExists,
		aciv1.ErrorCode_ERROR_CODE_PERMISSION_DENIED:   errdefs.ErrPermissionDenied,
		aciv1.ErrorCode_ERROR_CODE_FAILED_PRECONDITION: errdefs.ErrFailedPrecondition,
		aciv1.ErrorCode_ERROR_CODE_INTERNAL:            errdefs.ErrInternal,
		aciv1.ErrorCode(99):                            errdefs.ErrInternal,
	} {
		if e := aci.FromProto(&aciv1.Error{Code: code, Message: "m"}); !errors.Is(e, want) {
			t.Errorf("%v: errors.Is(%v, %v) = false", code, e, want)
		}
	}
	if !errors.Is(aci.ErrConnectionLost, errdefs.ErrUnavailable) {
		t.Error("ErrConnectionLost should be an errdefs.ErrUnavailable")
	}
}

func TestPipelining(t *testing.T) {
	srv := startServer(t, nil)
	s := dial(t, srv)
	ctx := ctxT(t)
	// Many goroutines, each pipelining several calls before collecting.
	var wg sync.WaitGroup
	errs := make(chan error, 64)
	for g := range 32 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var calls []*aci.Call
			for i := range 8 {
				c, err := s.Start(ctx, &aciv1.ClientMessage{Request: &aciv1.ClientMessage_Ping{
					Ping: &aciv1.PingRequest{Payload: fmt.Appendf(nil, "%d/%d", g, i)}}})
				if err != nil {
					errs <- err
					return
				}
				calls = append(calls, c)
			}
			for i, c := range calls {
				m, err := c.Wait(ctx)
				if err != nil {
					errs <- err
					return
				}
				if got, want := string(m.GetPing().GetPayload()), fmt.Sprintf("%d/%d", g, i); got != want {
					errs <- fmt.Errorf("reply %q for request %q", got, want)
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	// The server saw the requests of one goroutine in its order.
	var last = map[int]int{}
	for _, m := range srv.Requests()[1:] {
		var g, i int
		fmt.Sscanf(string(m.GetPing().GetPayload()), "%d/%d", &g, &i)
		if prev, ok := last[g]; ok && i != prev+1 {
			t.Fatalf("goroutine %d: request %d after %d", g, i, prev)
		}
		last[g] = i
	}
}

func TestCancel(t *testing.T) {
	srv := startServer(t, nil)
	s := dial(t, srv)
	ctx := ctxT(t)

	cctx, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	defer cancel()
	start := time.Now()
	_, err := s.Exec(cctx, &aciv1.ExecRequest{Argv: []string{"sleep", "10000"}})
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("err = %v, want context.DeadlineExceeded", err)
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Fatalf("cancel took %v", d)
	}
	// The CancelRequest reaches the server, the exec stops, its late reply
	// is discarded, and the session keeps working.
	deadline := time.Now().Add(5 * time.Second)
	for srv.Canceled() == 0 && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	if srv.Canceled() != 1 {
		t.Fatalf("server canceled %d requests, want 1", srv.Canceled())
	}
	if _, err := s.Ping(ctx, nil); err != nil {
		t.Fatal(err)
	}
	// Already-canceled context: nothing is sent.
	dead, cancel2 := context.WithCancel(ctx)
	cancel2()
	n := len(srv.Requests())
	if _, err := s.Ping(dead, nil); !errors.Is(err, context.Canceled) {
		t.Fatalf("err = %v", err)
	}
	if len(srv.Requests()) != n {
		t.Error("a request was sent with a canceled context")
	}
}

func TestEvents(t *testing.T) {
	srv := startServer(t, nil)
	s := dial(t, srv, aci.WithEventBuffer(4))
	ctx := ctxT(t)

	evctx, cancel := context.WithCancel(ctx)
	events := s.Events(evctx)
	var got atomic.Int64
	stop := s.OnEvent(func(*aciv1.Event) { got.Add(1) })
	defer stop()
	for i := range 10 {
		srv.Push(&aciv1.Event{Event: &aciv1.Event_Cursor{Cursor: &aciv1.CursorEvent{Position: &aciv1.Point{X: int32(i)}}}})
	}
	// A round trip after the pushes: the reader has dispatched them all.
	if _, err := s.Ping(ctx, nil); err != nil {
		t.Fatal(err)
	}
	// The unread subscriber kept the newest 4 and dropped the oldest.
	var xs []int32
	for range 4 {
		xs = append(xs, (<-events).GetCursor().GetPosition().GetX())
	}
	if fmt.Sprint(xs) != "[6 7 8 9]" {
		t.Errorf("kept %v, want the newest [6 7 8 9]", xs)
	}
	if s.EventsDropped() < 6 {
		t.Errorf("dropped = %d, want >= 6", s.EventsDropped())
	}
	cancel()
	for range events { // closed after cancel
	}
	deadline := time.Now().Add(2 * time.Second)
	for got.Load() == 0 && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	if got.Load() == 0 {
		t.Error("OnEvent saw nothing")
	}
}

func TestWaitReadyUsesPushedEvent(t *testing.T) {
	srv := startServer(t, nil)
	srv.SetReady(false)
	s := dial(t, srv)
	ctx := ctxT(t)
	done := make(chan error, 1)
	go func() {
		r, err := s.WaitReady(ctx)
		if err == nil && !r.GetReady() {
			err = errors.New("not ready")
		}
		done <- err
	}()
	time.Sleep(30 * time.Millisecond) // the first poll says not ready
	before := len(srv.Requests())
	srv.SetReady(true) // pushes a ReadyEvent
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("WaitReady did not return after the ReadyEvent")
	}
	// Returned on the event, not on a later poll (the next poll is >= 50 ms away).
	if n := len(srv.Requests()) - before; n > 1 {
		t.Errorf("%d polls after the event", n)
	}
	// Canceled context.
	srv.SetReady(false)
	cctx, cancel := context.WithTimeout(ctx, 30*time.Millisecond)
	defer cancel()
	if _, err := s.WaitReady(cctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("err = %v", err)
	}
}

func TestReconnectAfterRestore(t *testing.T) {
	srv := startServer(t, nil)
	reconnected := make(chan uint64, 4)
	s := dial(t, srv, aci.WithReconnect(aci.Backoff{Initial: 5 * time.Millisecond, Max: 20 * time.Millisecond}),
		aci.WithOnReconnect(func(s *aci.Session) { reconnected <- s.Generation() }))
	ctx := ctxT(t)
	if s.Generation() != 0 {
		t.Fatal("fresh boot should be generation 0")
	}
	events := s.Events(ctx)

	inflight := make(chan error, 1)
	go func() {
		_, err := s.Exec(ctx, &aciv1.ExecRequest{Argv: []string{"sleep", "10000"}})
		inflight <- err
	}()
	time.Sleep(20 * time.Millisecond)
	srv.SetGeneration(1) // the "restore"
	srv.DropConnections()

	select {
	case err := <-inflight:
		if !errors.Is(err, aci.ErrConnectionLost) || !errors.Is(err, errdefs.ErrUnavailable) {
			t.Fatalf("in-flight call: %v, want ErrConnectionLost", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("in-flight call did not fail")
	}
	// Calls made now wait for the new connection.
	if _, err := s.Ping(ctx, nil); err != nil {
		t.Fatalf("after reconnect: %v", err)
	}
	if g := s.Generation(); g != 1 {
		t.Fatalf("generation = %d, want 1", g)
	}
	select {
	case g := <-reconnected:
		if g != 1 {
			t.Errorf("OnReconnect saw generation %d", g)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("OnReconnect not called")
	}
	// Subscriptions span connections.
	srv.SetReady(true)
	select {
	case ev := <-events:
		if ev.GetReady() == nil {
			t.Errorf("event = %v", ev)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("no event after reconnect")
	}
	if srv.Connections() != 2 {
		t.Errorf("connections = %d", srv.Connections())
	}
}

func TestNoReconnectFailsFast(t *testing.T) {
	srv := startServer(t, nil)
	s := dial(t, srv)
	ctx := ctxT(t)
	srv.DropConnections()
	var err error
	deadline := time.Now().Add(5 * time.Second)
	for time.Now().Before(deadline) {
		if _, err = s.Ping(ctx, nil); err != nil {
			break
		}
		time.Sleep(5 * time.Millisecond)
	}
	if !errors.Is(err, aci.ErrConnectionLost) {
		t.Fatalf("err = %v, want ErrConnectionLost", err)
	}
	srv.SetGeneration(7)
	if err := s.Reconnect(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Ping(ctx, nil); err != nil {
		t.Fatal(err)
	}
	if s.Generation() != 7 {
		t.Errorf("generation = %d", s.Generation())
	}
	s.Close()
	if _, err := s.Ping(ctx, nil); !errors.Is(err, aci.ErrClosed) {
		t.Errorf("after Close: %v", err)
	}
}

func TestReconnectGivesUp(t *testing.T) {
	srv := acitest.NewServer()
	s, err := aci.Dial(ctxT(t), srv.URL(), "", aci.WithReconnect(aci.Backoff{Initial: time.Millisecond, Max: 5 * time.Millisecond, MaxElapsed: 50 * time.Millisecond}))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	srv.Close()
	_, err = s.Ping(ctxT(t), nil)
	if !errors.Is(err, aci.ErrConnectionLost) {
		t.Fatalf("err = %v, want ErrConnectionLost once reconnection gave up", err)
	}
}

// fleet is N replicas (one fake guestd each) observed through one shared
// FrameCache.
type fleet struct {
	servers  []*acitest.Server
	sessions []*aci.Session
}

func newFleet(t *testing.T, n int, cache *aci.FrameCache, frame []byte) *fleet {
	f := &fleet{}
	for range n {
		srv := startServer(t, nil)
		srv.SetFrame(frame)
		f.servers = append(f.servers, srv)
		f.sessions = append(f.sessions, dial(t, srv, aci.WithFrameCache(cache)))
	}
	return f
}

func (f *fleet) full() (n uint64) {
	for _, s := range f.servers {
		n += s.FullFrames()
	}
	return n
}

// round observes every replica once, in order, and checks each got its
// replica's frame.
func (f *fleet) round(t *testing.T, ctx context.Context, frames func(i int) []byte) {
	t.Helper()
	for i, s := range f.sessions {
		r, err := s.Screenshot(ctx, aci.JPEG(80))
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(r.GetData(), frames(i)) {
			t.Fatalf("replica %d got the wrong frame (%d bytes)", i, len(r.GetData()))
		}
	}
}

func TestFrameCacheFleet(t *testing.T) {
	const n = 8
	ctx := ctxT(t)
	cache := aci.NewFrameCache(0)
	frameA := bytes.Repeat([]byte("frame-A"), 10000)
	f := newFleet(t, n, cache, frameA)
	all := func(b []byte) func(int) []byte { return func(int) []byte { return b } }

	f.round(t, ctx, all(frameA))
	if f.full() != 1 {
		t.Fatalf("first round: %d full frames, want 1", f.full())
	}
	st := cache.Stats()
	if st.Hits != n-1 || st.Misses != 1 || st.BytesSaved != uint64((n-1)*len(frameA)) {
		t.Fatalf("stats = %+v", st)
	}
	f.round(t, ctx, all(frameA))
	if f.full() != 1 {
		t.Fatalf("steady round transferred %d full frames", f.full()-1)
	}

	// The whole fleet moves to a new screen: the first replica pays, the
	// second confirms, the rest follow the fleet.
	frameB := bytes.Repeat([]byte("frame-B"), 10000)
	for _, srv := range f.servers {
		srv.SetFrame(frameB)
	}
	f.round(t, ctx, all(frameB))
	if got := f.full() - 1; got != 2 {
		t.Fatalf("fleet moved: %d full frames, want 2", got)
	}

	// Two replicas diverge: each pays one full frame, the clean ones keep
	// hitting, and the diverged ones re-converge on their own screens.
	diverged := func(i int) []byte {
		if i == 2 || i == 5 {
			return bytes.Repeat([]byte{byte('0' + i)}, 50000)
		}
		return frameB
	}
	f.servers[2].SetFrame(diverged(2))
	f.servers[5].SetFrame(diverged(5))
	before := f.full()
	f.round(t, ctx, diverged)
	if got := f.full() - before; got != 2 {
		t.Fatalf("2 of %d diverged: %d full frames, want 2", n, got)
	}
	before = f.full()
	f.round(t, ctx, diverged)
	if got := f.full() - before; got != 0 {
		t.Fatalf("after divergence: %d full frames, want 0", got)
	}

	// Step observations go through the cache too; a hit is marked.
	r, err := f.sessions[0].Step(ctx, []*aciv1.Action{aci.Move(1, 1)}, aci.JPEG(80))
	if err != nil {
		t.Fatal(err)
	}
	if !aci.FromCache(r.GetObservation()) || !bytes.Equal(r.GetObservation().GetData(), frameB) {
		t.Fatal("step observation was not served from the cache")
	}
	// A different request shape (PNG) does not reuse JPEG bytes.
	if r, err := f.sessions[1].Screenshot(ctx, aci.PNG()); err != nil || aci.FromCache(r) {
		t.Fatalf("PNG after JPEG: fromCache=%v err=%v", aci.FromCache(r), err)
	}
}

func TestFrameCacheConcurrentAndBounded(t *testing.T) {
	srv := startServer(t, nil)
	cache := aci.NewFrameCache(64 << 10)
	ctx := ctxT(t)
	var sessions []*aci.Session
	for range 4 {
		sessions = append(sessions, dial(t, srv, aci.WithFrameCache(cache)))
	}
	var wg sync.WaitGroup
	for i, s := range sessions {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for j := range 50 {
				if j%10 == 0 && i == 0 {
					srv.SetFrame(bytes.Repeat([]byte{byte(j)}, 20<<10))
				}
				r, err := s.Screenshot(ctx, aci.PNG())
				if err != nil {
					t.Error(err)
					return
				}
				if len(r.GetData()) != 20<<10 && len(r.GetData()) != 1024 {
					t.Error("empty frame")
					return
				}
			}
		}()
	}
	wg.Wait()
	st := cache.Stats()
	if st.Bytes > 64<<10 {
		t.Errorf("cache holds %d bytes, bound 64 KiB", st.Bytes)
	}
	if st.Hits == 0 {
		t.Errorf("no hits: %+v", st)
	}
}

func TestNoDedupCapability(t *testing.T) {
	srv := startServer(t, func(s *acitest.Server) { s.Capabilities = []string{"codec.png"} })
	cache := aci.NewFrameCache(0)
	s1 := dial(t, srv, aci.WithFrameCache(cache))
	s2 := dial(t, srv, aci.WithFrameCache(cache))
	ctx := ctxT(t)
	for _, s := range []*aci.Session{s1, s2, s1} {
		if _, err := s.Screenshot(ctx, aci.PNG()); err != nil {
			t.Fatal(err)
		}
	}
	for _, m := range srv.Requests() {
		if len(m.GetScreenshot().GetIfNoneMatch()) > 0 {
			t.Fatal("if_none_match sent to a server without dedup")
		}
	}
	if srv.FullFrames() != 3 {
		t.Errorf("full frames = %d", srv.FullFrames())
	}
}

func TestChunkedFiles(t *testing.T) {
	srv := startServer(t, func(s *acitest.Server) { s.MaxMessageBytes = 256 << 10 })
	s := dial(t, srv)
	ctx := ctxT(t)
	data := make([]byte, 1<<20+12345)
	for i := range data {
		data[i] = byte(i * 7)
	}
	if err := s.PutFile(ctx, "/data/big.bin", data, aci.MakeParents()); err != nil {
		t.Fatal(err)
	}
	chunks := 0
	for _, m := range srv.Requests() {
		if m.GetFilePut() != nil {
			chunks++
			if m.GetFilePut().GetUploadId() == "" {
				t.Fatal("a chunk without upload id")
			}
		}
	}
	if chunks < 5 {
		t.Errorf("%d chunks for 1 MiB with a 256 KiB message limit", chunks)
	}
	stored, _ := srv.File("/data/big.bin")
	if !bytes.Equal(stored, data) {
		t.Fatal("stored file differs")
	}
	got, err := s.GetFile(ctx, "/data/big.bin")
	if err != nil || !bytes.Equal(got, data) {
		t.Fatalf("GetFile: %d bytes, %v", len(got), err)
	}
	// Over the limit in one message: refused client-side, clearly.
	err = s.PutFile(ctx, "/data/x", make([]byte, 300<<10), aci.ChunkSize(300<<10))
	if err != nil {
		t.Fatalf("ChunkSize is bounded by the server limit, got %v", err)
	}
	if err := s.PutFile(ctx, "relative", []byte("x")); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Errorf("relative path: %v", err)
	}
}

func TestJSONSubprotocol(t *testing.T) {
	srv := startServer(t, nil)
	s := dial(t, srv, aci.WithJSON(), aci.WithFrameCache(aci.NewFrameCache(0)))
	ctx := ctxT(t)
	r, err := s.Step(ctx, []*aciv1.Action{aci.Click(1, 2)}, aci.PNG())
	if err != nil || len(r.GetObservation().GetData()) == 0 {
		t.Fatalf("step over json: %v, %v", r, err)
	}
	if _, err := s.GetFile(ctx, "/none"); !errors.Is(err, aci.ErrNotFound) {
		t.Errorf("err = %v", err)
	}
	r2, err := s.Screenshot(ctx, aci.PNG())
	if err != nil || !aci.FromCache(r2) {
		t.Fatalf("dedup over json: fromCache=%v err=%v", aci.FromCache(r2), err)
	}
}

func TestDialUnix(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "aci.sock")
	srv, err := acitest.NewUnixServer(sock)
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	s, err := aci.DialUnix(ctxT(t), sock, "")
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if _, err := s.Ping(ctxT(t), nil); err != nil {
		t.Fatal(err)
	}
}

func TestCloseUnblocksCalls(t *testing.T) {
	srv := startServer(t, nil)
	s, err := aci.Dial(ctxT(t), srv.URL(), "")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() {
		_, err := s.Exec(context.Background(), &aciv1.ExecRequest{Argv: []string{"sleep", "10000"}})
		done <- err
	}()
	time.Sleep(20 * time.Millisecond)
	s.Close()
	select {
	case err := <-done:
		if !errors.Is(err, aci.ErrConnectionLost) && !errors.Is(err, aci.ErrClosed) {
			t.Errorf("err = %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Close did not unblock the call")
	}
}

// firstReads records what the server read first on each connection.
type firstReads struct {
	net.Listener
	mu    sync.Mutex
	reads [][]byte
}

func (l *firstReads) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return &firstRead{Conn: c, l: l}, nil
}

type firstRead struct {
	net.Conn
	l    *firstReads
	once sync.Once
}

func (c *firstRead) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	c.once.Do(func() {
		c.l.mu.Lock()
		c.l.reads = append(c.l.reads, bytes.Clone(p[:n]))
		c.l.mu.Unlock()
	})
	return n, err
}

// A local dial sends its Hello with the upgrade request (one round trip
// before the first request, not two) and still reports what a dial
// reports: a refused token, a server that never answers.
func TestDialUnixSendsHelloWithUpgrade(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "aci.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	rec := &firstReads{Listener: ln}
	srv := acitest.NewServer() // for its handler; its own TCP listener is not used
	srv.Token = "tok"
	hs := &http.Server{Handler: srv}
	go hs.Serve(rec)
	t.Cleanup(func() { hs.Close(); srv.Close() })

	for _, opts := range [][]aci.DialOption{nil, {aci.WithJSON()}} {
		s, err := aci.DialUnix(ctxT(t), sock, "tok", opts...)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := s.Ping(ctxT(t), []byte("p")); err != nil {
			t.Fatal(err)
		}
		if s.Welcome().GetProtocolVersion() == 0 {
			t.Error("no hello reply checked")
		}
		s.Close()
	}
	rec.mu.Lock()
	for i, r := range rec.reads {
		head, rest, ok := bytes.Cut(r, []byte("\r\n\r\n"))
		if !ok || len(rest) == 0 {
			t.Errorf("dial %d: the server's first read holds no hello behind the upgrade request: %q", i, head)
		}
	}
	rec.mu.Unlock()

	if _, err := aci.DialUnix(ctxT(t), sock, "wrong"); !errors.Is(err, aci.ErrPermissionDenied) {
		t.Errorf("wrong token: %v", err)
	}

	// A socket that accepts and never answers: the dial ends with its ctx.
	mute := filepath.Join(t.TempDir(), "mute.sock")
	ml, err := net.Listen("unix", mute)
	if err != nil {
		t.Fatal(err)
	}
	defer ml.Close()
	go func() {
		for {
			c, err := ml.Accept()
			if err != nil {
				return
			}
			defer c.Close()
		}
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	t0 := time.Now()
	if _, err := aci.DialUnix(ctx, mute, ""); err == nil {
		t.Fatal("dial of a mute socket succeeded")
	}
	if d := time.Since(t0); d > 5*time.Second {
		t.Errorf("dial of a mute socket took %v", d)
	}
}

// countClientFrames counts the masked WebSocket frames in b (what a client
// sends), up to the first incomplete one.
func countClientFrames(b []byte) int {
	n := 0
	for len(b) >= 2 {
		l, hdr := int(b[1]&0x7f), 2
		switch l {
		case 126:
			if len(b) < 4 {
				return n
			}
			l, hdr = int(b[2])<<8|int(b[3]), 4
		case 127:
			return n
		}
		hdr += 4 // mask key
		if len(b) < hdr+l {
			return n
		}
		b = b[hdr+l:]
		n++
	}
	return n
}

// WithPing: Dial pipelines a ping behind its Hello (on a local dial both
// ride with the upgrade request, in its first write) and returns once the
// ping's echo came back; over a URL too, and on the JSON subprotocol.
func TestDialWithPingPipelinesIt(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "aci.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	rec := &firstReads{Listener: ln}
	srv := acitest.NewServer()
	hs := &http.Server{Handler: srv}
	go hs.Serve(rec)
	t.Cleanup(func() { hs.Close(); srv.Close() })

	dials := []struct {
		name string
		dial func(opts ...aci.DialOption) (*aci.Session, error)
	}{
		{"unix", func(opts ...aci.DialOption) (*aci.Session, error) { return aci.DialUnix(ctxT(t), sock, "", opts...) }},
		{"url", func(opts ...aci.DialOption) (*aci.Session, error) { return aci.Dial(ctxT(t), srv.URL(), "", opts...) }},
	}
	for _, d := range dials {
		for _, opts := range [][]aci.DialOption{{aci.WithPing([]byte("first"))}, {aci.WithPing(nil), aci.WithJSON()}} {
			before := len(srv.Requests())
			s, err := d.dial(opts...)
			if err != nil {
				t.Fatalf("%s: %v", d.name, err)
			}
			reqs := srv.Requests()[before:]
			// Dial returned after the ping's reply: the server had it.
			if len(reqs) != 2 || reqs[0].GetHello() == nil || reqs[1].GetPing() == nil {
				t.Fatalf("%s: requests of the dial %v, want hello then ping", d.name, reqs)
			}
			if reqs[1].GetId() <= reqs[0].GetId() {
				t.Errorf("%s: ping id %d not after hello id %d", d.name, reqs[1].GetId(), reqs[0].GetId())
			}
			// The session goes on as usual: next ids, replies routed.
			if r, err := s.Ping(ctxT(t), []byte("second")); err != nil || string(r.GetPayload()) != "second" {
				t.Fatalf("%s: ping after the dial: %v %v", d.name, r, err)
			}
			s.Close()
		}
	}
	rec.mu.Lock()
	defer rec.mu.Unlock()
	if len(rec.reads) != 2 {
		t.Fatalf("%d unix connections, want 2", len(rec.reads))
	}
	for i, r := range rec.reads {
		_, rest, _ := bytes.Cut(r, []byte("\r\n\r\n"))
		if n := countClientFrames(rest); n != 2 {
			t.Errorf("unix dial %d: %d frames behind the upgrade request in the server's first read, want 2 (hello, ping)", i, n)
		}
	}
}
