//go:build linux

package guestd

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"image/png"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jezek/xgb"
	"github.com/jezek/xgb/xproto"

	aciclient "github.com/forkfleet/forkfleet/api/aci"
	"github.com/forkfleet/forkfleet/api/desktoptest"
	aciv1 "github.com/forkfleet/forkfleet/api/gen/forkfleet/aci/v1"
)

// The end-to-end tests run the real guestd binary as the session's init
// (supervising Xvfb and openbox on a private display) and talk to it over
// the real WebSocket. They need FORKFLEET_INTEGRATION=1.

const (
	e2eToken = "e2e-agent-token"
	e2eAdmin = "e2e-admin-token"
)

func needIntegration(t testing.TB) {
	t.Helper()
	if os.Getenv("FORKFLEET_INTEGRATION") != "1" {
		t.Skip("set FORKFLEET_INTEGRATION=1 to run against real Xvfb")
	}
	for _, p := range []string{"/usr/bin/Xvfb", "/usr/bin/openbox", "/usr/bin/xterm"} {
		if _, err := os.Stat(p); err != nil {
			t.Fatalf("FORKFLEET_INTEGRATION=1 but %s is missing", p)
		}
	}
}

// TestMain removes the guestd the tests built.
func TestMain(m *testing.M) {
	code := m.Run()
	desktoptest.RemoveBuilds()
	os.Exit(code)
}

// freeDisplay picks a display without a lock file.
func freeDisplay(t testing.TB) int {
	for n := 71; n < 96; n++ {
		if _, err := os.Stat(fmt.Sprintf("/tmp/.X%d-lock", n)); os.IsNotExist(err) {
			return n
		}
	}
	t.Fatal("no free X display in :71..:95")
	return 0
}

type guest struct {
	cmd     *exec.Cmd
	addr    string
	display string
	dir     string
	log     *bytes.Buffer
	exited  chan error
}

func startGuest(t testing.TB) *guest {
	t.Helper()
	return startGuestWith(t, nil, os.Environ())
}

// startGuestWith starts guestd with the test config as edited by edit and
// with environ as its environment (plus the tokens).
func startGuestWith(t testing.TB, edit func(cfg map[string]any), environ []string) *guest {
	t.Helper()
	needIntegration(t)
	bin := desktoptest.GuestdBinary(t)
	dir := t.TempDir()
	n := freeDisplay(t)
	display := ":" + strconv.Itoa(n)
	cfg := map[string]any{
		"display": display,
		"screen":  map[string]int{"width": 1024, "height": 768, "depth": 24},
		"listen":  map[string]string{"unix": filepath.Join(dir, "aci.sock"), "tcp": "127.0.0.1:0"},
		"xvfb": map[string]any{"name": "xvfb", "path": "/usr/bin/Xvfb",
			"args": []string{"-nolisten", "tcp", "+extension", "XTEST", "+extension", "DAMAGE", "+extension", "XFIXES"}},
		"window_manager": map[string]any{"name": "openbox", "path": "/usr/bin/openbox", "args": []string{}},
		"root_color":     "#2f3b4c",
		"apps":           []any{},
	}
	if edit != nil {
		edit(cfg)
	}
	b, _ := json.Marshal(cfg)
	cfgPath := filepath.Join(dir, "guestd.json")
	if err := os.WriteFile(cfgPath, b, 0o644); err != nil {
		t.Fatal(err)
	}
	g := &guest{display: display, dir: dir, log: &bytes.Buffer{}, exited: make(chan error, 1)}
	addrFile := filepath.Join(dir, "addr")
	g.cmd = exec.Command(bin, "--config", cfgPath, "--addr-file", addrFile, "--shutdown-grace", "2s")
	g.cmd.Env = append(environ, "FORKFLEET_ACI_TOKEN="+e2eToken, "FORKFLEET_ADMIN_TOKEN="+e2eAdmin, "FORKFLEET_SANDBOX_ID=sb-e2e")
	g.cmd.Stdout, g.cmd.Stderr = g.log, g.log
	if err := g.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { g.exited <- g.cmd.Wait() }()
	t.Cleanup(func() {
		select {
		case <-g.exited:
		default:
			g.cmd.Process.Signal(syscall.SIGTERM)
			select {
			case <-g.exited:
			case <-time.After(10 * time.Second):
				g.cmd.Process.Kill()
			}
		}
		if t.Failed() {
			t.Logf("guestd log:\n%s", g.log.String())
		}
	})
	deadline := time.Now().Add(10 * time.Second)
	for {
		if b, err := os.ReadFile(addrFile); err == nil && bytes.HasSuffix(b, []byte("\n")) {
			g.addr = strings.TrimSpace(string(b))
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("guestd did not listen:\n%s", g.log.String())
		}
		time.Sleep(5 * time.Millisecond)
	}
	return g
}

func (g *guest) client(t testing.TB) *aciclient.WireConn {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, _, err := aciclient.DialWire(ctx, "ws://"+g.addr+"/", e2eToken)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Conn.CloseNow() })
	if _, err := c.Hello(ctx, "events.ready", "codec.png", "dedup"); err != nil {
		t.Fatal(err)
	}
	if _, err := c.WaitReady(ctx); err != nil {
		t.Fatalf("no ReadyEvent: %v", err)
	}
	return c
}

func do(t testing.TB, c *aciclient.WireConn, m *aciv1.ClientMessage) *aciv1.ServerMessage {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	r, err := c.Call(ctx, m)
	if err != nil {
		t.Fatal(err)
	}
	if e := r.GetError(); e != nil {
		t.Fatalf("%v: error %v", m, e)
	}
	return r
}

func screenshot(req *aciv1.ScreenshotRequest) *aciv1.ClientMessage {
	return &aciv1.ClientMessage{Request: &aciv1.ClientMessage_Screenshot{Screenshot: req}}
}

// pattern is the color of pixel (x, y) of the test window, generation g.
func pattern(x, y, g int) (r, gg, b byte) {
	return byte(x*4 + g*17), byte(y*5 + g*3), byte((x ^ y) * 3)
}

// testWindow is an override-redirect window (the WM leaves it alone) that
// the test draws known pixels into with PutImage.
type testWindow struct {
	c    *xgb.Conn
	win  xproto.Window
	gc   xproto.Gcontext
	x, y int
	w, h int
}

func newTestWindow(t *testing.T, display string, x, y, w, h int) *testWindow {
	c, err := xgb.NewConnDisplay(display)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	scr := xproto.Setup(c).DefaultScreen(c)
	win, _ := xproto.NewWindowId(c)
	if err := xproto.CreateWindowChecked(c, scr.RootDepth, win, scr.Root, int16(x), int16(y), uint16(w), uint16(h), 0,
		xproto.WindowClassInputOutput, scr.RootVisual, xproto.CwBackPixel|xproto.CwOverrideRedirect, []uint32{0, 1}).Check(); err != nil {
		t.Fatal(err)
	}
	gc, _ := xproto.NewGcontextId(c)
	if err := xproto.CreateGCChecked(c, gc, xproto.Drawable(win), 0, nil).Check(); err != nil {
		t.Fatal(err)
	}
	if err := xproto.MapWindowChecked(c, win).Check(); err != nil {
		t.Fatal(err)
	}
	return &testWindow{c: c, win: win, gc: gc, x: x, y: y, w: w, h: h}
}

func (tw *testWindow) draw(t *testing.T, g int) {
	data := make([]byte, tw.w*tw.h*4)
	for y := 0; y < tw.h; y++ {
		for x := 0; x < tw.w; x++ {
			r, gg, b := pattern(x, y, g)
			o := (y*tw.w + x) * 4
			data[o], data[o+1], data[o+2] = b, gg, r
		}
	}
	if err := xproto.PutImageChecked(tw.c, xproto.ImageFormatZPixmap, xproto.Drawable(tw.win), tw.gc,
		uint16(tw.w), uint16(tw.h), 0, 0, 0, 24, data).Check(); err != nil {
		t.Fatal(err)
	}
}

func (tw *testWindow) verify(t *testing.T, s *aciv1.ScreenshotResponse, g int) {
	t.Helper()
	img, err := png.Decode(bytes.NewReader(s.GetData()))
	if err != nil {
		t.Fatal(err)
	}
	if b := img.Bounds(); b.Dx() != tw.w || b.Dy() != tw.h {
		t.Fatalf("image %v, want %dx%d", b, tw.w, tw.h)
	}
	bad := 0
	for y := 0; y < tw.h; y++ {
		for x := 0; x < tw.w; x++ {
			r, gg, b := pattern(x, y, g)
			cr, cg, cb, _ := img.At(x, y).RGBA()
			if byte(cr>>8) != r || byte(cg>>8) != gg || byte(cb>>8) != b {
				if bad < 5 {
					t.Errorf("pixel (%d,%d) = %02x%02x%02x, want %02x%02x%02x", x, y, cr>>8, cg>>8, cb>>8, r, gg, b)
				}
				bad++
			}
		}
	}
	if bad > 0 {
		t.Fatalf("%d of %d pixels differ", bad, tw.w*tw.h)
	}
}

func TestE2E(t *testing.T) {
	g := startGuest(t)

	t.Run("auth", func(t *testing.T) {
		for _, tok := range []string{"", "nope"} {
			_, resp, err := aciclient.DialWire(context.Background(), "ws://"+g.addr+"/", tok)
			if err == nil || resp == nil || resp.StatusCode != http.StatusUnauthorized {
				t.Fatalf("token %q: %v", tok, err)
			}
		}
	})

	c := g.client(t)

	t.Run("unix_socket", func(t *testing.T) {
		sock := filepath.Join(g.dir, "aci.sock")
		unix := func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", sock)
		}
		// The token never leaves the machine on a unix socket: plaintext is fine.
		uc, _, err := aciclient.DialWire(context.Background(), "ws://guestd/", e2eAdmin, aciclient.WithDialer(unix), aciclient.WithInsecure())
		if err != nil {
			t.Fatal(err)
		}
		defer uc.Conn.CloseNow()
		h, err := uc.Hello(context.Background())
		if err != nil || h.GetSandboxId() != "sb-e2e" || h.GetScreen().GetWidth() != 1024 {
			t.Fatalf("hello over unix socket: %v %v", h, err)
		}
	})

	t.Run("pixels_and_dedup", func(t *testing.T) {
		tw := newTestWindow(t, g.display, 100, 120, 64, 48)
		tw.draw(t, 0)
		region := &aciv1.Rect{X: 100, Y: 120, Width: 64, Height: 48}
		r := do(t, c, screenshot(&aciv1.ScreenshotRequest{Region: region}))
		tw.verify(t, r.GetScreenshot(), 0)
		hash := r.GetScreenshot().GetFrameHash()

		r = do(t, c, screenshot(&aciv1.ScreenshotRequest{Region: region, IfNoneMatch: hash}))
		if !r.GetScreenshot().GetNotModified() || len(r.GetScreenshot().GetData()) != 0 {
			t.Fatalf("want not_modified: %v", r)
		}
		tw.draw(t, 1)
		r = do(t, c, screenshot(&aciv1.ScreenshotRequest{Region: region, IfNoneMatch: hash, SettleMs: 20}))
		if r.GetScreenshot().GetNotModified() {
			t.Fatal("not_modified after a change")
		}
		tw.verify(t, r.GetScreenshot(), 1)

		// The painted root shows where no window is.
		r = do(t, c, screenshot(&aciv1.ScreenshotRequest{Region: &aciv1.Rect{X: 1000, Y: 740, Width: 4, Height: 4}}))
		img, err := png.Decode(bytes.NewReader(r.GetScreenshot().GetData()))
		if err != nil {
			t.Fatal(err)
		}
		if cr, cg, cb, _ := img.At(1, 1).RGBA(); cr>>8 != 0x2f || cg>>8 != 0x3b || cb>>8 != 0x4c {
			t.Fatalf("root pixel %02x%02x%02x, want 2f3b4c", cr>>8, cg>>8, cb>>8)
		}
	})

	t.Run("pointer", func(t *testing.T) {
		r := do(t, c, &aciv1.ClientMessage{Request: &aciv1.ClientMessage_Step{Step: &aciv1.StepRequest{
			Actions: []*aciv1.Action{{Action: &aciv1.Action_Move{Move: &aciv1.MoveAction{To: &aciv1.Point{X: 321, Y: 234}}}}},
			Observe: &aciv1.ScreenshotRequest{Format: aciv1.ImageFormat_IMAGE_FORMAT_NONE}}}})
		if e := r.GetStep().GetOutcomes()[0].GetError(); e != nil {
			t.Fatal(e)
		}
		xc, err := xgb.NewConnDisplay(g.display)
		if err != nil {
			t.Fatal(err)
		}
		defer xc.Close()
		q, err := xproto.QueryPointer(xc, xproto.Setup(xc).DefaultScreen(xc).Root).Reply()
		if err != nil || q.RootX != 321 || q.RootY != 234 {
			t.Fatalf("X pointer at %d,%d (%v)", q.RootX, q.RootY, err)
		}
		r = do(t, c, &aciv1.ClientMessage{Request: &aciv1.ClientMessage_CursorPosition{CursorPosition: &aciv1.CursorPositionRequest{}}})
		if p := r.GetCursorPosition().GetPosition(); p.GetX() != 321 || p.GetY() != 234 {
			t.Fatalf("cursor_position %v", p)
		}
	})

	t.Run("type_into_xterm", func(t *testing.T) {
		out := filepath.Join(g.dir, "typed.txt")
		text := "hello wörld ñ € 123"
		r := do(t, c, &aciv1.ClientMessage{Request: &aciv1.ClientMessage_Launch{Launch: &aciv1.LaunchRequest{
			Argv: []string{"xterm", "-u8", "-title", "e2e-typing", "-e", "sh", "-c", "stty -echo; cat > " + out},
			Env:  map[string]string{"LANG": "C.UTF-8", "LC_ALL": "C.UTF-8"}}}})
		pid := r.GetLaunch().GetPid()
		var win uint32
		deadline := time.Now().Add(10 * time.Second)
		for win == 0 {
			r = do(t, c, &aciv1.ClientMessage{Request: &aciv1.ClientMessage_ListWindows{ListWindows: &aciv1.ListWindowsRequest{}}})
			for _, w := range r.GetListWindows().GetWindows() {
				if w.GetTitle() == "e2e-typing" {
					win = w.GetId()
				}
			}
			if time.Now().After(deadline) {
				t.Fatalf("xterm (pid %d) window did not appear: %v", pid, r)
			}
			time.Sleep(20 * time.Millisecond)
		}
		do(t, c, &aciv1.ClientMessage{Request: &aciv1.ClientMessage_WindowAction{WindowAction: &aciv1.WindowActionRequest{WindowId: win, Op: aciv1.WindowOp_WINDOW_OP_ACTIVATE}}})
		// Give the shell a moment to reach cat (stty ran first), then type.
		r = do(t, c, &aciv1.ClientMessage{Request: &aciv1.ClientMessage_Step{Step: &aciv1.StepRequest{Actions: []*aciv1.Action{
			{Action: &aciv1.Action_Wait{Wait: &aciv1.WaitAction{Milliseconds: 300}}},
			{Action: &aciv1.Action_TypeText{TypeText: &aciv1.TypeTextAction{Text: text}}},
			{Action: &aciv1.Action_KeyPress{KeyPress: &aciv1.KeyAction{Key: "Return"}}},
			{Action: &aciv1.Action_KeyCombo{KeyCombo: &aciv1.KeyComboAction{Keys: []string{"ctrl", "d"}}}},
		}}}})
		for i, o := range r.GetStep().GetOutcomes() {
			if o.GetError() != nil {
				t.Fatalf("action %d: %v", i, o.GetError())
			}
		}
		deadline = time.Now().Add(10 * time.Second)
		for {
			b, err := os.ReadFile(out)
			if err == nil && string(b) == text+"\n" {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("xterm received %q, want %q", b, text+"\n")
			}
			time.Sleep(20 * time.Millisecond)
		}
	})

	t.Run("exec_and_files", func(t *testing.T) {
		r := do(t, c, &aciv1.ClientMessage{Request: &aciv1.ClientMessage_Exec{Exec: &aciv1.ExecRequest{
			Argv: []string{"sh", "-c", "echo $DISPLAY; env | grep -c FORKFLEET_.*TOKEN || true"}}}})
		if got := string(r.GetExec().GetStdout()); got != g.display+"\n0\n" {
			t.Fatalf("exec saw %q (tokens must not leak to children)", got)
		}
		p := filepath.Join(g.dir, "f", "data.bin")
		do(t, c, &aciv1.ClientMessage{Request: &aciv1.ClientMessage_FilePut{FilePut: &aciv1.FilePutRequest{Path: p, Data: []byte("chunk1-"), UploadId: "u", MakeParents: true}}})
		do(t, c, &aciv1.ClientMessage{Request: &aciv1.ClientMessage_FilePut{FilePut: &aciv1.FilePutRequest{Path: p, Data: []byte("chunk2"), UploadId: "u", Offset: 7, Last: true}}})
		r = do(t, c, &aciv1.ClientMessage{Request: &aciv1.ClientMessage_FileGet{FileGet: &aciv1.FileGetRequest{Path: p, Offset: 7}}})
		if string(r.GetFileGet().GetData()) != "chunk2" || !r.GetFileGet().GetEof() {
			t.Fatalf("file_get: %v", r)
		}
	})

	t.Run("sigterm_shutdown", func(t *testing.T) {
		xvfbPids := pidsMatching("Xvfb " + g.display)
		if len(xvfbPids) != 1 {
			t.Fatalf("Xvfb pids %v", xvfbPids)
		}
		g.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case err := <-g.exited:
			if err != nil {
				t.Fatalf("guestd exit: %v", err)
			}
		case <-time.After(15 * time.Second):
			t.Fatal("guestd did not exit after SIGTERM")
		}
		if p := pidsMatching("Xvfb " + g.display); len(p) != 0 {
			t.Fatalf("Xvfb survived: %v", p)
		}
		if _, err := os.Stat(fmt.Sprintf("/tmp/.X%s-lock", g.display[1:])); !os.IsNotExist(err) {
			t.Fatal("X lock left behind")
		}
		if !strings.Contains(g.log.String(), "shutdown step done") {
			t.Fatalf("no shutdown steps logged:\n%s", g.log.String())
		}
	})
}

// pidsMatching lists live processes whose command line contains s.
func pidsMatching(s string) []int {
	var out []int
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile("/proc/" + e.Name() + "/cmdline")
		if err != nil || len(b) == 0 {
			continue
		}
		if strings.Contains(strings.ReplaceAll(string(b), "\x00", " "), s) {
			out = append(out, pid)
		}
	}
	return out
}

// TestE2ETypingAtReady: an agent that types the moment the ReadyEvent
// arrives reaches the session's app. guestd's readiness waits for what the
// image names (here: the xterm window mapped and holding the focus), so the
// keys are not lost to a desktop whose app has no window yet. guestd runs
// with no locale in its environment and the text is not ASCII: the
// session's C.UTF-8 makes it reach the shell as UTF-8. Several boots, as the
// race is at boot.
func TestE2ETypingAtReady(t *testing.T) {
	needIntegration(t)
	var environ []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "LANG=") && !strings.HasPrefix(kv, "LC_") {
			environ = append(environ, kv)
		}
	}
	const want = "été ✓ 丘丙 über"
	for i := range 3 {
		out := filepath.Join(t.TempDir(), "typed")
		g := startGuestWith(t, func(cfg map[string]any) {
			cfg["apps"] = []any{map[string]any{"name": "xterm", "path": "/usr/bin/xterm",
				"args":    []string{"-geometry", "80x10+40+40", "-e", "sh", "-c", `IFS= read -r line; printf %s "$line" > ` + out},
				"restart": "never"}}
			cfg["ready"] = map[string]any{"windows": []any{map[string]any{"name": "xterm", "class": "XTerm", "focus": true}}}
		}, environ)
		t0 := time.Now()
		c := g.client(t) // returns at the ReadyEvent
		t.Logf("boot %d: ReadyEvent after %s", i, time.Since(t0))
		do(t, c, &aciv1.ClientMessage{Request: &aciv1.ClientMessage_Step{Step: &aciv1.StepRequest{Actions: []*aciv1.Action{
			{Action: &aciv1.Action_TypeText{TypeText: &aciv1.TypeTextAction{Text: want + "\n"}}}}}}})
		r := do(t, c, &aciv1.ClientMessage{Request: &aciv1.ClientMessage_Ready{Ready: &aciv1.ReadyRequest{}}}).GetReady()
		if !r.GetReady() || r.GetWindowsMappedMs() == 0 || r.GetFocusedMs() < r.GetPaintedMs() {
			t.Fatalf("boot %d: ready state %v", i, r)
		}
		deadline := time.Now().Add(20 * time.Second)
		for {
			got, err := os.ReadFile(out)
			if err == nil && len(got) > 0 {
				if string(got) != want {
					t.Fatalf("boot %d: the shell read %q, want %q", i, got, want)
				}
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("boot %d: the keys typed at the ReadyEvent never reached the shell", i)
			}
			time.Sleep(10 * time.Millisecond)
		}
		g.cmd.Process.Signal(syscall.SIGTERM)
		<-g.exited
		g.exited <- nil // for the cleanup
	}
}

// TestE2EAgentUser: with "user" set, exec, launch and the session apps run
// as that unprivileged user (here the host's nobody) while guestd stays
// root: the agent cannot read guestd's environment (its tokens) or write
// /etc, and what its xterm writes is its own. Keys typed through more spare
// keycodes than there are reach that xterm exactly, which needs guestd to
// watch a process of another user. FORKFLEET_RUN_AS_ROOT=1 gives the agent
// root.
func TestE2EAgentUser(t *testing.T) {
	needIntegration(t)
	if os.Geteuid() != 0 {
		t.Fatal("FORKFLEET_INTEGRATION=1: the agent user test needs root")
	}
	dir, err := os.MkdirTemp("", "guestd-agent-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o777); err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(dir, "typed")
	edit := func(cfg map[string]any) {
		cfg["user"] = "nobody"
		cfg["apps"] = []any{map[string]any{"name": "xterm", "path": "/usr/bin/xterm",
			"args":    []string{"-geometry", "80x10+40+40", "-e", "sh", "-c", `IFS= read -r line; printf %s "$line" > ` + out},
			"restart": "never"}}
		cfg["ready"] = map[string]any{"windows": []any{map[string]any{"class": "XTerm", "focus": true}}}
	}
	g := startGuestWith(t, edit, os.Environ())
	c := g.client(t)
	exec := func(c *aciclient.WireConn, script string) *aciv1.ExecResponse {
		t.Helper()
		return do(t, c, &aciv1.ClientMessage{Request: &aciv1.ClientMessage_Exec{Exec: &aciv1.ExecRequest{
			Argv: []string{"/bin/sh", "-c", script}}}}).GetExec()
	}
	if r := exec(c, "id -un; id -u"); string(r.GetStdout()) != "nobody\n65534\n" {
		t.Fatalf("exec runs as %q (%s)", r.GetStdout(), r.GetStderr())
	}
	if r := exec(c, fmt.Sprintf("cat /proc/%d/environ", g.cmd.Process.Pid)); r.GetExitCode() == 0 ||
		bytes.Contains(r.GetStdout(), []byte(e2eToken)) || bytes.Contains(r.GetStdout(), []byte(e2eAdmin)) {
		t.Fatalf("the agent read guestd's environment: %q", r.GetStdout())
	}
	if r := exec(c, "touch /etc/forkfleet-agent-e2e"); r.GetExitCode() == 0 {
		os.Remove("/etc/forkfleet-agent-e2e")
		t.Fatal("the agent wrote into /etc")
	}
	var cjk []rune
	for r := rune(0x4e00); r < 0x4e00+60; r++ {
		cjk = append(cjk, r)
	}
	want := "été " + string(cjk)
	do(t, c, &aciv1.ClientMessage{Request: &aciv1.ClientMessage_Step{Step: &aciv1.StepRequest{Actions: []*aciv1.Action{
		{Action: &aciv1.Action_TypeText{TypeText: &aciv1.TypeTextAction{Text: want + "\n"}}}}}}})
	deadline := time.Now().Add(20 * time.Second)
	for {
		got, err := os.ReadFile(out)
		if err == nil && len(got) > 0 {
			if string(got) != want {
				t.Fatalf("the agent's xterm read %q, want %q", got, want)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the keys never reached the agent's xterm")
		}
		time.Sleep(10 * time.Millisecond)
	}
	if st, err := os.Stat(out); err != nil || st.Sys().(*syscall.Stat_t).Uid != 65534 {
		t.Fatalf("the agent's xterm wrote %s as uid %v (%v)", out, st.Sys().(*syscall.Stat_t).Uid, err)
	}
	g.cmd.Process.Signal(syscall.SIGTERM)
	<-g.exited
	g.exited <- nil

	root := startGuestWith(t, edit, append(os.Environ(), "FORKFLEET_RUN_AS_ROOT=1"))
	if r := exec(root.client(t), "id -u"); string(r.GetStdout()) != "0\n" {
		t.Fatalf("with FORKFLEET_RUN_AS_ROOT=1 exec runs as uid %q", r.GetStdout())
	}
}
