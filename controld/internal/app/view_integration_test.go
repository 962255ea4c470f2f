package app_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"image"
	"image/png"
	"net/http"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/coder/websocket"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/forkfleet/forkfleet/api/aci"
	controldv1 "github.com/forkfleet/forkfleet/api/gen/forkfleet/controld/v1"
)

// TestRealStackView: the live view in a real browser. Headless Chromium
// (Debian's, installed by `make test`), driven over the DevTools protocol,
// opens the view page of a sandbox on the real stack through controld's
// gateway on loopback:
//
//   - the canvas, read back, equals the sandbox's PNG screenshot pixel for
//     pixel;
//   - keys typed into the page of a control ticket reach the xterm's shell;
//   - a view-only ticket's page that sends input anyway is disconnected
//     (1008) and its input never arrives;
//   - a spent, an expired or another sandbox's ticket gets 401.
func TestRealStackView(t *testing.T) {
	browser := chromiumPath(t)
	s := newStackIn(t, "forkfleet-view-it")
	ctx := s.ctx
	s.launch(1)
	s.waitSlots(1)
	cr, err := s.sbc.CreateSandbox(ctx, &controldv1.CreateSandboxRequest{WaitReady: true})
	if err != nil {
		t.Fatal(err)
	}
	id := cr.Sandbox.Id
	t.Cleanup(func() { s.sbc.DeleteSandbox(context.Background(), &controldv1.DeleteSandboxRequest{Id: id}) })
	sess, err := aci.Dial(ctx, cr.Endpoint.Url, cr.Endpoint.Token)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sess.Close() })
	ticket := func(control bool, ttl time.Duration) *controldv1.CreateViewTicketResponse {
		t.Helper()
		req := &controldv1.CreateViewTicketRequest{SandboxId: id, Control: control}
		if ttl > 0 {
			req.Ttl = durationpb.New(ttl)
		}
		r, err := s.sbc.CreateViewTicket(ctx, req)
		if err != nil {
			t.Fatal(err)
		}
		return r
	}

	cdp := startChromium(t, ctx, browser)
	ctl := ticket(true, 0)
	page := cdp.open(ctl.Url)
	page.waitFor("window.forkfleetView && forkfleetView.connected && forkfleetView.keyframes > 0 && forkfleetView.control", 30*time.Second)
	if loc := page.eval("location.href"); strings.Contains(loc, "ticket") {
		t.Fatalf("the ticket stayed in the address bar: %s", loc)
	}

	// The canvas equals the screenshot (the screen is still: the xterm's
	// cursor does not blink); the page may be a frame behind, so retry.
	deadline := time.Now().Add(20 * time.Second)
	for {
		shot, err := sess.Screenshot(ctx, aci.PNG())
		if err != nil {
			t.Fatal(err)
		}
		want, err := png.Decode(bytes.NewReader(shot.Data))
		if err != nil {
			t.Fatal(err)
		}
		time.Sleep(300 * time.Millisecond)
		diff := compareCanvas(page.canvas(), want)
		if diff == "" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("canvas != screenshot: %s", diff)
		}
	}

	// Control: keys typed into the page reach the shell in the xterm.
	page.typeKeys("echo viewtyped > /tmp/viewtyped")
	page.key("Enter", 13)
	waitFile(t, ctx, sess, "/tmp/viewtyped", "viewtyped")

	// View only: the page sends nothing, and input sent anyway closes it.
	ro := cdp.open(ticket(false, 0).Url)
	ro.waitFor("window.forkfleetView && forkfleetView.keyframes > 0 && !forkfleetView.control", 30*time.Second)
	ro.typeKeys("echo x")
	ro.eval(`forkfleetView.socket.send(JSON.stringify({t: "text", text: "echo leaked > /tmp/leaked\n"})), "sent"`)
	ro.waitFor(`forkfleetView.closeCode === 1008 && forkfleetView.closeReason === "view-only ticket"`, 10*time.Second)
	time.Sleep(time.Second)
	if got := shell(t, ctx, sess, "cat /tmp/leaked 2>/dev/null || echo none"); got != "none" {
		t.Fatalf("a view-only ticket's input reached the sandbox: %q", got)
	}

	// Refusals: spent, expired, another sandbox's, made up: all 401.
	noRedirect := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	status := func(u string) int {
		t.Helper()
		resp, err := noRedirect.Get(u)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	if c := status(ctl.Url); c != http.StatusUnauthorized {
		t.Errorf("a spent ticket: %d, want 401", c)
	}
	short := ticket(false, time.Second)
	time.Sleep(1100 * time.Millisecond)
	if c := status(short.Url); c != http.StatusUnauthorized {
		t.Errorf("an expired ticket: %d, want 401", c)
	}
	other := ticket(false, 0)
	if c := status(strings.Replace(other.Url, id, "sb-0000000000000000", 1)); c != http.StatusUnauthorized {
		t.Errorf("another sandbox's ticket: %d, want 401", c)
	}
	if c := status(other.Url); c != http.StatusSeeOther {
		t.Errorf("a fresh ticket: %d, want 303 (tried on the wrong sandbox first, it is not spent)", c)
	}
	if c := status(strings.Split(other.Url, "?")[0]); c != http.StatusUnauthorized {
		t.Errorf("the page without a cookie: %d, want 401", c)
	}
}

func waitFile(t *testing.T, ctx context.Context, sess *aci.Session, file, want string) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		got := shell(t, ctx, sess, "cat "+file+" 2>/dev/null || true")
		if got == want {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s holds %q, want %q", file, got, want)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// compareCanvas returns "" when the canvas's RGB equals want's, else the
// first difference.
func compareCanvas(c canvasPixels, want image.Image) string {
	b := want.Bounds()
	if c.W != b.Dx() || c.H != b.Dy() {
		return fmt.Sprintf("canvas %dx%d, screenshot %v", c.W, c.H, b.Size())
	}
	n := 0
	first := ""
	for y := 0; y < c.H; y++ {
		for x := 0; x < c.W; x++ {
			r, g, bl, _ := want.At(b.Min.X+x, b.Min.Y+y).RGBA()
			p := c.Px[(y*c.W+x)*4:]
			if p[0] != byte(r>>8) || p[1] != byte(g>>8) || p[2] != byte(bl>>8) {
				if n == 0 {
					first = fmt.Sprintf("(%d,%d) canvas %v, screenshot %d,%d,%d", x, y, p[:3], r>>8, g>>8, bl>>8)
				}
				n++
			}
		}
	}
	if n == 0 {
		return ""
	}
	return fmt.Sprintf("%d pixels differ, first %s", n, first)
}

// chromiumPath finds Debian's chromium (make test installs it).
func chromiumPath(t *testing.T) string {
	for _, p := range []string{"/usr/bin/chromium", "/usr/lib/chromium/chromium"} {
		if _, err := os.Stat(p); err == nil {
			return p
		}
	}
	t.Fatal("chromium is not installed: run `make test` (deploy/host-setup.sh --packages chromium)")
	return ""
}

// cdpBrowser is a headless Chromium and its DevTools endpoint.
type cdpBrowser struct {
	t    *testing.T
	ctx  context.Context
	http string // 127.0.0.1:port
}

var devtoolsRE = regexp.MustCompile(`DevTools listening on ws://([0-9.]+:[0-9]+)/`)

func startChromium(t *testing.T, ctx context.Context, path string) *cdpBrowser {
	t.Helper()
	cmd := exec.CommandContext(ctx, path, "--headless=new", "--no-sandbox", "--disable-gpu", "--no-first-run",
		"--no-default-browser-check", "--disable-extensions", "--disable-background-networking",
		"--remote-debugging-address=127.0.0.1", "--remote-debugging-port=0", "--user-data-dir="+t.TempDir(),
		"--window-size=1600,1000", "about:blank")
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	addr := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			if m := devtoolsRE.FindStringSubmatch(sc.Text()); m != nil {
				select {
				case addr <- m[1]:
				default:
				}
			}
		}
	}()
	select {
	case a := <-addr:
		return &cdpBrowser{t: t, ctx: ctx, http: a}
	case <-time.After(30 * time.Second):
		t.Fatal("chromium printed no DevTools address")
	}
	return nil
}

// cdpPage is one tab, driven over its DevTools WebSocket.
type cdpPage struct {
	t   *testing.T
	ctx context.Context
	c   *websocket.Conn
	id  atomic.Int64
}

// open makes a new tab at url.
func (b *cdpBrowser) open(url string) *cdpPage {
	b.t.Helper()
	req, _ := http.NewRequestWithContext(b.ctx, http.MethodPut, "http://"+b.http+"/json/new?about:blank", nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		b.t.Fatal(err)
	}
	defer resp.Body.Close()
	var target struct {
		WebSocketDebuggerURL string `json:"webSocketDebuggerUrl"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&target); err != nil {
		b.t.Fatal(err)
	}
	c, _, err := websocket.Dial(b.ctx, target.WebSocketDebuggerURL, nil)
	if err != nil {
		b.t.Fatal(err)
	}
	c.SetReadLimit(256 << 20)
	b.t.Cleanup(func() { c.CloseNow() })
	p := &cdpPage{t: b.t, ctx: b.ctx, c: c}
	p.call("Page.navigate", map[string]any{"url": url}, nil)
	return p
}

// call sends one command and waits for its result (events are skipped).
func (p *cdpPage) call(method string, params any, result any) {
	p.t.Helper()
	id := p.id.Add(1)
	msg, _ := json.Marshal(map[string]any{"id": id, "method": method, "params": params})
	ctx, cancel := context.WithTimeout(p.ctx, 30*time.Second)
	defer cancel()
	if err := p.c.Write(ctx, websocket.MessageText, msg); err != nil {
		p.t.Fatalf("%s: %v", method, err)
	}
	for {
		_, data, err := p.c.Read(ctx)
		if err != nil {
			p.t.Fatalf("%s: %v", method, err)
		}
		var r struct {
			ID     int64           `json:"id"`
			Result json.RawMessage `json:"result"`
			Error  *struct {
				Message string `json:"message"`
			} `json:"error"`
		}
		if json.Unmarshal(data, &r) != nil || r.ID != id {
			continue
		}
		if r.Error != nil {
			p.t.Fatalf("%s: %s", method, r.Error.Message)
		}
		if result != nil {
			if err := json.Unmarshal(r.Result, result); err != nil {
				p.t.Fatalf("%s: %v", method, err)
			}
		}
		return
	}
}

// eval returns a JavaScript expression's value as a string.
func (p *cdpPage) eval(expr string) string {
	p.t.Helper()
	var r struct {
		Result struct {
			Value any `json:"value"`
		} `json:"result"`
		Exception *struct {
			Text string `json:"text"`
		} `json:"exceptionDetails"`
	}
	p.call("Runtime.evaluate", map[string]any{"expression": expr, "returnByValue": true, "awaitPromise": true}, &r)
	if r.Exception != nil {
		return "exception: " + r.Exception.Text
	}
	return fmt.Sprint(r.Result.Value)
}

func (p *cdpPage) waitFor(cond string, timeout time.Duration) {
	p.t.Helper()
	deadline := time.Now().Add(timeout)
	for p.eval("!!("+cond+")") != "true" {
		if time.Now().After(deadline) {
			p.t.Fatalf("page never got %s (state %s)", cond, p.eval("JSON.stringify(window.forkfleetView)"))
		}
		time.Sleep(50 * time.Millisecond)
	}
}

type canvasPixels struct {
	W, H int
	Px   []byte
}

func (p *cdpPage) canvas() canvasPixels {
	p.t.Helper()
	out := p.eval(`(() => {
		const c = document.getElementById("screen");
		const d = c.getContext("2d").getImageData(0, 0, c.width, c.height).data;
		let s = "";
		for (let i = 0; i < d.length; i += 0x8000) s += String.fromCharCode.apply(null, d.subarray(i, i + 0x8000));
		return JSON.stringify({w: c.width, h: c.height, px: btoa(s)});
	})()`)
	var v struct {
		W, H int
		Px   string
	}
	if err := json.Unmarshal([]byte(out), &v); err != nil {
		p.t.Fatalf("canvas: %v (%.200s)", err, out)
	}
	px, err := base64.StdEncoding.DecodeString(v.Px)
	if err != nil {
		p.t.Fatal(err)
	}
	return canvasPixels{W: v.W, H: v.H, Px: px}
}

// typeKeys presses a key per character, as a person at the page would.
func (p *cdpPage) typeKeys(text string) {
	p.t.Helper()
	for _, r := range text {
		k := string(r)
		p.call("Input.dispatchKeyEvent", map[string]any{"type": "keyDown", "key": k, "text": k}, nil)
		p.call("Input.dispatchKeyEvent", map[string]any{"type": "keyUp", "key": k}, nil)
	}
}

func (p *cdpPage) key(name string, code int) {
	p.t.Helper()
	p.call("Input.dispatchKeyEvent", map[string]any{"type": "rawKeyDown", "key": name, "code": name, "windowsVirtualKeyCode": code}, nil)
	p.call("Input.dispatchKeyEvent", map[string]any{"type": "keyUp", "key": name, "code": name, "windowsVirtualKeyCode": code}, nil)
}
