package app_test

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"image"
	"image/png"
	"net/http"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/forkfleet/forkfleet/api/aci"
	"github.com/forkfleet/forkfleet/api/browsertest"
	aciv1 "github.com/forkfleet/forkfleet/api/gen/forkfleet/aci/v1"
	controldv1 "github.com/forkfleet/forkfleet/api/gen/forkfleet/controld/v1"
)

// TestRealStackView: the live view in a real browser. Headless Chromium
// (Debian's, installed by `make test`), driven over the DevTools protocol,
// opens the view page of a sandbox on the real stack through controld's
// gateway on loopback:
//
//   - the canvas, read back, equals the sandbox's PNG screenshot pixel for
//     pixel;
//   - the page follows the sandbox's pointer, and moves it (control);
//   - keys typed into the page of a control ticket reach the xterm's shell,
//     and again after a live checkpoint (the page stays, the view resumes
//     from a keyframe);
//   - a view-only ticket's page that sends input anyway is disconnected
//     (1008) and its input never arrives;
//   - a spent, an expired or another sandbox's ticket gets 401;
//   - deleting the sandbox closes its pages (4404).
func TestRealStackView(t *testing.T) {
	browser, err := browsertest.Path()
	if err != nil {
		t.Fatal(err)
	}
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

	cdp, err := browsertest.Start(ctx, browser)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cdp.Close() })
	ctl := ticket(true, 0)
	page, err := cdp.Open(ctx, ctl.Url)
	must(t, err)
	must(t, page.WaitFor(ctx, "window.forkfleetView && forkfleetView.connected && forkfleetView.keyframes > 0 && forkfleetView.control", 30*time.Second))
	if loc, err := page.Eval(ctx, "location.href"); err != nil || strings.Contains(loc, "ticket") {
		t.Fatalf("the ticket stayed in the address bar: %s %v", loc, err)
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
		diff := compareCanvas(readCanvas(t, ctx, page), want)
		if diff == "" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("canvas != screenshot: %s", diff)
		}
	}

	// The page follows the sandbox's pointer, and its own pointer moves it
	// (control).
	if _, err := sess.Step(ctx, []*aciv1.Action{aci.Move(123, 77)}, nil); err != nil {
		t.Fatal(err)
	}
	must(t, page.WaitFor(ctx, "forkfleetView.cursor && forkfleetView.cursor[0] === 123 && forkfleetView.cursor[1] === 77", 10*time.Second))
	rect, err := page.Eval(ctx, `(() => { const r = document.getElementById("screen").getBoundingClientRect(); return JSON.stringify([r.left, r.top, r.width / document.getElementById("screen").width]); })()`)
	must(t, err)
	var r [3]float64
	must(t, json.Unmarshal([]byte(rect), &r))
	must(t, page.Call(ctx, "Input.dispatchMouseEvent", map[string]any{"type": "mouseMoved", "x": r[0] + 200*r[2] + 0.5, "y": r[1] + 100*r[2] + 0.5}, nil))
	deadline = time.Now().Add(10 * time.Second)
	for {
		p, err := sess.CursorPosition(ctx)
		must(t, err)
		if p.X == 200 && p.Y == 100 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the page's pointer at (200,100) moved the sandbox's to (%d,%d)", p.X, p.Y)
		}
		time.Sleep(20 * time.Millisecond)
	}

	// Control: keys typed into the page reach the shell in the xterm.
	must(t, page.TypeKeys(ctx, "echo viewtyped > /tmp/viewtyped"))
	must(t, page.Key(ctx, "Enter", 13))
	waitFile(t, ctx, sess, "/tmp/viewtyped", "viewtyped")

	// A live checkpoint drops the gateway's session to guestd; the page
	// stays, the view comes back with a keyframe, and control works again.
	before, err := page.Eval(ctx, "forkfleetView.keyframes")
	must(t, err)
	ck, err := s.ckc.CreateCheckpoint(ctx, &controldv1.CreateCheckpointRequest{SandboxId: id})
	if err != nil {
		t.Fatalf("checkpoint: %v", err)
	}
	t.Cleanup(func() {
		s.ckc.DeleteCheckpoint(context.Background(), &controldv1.DeleteCheckpointRequest{Id: ck.Checkpoint.Id, Cascade: true})
	})
	must(t, page.WaitFor(ctx, "forkfleetView.keyframes > "+before, 30*time.Second))
	// The checkpoint closed this test's own session too.
	sess, err = aci.Dial(ctx, cr.Endpoint.Url, cr.Endpoint.Token)
	must(t, err)
	t.Cleanup(func() { sess.Close() })
	must(t, page.TypeKeys(ctx, "echo aftercheckpoint > /tmp/after"))
	must(t, page.Key(ctx, "Enter", 13))
	waitFile(t, ctx, sess, "/tmp/after", "aftercheckpoint")

	// View only: the page sends nothing, and input sent anyway closes it.
	ro, err := cdp.Open(ctx, ticket(false, 0).Url)
	must(t, err)
	must(t, ro.WaitFor(ctx, "window.forkfleetView && forkfleetView.keyframes > 0 && !forkfleetView.control", 30*time.Second))
	must(t, ro.TypeKeys(ctx, "echo x"))
	_, err = ro.Eval(ctx, `forkfleetView.socket.send(JSON.stringify({t: "text", text: "echo leaked > /tmp/leaked\n"})), "sent"`)
	must(t, err)
	must(t, ro.WaitFor(ctx, `forkfleetView.closeCode === 1008 && forkfleetView.closeReason === "view-only ticket"`, 10*time.Second))
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

	// Deleting the sandbox closes its viewers (4404), which stop reconnecting.
	if _, err := s.sbc.DeleteSandbox(ctx, &controldv1.DeleteSandboxRequest{Id: id}); err != nil {
		t.Fatal(err)
	}
	must(t, page.WaitFor(ctx, `forkfleetView.closeCode === 4404`, 30*time.Second))
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

type canvasPixels struct {
	W, H int
	Px   []byte
}

// readCanvas reads the view page's canvas back as RGBA.
func readCanvas(t *testing.T, ctx context.Context, p *browsertest.Page) canvasPixels {
	t.Helper()
	out, err := p.Eval(ctx, `(() => {
		const c = document.getElementById("screen");
		const d = c.getContext("2d").getImageData(0, 0, c.width, c.height).data;
		let s = "";
		for (let i = 0; i < d.length; i += 0x8000) s += String.fromCharCode.apply(null, d.subarray(i, i + 0x8000));
		return JSON.stringify({w: c.width, h: c.height, px: btoa(s)});
	})()`)
	if err != nil {
		t.Fatal(err)
	}
	var v struct {
		W, H int
		Px   string
	}
	if err := json.Unmarshal([]byte(out), &v); err != nil {
		t.Fatalf("canvas: %v (%.200s)", err, out)
	}
	px, err := base64.StdEncoding.DecodeString(v.Px)
	if err != nil {
		t.Fatal(err)
	}
	return canvasPixels{W: v.W, H: v.H, Px: px}
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}
