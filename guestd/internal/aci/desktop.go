package aci

import (
	"context"
	"image"
	"time"

	"github.com/forkfleet/forkfleet/guestd/internal/desktop"
)

// Desktop is what the ACI needs from the X display. The real one is
// x11.Desktop (guestd/internal/x11); tests may use fakes. Every method is safe
// for concurrent use. Errors that the client caused (bad key name, unknown
// window) wrap errdefs.ErrInvalidArgument or errdefs.ErrNotFound so the
// dispatcher can map them to typed ACI codes.
type Desktop interface {
	// ScreenSize is the root window size in pixels.
	ScreenSize() (w, h int)

	// Ready reports readiness without capturing a whole frame.
	Ready(ctx context.Context) (desktop.ReadyState, error)

	// Input through XTEST. Each call returns once the X server has processed
	// the events (one sync round trip), so a following capture sees the effect.
	MoveTo(x, y int) error
	ButtonDown(button int) error
	ButtonUp(button int) error
	// Click presses and releases button count times at the current position.
	Click(button, count int) error
	// Scroll by whole notches; dy>0 scrolls down, dx>0 scrolls right.
	Scroll(dx, dy int) error
	// KeyDown/KeyUp take one key name: an X keysym name ("Return", "a",
	// "F5", "ctrl" aliases accepted) .
	KeyDown(name string) error
	KeyUp(name string) error
	// KeyCombo presses the keys in order and releases them in reverse
	// ("ctrl","shift","t").
	KeyCombo(names []string) error
	// TypeText types UTF-8 text, remapping a spare keycode for characters
	// that have no keycode in the current keymap.
	TypeText(text string) error
	CursorPosition() (x, y int, err error)

	// Capture copies the pixels of r (in root coordinates, already clipped
	// to the screen by the caller) into dst as BGRX, 4 bytes per pixel,
	// reusing dst.Pix when it is large enough. MIT-SHM when available.
	Capture(r image.Rectangle, dst *desktop.Frame) error
	// CursorImage returns the cursor sprite (ARGB, premultiplied as XFIXES
	// gives it) and its hotspot position on screen.
	CursorImage() (desktop.Cursor, error)

	// Windows (EWMH).
	ListWindows() ([]desktop.Window, error)
	ActivateWindow(id uint32) error
	CloseWindow(id uint32) error
	MoveResizeWindow(id uint32, x, y, w, h int) error
	SetWindowState(id uint32, state desktop.WindowState) error

	// Clipboard (CLIPBOARD selection, UTF8_STRING).
	ClipboardGet(ctx context.Context) (string, error)
	ClipboardSet(text string) error

	// Damage delivers the bounding rectangles of screen changes (X DAMAGE)
	// to ch until ctx ends. Rectangles may be coalesced. Used for settle
	// waits and the screencast.
	WatchDamage(ctx context.Context, ch chan<- image.Rectangle) error
}

// ScratchReleaser is implemented by a Desktop whose capture buffers can be
// given back to the kernel while idle (x11.Desktop's MIT-SHM segments and
// its copy of the screen): before a checkpoint, so neither the dump nor
// every replica carries them, once no capture used them for a while
// (Options.ScratchIdle), and before a pool member is frozen.
type ScratchReleaser interface {
	// ReleaseScratch gives back the buffers no capture used for idle (0:
	// all of them) and returns the bytes given back.
	ReleaseScratch(idle time.Duration) int
	// ReleaseShared gives back the buffers KSM never merges (shared
	// memory) and keeps the copy of the screen the next capture starts
	// from: a frozen member's copy merges with its siblings', and its
	// first capture after the claim reads only what was drawn since.
	ReleaseShared() int
}

// ServerGrabber is implemented by a Desktop that can make the X server
// serve it alone (x11.Desktop). A checkpoint holds the grab from the frame it
// proves until the dump is done, and a replica (whose X server restores the
// grab) captures its first frame before releasing it: the proof compares the
// very frame the dump holds, however busy the apps are drawing.
type ServerGrabber interface {
	GrabServer() error
	UngrabServer() error
}

// DamageSequencer is implemented by a Desktop that can prove the screen
// unchanged without capturing it (x11.Desktop does, through DAMAGE). The
// screenshot path then answers repeated requests from a cache.
type DamageSequencer interface {
	// DamageSeqSync returns a counter of screen changes once every change
	// made before the call has been counted: equal results of two calls
	// mean nothing was drawn between the first and the second, so a frame
	// captured after the first returned is still current. Values of
	// different Desktops are unrelated.
	DamageSeqSync(ctx context.Context) (uint64, error)
}

// FrameViewer is implemented by a Desktop that can lend its capture buffer
// instead of copying a frame out.
type FrameViewer interface {
	// CaptureView captures r (clipped to the screen by the caller) and
	// calls fn with a BGRX frame aliasing the capture buffer, valid only
	// until fn returns. fn may draw into it. Other captures wait for fn.
	CaptureView(r image.Rectangle, fn func(f *desktop.Frame) error) error
}

// ScreenMirror is implemented by a Desktop that keeps a whole-screen copy
// refreshed from damage reports, so a full-screen frame after a small
// repaint reads only the repainted rows.
type ScreenMirror interface {
	// CaptureScreenSynced calls fn with the whole screen as of the
	// caller's most recent DamageSeqSync (or later). The frame is valid
	// only until fn returns and must not be modified. An error wrapping
	// errdefs.ErrUnavailable before fn runs means no mirror: capture
	// another way.
	CaptureScreenSynced(fn func(f *desktop.Frame) error) error
}
