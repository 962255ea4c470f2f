package gateway_test

import (
	"bytes"
	"context"
	"encoding/binary"
	"image"
	"image/png"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/coder/websocket"
	"go.uber.org/goleak"

	"github.com/forkfleet/forkfleet/api/aci/acitest"
	"github.com/forkfleet/forkfleet/api/errdefs"
	aciv1 "github.com/forkfleet/forkfleet/api/gen/forkfleet/aci/v1"
	"github.com/forkfleet/forkfleet/api/guestsock"
	"github.com/forkfleet/forkfleet/controld/internal/fleet"
	"github.com/forkfleet/forkfleet/controld/internal/gateway"
)

const viewSB = "sb-aaaaaaaaaaaaaaaa"

// viewRouter routes viewSB and redeems its tickets once, like fleet.Manager.
type viewRouter struct {
	router
	mu      sync.Mutex
	tickets map[string]fleet.ViewGrant
	deleted bool
	// checkpointing refuses routes as fleet.Manager does during a dump;
	// afterRoute runs after a successful Route, before it returns.
	checkpointing bool
	afterRoute    func()
	routes        int
}

func (r *viewRouter) Route(id string) (fleet.Route, error) {
	r.mu.Lock()
	r.routes++
	rt, err := r.router.Route(id)
	switch {
	case r.deleted:
		rt, err = fleet.Route{}, errdefs.ErrNotFound
	case r.checkpointing:
		rt, err = fleet.Route{Token: rt.Token}, errdefs.WithReason(errdefs.ErrUnavailable, "SANDBOX_CHECKPOINTING", "checkpointing")
	}
	after := r.afterRoute
	r.mu.Unlock()
	if err == nil && after != nil {
		after()
	}
	return rt, err
}

// beginCheckpointAfterNextRoute makes the next successful Route start a
// checkpoint just before it returns: the caller holds a route while the
// gateway's connections are dropped, the race the gateway must close.
func (f *viewFixture) beginCheckpointAfterNextRoute() {
	f.vr.mu.Lock()
	defer f.vr.mu.Unlock()
	f.vr.afterRoute = func() {
		f.vr.mu.Lock()
		f.vr.checkpointing, f.vr.afterRoute = true, nil
		f.vr.mu.Unlock()
		f.gw.DropSandbox(viewSB)
	}
}

func (f *viewFixture) routeCount() int {
	f.vr.mu.Lock()
	defer f.vr.mu.Unlock()
	return f.vr.routes
}

func (r *viewRouter) RedeemViewTicket(id, ticket string) (fleet.ViewGrant, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	g, ok := r.tickets[ticket]
	if !ok || g.Sandbox != id {
		return fleet.ViewGrant{}, errdefs.ErrPermissionDenied
	}
	delete(r.tickets, ticket)
	return g, nil
}

type viewFixture struct {
	gw    *gateway.Gateway
	guest *acitest.Server
	vr    *viewRouter
	base  string // http://127.0.0.1:port

	mu        sync.Mutex
	keyframes int // ScreencastKeyframe requests
}

func setupView(t *testing.T) *viewFixture {
	t.Helper()
	dir := t.TempDir()
	sock := filepath.Join(dir, "aci.sock")
	guest, err := acitest.NewUnixServer(sock)
	if err != nil {
		t.Fatal(err)
	}
	guest.Token = token
	addr, err := guestsock.Self(sock)
	if err != nil {
		t.Fatal(err)
	}
	f := &viewFixture{guest: guest}
	guest.Handle = func(ctx context.Context, m *aciv1.ClientMessage) *aciv1.ServerMessage {
		switch m.GetRequest().(type) {
		case *aciv1.ClientMessage_ScreencastStart:
			return &aciv1.ServerMessage{Id: m.GetId(), Reply: &aciv1.ServerMessage_ScreencastStart{ScreencastStart: &aciv1.ScreencastStartResponse{StreamId: 7}}}
		case *aciv1.ClientMessage_ScreencastKeyframe:
			f.mu.Lock()
			f.keyframes++
			f.mu.Unlock()
			return &aciv1.ServerMessage{Id: m.GetId(), Reply: &aciv1.ServerMessage_ScreencastKeyframe{ScreencastKeyframe: &aciv1.ScreencastKeyframeResponse{}}}
		}
		return nil
	}
	f.vr = &viewRouter{router: router{viewSB: {Route: fleet.Route{Token: token, ACISocket: addr}}}, tickets: map[string]fleet.ViewGrant{
		"control-1": {Sandbox: viewSB, Control: true}, "control-2": {Sandbox: viewSB, Control: true},
		"watch-1": {Sandbox: viewSB}, "watch-2": {Sandbox: viewSB},
	}}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	f.gw = gateway.New(f.vr, gateway.Options{})
	srv := gateway.NewServer(f.gw)
	go srv.Serve(ln)
	f.base = "http://" + ln.Addr().String()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		srv.Shutdown(ctx)
		guest.Close()
	})
	return f
}

var noRedirect = &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}

func get(t *testing.T, url, cookie string) (*http.Response, string) {
	t.Helper()
	req, _ := http.NewRequest(http.MethodGet, url, nil)
	if cookie != "" {
		req.Header.Set("Cookie", cookie)
	}
	resp, err := noRedirect.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp, string(b)
}

// redeem exchanges a ticket for the view cookie.
func (f *viewFixture) redeem(t *testing.T, ticket string) string {
	t.Helper()
	resp, _ := get(t, f.base+"/v1/sandboxes/"+viewSB+"/view?ticket="+ticket, "")
	if resp.StatusCode != http.StatusSeeOther || resp.Header.Get("Location") != "/v1/sandboxes/"+viewSB+"/view" {
		t.Fatalf("redeem %s: %d %q", ticket, resp.StatusCode, resp.Header.Get("Location"))
	}
	cs := resp.Cookies()
	if len(cs) != 1 || !cs[0].HttpOnly || cs[0].SameSite != http.SameSiteStrictMode || cs[0].Path != "/v1/sandboxes/"+viewSB+"/view" {
		t.Fatalf("view cookie: %+v", cs)
	}
	return cs[0].Name + "=" + cs[0].Value
}

func TestViewTickets(t *testing.T) {
	f := setupView(t)
	view := f.base + "/v1/sandboxes/" + viewSB + "/view"
	cookie := f.redeem(t, "watch-1")

	// Spent, made up, another sandbox's: the same 401, known sandbox or not.
	denied, deniedBody := get(t, view+"?ticket=watch-1", "")
	for _, u := range []string{view + "?ticket=nope", f.base + "/v1/sandboxes/sb-bbbbbbbbbbbbbbbb/view?ticket=watch-2", view, view + "/stream"} {
		resp, body := get(t, u, "")
		if resp.StatusCode != http.StatusUnauthorized || body != deniedBody || denied.StatusCode != http.StatusUnauthorized {
			t.Fatalf("%s: %d %q, want the same 401 as a spent ticket (%d %q)", u, resp.StatusCode, body, denied.StatusCode, deniedBody)
		}
	}
	// The cookie opens its sandbox's page only.
	resp, body := get(t, view, cookie)
	if resp.StatusCode != http.StatusOK || !strings.Contains(body, "/v1/view.js") || !strings.Contains(resp.Header.Get("Content-Security-Policy"), "default-src 'none'") {
		t.Fatalf("page: %d %v %.100q", resp.StatusCode, resp.Header, body)
	}
	if resp, _ := get(t, f.base+"/v1/sandboxes/sb-bbbbbbbbbbbbbbbb/view", cookie); resp.StatusCode != http.StatusUnauthorized {
		t.Fatalf("a cookie on another sandbox: %d", resp.StatusCode)
	}
	if resp, body := get(t, f.base+"/v1/view.js", ""); resp.StatusCode != http.StatusOK || !strings.Contains(body, "DecompressionStream") {
		t.Fatalf("view.js: %d", resp.StatusCode)
	}
}

func randomPNG(t testing.TB, w, h int, seed uint64) []byte {
	img := image.NewNRGBA(image.Rect(0, 0, w, h))
	r := rand.New(rand.NewPCG(seed, 1))
	for i := range img.Pix {
		img.Pix[i] = byte(r.Uint32())
		if i%4 == 3 {
			img.Pix[i] = 0xff
		}
	}
	var b bytes.Buffer
	if err := png.Encode(&b, img); err != nil {
		t.Fatal(err)
	}
	return b.Bytes()
}

func frame(seq uint64, key bool, x, y, w, h int, data []byte) *aciv1.Event {
	f := &aciv1.ScreencastFrame{StreamId: 7, Seq: seq, Keyframe: key, Format: aciv1.ImageFormat_IMAGE_FORMAT_PNG,
		Tiles: []*aciv1.Tile{{Rect: &aciv1.Rect{X: int32(x), Y: int32(y), Width: int32(w), Height: int32(h)}, Data: data}}}
	if key {
		f.Width, f.Height = 512, 512
	}
	return &aciv1.Event{Event: &aciv1.Event_Frame{Frame: f}}
}

type viewConn struct {
	t *testing.T
	c *websocket.Conn
}

func (f *viewFixture) dial(t *testing.T, ticket string) *viewConn {
	t.Helper()
	cookie := f.redeem(t, ticket)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	c, _, err := websocket.Dial(ctx, "ws"+strings.TrimPrefix(f.base, "http")+"/v1/sandboxes/"+viewSB+"/view/stream",
		&websocket.DialOptions{HTTPHeader: http.Header{"Cookie": {cookie}}})
	if err != nil {
		t.Fatal(err)
	}
	c.SetReadLimit(8 << 20)
	t.Cleanup(func() { c.CloseNow() })
	return &viewConn{t: t, c: c}
}

// next reads messages until one of kind.
func (v *viewConn) next(kind byte) []byte {
	v.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for {
		_, m, err := v.c.Read(ctx)
		if err != nil {
			v.t.Fatalf("read: %v", err)
		}
		if m[0] == kind {
			return m
		}
	}
}

func isKeyframe(m []byte) bool { return m[0] == 1 && m[1]&1 == 1 }

// TestViewStream: viewers share one screencast, the frames they get passed
// the compositor's checks, a stalled viewer neither slows the others nor
// queues without bound (it resyncs from a keyframe), and only a control
// viewer's input reaches the sandbox.
func TestViewStream(t *testing.T) {
	// Registered first, so it runs after the fixture's cleanups.
	t.Cleanup(func() { goleak.VerifyNone(t) })
	f := setupView(t)
	a := f.dial(t, "control-1")
	if h := a.next(3); h[1] != 1 {
		t.Fatalf("hello %v: want control", h)
	}
	// Wait for the hub's screencast, then push a keyframe.
	waitFor(t, func() bool { return startedScreencast(f.guest) })
	key := randomPNG(t, 512, 512, 1)
	f.guest.Push(frame(1, true, 0, 0, 512, 512, key))
	m := a.next(1)
	if !isKeyframe(m) || binary.LittleEndian.Uint16(m[4:]) != 512 || binary.LittleEndian.Uint16(m[6:]) != 512 {
		t.Fatalf("first frame %v", m[:10])
	}
	// A tile outside the frame never reaches a browser; a keyframe is asked for.
	f.guest.Push(frame(2, false, 500, 500, 64, 64, randomPNG(t, 64, 64, 2)))
	waitFor(t, func() bool { f.mu.Lock(); defer f.mu.Unlock(); return f.keyframes == 1 })
	f.guest.Push(frame(3, true, 0, 0, 512, 512, key))
	if m := a.next(1); !isKeyframe(m) {
		t.Fatal("the corrupt delta was forwarded")
	}
	// A late viewer starts from the keyframe.
	b := f.dial(t, "watch-1")
	if h := b.next(3); h[1] != 0 {
		t.Fatalf("hello %v: want view-only", h)
	}
	if m := b.next(1); !isKeyframe(m) {
		t.Fatal("a late viewer's first frame is not a keyframe")
	}
	// c stalls: 40 deltas of 0.8 MB (past its queue, the history and the
	// socket buffers) reach a, which reads, in full and in order.
	c := f.dial(t, "watch-2")
	c.next(3)
	if m := c.next(1); !isKeyframe(m) {
		t.Fatal("a late viewer's first frame is not a keyframe")
	}
	const n = 40
	tiles := make([][]byte, 4)
	for i := range tiles {
		tiles[i] = randomPNG(t, 512, 512, uint64(10+i))
	}
	// Each delta is pushed when a has the previous one: a keeps up (so
	// its queue never fills), c reads nothing.
	for i := range n {
		f.guest.Push(frame(uint64(4+i), false, 0, 0, 512, 512, tiles[i%len(tiles)]))
		m := a.next(1)
		if isKeyframe(m) || !bytes.Equal(m[22:], tiles[i%len(tiles)]) {
			t.Fatalf("delta %d: a viewer that reads lost frames while another stalled", i)
		}
	}
	// The history overflowed: the hub asked for a keyframe; c, reading at
	// last, gets what its socket held, then resyncs from that keyframe.
	waitFor(t, func() bool { f.mu.Lock(); defer f.mu.Unlock(); return f.keyframes == 2 })
	f.guest.Push(frame(4+n, true, 0, 0, 512, 512, key))
	got := 0
	for {
		m := c.next(1)
		if isKeyframe(m) {
			break
		}
		got++
	}
	if got >= n {
		t.Fatalf("the stalled viewer got all %d deltas: its queue is not bounded", got)
	}
	t.Logf("the stalled viewer got %d of %d deltas, then the keyframe", got, n)

	// Input: a control viewer's reaches guestd as a step; a view-only
	// viewer's closes its connection (1008) and never arrives.
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := a.c.Write(ctx, websocket.MessageText, []byte(`{"t":"text","text":"hello"}`)); err != nil {
		t.Fatal(err)
	}
	waitFor(t, func() bool { return typed(f.guest) == "hello" })
	if err := b.c.Write(ctx, websocket.MessageText, []byte(`{"t":"text","text":"leak"}`)); err != nil {
		t.Fatal(err)
	}
	_, _, err := b.c.Read(ctx)
	for err == nil {
		_, _, err = b.c.Read(ctx)
	}
	if websocket.CloseStatus(err) != websocket.StatusPolicyViolation {
		t.Fatalf("view-only input: %v, want 1008", err)
	}
	if got := typed(f.guest); got != "hello" {
		t.Fatalf("typed %q: a view-only viewer's input arrived", got)
	}
	// Malformed input closes a control viewer too.
	if err := a.c.Write(ctx, websocket.MessageText, []byte(`{"t":"key","keys":["a b"]}`)); err != nil {
		t.Fatal(err)
	}
	_, _, err = a.c.Read(ctx)
	for err == nil {
		_, _, err = a.c.Read(ctx)
	}
	if websocket.CloseStatus(err) != websocket.StatusUnsupportedData {
		t.Fatalf("malformed input: %v", err)
	}
}

func startedScreencast(s *acitest.Server) bool {
	for _, r := range s.Requests() {
		if r.GetScreencastStart() != nil {
			return true
		}
	}
	return false
}

func typed(s *acitest.Server) string {
	var out string
	for _, r := range s.Requests() {
		for _, a := range r.GetStep().GetActions() {
			out += a.GetTypeText().GetText()
		}
	}
	return out
}

func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("condition never met")
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// TestViewSandboxDeleted: a deleted sandbox's viewers are closed with 4404
// (the page stops reconnecting) instead of waiting for it forever.
func TestViewSandboxDeleted(t *testing.T) {
	f := setupView(t)
	v := f.dial(t, "watch-1")
	v.next(3)
	waitFor(t, func() bool { return startedScreencast(f.guest) })
	f.vr.mu.Lock()
	f.vr.deleted = true
	f.vr.mu.Unlock()
	f.gw.DropSandbox(viewSB) // as controld does before a checkpoint or a delete
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var err error
	for err == nil {
		_, _, err = v.c.Read(ctx)
	}
	if websocket.CloseStatus(err) != 4404 {
		t.Fatalf("viewer of a deleted sandbox: %v, want 4404", err)
	}
}

// TestViewSessionsSurviveRestart: a redeemed view cookie still opens the
// page after the gateway (controld) restarts; the file keeps its hash, not
// the cookie, and an expired session is not restored.
func TestViewSessionsSurviveRestart(t *testing.T) {
	f := setupView(t)
	path := filepath.Join(t.TempDir(), "view-sessions.json")
	serve := func() (string, func()) {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		srv := gateway.NewServer(gateway.New(f.vr, gateway.Options{ViewSessions: path}))
		go srv.Serve(ln)
		return "http://" + ln.Addr().String(), func() {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			srv.Shutdown(ctx)
		}
	}
	base, stop := serve()
	resp, _ := get(t, base+"/v1/sandboxes/"+viewSB+"/view?ticket=watch-1", "")
	if resp.StatusCode != http.StatusSeeOther || len(resp.Cookies()) != 1 {
		t.Fatalf("redeem: %d", resp.StatusCode)
	}
	c := resp.Cookies()[0]
	stop()
	b, err := os.ReadFile(path)
	if err != nil || strings.Contains(string(b), c.Value) || !strings.Contains(string(b), viewSB) {
		t.Fatalf("sessions file %q: %v", b, err)
	}
	base, stop = serve()
	if resp, _ := get(t, base+"/v1/sandboxes/"+viewSB+"/view", c.Name+"="+c.Value); resp.StatusCode != http.StatusOK {
		t.Fatalf("the cookie after a restart: %d", resp.StatusCode)
	}
	stop()
	// Expired meanwhile: not restored.
	expired := strings.Replace(string(b), `"expires":"`, `"expires":"2001`, 1)
	expired = expired[:strings.Index(expired, `"expires":"2001`)+len(`"expires":"2001`)] + `-01-01T00:00:00Z"}]`
	if err := os.WriteFile(path, []byte(expired), 0o600); err != nil {
		t.Fatal(err)
	}
	base, stop = serve()
	defer stop()
	if resp, _ := get(t, base+"/v1/sandboxes/"+viewSB+"/view", c.Name+"="+c.Value); resp.StatusCode != http.StatusUnauthorized {
		t.Fatalf("an expired cookie after a restart: %d", resp.StatusCode)
	}
}
