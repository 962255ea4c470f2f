//go:build linux

package x11

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/jezek/xgb"
	"github.com/jezek/xgb/xproto"

	"github.com/forkfleet/forkfleet/api/errdefs"
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
	if err := d.MoveTo(screenW, 0); !isErr(err, errdefs.ErrInvalidArgument) {
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
		if err := d.ButtonDown(b); !isErr(err, errdefs.ErrInvalidArgument) {
			t.Errorf("button %d: %v", b, err)
		}
	}
	if err := d.Click(1, 0); !isErr(err, errdefs.ErrInvalidArgument) {
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
	if err := d.KeyUp("U+2713"); err != nil {
		t.Fatal(err)
	}
	evs = collectKeys(t, c, 2)
	if ks := runeKeysym(0x2713); fmt.Sprint(evs) != fmt.Sprint([]keyEvent{{true, ks}, {false, ks}}) {
		t.Fatalf("unmapped KeyDown/KeyUp: %+v want keysym 0x%x", evs, ks)
	}

	for _, bad := range []string{"", "nosuchkey", "ctrl+c"} {
		err := d.KeyDown(bad)
		if !errors.Is(err, errdefs.ErrInvalidArgument) {
			t.Errorf("KeyDown(%q): %v, want ErrInvalid", bad, err)
		}
	}
	if err := d.KeyCombo([]string{"ctrl", "bogus"}); !isErr(err, errdefs.ErrInvalidArgument) {
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

	// The scratch keycodes keep their characters (putting one back would
	// be a remap too), so typing them again changes no mapping.
	d.in.mu.Lock()
	n := len(d.in.scratch)
	d.in.mu.Unlock()
	if n == 0 {
		t.Fatal("no scratch keycodes found in the Xvfb keymap")
	}
	c.drain()
	if err := d.TypeText("✓日本語"); err != nil {
		t.Fatal(err)
	}
	if ev, ok := c.poll(300*time.Millisecond, func(e xgb.Event) bool { _, ok := e.(xproto.MappingNotifyEvent); return ok }); ok {
		t.Fatalf("retyping characters already mapped remapped a keycode: %+v", ev)
	}
}

// TestTypeTextLazyClient types more distinct unmapped characters than there
// are scratch slots to a client that translates its key events only when
// TypeText asks whether it has (the latest a real client may do: Xlib
// fetches the keymap lazily). Every character must come out right: no slot
// may change meaning before its presses were taken.
func TestTypeTextLazyClient(t *testing.T) {
	x := startX(t)
	d := openDesktop(t, x)
	c := newClient(t, x)
	newKeyWindow(t, c)
	d.in.mu.Lock()
	if _, err := d.keymapLocked(); err != nil {
		t.Fatal(err)
	}
	n := len(d.in.scratch)
	var got []uint32
	proofs := 0
	d.in.awaitTaken = func(pid int) error {
		if pid != -1 {
			t.Errorf("recipient pid %d, want -1 (a client in guestd's own process)", pid)
		}
		proofs++
		if err := d.sync(); err != nil {
			return err
		}
		got = append(got, typedSyms(t, c)...)
		return nil
	}
	d.in.mu.Unlock()
	var text []rune
	for i := 0; i < 3*n+7; i++ {
		text = append(text, rune(0x4e00+i), 'a', rune(0x4e00+i/2)) // CJK, never in the keymap, and repeats
	}
	if err := d.TypeText(string(text)); err != nil {
		t.Fatal(err)
	}
	got = append(got, typedSyms(t, c)...)
	var want []uint32
	for _, r := range text {
		want = append(want, runeKeysym(r))
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("typed %d characters through %d slots with %d proofs: got %x\nwant %x", len(text), n, proofs, got, want)
	}
	t.Logf("%d characters through %d slots with %d proofs", len(text), n, proofs)
	if proofs == 0 || proofs > len(text)/n+1 {
		t.Fatalf("%d proofs for %d characters through %d slots", proofs, len(text), n)
	}
	// Re-reading the keymap (after every remap) keeps guestd's keycodes.
	d.in.mu.Lock()
	d.in.stale.Store(true)
	_, err := d.keymapLocked()
	m := len(d.in.scratch)
	d.in.mu.Unlock()
	if err != nil || m != n {
		t.Fatalf("%d scratch slots after typing, %d before (%v)", m, n, err)
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

// TestTypeTextXterm types into a real Xlib application on a loaded host:
// xterm translates key events lazily (Xlib fetches the keymap when the
// application translates the first key after a MappingNotify), so a spare
// keycode remapped before xterm got to its earlier presses would type the
// new character. Busy processes on every CPU make xterm lag far behind
// the keys; the text must still arrive exactly.
func TestTypeTextXterm(t *testing.T) {
	const xtermPath = "/usr/bin/xterm"
	if _, err := os.Stat(xtermPath); err != nil {
		t.Skipf("%s not installed", xtermPath)
	}
	x := startX(t)
	d := openDesktop(t, x)
	out := filepath.Join(t.TempDir(), "typed")
	cmd := exec.Command(xtermPath, "-u8", "-geometry", "80x10+0+0", "-e", "sh", "-c",
		`while IFS= read -r line; do printf '%s\n' "$line" >> `+out+`; done`)
	cmd.Env = append(os.Environ(), "DISPLAY="+x.display, "LANG=C.UTF-8", "LC_ALL=C.UTF-8")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cmd.Process.Kill()
		cmd.Wait()
	})
	// Without a WM the keyboard follows the pointer (PointerRoot focus).
	waitFor(t, 10*time.Second, "xterm window", func() bool {
		ws, err := d.ListWindows()
		return err == nil && len(ws) == 1
	})
	if err := d.MoveTo(100, 50); err != nil {
		t.Fatal(err)
	}
	loadCPUs(t)
	var cjk, mixed []rune
	for r := rune(0x4e00); r < 0x4e00+80; r++ {
		cjk = append(cjk, r)
	}
	for i := range 300 { // several times the spare keycodes, with repeats
		mixed = append(mixed, rune(0x5000+i), rune('a'+i%26), rune(0x5000+i/3), rune(0x3b1+i%20))
	}
	texts := []string{
		"Hello, wörld ✓ Ωμέγα ~!@#$%^&*() " + string(cjk),
		string(mixed),
		"été 日本語 été",
	}
	for i, want := range texts {
		if err := d.TypeText(want + "\n"); err != nil {
			t.Fatal(err)
		}
		var lines []string
		waitFor(t, 60*time.Second, fmt.Sprintf("line %d in %s", i+1, out), func() bool {
			b, _ := os.ReadFile(out)
			lines = strings.Split(strings.TrimSuffix(string(b), "\n"), "\n")
			return len(b) > 0 && len(lines) > i
		})
		if lines[i] != want {
			t.Fatalf("xterm read %q\nwant %q", lines[i], want)
		}
	}
}

// loadCPUs keeps two busy processes per CPU running until the test ends.
func loadCPUs(t *testing.T) {
	for range 2 * runtime.NumCPU() {
		c := exec.Command("/bin/sh", "-c", "while :; do :; done")
		if err := c.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			c.Process.Kill()
			c.Wait()
		})
	}
}
