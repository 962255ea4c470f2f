//go:build linux

package x11

import (
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"github.com/jezek/xgb/xproto"
	"github.com/jezek/xgb/xtest"

	"github.com/forkfleet/forkfleet/guestd/internal/desktop"
)

// Limits on one call, so a bad request cannot queue minutes of input.
const (
	maxClicks     = 100
	maxScroll     = 1000
	maxComboKeys  = 16
	maxTypeLength = 64 << 10
)

// remapRestoreDelay is how long remapped scratch keycodes keep their
// characters after TypeText. Xlib clients re-read the keymap lazily when
// they translate a key event, possibly after this process has moved on;
// restoring immediately would make them translate with the old map.
var remapRestoreDelay = 250 * time.Millisecond

// remapReuseDelay is the pause before scratch keycodes get new characters
// while text is being typed (see keyFor). Xlib clients fetch the keymap
// lazily when they translate the first key event after a MappingNotify,
// so a keycode may change meaning only once they have worked through the
// events that used it; nothing in the protocol reports that, so this is a
// generous allowance for a client on a busy machine.
const remapReuseDelay = 100 * time.Millisecond

// input is the keyboard state: cached keymap, keys held through KeyDown and
// the scratch keycodes used for characters absent from the keymap.
type input struct {
	mu    sync.Mutex
	stale atomic.Bool // set by the event loop on MappingNotify

	km *keymap
	// held maps keycodes pressed by KeyDown to whether an implicit Shift
	// was pressed with them.
	held map[xproto.Keycode]bool
	// scratch are the keycodes free for remapping (empty in the keymap).
	scratch []scratchSlot
	// restore fires remapRestoreDelay after the last remap.
	restore *time.Timer
	// fence is the LRU clock at the last reuse pause: slots used before
	// it may be remapped without another pause.
	fence uint64
}

// scratchSlot is one column of a spare keycode: column 0 (no modifier) or
// column 1 (Shift), so each spare keycode carries two characters.
type scratchSlot struct {
	kc     xproto.Keycode
	shift  bool
	keysym uint32 // currently mapped keysym, 0 if none
	pinned bool   // held down through KeyDown
	used   uint64 // LRU clock
}

type keymap struct {
	min, max xproto.Keycode
	per      int
	syms     []xproto.Keysym
	pos      map[uint32]keyPos
}

type keyPos struct {
	kc    xproto.Keycode
	shift bool
}

// keymapLocked returns the cached keymap, refetching it after a
// MappingNotify. in.mu must be held.
func (d *Desktop) keymapLocked() (*keymap, error) {
	in := &d.in
	if in.km != nil && !in.stale.Load() {
		return in.km, nil
	}
	in.stale.Store(false)
	setup := xproto.Setup(d.conn)
	min, max := setup.MinKeycode, setup.MaxKeycode
	r, err := xproto.GetKeyboardMapping(d.conn, min, byte(int(max)-int(min)+1)).Reply()
	if err != nil {
		return nil, xerr("GetKeyboardMapping", err)
	}
	if r == nil || r.KeysymsPerKeycode == 0 {
		return nil, errNilReply("GetKeyboardMapping")
	}
	km := &keymap{min: min, max: max, per: int(r.KeysymsPerKeycode), syms: r.Keysyms, pos: map[uint32]keyPos{}}
	var empty []xproto.Keycode
	for kc := int(min); kc <= int(max); kc++ {
		row := km.row(xproto.Keycode(kc))
		if row == nil {
			continue
		}
		allEmpty := true
		for _, s := range row {
			if s != 0 {
				allEmpty = false
			}
		}
		if allEmpty {
			empty = append(empty, xproto.Keycode(kc))
			continue
		}
		// Columns 0 and 1 are group 1 without and with Shift; later
		// columns need other groups or levels that XTEST cannot select
		// reliably, so they are not used.
		for col := 0; col < 2 && col < len(row); col++ {
			ks := uint32(row[col])
			if ks == 0 {
				continue
			}
			if _, ok := km.pos[ks]; !ok {
				km.pos[ks] = keyPos{kc: xproto.Keycode(kc), shift: col == 1}
			}
		}
	}
	// Scratch keycodes are chosen while none is in use, so our own
	// remapping never makes a keycode look taken.
	inUse := false
	for _, s := range in.scratch {
		if s.keysym != 0 {
			inUse = true
		}
	}
	if !inUse {
		in.scratch = in.scratch[:0]
		for _, kc := range empty {
			in.scratch = append(in.scratch, scratchSlot{kc: kc}, scratchSlot{kc: kc, shift: true})
		}
	}
	in.km = km
	return km, nil
}

func (km *keymap) row(kc xproto.Keycode) []xproto.Keysym {
	i := (int(kc) - int(km.min)) * km.per
	if i < 0 || i+km.per > len(km.syms) {
		return nil
	}
	return km.syms[i : i+km.per]
}

// lookup finds a keycode producing keysym ks without remapping.
func (d *Desktop) lookup(km *keymap, ks uint32) (keyPos, bool) {
	for _, s := range d.in.scratch {
		if s.keysym == ks {
			return keyPos{kc: s.kc, shift: s.shift}, true
		}
	}
	for _, alt := range keysymAlternates(ks) {
		if p, ok := km.pos[alt]; ok && !d.isScratch(p.kc) {
			return p, true
		}
	}
	return keyPos{}, false
}

func (d *Desktop) isScratch(kc xproto.Keycode) bool {
	for _, s := range d.in.scratch {
		if s.kc == kc {
			return true
		}
	}
	return false
}

var lruClock atomic.Uint64

// keyFor returns a keycode for ks, remapping a scratch keycode when the
// keymap has none. in.mu must be held.
func (d *Desktop) keyFor(ks uint32) (keyPos, error) {
	km, err := d.keymapLocked()
	if err != nil {
		return keyPos{}, err
	}
	if p, ok := d.lookup(km, ks); ok {
		if d.isScratch(p.kc) {
			d.touchScratch(p)
		}
		return p, nil
	}
	// Least recently used unpinned slot.
	best := -1
	for i, s := range d.in.scratch {
		if s.pinned {
			continue
		}
		if best < 0 || s.used < d.in.scratch[best].used {
			best = i
		}
	}
	if best < 0 {
		return keyPos{}, fmt.Errorf("x11: no spare keycode to type keysym 0x%x: %w", ks, desktop.ErrUnavailable)
	}
	slot := &d.in.scratch[best]
	if slot.keysym != 0 && slot.used >= d.in.fence {
		// Every slot is taken by text typed moments ago: give clients time
		// to translate the events already sent before any slot changes
		// meaning. One pause frees all slots used so far, so long
		// non-Latin text pauses once per len(scratch) (two per spare
		// keycode) distinct characters.
		if err := d.sync(); err != nil {
			return keyPos{}, err
		}
		time.Sleep(remapReuseDelay)
		d.in.fence = lruClock.Add(1)
	}
	slot.keysym = ks
	slot.used = lruClock.Add(1)
	d.writeScratchRow(km.per, slot.kc)
	d.scheduleRestore()
	return keyPos{kc: slot.kc, shift: slot.shift}, nil
}

// writeScratchRow maps a spare keycode to the keysyms of its two slots:
// the pair fills both groups' columns so the group in use does not matter;
// a lone column-0 keysym fills every column so Shift does not matter.
func (d *Desktop) writeScratchRow(per int, kc xproto.Keycode) {
	var k [2]uint32
	for _, s := range d.in.scratch {
		if s.kc == kc {
			if s.shift {
				k[1] = s.keysym
			} else {
				k[0] = s.keysym
			}
		}
	}
	syms := make([]xproto.Keysym, per)
	for i := range syms {
		switch {
		case k[1] == 0:
			syms[i] = xproto.Keysym(k[0])
		case i < 4:
			syms[i] = xproto.Keysym(k[i%2])
		}
	}
	xproto.ChangeKeyboardMapping(d.conn, 1, kc, byte(per), syms)
}

func (d *Desktop) touchScratch(p keyPos) {
	for i := range d.in.scratch {
		if s := &d.in.scratch[i]; s.kc == p.kc && s.shift == p.shift {
			s.used = lruClock.Add(1)
		}
	}
}

func (d *Desktop) setPinned(kc xproto.Keycode, pinned bool) {
	for i := range d.in.scratch {
		if d.in.scratch[i].kc == kc {
			d.in.scratch[i].pinned = pinned
		}
	}
}

// unpin releases a scratch keycode held through KeyDown/KeyCombo; the
// restore timer may have skipped it while it was down.
func (d *Desktop) unpin(kc xproto.Keycode) {
	if d.isScratch(kc) {
		d.setPinned(kc, false)
		d.scheduleRestore()
	}
}

func (d *Desktop) scheduleRestore() {
	if d.in.restore != nil {
		d.in.restore.Stop()
	}
	d.in.restore = time.AfterFunc(remapRestoreDelay, func() { d.in.restoreScratch(d, false) })
}

// restoreScratch unmaps every scratch keycode that is not held down.
func (in *input) restoreScratch(d *Desktop, closing bool) {
	in.mu.Lock()
	defer in.mu.Unlock()
	if closing && in.restore != nil {
		in.restore.Stop()
	}
	if in.km == nil || !d.alive() {
		return
	}
	var changed []xproto.Keycode
	for i := range in.scratch {
		s := &in.scratch[i]
		if s.keysym == 0 || (s.pinned && !closing) {
			continue
		}
		s.keysym, s.pinned = 0, false
		if !slices.Contains(changed, s.kc) {
			changed = append(changed, s.kc)
		}
	}
	for _, kc := range changed {
		d.writeScratchRow(in.km.per, kc)
	}
	if len(changed) > 0 {
		d.sync()
	}
}

// fake sends one XTEST event (no round trip).
func (d *Desktop) fake(typ byte, detail byte, x, y int16) {
	xtest.FakeInput(d.conn, typ, detail, 0, d.root, x, y, 0)
}

func (d *Desktop) shiftKey() (xproto.Keycode, error) {
	p, err := d.keyFor(0xffe1) // Shift_L
	return p.kc, err
}

// MoveTo moves the pointer to (x, y) in root coordinates.
func (d *Desktop) MoveTo(x, y int) error {
	if x < 0 || y < 0 || x >= d.width || y >= d.height {
		return fmt.Errorf("x11: move to (%d,%d): outside the %dx%d screen: %w", x, y, d.width, d.height, desktop.ErrInvalid)
	}
	d.in.mu.Lock()
	defer d.in.mu.Unlock()
	d.fake(xproto.MotionNotify, 0, int16(x), int16(y))
	return d.sync()
}

func checkButton(b int) error {
	if b < 1 || b > 9 {
		return fmt.Errorf("x11: button %d not in 1..9: %w", b, desktop.ErrInvalid)
	}
	return nil
}

// ButtonDown presses button 1..9.
func (d *Desktop) ButtonDown(button int) error {
	if err := checkButton(button); err != nil {
		return err
	}
	d.in.mu.Lock()
	defer d.in.mu.Unlock()
	d.fake(xproto.ButtonPress, byte(button), 0, 0)
	return d.sync()
}

// ButtonUp releases button 1..9.
func (d *Desktop) ButtonUp(button int) error {
	if err := checkButton(button); err != nil {
		return err
	}
	d.in.mu.Lock()
	defer d.in.mu.Unlock()
	d.fake(xproto.ButtonRelease, byte(button), 0, 0)
	return d.sync()
}

// Click presses and releases button count times at the pointer position.
func (d *Desktop) Click(button, count int) error {
	if err := checkButton(button); err != nil {
		return err
	}
	if count < 1 || count > maxClicks {
		return fmt.Errorf("x11: click count %d not in 1..%d: %w", count, maxClicks, desktop.ErrInvalid)
	}
	d.in.mu.Lock()
	defer d.in.mu.Unlock()
	for i := 0; i < count; i++ {
		d.fake(xproto.ButtonPress, byte(button), 0, 0)
		d.fake(xproto.ButtonRelease, byte(button), 0, 0)
	}
	return d.sync()
}

// Scroll clicks the wheel buttons: dy>0 down (5), dy<0 up (4), dx>0 right
// (7), dx<0 left (6), one click per notch.
func (d *Desktop) Scroll(dx, dy int) error {
	if dx < -maxScroll || dx > maxScroll || dy < -maxScroll || dy > maxScroll {
		return fmt.Errorf("x11: scroll (%d,%d) beyond %d notches: %w", dx, dy, maxScroll, desktop.ErrInvalid)
	}
	d.in.mu.Lock()
	defer d.in.mu.Unlock()
	notch := func(button byte, n int) {
		for ; n > 0; n-- {
			d.fake(xproto.ButtonPress, button, 0, 0)
			d.fake(xproto.ButtonRelease, button, 0, 0)
		}
	}
	if dy > 0 {
		notch(5, dy)
	} else {
		notch(4, -dy)
	}
	if dx > 0 {
		notch(7, dx)
	} else {
		notch(6, -dx)
	}
	return d.sync()
}

// pressKey presses the key for ks, with Shift when the keysym sits on the
// shifted level. in.mu must be held.
func (d *Desktop) pressKey(ks uint32) (xproto.Keycode, bool, error) {
	p, err := d.keyFor(ks)
	if err != nil {
		return 0, false, err
	}
	if p.shift {
		sk, err := d.shiftKey()
		if err != nil {
			return 0, false, err
		}
		d.fake(xproto.KeyPress, byte(sk), 0, 0)
	}
	d.fake(xproto.KeyPress, byte(p.kc), 0, 0)
	return p.kc, p.shift, nil
}

func (d *Desktop) releaseKey(kc xproto.Keycode, shift bool) error {
	d.fake(xproto.KeyRelease, byte(kc), 0, 0)
	if shift {
		sk, err := d.shiftKey()
		if err != nil {
			return err
		}
		d.fake(xproto.KeyRelease, byte(sk), 0, 0)
	}
	return nil
}

// KeyDown presses one key (keysym name or alias) and keeps it down. Keys
// on the shifted level ("A", "!") are pressed with Shift.
func (d *Desktop) KeyDown(name string) error {
	ks, err := resolveKey(name)
	if err != nil {
		return err
	}
	d.in.mu.Lock()
	defer d.in.mu.Unlock()
	kc, shift, err := d.pressKey(ks)
	if err != nil {
		return err
	}
	if d.in.held == nil {
		d.in.held = map[xproto.Keycode]bool{}
	}
	d.in.held[kc] = shift
	d.setPinned(kc, true)
	return d.sync()
}

// KeyUp releases a key, along with the Shift KeyDown added for it.
func (d *Desktop) KeyUp(name string) error {
	ks, err := resolveKey(name)
	if err != nil {
		return err
	}
	d.in.mu.Lock()
	defer d.in.mu.Unlock()
	p, err := d.keyFor(ks)
	if err != nil {
		return err
	}
	shift := d.in.held[p.kc]
	delete(d.in.held, p.kc)
	if err := d.releaseKey(p.kc, shift); err != nil {
		return err
	}
	err = d.sync()
	d.unpin(p.kc)
	return err
}

// KeyCombo presses the keys in order and releases them in reverse.
func (d *Desktop) KeyCombo(names []string) error {
	if len(names) == 0 || len(names) > maxComboKeys {
		return fmt.Errorf("x11: key combo of %d keys, want 1..%d: %w", len(names), maxComboKeys, desktop.ErrInvalid)
	}
	syms := make([]uint32, len(names))
	for i, n := range names {
		ks, err := resolveKey(n)
		if err != nil {
			return err
		}
		syms[i] = ks
	}
	d.in.mu.Lock()
	defer d.in.mu.Unlock()
	type pressed struct {
		kc    xproto.Keycode
		shift bool
	}
	down := make([]pressed, 0, len(syms))
	var err error
	for _, ks := range syms {
		var p pressed
		if p.kc, p.shift, err = d.pressKey(ks); err != nil {
			break
		}
		d.setPinned(p.kc, true)
		down = append(down, p)
	}
	// Release whatever went down, even after an error, so no key sticks.
	for i := len(down) - 1; i >= 0; i-- {
		if rerr := d.releaseKey(down[i].kc, down[i].shift); rerr != nil && err == nil {
			err = rerr
		}
		d.unpin(down[i].kc)
	}
	if serr := d.sync(); err == nil {
		err = serr
	}
	return err
}

// TypeText types UTF-8 text. Characters missing from the keymap are typed
// through temporarily remapped spare keycodes; upper-case letters and
// shifted symbols are typed with Shift. "\n" is Return, "\t" Tab.
func (d *Desktop) TypeText(text string) error {
	if len(text) > maxTypeLength {
		return fmt.Errorf("x11: text of %d bytes exceeds %d: %w", len(text), maxTypeLength, desktop.ErrInvalid)
	}
	if !utf8.ValidString(text) {
		return fmt.Errorf("x11: text is not valid UTF-8: %w", desktop.ErrInvalid)
	}
	d.in.mu.Lock()
	defer d.in.mu.Unlock()
	var shiftDown bool
	var shiftKC xproto.Keycode
	setShift := func(on bool) error {
		if on == shiftDown {
			return nil
		}
		if shiftKC == 0 {
			kc, err := d.shiftKey()
			if err != nil {
				return err
			}
			shiftKC = kc
		}
		if on {
			d.fake(xproto.KeyPress, byte(shiftKC), 0, 0)
		} else {
			d.fake(xproto.KeyRelease, byte(shiftKC), 0, 0)
		}
		shiftDown = on
		return nil
	}
	var err error
	for i, r := range text {
		if r == '\r' && i+1 < len(text) && text[i+1] == '\n' {
			continue // CRLF types one Return
		}
		var p keyPos
		if p, err = d.keyFor(runeKeysym(r)); err != nil {
			break
		}
		if err = setShift(p.shift); err != nil {
			break
		}
		d.fake(xproto.KeyPress, byte(p.kc), 0, 0)
		d.fake(xproto.KeyRelease, byte(p.kc), 0, 0)
	}
	if serr := setShift(false); err == nil {
		err = serr
	}
	if serr := d.sync(); err == nil {
		err = serr
	}
	return err
}
