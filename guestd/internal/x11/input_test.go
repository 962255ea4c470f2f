//go:build linux

package x11

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/jezek/xgb"
	"github.com/jezek/xgb/xproto"

	"github.com/forkfleet/forkfleet/guestd/internal/desktop"
)

func TestPointer(t *testing.T) {
	x := startX(t)
	d := openDesktop(t, x)
	c := newClient(t, x)
	c.window(winOpts{x: 0, y: 0, w: screenW, h: screenH, override: true,
		eventMask: xproto.EventMaskButtonPress | xproto.EventMaskButtonRelease})

	for _, p := range [][2]int{{0, 0}, {640, 400}, {1279, 799}, {17, 793}} {
		if err := d.MoveTo(p[0], p[1]); err != nil {
			t.Fatal(err)
		}
		// MoveTo returned after a sync: another client sees the position.
		r, err := xproto.QueryPointer(c.conn, c.root).Reply()
		if err != nil {
			t.Fatal(err)
		}
		if int(r.RootX) != p[0] || int(r.RootY) != p[1] {
			t.Fatalf("pointer at %d,%d want %v", r.RootX, r.RootY, p)
		}
		if x, y, err := d.CursorPosition(); err != nil || x != p[0] || y != p[1] {
			t.Fatalf("CursorPosition %d,%d %v want %v", x, y, err, p)
		}
	}
	if err := d.MoveTo(screenW, 0); !isErr(err, desktop.ErrInvalid) {
		t.Fatalf("off-screen move: %v", err)
	}

	expectButtons := func(what string, want ...byte) {
		t.Helper()
		for i, b := range want {
			ev := c.next(2*time.Second, fmt.Sprintf("%s press %d", what, i), func(e xgb.Event) bool {
				_, ok := e.(xproto.ButtonPressEvent)
				return ok
			}).(xproto.ButtonPressEvent)
			if byte(ev.Detail) != b {
				t.Fatalf("%s: press %d is button %d, want %d", what, i, ev.Detail, b)
			}
			c.next(2*time.Second, what+" release", func(e xgb.Event) bool {
				r, ok := e.(xproto.ButtonReleaseEvent)
				return ok && byte(r.Detail) == b
			})
		}
	}
	if err := d.MoveTo(300, 300); err != nil {
		t.Fatal(err)
	}
	c.drain()
	if err := d.Click(1, 2); err != nil {
		t.Fatal(err)
	}
	expectButtons("double click", 1, 1)
	if err := d.Click(3, 1); err != nil {
		t.Fatal(err)
	}
	expectButtons("right click", 3)
	if err := d.Scroll(0, 3); err != nil {
		t.Fatal(err)
	}
	expectButtons("scroll down", 5, 5, 5)
	if err := d.Scroll(-2, -1); err != nil {
		t.Fatal(err)
	}
	expectButtons("scroll up-left", 4, 6, 6)
	if err := d.ButtonDown(2); err != nil {
		t.Fatal(err)
	}
	if err := d.ButtonUp(2); err != nil {
		t.Fatal(err)
	}
	expectButtons("middle down/up", 2)

	for _, b := range []int{0, 10} {
		if err := d.ButtonDown(b); !isErr(err, desktop.ErrInvalid) {
			t.Errorf("button %d: %v", b, err)
		}
	}
	if err := d.Click(1, 0); !isErr(err, desktop.ErrInvalid) {
		t.Errorf("zero clicks: %v", err)
	}
}

// keyRecorder translates a test window's key events to keysyms with the
// keymap as it is right now (remapped scratch keycodes included).
type keyRecorder struct {
	c      *client
	min    xproto.Keycode
	per    int
	syms   []xproto.Keysym
	events []xgb.Event
}

func newKeyWindow(t *testing.T, c *client) {
	t.Helper()
	w := c.window(winOpts{x: 0, y: 0, w: 400, h: 300, override: true,
		eventMask: xproto.EventMaskKeyPress | xproto.EventMaskKeyRelease})
	if err := xproto.SetInputFocusChecked(c.conn, xproto.InputFocusPointerRoot, w, xproto.TimeCurrentTime).Check(); err != nil {
		t.Fatal(err)
	}
	c.sync()
	c.drain()
}

type keyEvent struct {
	press  bool
	keysym uint32
}

// collectKeys waits for n key events and translates them.
func collectKeys(t *testing.T, c *client, n int) []keyEvent {
	return collectKeysUntil(t, c, n, 0)
}

// typedSyms collects key events until none arrived for a while and
// returns the keysyms pressed, Shift excluded.
func typedSyms(t *testing.T, c *client) []uint32 {
	var out []uint32
	for _, ks := range pressedSyms(collectKeysUntil(t, c, -1, 300*time.Millisecond)) {
		if ks != 0xffe1 {
			out = append(out, ks)
		}
	}
	return out
}

// collectKeysUntil reads n key events, or with n < 0 every key event until
// quiet passes without one.
func collectKeysUntil(t *testing.T, c *client, n int, quiet time.Duration) []keyEvent {
	t.Helper()
	setup := xproto.Setup(c.conn)
	km, err := xproto.GetKeyboardMapping(c.conn, setup.MinKeycode, byte(int(setup.MaxKeycode)-int(setup.MinKeycode)+1)).Reply()
	if err != nil {
		t.Fatal(err)
	}
	per := int(km.KeysymsPerKeycode)
	lookup := func(kc xproto.Keycode, state uint16) uint32 {
		col := 0
		if state&xproto.ModMaskShift != 0 {
			col = 1
		}
		i := (int(kc)-int(setup.MinKeycode))*per + col
		ks := uint32(km.Keysyms[i])
		if ks == 0 && col == 1 {
			ks = uint32(km.Keysyms[i-1])
		}
		return ks
	}
	isKey := func(e xgb.Event) bool {
		switch e.(type) {
		case xproto.KeyPressEvent, xproto.KeyReleaseEvent:
			return true
		}
		return false
	}
	var out []keyEvent
	for n < 0 || len(out) < n {
		var ev xgb.Event
		if n < 0 {
			var ok bool
			if ev, ok = c.poll(quiet, isKey); !ok {
				break
			}
		} else {
			ev = c.next(2*time.Second, fmt.Sprintf("key event %d of %d", len(out)+1, n), isKey)
		}
		switch e := ev.(type) {
		case xproto.KeyPressEvent:
			out = append(out, keyEvent{true, lookup(e.Detail, e.State)})
		case xproto.KeyReleaseEvent:
			out = append(out, keyEvent{false, lookup(e.Detail, e.State)})
		}
	}
	return out
}

func pressedSyms(evs []keyEvent) []uint32 {
	var out []uint32
	for _, e := range evs {
		if e.press {
			out = append(out, e.keysym)
		}
	}
	return out
}

func TestKeyboard(t *testing.T) {
	x := startX(t)
	d := openDesktop(t, x)
	c := newClient(t, x)
	newKeyWindow(t, c)

	if err := d.KeyDown("ctrl"); err != nil {
		t.Fatal(err)
	}
	if err := d.KeyUp("CTRL"); err != nil {
		t.Fatal(err)
	}
	evs := collectKeys(t, c, 2)
	if evs[0] != (keyEvent{true, 0xffe3}) || !(evs[1].keysym == 0xffe3 && !evs[1].press) {
		t.Fatalf("ctrl down/up: %+v", evs)
	}

	if err := d.KeyCombo([]string{"ctrl", "shift", "t"}); err != nil {
		t.Fatal(err)
	}
	evs = collectKeys(t, c, 6)
	// The T is reported with Shift held, so the client sees "T".
	want := []keyEvent{{true, 0xffe3}, {true, 0xffe1}, {true, 'T'}, {false, 'T'}, {false, 0xffe1}, {false, 0xffe3}}
	for i := range want {
		if evs[i] != want[i] {
			t.Fatalf("ctrl+shift+t event %d: %+v want %+v (all %+v)", i, evs[i], want[i], evs)
		}
	}

	for _, name := range []string{"Return", "enter", "esc", "BackSpace", "f5", "F12", "pageup", "Page_Down", "super", "space", "delete", "left"} {
		if err := d.KeyCombo([]string{name}); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		ks, _ := resolveKey(name)
		if evs := collectKeys(t, c, 2); evs[0].keysym != ks {
			t.Fatalf("%s: got keysym 0x%x want 0x%x", name, evs[0].keysym, ks)
		}
	}

	// A shifted key held down brings its Shift along, and an unmapped one
	// a remapped scratch keycode that stays mapped while held.
	if err := d.KeyDown("A"); err != nil {
		t.Fatal(err)
	}
	if err := d.KeyUp("A"); err != nil {
		t.Fatal(err)
	}
	evs = collectKeys(t, c, 4)
	if want := []keyEvent{{true, 0xffe1}, {true, 'A'}, {false, 'A'}, {false, 0xffe1}}; fmt.Sprint(evs) != fmt.Sprint(want) {
		t.Fatalf("shifted KeyDown/KeyUp: %+v want %+v", evs, want)
	}
	if err := d.KeyDown("✓"); err != nil {
		t.Fatal(err)
	}
	time.Sleep(remapRestoreDelay + 100*time.Millisecond) // held: must not be restored
	if err := d.KeyUp("U+2713"); err != nil {
		t.Fatal(err)
	}
	evs = collectKeys(t, c, 2)
	if ks := runeKeysym(0x2713); fmt.Sprint(evs) != fmt.Sprint([]keyEvent{{true, ks}, {false, ks}}) {
		t.Fatalf("unmapped KeyDown/KeyUp: %+v want keysym 0x%x", evs, ks)
	}

	for _, bad := range []string{"", "nosuchkey", "ctrl+c"} {
		err := d.KeyDown(bad)
		if !errors.Is(err, desktop.ErrInvalid) {
			t.Errorf("KeyDown(%q): %v, want ErrInvalid", bad, err)
		}
	}
	if err := d.KeyCombo([]string{"ctrl", "bogus"}); !isErr(err, desktop.ErrInvalid) {
		t.Errorf("combo with bad key: %v", err)
	}
}

func TestTypeText(t *testing.T) {
	x := startX(t)
	d := openDesktop(t, x)
	c := newClient(t, x)
	newKeyWindow(t, c)

	for _, text := range []string{"Hello, World! ~{}|<>?", "héllo ✓", "Ωμέγα → 日本語"} {
		if err := d.TypeText(text); err != nil {
			t.Fatal(err)
		}
		var want []uint32
		for _, r := range text {
			want = append(want, runeKeysym(r))
		}
		if got := typedSyms(t, c); fmt.Sprint(got) != fmt.Sprint(want) {
			t.Fatalf("typed %q: keysyms %x want %x", text, got, want)
		}
	}

	// The scratch keycodes go back to empty after the restore delay.
	time.Sleep(remapRestoreDelay + 200*time.Millisecond)
	setup := xproto.Setup(c.conn)
	km, err := xproto.GetKeyboardMapping(c.conn, setup.MinKeycode, byte(int(setup.MaxKeycode)-int(setup.MinKeycode)+1)).Reply()
	if err != nil {
		t.Fatal(err)
	}
	d.in.mu.Lock()
	defer d.in.mu.Unlock()
	if len(d.in.scratch) == 0 {
		t.Fatal("no scratch keycodes found in the Xvfb keymap")
	}
	for _, s := range d.in.scratch {
		for i := 0; i < int(km.KeysymsPerKeycode); i++ {
			if ks := km.Keysyms[(int(s.kc)-int(setup.MinKeycode))*int(km.KeysymsPerKeycode)+i]; ks != 0 {
				t.Fatalf("scratch keycode %d still maps 0x%x", s.kc, ks)
			}
		}
	}
}

func BenchmarkMoveTo(b *testing.B) {
	x := startX(b)
	d := openDesktop(b, x)
	for i := 0; i < b.N; i++ {
		if err := d.MoveTo(i%screenW, i%screenH); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkKeyPress(b *testing.B) {
	x := startX(b)
	d := openDesktop(b, x)
	for i := 0; i < b.N; i++ {
		if err := d.KeyCombo([]string{"a"}); err != nil {
			b.Fatal(err)
		}
	}
}

// TestTypeTextXterm types into a real Xlib application: xterm translates
// the keycodes (including remapped ones) and writes the line to a file.
func TestTypeTextXterm(t *testing.T) {
	const xtermPath = "/usr/bin/xterm"
	if _, err := os.Stat(xtermPath); err != nil {
		t.Skipf("%s not installed", xtermPath)
	}
	x := startX(t)
	d := openDesktop(t, x)
	out := filepath.Join(t.TempDir(), "typed")
	cmd := exec.Command(xtermPath, "-u8", "-geometry", "80x10+0+0", "-e", "sh", "-c", "IFS= read -r line; printf %s \"$line\" > "+out)
	cmd.Env = append(os.Environ(), "DISPLAY="+x.display, "LANG=C.UTF-8", "LC_ALL=C.UTF-8")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	t.Cleanup(func() {
		cmd.Process.Kill()
		<-done
		done <- nil
	})
	// Without a WM the keyboard follows the pointer (PointerRoot focus).
	waitFor(t, 10*time.Second, "xterm window", func() bool {
		ws, err := d.ListWindows()
		return err == nil && len(ws) == 1
	})
	if err := d.MoveTo(100, 50); err != nil {
		t.Fatal(err)
	}
	time.Sleep(300 * time.Millisecond) // shell startup
	// More distinct unmapped characters than Xvfb has spare keycodes, so
	// slots get new meanings while xterm is still translating.
	var cjk []rune
	for r := rune(0x4e00); r < 0x4e00+80; r++ {
		cjk = append(cjk, r)
	}
	want := "Hello, wörld ✓ Ωμέγα ~!@#$%^&*() " + string(cjk)
	if err := d.TypeText(want + "\n"); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-done:
		done <- err // for the cleanup
	case <-time.After(10 * time.Second):
		t.Fatal("xterm did not finish")
	}
	got, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	if string(got) != want {
		t.Fatalf("xterm read %q, want %q", got, want)
	}
}

// TestTypeTextManyUnmapped types more distinct unmapped characters than
// there are scratch keycodes, so slots are reused mid-text.
func TestTypeTextManyUnmapped(t *testing.T) {
	x := startX(t)
	d := openDesktop(t, x)
	c := newClient(t, x)
	newKeyWindow(t, c)
	d.in.mu.Lock()
	if _, err := d.keymapLocked(); err != nil {
		t.Fatal(err)
	}
	n := len(d.in.scratch)
	d.in.mu.Unlock()
	var text []rune
	for i := 0; i < n+40; i++ {
		text = append(text, rune(0x4e00+i)) // CJK, never in the keymap
	}
	start := time.Now()
	if err := d.TypeText(string(text)); err != nil {
		t.Fatal(err)
	}
	t.Logf("%d scratch keycodes, %d characters typed in %s", n, len(text), time.Since(start))
	// Keysyms are checked against the keymap as it is when the events are
	// read, which holds only for slots not reused since: verify the count
	// and the tail.
	evs := typedSyms(t, c)
	if len(evs) != len(text) {
		t.Fatalf("%d key presses for %d characters", len(evs), len(text))
	}
	for i := len(text) - 10; i < len(text); i++ {
		if evs[i] != runeKeysym(text[i]) {
			t.Fatalf("char %d: keysym 0x%x want 0x%x", i, evs[i], runeKeysym(text[i]))
		}
	}
}
