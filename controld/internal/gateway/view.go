package gateway

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	_ "embed"
	"encoding/hex"
	"encoding/json"
	"errors"
	"log/slog"
	"net/http"
	"os"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/coder/websocket"

	"github.com/forkfleet/forkfleet/api/aci"
	aciv1 "github.com/forkfleet/forkfleet/api/gen/forkfleet/aci/v1"
	"github.com/forkfleet/forkfleet/controld/internal/atomicfile"
	"github.com/forkfleet/forkfleet/controld/internal/fleet"
)

// The live view: /v1/sandboxes/{id}/view is a page (view.html, view.js)
// that draws the sandbox's screencast into a canvas and, with a control
// ticket, sends mouse and keyboard input.
//
// Access: a view ticket (CreateViewTicket: short-lived, single-use, one
// sandbox, watch or control) is redeemed by GET .../view?ticket=T for a
// cookie scoped to that sandbox's view path, and the browser is redirected
// to the same path without the ticket, so no credential stays in the
// address bar or history. The page and its WebSocket
// (.../view/stream) take the cookie only. Every refusal is the same 401,
// whether the sandbox exists or not.

// ViewRouter redeems view tickets (fleet.Manager implements it).
type ViewRouter interface {
	RedeemViewTicket(id, ticket string) (fleet.ViewGrant, error)
}

const (
	// ViewSessionLifetime is how long a redeemed ticket's cookie works.
	ViewSessionLifetime = time.Hour
	// MaxViewSessions bounds the cookies alive at once (a redeem past it
	// gets 429).
	MaxViewSessions = 4096
	viewCookie      = "forkfleet_view"
	// viewWriteTimeout closes a viewer whose browser stopped reading.
	viewWriteTimeout = 10 * time.Second
	// statusSandboxGone closes the viewers of a deleted sandbox (the page
	// then stops reconnecting).
	statusSandboxGone websocket.StatusCode = 4404
	// maxInput bounds one input message and its text.
	maxInput = 1024
)

//go:embed view.html
var viewHTML []byte

//go:embed view.js
var viewJS []byte

type viewSession struct {
	grant   fleet.ViewGrant
	expires time.Time
}

// viewSessions are the redeemed tickets' cookies, by their SHA-256. With a
// path they outlive a controld restart: the file holds each cookie's hash,
// grant and expiry (never the cookie), written whole on every redeem.
type viewSessions struct {
	mu   sync.Mutex
	m    map[[sha256.Size]byte]viewSession
	path string
	log  *slog.Logger
}

// persistedView is one line of the view sessions file.
type persistedView struct {
	SHA256  string    `json:"sha256"`
	Sandbox string    `json:"sandbox"`
	Control bool      `json:"control,omitempty"`
	Expires time.Time `json:"expires"`
}

// load reads the sessions file (a missing one is empty); sessions that
// expired meanwhile are dropped.
func (vs *viewSessions) load() error {
	vs.m = map[[sha256.Size]byte]viewSession{}
	b, err := os.ReadFile(vs.path)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	var ps []persistedView
	if err := json.Unmarshal(b, &ps); err != nil {
		return err
	}
	now := time.Now()
	for _, p := range ps {
		var k [sha256.Size]byte
		h, err := hex.DecodeString(p.SHA256)
		if err != nil || len(h) != len(k) || !now.Before(p.Expires) || len(vs.m) >= MaxViewSessions {
			continue
		}
		copy(k[:], h)
		vs.m[k] = viewSession{grant: fleet.ViewGrant{Sandbox: p.Sandbox, Control: p.Control}, expires: p.Expires}
	}
	return nil
}

// save writes the live sessions. vs.mu held.
func (vs *viewSessions) save(now time.Time) {
	if vs.path == "" {
		return
	}
	ps := make([]persistedView, 0, len(vs.m))
	for k, s := range vs.m {
		if now.Before(s.expires) {
			ps = append(ps, persistedView{SHA256: hex.EncodeToString(k[:]), Sandbox: s.grant.Sandbox, Control: s.grant.Control, Expires: s.expires})
		}
	}
	b, err := json.Marshal(ps)
	if err == nil {
		err = atomicfile.Write(vs.path, b, 0o600)
	}
	if err != nil && vs.log != nil {
		// The cookie works until controld restarts; it is lost then.
		vs.log.Warn("view: persisting view sessions", "path", vs.path, "err", err)
	}
}

func (vs *viewSessions) add(g fleet.ViewGrant) (string, bool) {
	now := time.Now()
	vs.mu.Lock()
	defer vs.mu.Unlock()
	if vs.m == nil {
		vs.m = map[[sha256.Size]byte]viewSession{}
	}
	if len(vs.m) >= MaxViewSessions {
		for k, s := range vs.m {
			if !now.Before(s.expires) {
				delete(vs.m, k)
			}
		}
		if len(vs.m) >= MaxViewSessions {
			return "", false
		}
	}
	c := rand.Text()
	vs.m[sha256.Sum256([]byte(c))] = viewSession{grant: g, expires: now.Add(ViewSessionLifetime)}
	vs.save(now)
	return c, true
}

// get returns the grant of a cookie for sandbox id.
func (vs *viewSessions) get(id, cookie string) (fleet.ViewGrant, bool) {
	k := sha256.Sum256([]byte(cookie))
	vs.mu.Lock()
	defer vs.mu.Unlock()
	s, ok := vs.m[k]
	if !ok || s.grant.Sandbox != id {
		return fleet.ViewGrant{}, false
	}
	if !time.Now().Before(s.expires) {
		delete(vs.m, k)
		return fleet.ViewGrant{}, false
	}
	return s.grant, true
}

func viewPath(id string) string { return "/v1/sandboxes/" + id + "/view" }

func (g *Gateway) viewDenied(w http.ResponseWriter) {
	http.Error(w, "missing, invalid or expired view ticket", http.StatusUnauthorized)
}

// viewGrant is the grant of the request's cookie.
func (g *Gateway) viewGrant(r *http.Request, id string) (fleet.ViewGrant, bool) {
	c, err := r.Cookie(viewCookie)
	if err != nil {
		return fleet.ViewGrant{}, false
	}
	return g.views.get(id, c.Value)
}

func securityHeaders(w http.ResponseWriter) {
	h := w.Header()
	h.Set("Cache-Control", "no-store")
	h.Set("Referrer-Policy", "no-referrer")
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("X-Frame-Options", "DENY")
	h.Set("Content-Security-Policy", "default-src 'none'; script-src 'self'; connect-src 'self'; style-src 'unsafe-inline'; img-src 'self' blob: data:; frame-ancestors 'none'")
}

// serveView redeems a ticket for a cookie, or serves the page to a cookie.
func (g *Gateway) serveView(vr ViewRouter) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		id := r.PathValue("id")
		securityHeaders(w)
		if ticket := r.URL.Query().Get("ticket"); ticket != "" {
			grant, err := vr.RedeemViewTicket(id, ticket)
			if err != nil {
				g.viewDenied(w)
				return
			}
			cookie, ok := g.views.add(grant)
			if !ok {
				w.Header().Set("Retry-After", "60")
				http.Error(w, "too many view sessions", http.StatusTooManyRequests)
				return
			}
			http.SetCookie(w, &http.Cookie{
				Name: viewCookie, Value: cookie, Path: viewPath(id), MaxAge: int(ViewSessionLifetime / time.Second),
				HttpOnly: true, Secure: g.opts.TLS != nil, SameSite: http.SameSiteStrictMode,
			})
			http.Redirect(w, r, viewPath(id), http.StatusSeeOther)
			return
		}
		if _, ok := g.viewGrant(r, id); !ok {
			g.viewDenied(w)
			return
		}
		w.Header().Set("Content-Type", "text/html; charset=utf-8")
		w.Write(viewHTML)
	}
}

func serveViewJS(w http.ResponseWriter, r *http.Request) {
	securityHeaders(w)
	w.Header().Set("Content-Type", "text/javascript; charset=utf-8")
	w.Write(viewJS)
}

// serveViewStream is the page's WebSocket: frames down, input up.
func (g *Gateway) serveViewStream(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	grant, ok := g.viewGrant(r, id)
	if !ok {
		g.viewDenied(w)
		return
	}
	if !g.reserveSession() {
		w.Header().Set("Retry-After", "1")
		http.Error(w, "the gateway holds its limit of sessions", http.StatusTooManyRequests)
		return
	}
	defer g.releaseSession()
	// websocket.Accept refuses a cross-origin upgrade (its Origin must be
	// the Host): another site's page cannot ride the viewer's cookie.
	c, err := websocket.Accept(w, r, nil)
	if err != nil {
		return
	}
	defer c.CloseNow()
	c.SetReadLimit(maxInput)
	ctx, cancel := context.WithCancel(r.Context())
	defer cancel()
	vc := &viewCloser{cancel: cancel}
	if !g.track("view:"+id, vc) { // Shutdown ends it; DropSandbox does not (viewers stay)
		return
	}
	// Shutdown waits for the viewer (and its hub) to be gone.
	g.wg.Add(1)
	defer g.wg.Done()
	defer g.untrack(vc)

	h, v := g.joinHub(id)
	defer h.leave(v)
	hello := []byte{msgHello, 0}
	if grant.Control {
		hello[1] = 1
	}
	if err := g.writeView(ctx, c, hello); err != nil {
		return
	}
	go func() {
		defer cancel()
		g.readInput(ctx, c, h, grant.Control)
	}()
	for {
		select {
		case <-ctx.Done():
			return
		case <-h.gone:
			c.Close(statusSandboxGone, "sandbox deleted")
			return
		case <-v.wake:
		}
		for _, m := range h.take(v) {
			if err := g.writeView(ctx, c, m); err != nil {
				return
			}
		}
	}
}

// viewCloser ends a viewer's connection (Shutdown).
type viewCloser struct{ cancel func() }

func (v *viewCloser) Close() error { v.cancel(); return nil }

func (g *Gateway) writeView(ctx context.Context, c *websocket.Conn, m []byte) error {
	ctx, cancel := context.WithTimeout(ctx, viewWriteTimeout)
	defer cancel()
	return c.Write(ctx, websocket.MessageBinary, m)
}

// inputMsg is one input event of a control viewer (view.js sends them).
type inputMsg struct {
	T    string   `json:"t"` // move, down, up, wheel, key, text
	X    int      `json:"x"`
	Y    int      `json:"y"`
	B    int      `json:"b"` // 1 left, 2 middle, 3 right
	DX   int      `json:"dx"`
	DY   int      `json:"dy"`
	Keys []string `json:"keys"`
	Text string   `json:"text"`
}

var errViewOnly = errors.New("view-only ticket")

// action turns an input message into ACI actions, refusing malformed ones.
func (m *inputMsg) actions() ([]*aciv1.Action, error) {
	const edge = 1 << 15
	if m.X < 0 || m.Y < 0 || m.X >= edge || m.Y >= edge {
		return nil, errors.New("position out of range")
	}
	button := func() (aciv1.MouseButton, error) {
		switch m.B {
		case 1:
			return aciv1.MouseButton_MOUSE_BUTTON_LEFT, nil
		case 2:
			return aciv1.MouseButton_MOUSE_BUTTON_MIDDLE, nil
		case 3:
			return aciv1.MouseButton_MOUSE_BUTTON_RIGHT, nil
		}
		return 0, errors.New("unknown button")
	}
	switch m.T {
	case "move":
		return []*aciv1.Action{aci.Move(m.X, m.Y)}, nil
	case "down", "up":
		b, err := button()
		if err != nil {
			return nil, err
		}
		if m.T == "down" {
			return []*aciv1.Action{aci.Move(m.X, m.Y), aci.ButtonDown(b)}, nil
		}
		return []*aciv1.Action{aci.Move(m.X, m.Y), aci.ButtonUp(b)}, nil
	case "wheel":
		if m.DX < -10 || m.DX > 10 || m.DY < -10 || m.DY > 10 {
			return nil, errors.New("scroll out of range")
		}
		return []*aciv1.Action{aci.Scroll(m.X, m.Y, m.DX, m.DY)}, nil
	case "key":
		if len(m.Keys) == 0 || len(m.Keys) > 4 {
			return nil, errors.New("1 to 4 keys")
		}
		for _, k := range m.Keys {
			if k == "" || len(k) > 32 || strings.ContainsFunc(k, func(r rune) bool { return r < 0x21 || r > 0x7e }) {
				return nil, errors.New("bad key name")
			}
		}
		return []*aciv1.Action{aci.Key(m.Keys...)}, nil
	case "text":
		if m.Text == "" || !utf8.ValidString(m.Text) {
			return nil, errors.New("bad text")
		}
		return []*aciv1.Action{aci.Type(m.Text)}, nil
	}
	return nil, errors.New("unknown input")
}

// readInput reads the viewer's messages until it leaves. A view-only
// viewer that sends anything is disconnected (1008); a control viewer's
// input runs on the hub's session, in order.
func (g *Gateway) readInput(ctx context.Context, c *websocket.Conn, h *hub, control bool) {
	for {
		_, data, err := c.Read(ctx)
		if err != nil {
			return
		}
		if !control {
			c.Close(websocket.StatusPolicyViolation, errViewOnly.Error())
			return
		}
		var m inputMsg
		if err := json.Unmarshal(data, &m); err != nil {
			c.Close(websocket.StatusUnsupportedData, "malformed input")
			return
		}
		acts, err := m.actions()
		if err != nil {
			c.Close(websocket.StatusUnsupportedData, err.Error())
			return
		}
		s := h.upstream()
		if s == nil {
			continue // between sessions (a checkpoint): input is dropped
		}
		sctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		sent := time.Now()
		resp, err := s.Step(sctx, acts, nil)
		cancel()
		if err != nil {
			g.log.Debug("view input", "sandbox", h.id, "err", err)
		}
		// A person's input is in the sandbox's recordings too.
		for _, sink := range h.sinkList() {
			sink.ViewStep(acts, sent, resp, err)
		}
	}
}
