//go:build linux

package x11

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/jezek/xgb/xproto"

	"github.com/forkfleet/forkfleet/api/errdefs"
)

const (
	// maxClipboardSet keeps a served selection inside one core
	// ChangeProperty request (262140 bytes without BIG-REQUESTS); larger
	// transfers would need the INCR protocol on the serving side.
	maxClipboardSet = 256000
	// maxClipboardGet bounds what ClipboardGet accepts from other owners.
	maxClipboardGet = 16 << 20
	// defaultClipboardTimeout applies when the caller's context has no
	// deadline: an owner that never answers must not hang the call.
	defaultClipboardTimeout = 2 * time.Second
)

// clipboard is the CLIPBOARD selection this process owns, if any.
type clipboard struct {
	mu    sync.Mutex
	owned bool
	text  string
	time  xproto.Timestamp

	getMu sync.Mutex // one conversion at a time: they share a property
}

func (c *clipboard) lost(e xproto.SelectionClearEvent) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if e.Time >= c.time || e.Time == 0 {
		c.owned, c.text = false, ""
	}
}

// serverTime obtains a real server timestamp (ICCCM forbids CurrentTime
// for SetSelectionOwner) from the PropertyNotify of an empty append.
func (d *Desktop) serverTime(ctx context.Context) (xproto.Timestamp, error) {
	drainProps(d.props)
	xproto.ChangeProperty(d.conn, xproto.PropModeAppend, d.win, d.atoms.tsProp, xproto.AtomInteger, 32, 0, nil)
	for {
		select {
		case e := <-d.props:
			if e.Atom == d.atoms.tsProp {
				return e.Time, nil
			}
		case <-d.dead:
			return 0, fmt.Errorf("x11: wait for server time: connection lost: %w", errdefs.ErrUnavailable)
		case <-ctx.Done():
			return 0, ctxErr(ctx)
		}
	}
}

func drainProps(ch chan xproto.PropertyNotifyEvent) {
	for {
		select {
		case <-ch:
		default:
			return
		}
	}
}

// ClipboardSet takes ownership of CLIPBOARD and serves text to whoever
// asks (UTF8_STRING, STRING, TEXT, TARGETS, TIMESTAMP).
func (d *Desktop) ClipboardSet(text string) error {
	if len(text) > maxClipboardSet {
		return fmt.Errorf("x11: clipboard text of %d bytes exceeds %d: %w", len(text), maxClipboardSet, errdefs.ErrInvalidArgument)
	}
	if !utf8.ValidString(text) {
		return fmt.Errorf("x11: clipboard text is not valid UTF-8: %w", errdefs.ErrInvalidArgument)
	}
	ctx, cancel := context.WithTimeout(context.Background(), defaultClipboardTimeout)
	defer cancel()
	d.clip.getMu.Lock() // serverTime consumes d.props
	ts, err := d.serverTime(ctx)
	d.clip.getMu.Unlock()
	if err != nil {
		return err
	}
	d.clip.mu.Lock()
	d.clip.text, d.clip.time, d.clip.owned = text, ts, true
	d.clip.mu.Unlock()
	xproto.SetSelectionOwner(d.conn, d.win, d.atoms.clipboard, ts)
	r, err := xproto.GetSelectionOwner(d.conn, d.atoms.clipboard).Reply()
	if err != nil {
		return xerr("GetSelectionOwner", err)
	}
	if r == nil || r.Owner != d.win {
		return fmt.Errorf("x11: could not take ownership of CLIPBOARD: %w", errdefs.ErrUnavailable)
	}
	return nil
}

// serveSelection answers a SelectionRequest; it only sends requests and
// never waits for replies.
func (d *Desktop) serveSelection(e xproto.SelectionRequestEvent) {
	d.clip.mu.Lock()
	owned, text, ts := d.clip.owned, d.clip.text, d.clip.time
	d.clip.mu.Unlock()

	prop := e.Property
	if prop == 0 {
		prop = e.Target // obsolete requestors (ICCCM 2.2)
	}
	ok := owned && e.Selection == d.atoms.clipboard && e.Owner == d.win &&
		(e.Time == 0 || e.Time >= ts)
	if ok {
		switch e.Target {
		case d.atoms.targets:
			list := []xproto.Atom{d.atoms.targets, d.atoms.utf8String, xproto.AtomString, d.atoms.text, d.atoms.timestamp}
			buf := make([]byte, 4*len(list))
			for i, a := range list {
				xgbPut32(buf[4*i:], uint32(a))
			}
			xproto.ChangeProperty(d.conn, xproto.PropModeReplace, e.Requestor, prop, xproto.AtomAtom, 32, uint32(len(list)), buf)
		case d.atoms.utf8String, d.atoms.text:
			xproto.ChangeProperty(d.conn, xproto.PropModeReplace, e.Requestor, prop, d.atoms.utf8String, 8, uint32(len(text)), []byte(text))
		case xproto.AtomString:
			latin := toLatin1(text)
			xproto.ChangeProperty(d.conn, xproto.PropModeReplace, e.Requestor, prop, xproto.AtomString, 8, uint32(len(latin)), latin)
		case d.atoms.timestamp:
			var buf [4]byte
			xgbPut32(buf[:], uint32(ts))
			xproto.ChangeProperty(d.conn, xproto.PropModeReplace, e.Requestor, prop, xproto.AtomInteger, 32, 1, buf[:])
		default:
			ok = false
		}
	}
	if !ok {
		prop = 0 // refusal
	}
	ev := xproto.SelectionNotifyEvent{
		Time: e.Time, Requestor: e.Requestor, Selection: e.Selection, Target: e.Target, Property: prop,
	}
	xproto.SendEvent(d.conn, false, e.Requestor, xproto.EventMaskNoEvent, string(ev.Bytes()))
}

func xgbPut32(b []byte, v uint32) {
	b[0], b[1], b[2], b[3] = byte(v), byte(v>>8), byte(v>>16), byte(v>>24)
}

// toLatin1 converts for the STRING target; characters outside Latin-1
// become '?'.
func toLatin1(s string) []byte {
	out := make([]byte, 0, len(s))
	for _, r := range s {
		if r > 0xff {
			r = '?'
		}
		out = append(out, byte(r))
	}
	return out
}

func fromLatin1(b []byte) string {
	var sb strings.Builder
	sb.Grow(len(b))
	for _, c := range b {
		sb.WriteRune(rune(c))
	}
	return sb.String()
}

// ClipboardGet returns the text on CLIPBOARD ("" when nobody owns it or
// the owner offers no text). Without a deadline on ctx it gives up after
// two seconds with errdefs.ErrDeadlineExceeded.
func (d *Desktop) ClipboardGet(ctx context.Context) (string, error) {
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, defaultClipboardTimeout)
		defer cancel()
	}
	d.clip.mu.Lock()
	owned, text := d.clip.owned, d.clip.text
	d.clip.mu.Unlock()
	owner, err := xproto.GetSelectionOwner(d.conn, d.atoms.clipboard).Reply()
	if err != nil {
		return "", xerr("GetSelectionOwner", err)
	}
	if owner == nil {
		return "", errNilReply("GetSelectionOwner")
	}
	switch {
	case owner.Owner == 0:
		return "", nil
	case owner.Owner == d.win && owned:
		return text, nil
	}

	d.clip.getMu.Lock()
	defer d.clip.getMu.Unlock()
	for _, target := range []xproto.Atom{d.atoms.utf8String, xproto.AtomString} {
		s, ok, err := d.convert(ctx, target)
		if err != nil || ok {
			return s, err
		}
	}
	return "", nil
}

// convert asks the owner for target and reads the result, following the
// INCR protocol for large transfers. ok is false when the owner refused.
func (d *Desktop) convert(ctx context.Context, target xproto.Atom) (string, bool, error) {
	for { // drop notifications of conversions that timed out earlier
		select {
		case <-d.sel:
			continue
		default:
		}
		break
	}
	drainProps(d.props)
	xproto.DeleteProperty(d.conn, d.win, d.atoms.selProp)
	xproto.ConvertSelection(d.conn, d.win, d.atoms.clipboard, target, d.atoms.selProp, xproto.TimeCurrentTime)
	var ev xproto.SelectionNotifyEvent
	select {
	case ev = <-d.sel:
	case <-d.dead:
		return "", false, fmt.Errorf("x11: clipboard: connection lost: %w", errdefs.ErrUnavailable)
	case <-ctx.Done():
		return "", false, fmt.Errorf("x11: clipboard owner did not answer: %w", ctxErr(ctx))
	}
	if ev.Property == 0 {
		return "", false, nil
	}
	r, err := xproto.GetProperty(d.conn, true, d.win, d.atoms.selProp, xproto.GetPropertyTypeAny, 0, maxClipboardGet/4).Reply()
	if err != nil {
		return "", false, xerr("read selection property", err)
	}
	if r == nil {
		return "", false, errNilReply("read selection property")
	}
	if r.Type == d.atoms.incr {
		data, err := d.readIncr(ctx)
		if err != nil {
			return "", false, err
		}
		return decodeText(target, data), true, nil
	}
	if r.BytesAfter > 0 {
		return "", false, fmt.Errorf("x11: clipboard text exceeds %d bytes: %w", maxClipboardGet, errdefs.ErrInvalidArgument)
	}
	return decodeText(r.Type, r.Value), true, nil
}

func decodeText(typ xproto.Atom, b []byte) string {
	if typ == xproto.AtomString {
		return fromLatin1(b)
	}
	return strings.ToValidUTF8(string(b), "\uFFFD")
}

// readIncr receives an INCR transfer: the owner writes chunks into our
// property, each announced by PropertyNotify(NewValue) and acknowledged by
// deleting it; a zero-length chunk ends the transfer. The initial INCR
// property was already deleted by the GetProperty that read it.
func (d *Desktop) readIncr(ctx context.Context) ([]byte, error) {
	var data []byte
	for {
		select {
		case e := <-d.props:
			if e.Atom != d.atoms.selProp || e.State != xproto.PropertyNewValue {
				continue
			}
		case <-d.dead:
			return nil, fmt.Errorf("x11: clipboard: connection lost: %w", errdefs.ErrUnavailable)
		case <-ctx.Done():
			return nil, fmt.Errorf("x11: clipboard INCR transfer stalled: %w", ctxErr(ctx))
		}
		r, err := xproto.GetProperty(d.conn, true, d.win, d.atoms.selProp, xproto.GetPropertyTypeAny, 0, maxClipboardGet/4).Reply()
		if err != nil {
			return nil, xerr("read INCR chunk", err)
		}
		if r == nil {
			return nil, errNilReply("read INCR chunk")
		}
		if len(r.Value) == 0 {
			return data, nil
		}
		if len(data)+len(r.Value) > maxClipboardGet {
			return nil, fmt.Errorf("x11: clipboard text exceeds %d bytes: %w", maxClipboardGet, errdefs.ErrInvalidArgument)
		}
		data = append(data, r.Value...)
	}
}
