package aci

import (
	"context"
	"fmt"
	"image"
	"strings"
	"sync"
	"time"

	"github.com/forkfleet/forkfleet/api/errdefs"
	"github.com/forkfleet/forkfleet/guestd/internal/desktop"
)

// fakeDesktop is an in-memory Desktop: a BGRX framebuffer, a pointer, and a
// log of input calls. Key names starting with "bogus" fail with ErrInvalid.
type fakeDesktop struct {
	mu     sync.Mutex
	w, h   int
	pix    []byte
	x, y   int
	calls  []string
	clip   string
	ready  desktop.ReadyState
	damage []chan<- image.Rectangle
	// grabbed: GrabServer was called and UngrabServer not since.
	grabbed bool
	// released lists the idle periods ReleaseScratch was called with.
	released []time.Duration
	// sharedReleases counts ReleaseShared calls.
	sharedReleases int
}

func newFakeDesktop(w, h int) *fakeDesktop {
	f := &fakeDesktop{w: w, h: h, pix: make([]byte, w*h*4)}
	f.ready = desktop.ReadyState{XUp: true, WMUp: true, RootPainted: true}
	f.fill(image.Rect(0, 0, w, h), 0x30, 0x40, 0x50)
	return f
}

// fill paints r (B, G, R) and reports damage.
func (f *fakeDesktop) fill(r image.Rectangle, b, g, rr byte) {
	f.mu.Lock()
	for y := r.Min.Y; y < r.Max.Y; y++ {
		for x := r.Min.X; x < r.Max.X; x++ {
			o := (y*f.w + x) * 4
			f.pix[o], f.pix[o+1], f.pix[o+2], f.pix[o+3] = b, g, rr, 0
		}
	}
	chs := append([]chan<- image.Rectangle(nil), f.damage...)
	f.mu.Unlock()
	for _, ch := range chs {
		select {
		case ch <- r:
		default:
		}
	}
}

func (f *fakeDesktop) log(format string, args ...any) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls = append(f.calls, fmt.Sprintf(format, args...))
	return nil
}

// ReleaseScratch records idle; the fake holds no scratch to give back.
func (f *fakeDesktop) ReleaseScratch(idle time.Duration) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.released = append(f.released, idle)
	return 0
}

// ReleaseShared counts; the fake holds no scratch to give back.
func (f *fakeDesktop) ReleaseShared() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.sharedReleases++
	return 0
}

// scratchReleases lists the idle periods ReleaseScratch was called with.
func (f *fakeDesktop) scratchReleases() []time.Duration {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]time.Duration(nil), f.released...)
}

func (f *fakeDesktop) Calls() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]string(nil), f.calls...)
}

func (f *fakeDesktop) ScreenSize() (int, int) { return f.w, f.h }
func (f *fakeDesktop) Ready(context.Context) (desktop.ReadyState, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.ready, nil
}
func (f *fakeDesktop) MoveTo(x, y int) error {
	f.mu.Lock()
	f.x, f.y = x, y
	f.mu.Unlock()
	return f.log("move %d %d", x, y)
}
func (f *fakeDesktop) ButtonDown(b int) error  { return f.log("down %d", b) }
func (f *fakeDesktop) ButtonUp(b int) error    { return f.log("up %d", b) }
func (f *fakeDesktop) Click(b, n int) error    { return f.log("click %d %d", b, n) }
func (f *fakeDesktop) Scroll(dx, dy int) error { return f.log("scroll %d %d", dx, dy) }
func (f *fakeDesktop) KeyDown(k string) error  { return f.key("keydown", k) }
func (f *fakeDesktop) KeyUp(k string) error    { return f.key("keyup", k) }
func (f *fakeDesktop) TypeText(t string) error { return f.log("type %q", t) }
func (f *fakeDesktop) ClipboardSet(t string) error {
	f.mu.Lock()
	f.clip = t
	f.mu.Unlock()
	return nil
}
func (f *fakeDesktop) ClipboardGet(context.Context) (string, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.clip, nil
}
func (f *fakeDesktop) KeyCombo(ks []string) error {
	for _, k := range ks {
		if strings.HasPrefix(k, "bogus") {
			return fmt.Errorf("%w: unknown key %q", errdefs.ErrInvalidArgument, k)
		}
	}
	return f.log("combo %s", strings.Join(ks, "+"))
}
func (f *fakeDesktop) key(op, k string) error {
	if strings.HasPrefix(k, "bogus") {
		return fmt.Errorf("%w: unknown key %q", errdefs.ErrInvalidArgument, k)
	}
	return f.log("%s %s", op, k)
}
func (f *fakeDesktop) CursorPosition() (int, int, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.x, f.y, nil
}
func (f *fakeDesktop) Capture(r image.Rectangle, dst *desktop.Frame) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	stride := r.Dx() * 4
	if cap(dst.Pix) < stride*r.Dy() {
		dst.Pix = make([]byte, stride*r.Dy())
	}
	dst.Pix = dst.Pix[:stride*r.Dy()]
	dst.Stride, dst.Rect = stride, r
	for y := r.Min.Y; y < r.Max.Y; y++ {
		o := (y*f.w + r.Min.X) * 4
		copy(dst.Pix[(y-r.Min.Y)*stride:], f.pix[o:o+stride])
	}
	return nil
}
func (f *fakeDesktop) CursorImage() (desktop.Cursor, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return desktop.Cursor{X: f.x, Y: f.y, Width: 2, Height: 2, ARGB: []uint32{0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff}}, nil
}
func (f *fakeDesktop) ListWindows() ([]desktop.Window, error) {
	return []desktop.Window{{ID: 7, Title: "term", Class: "XTerm", Width: 10, Height: 10, Focused: true}}, nil
}
func (f *fakeDesktop) ActivateWindow(id uint32) error { return f.win(id, "activate") }
func (f *fakeDesktop) CloseWindow(id uint32) error    { return f.win(id, "close") }
func (f *fakeDesktop) MoveResizeWindow(id uint32, x, y, w, h int) error {
	return f.win(id, fmt.Sprintf("moveresize %d %d %d %d", x, y, w, h))
}
func (f *fakeDesktop) SetWindowState(id uint32, s desktop.WindowState) error {
	return f.win(id, fmt.Sprintf("state %d", s))
}
func (f *fakeDesktop) win(id uint32, op string) error {
	if id != 7 {
		return fmt.Errorf("%w: window %d", errdefs.ErrNotFound, id)
	}
	return f.log("%s %d", op, id)
}
func (f *fakeDesktop) WatchDamage(ctx context.Context, ch chan<- image.Rectangle) error {
	f.mu.Lock()
	f.damage = append(f.damage, ch)
	f.mu.Unlock()
	<-ctx.Done()
	f.mu.Lock()
	for i, c := range f.damage {
		if c == ch {
			f.damage = append(f.damage[:i], f.damage[i+1:]...)
			break
		}
	}
	f.mu.Unlock()
	return nil
}

var _ Desktop = (*fakeDesktop)(nil)

// GrabServer and UngrabServer record the grab (the fake serves no other
// client, so it has nothing to hold off).
func (f *fakeDesktop) GrabServer() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.grabbed = true
	f.calls = append(f.calls, "grab")
	return nil
}

func (f *fakeDesktop) UngrabServer() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.grabbed = false
	f.calls = append(f.calls, "ungrab")
	return nil
}

func (f *fakeDesktop) isGrabbed() bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.grabbed
}
