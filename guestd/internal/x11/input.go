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

	"github.com/forkfleet/forkfleet/api/errdefs"
)

// Limits on one call, so a bad request cannot queue minutes of input.
const (
	maxClicks     = 100
	maxScroll     = 1000
	maxComboKeys  = 16
	maxTypeLength = 64 << 10
)

// Characters missing from the keymap are typed through spare keycodes
// (empty in the keymap) remapped to the character's keysym. Clients do not
// translate a key event when it arrives: Xlib notes a MappingNotify when it
// reads the event off the socket and fetches the new map when the
// application next translates a key, which may be many events later; GDK
// and xkbcommon clients fetch when they process the notify. Either way the
// client translates a keycode with the map as it is at that later moment.
// So a spare keycode may change meaning only once every client that got
// events of it has translated them: before a slot pressed since the last
// proof is remapped, awaitTaken waits until the client that receives the
// keys has processed everything sent so far (keysTaken in taken.go). Slots
// keep their characters afterwards (no restore timer: putting a keycode
// back is a remap too), so text that repeats characters remaps nothing.

// remapFallbackDelay is the pause before a slot is reused when the
// recipient of the keys cannot be watched (a client in another process
// namespace, a server without X-Resource, guestd's own test clients): a
// generous allowance, the best that can be done without seeing the client.
var remapFallbackDelay = 100 * time.Millisecond

// input is the keyboard state: cached keymap, keys held through KeyDown and
// the scratch keycodes used for characters absent from the keymap.
type input struct {
	mu    sync.Mutex
	stale atomic.Bool // set by the event loop on MappingNotify

	km *keymap
	// held maps keycodes pressed by KeyDown to whether an implicit Shift
	// was pressed with them.
	held map[xproto.Keycode]bool
	// scratch are the keycodes free for remapping (empty in the keymap, or
	// holding what guestd wrote there).
	scratch []scratchSlot
	// pressSeq counts presses of scratch slots; taken is the pressSeq up
	// to which the recipients proved they translated them.
	pressSeq, taken uint64
	// recipients are the clients (pids; -1: unknown) that received scratch
	// presses after the last proof.
	recipients []int
	// awaitTaken proves that a client translated every key sent so far
	// (Desktop.keysTaken; tests replace it).
	awaitTaken func(pid int) error
}

// scratchSlot is one column of a spare keycode: column 0 (no modifier) or
// column 1 (Shift), so each spare keycode carries two characters.
type scratchSlot struct {
	kc      xproto.Keycode
	shift   bool
	keysym  uint32 // currently mapped keysym, 0 if none
	pinned  bool   // held down through KeyDown
	used    uint64 // LRU clock
	pressed uint64 // pressSeq of the last press (0: not pressed)
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
	in.scratch = rescanScratch(in.scratch, km, empty)
	in.km = km
	return km, nil
}

// rescanScratch keeps the slots whose keycode still holds exactly what
// guestd wrote there (another client, setxkbmap say, may have remapped it:
// such a keycode is no longer guestd's) and adds keycodes that became empty.
func rescanScratch(old []scratchSlot, km *keymap, empty []xproto.Keycode) []scratchSlot {
	out := make([]scratchSlot, 0, 2*len(empty))
	kept := map[xproto.Keycode]bool{}
	for i := 0; i < len(old); i++ {
		kc := old[i].kc
		if kept[kc] {
			continue
		}
		var pair []scratchSlot
		for _, s := range old {
			if s.kc == kc {
				pair = append(pair, s)
			}
		}
		if sameScratchRow(km.row(kc), scratchRow(km.per, kc, pair)) {
			kept[kc] = true
			out = append(out, pair...)
		}
	}
	for _, kc := range empty {
		if !kept[kc] {
			out = append(out, scratchSlot{kc: kc}, scratchSlot{kc: kc, shift: true})
		}
	}
	return out
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
		return keyPos{}, fmt.Errorf("x11: no spare keycode to type keysym 0x%x: %w", ks, errdefs.ErrUnavailable)
	}
	if d.in.scratch[best].pressed > d.in.taken {
		// The slot's last character may still be waiting for its
		// translation. One proof frees every slot pressed so far, so long
		// non-Latin text waits once per len(scratch) distinct characters.
		if err := d.proveTaken(); err != nil {
			return keyPos{}, err
		}
	}
	slot := &d.in.scratch[best]
	slot.keysym = ks
	slot.used = lruClock.Add(1)
	slot.pressed = 0
	d.writeScratchRow(km.per, slot.kc)
	if err := d.remapTaken(); err != nil {
		return keyPos{}, err
	}
	return keyPos{kc: slot.kc, shift: slot.shift}, nil
}

// remapTaken waits until the client that receives the keys has processed
// the notify of a remap just written, before its key is pressed. Xlib and
// xkbcommon clients translate with the map as it is when they translate,
// but Chromium refreshes its keymap from the notify in a task of its own, so
// a key pressed at once was translated with the old map (the first
// non-keymap character of a text was lost in 3 runs of 5 on a 2-core host).
// The wait is keysTaken's proof, which covers the notify as it covers
// keys. A client guestd cannot watch gets no wait here: the fallback delay
// on every remap would cost more than it proves. in.mu must be held.
func (d *Desktop) remapTaken() error {
	pid, err := d.keyRecipient()
	if err != nil || pid <= 0 {
		return err
	}
	wait := d.in.awaitTaken
	if wait == nil {
		wait = d.keysTaken
	}
	return wait(pid)
}

// proveTaken waits until every client that received scratch presses since
// the last proof has translated them. in.mu must be held.
func (d *Desktop) proveTaken() error {
	wait := d.in.awaitTaken
	if wait == nil {
		wait = d.keysTaken
	}
	for _, pid := range d.in.recipients {
		if err := wait(pid); err != nil {
			return err
		}
	}
	d.in.recipients = d.in.recipients[:0]
	d.in.taken = d.in.pressSeq
	return nil
}

// notePress records a press of kc (shifted or not) for the proof that must
// come before its slot is remapped: the client receiving it is looked up
// once per batch of presses. in.mu must be held.
func (d *Desktop) notePress(p keyPos) error {
	i := slices.IndexFunc(d.in.scratch, func(s scratchSlot) bool { return s.kc == p.kc && s.shift == p.shift })
	if i < 0 {
		return nil
	}
	if d.in.pressSeq == d.in.taken || len(d.in.recipients) == 0 {
		// First press after a proof: find who gets it. A focus change in
		// the middle of a batch adds the new recipient at the next proof.
		pid, err := d.keyRecipient()
		if err != nil {
			return err
		}
		if !slices.Contains(d.in.recipients, pid) {
			d.in.recipients = append(d.in.recipients, pid)
		}
	}
	d.in.pressSeq++
	d.in.scratch[i].pressed = d.in.pressSeq
	return nil
}

// sameScratchRow compares a row read back from the server with the one
// guestd wrote: on the columns XTEST can select (two groups of two levels);
// an XKB server reports further columns as it likes.
func sameScratchRow(got, wrote []xproto.Keysym) bool {
	n := min(4, len(got), len(wrote))
	return len(got) == len(wrote) && slices.Equal(got[:n], wrote[:n])
}

// scratchRow is the keysym row of a spare keycode holding the given slots:
// the pair fills both groups' columns so the group in use does not matter;
// a lone column-0 keysym fills both levels so Shift does not matter.
func scratchRow(per int, kc xproto.Keycode, slots []scratchSlot) []xproto.Keysym {
	var k [2]uint32
	for _, s := range slots {
		if s.kc == kc {
			if s.shift {
				k[1] = s.keysym
			} else {
				k[0] = s.keysym
			}
		}
	}
	syms := make([]xproto.Keysym, per)
	for i := range min(4, per) {
		if k[1] == 0 {
			syms[i] = xproto.Keysym(k[0])
		} else {
			syms[i] = xproto.Keysym(k[i%2])
		}
	}
	return syms
}

// writeScratchRow maps a spare keycode to the keysyms of its two slots.
func (d *Desktop) writeScratchRow(per int, kc xproto.Keycode) {
	xproto.ChangeKeyboardMapping(d.conn, 1, kc, byte(per), scratchRow(per, kc, d.in.scratch))
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

// restoreScratch empties every scratch keycode when the connection closes
// (guestd stops or loses X): nothing will be typed through them any more.
func (in *input) restoreScratch(d *Desktop) {
	in.mu.Lock()
	defer in.mu.Unlock()
	if in.km == nil || !d.alive() {
		return
	}
	var changed []xproto.Keycode
	for i := range in.scratch {
		s := &in.scratch[i]
		if s.keysym == 0 {
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
		return fmt.Errorf("x11: move to (%d,%d): outside the %dx%d screen: %w", x, y, d.width, d.height, errdefs.ErrInvalidArgument)
	}
	d.in.mu.Lock()
	defer d.in.mu.Unlock()
	d.fake(xproto.MotionNotify, 0, int16(x), int16(y))
	return d.sync()
}

func checkButton(b int) error {
	if b < 1 || b > 9 {
		return fmt.Errorf("x11: button %d not in 1..9: %w", b, errdefs.ErrInvalidArgument)
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
		return fmt.Errorf("x11: click count %d not in 1..%d: %w", count, maxClicks, errdefs.ErrInvalidArgument)
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
		return fmt.Errorf("x11: scroll (%d,%d) beyond %d notches: %w", dx, dy, maxScroll, errdefs.ErrInvalidArgument)
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
	if err := d.notePress(p); err != nil {
		return 0, false, err
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
	// The release is translated too, maybe long after a proof that
	// covered the press.
	if err := d.notePress(p); err != nil {
		return err
	}
	if err := d.releaseKey(p.kc, shift); err != nil {
		return err
	}
	err = d.sync()
	d.setPinned(p.kc, false)
	return err
}

// KeyCombo presses the keys in order and releases them in reverse.
func (d *Desktop) KeyCombo(names []string) error {
	if len(names) == 0 || len(names) > maxComboKeys {
		return fmt.Errorf("x11: key combo of %d keys, want 1..%d: %w", len(names), maxComboKeys, errdefs.ErrInvalidArgument)
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
		d.setPinned(down[i].kc, false)
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
		return fmt.Errorf("x11: text of %d bytes exceeds %d: %w", len(text), maxTypeLength, errdefs.ErrInvalidArgument)
	}
	if !utf8.ValidString(text) {
		return fmt.Errorf("x11: text is not valid UTF-8: %w", errdefs.ErrInvalidArgument)
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
		if err = d.notePress(p); err != nil {
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
