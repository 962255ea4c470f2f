//go:build linux

package x11

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jezek/xgb/damage"
	"github.com/jezek/xgb/xproto"

	"github.com/forkfleet/forkfleet/api/errdefs"
)

// damageSyncTimeout bounds one DamageSeqSync round trip: a server that does
// not answer in this time is treated as unable to prove anything.
const damageSyncTimeout = 2 * time.Second

// damageSeq counts screen changes so a caller can prove that nothing was
// drawn between two moments without capturing a frame.
//
// A second DAMAGE object on the root, at report level RawRectangles, makes
// the server send an event for every drawing operation on the screen
// (windows draw into the root's pixmap, so the root's damage covers them);
// the event goroutine counts them. Raw level needs no re-arming, so no
// change can fall between an event and a Subtract, which is what the
// NonEmpty object of damager would allow.
//
// Events arrive in server order, but xgb hands replies and events to
// different goroutines, so a reply alone does not prove that the events
// before it were counted. The sync marker is therefore itself an event: a
// ClientMessage sent to our own helper window. When the event goroutine
// sees marker k, every damage event the server generated before
// processing marker k's SendEvent has been counted.
type damageSeq struct {
	dmg  damage.Damage
	atom xproto.Atom
	err  error // why the sequence is unavailable; nil when on

	count atomic.Uint64
	dirty dirtyRows // for the screen mirror

	mu       sync.Mutex
	sent     uint32        // last marker token sent
	seen     uint32        // last marker token processed by the event goroutine
	progress chan struct{} // closed and replaced whenever seen advances
}

// init sets up the counting DAMAGE object. A failure leaves the
// sequence off (DamageSeqSync then reports why); capture keeps working.
func (m *damageSeq) init(d *Desktop) {
	m.progress = make(chan struct{})
	m.err = m.setup(d)
}

func (m *damageSeq) setup(d *Desktop) error {
	ar, err := xproto.InternAtom(d.conn, false, uint16(len(damageSyncAtom)), damageSyncAtom).Reply()
	if err != nil {
		return xerr("intern "+damageSyncAtom, err)
	}
	if ar == nil {
		return errNilReply("intern " + damageSyncAtom)
	}
	m.atom = ar.Atom
	id, err := damage.NewDamageId(d.conn)
	if err != nil {
		return xerr("allocate damage id", err)
	}
	if err := damage.CreateChecked(d.conn, id, xproto.Drawable(d.root), damage.ReportLevelRawRectangles).Check(); err != nil {
		return xerr("DAMAGE Create (raw)", err)
	}
	m.dmg = id
	return nil
}

const damageSyncAtom = "_FORKFLEET_DAMAGE_SYNC"

// damaged is called by the event goroutine for every DAMAGE event; it
// reports whether the event belonged to the counting object.
func (m *damageSeq) damaged(e damage.NotifyEvent) bool {
	if m.err != nil || e.Damage != m.dmg {
		return false
	}
	m.dirty.add(e.Area)
	m.count.Add(1)
	return true
}

// marker is called by the event goroutine for a ClientMessage on the
// helper window; it reports whether the event was a sync marker.
func (m *damageSeq) marker(e xproto.ClientMessageEvent) bool {
	if m.err != nil || e.Type != m.atom || e.Format != 32 {
		return false
	}
	tok := e.Data.Data32[0]
	m.mu.Lock()
	// Tokens are sent in order and the server keeps that order, so a
	// marker also completes every earlier one.
	if int32(tok-m.seen) > 0 {
		m.seen = tok
		close(m.progress)
		m.progress = make(chan struct{})
	}
	m.mu.Unlock()
	return true
}

// DamageSeqSync returns a counter of the screen changes the X server has
// made, once every change it made before this call has been counted. Two
// results are equal only if the screen was not drawn to between the
// first call and the second one, so a frame captured after the first call
// returned is still current at the second. It takes one round trip. The
// counter is per Desktop: results of different Desktops (a reconnect)
// must not be compared. It fails with an error wrapping
// errdefs.ErrUnavailable when the server cannot support it or the
// connection is lost.
func (d *Desktop) DamageSeqSync(ctx context.Context) (uint64, error) {
	if err := ctx.Err(); err != nil {
		return 0, err // not after a round trip that raced the cancel
	}
	m := &d.seq
	if m.err != nil {
		return 0, fmt.Errorf("x11: damage sequence: %v: %w", m.err, errdefs.ErrUnavailable)
	}
	if !d.alive() {
		return 0, fmt.Errorf("x11: damage sequence: connection lost: %w", errdefs.ErrUnavailable)
	}
	// Sending under the lock keeps tokens in wire order.
	m.mu.Lock()
	m.sent++
	tok := m.sent
	ev := xproto.ClientMessageEvent{
		Format: 32,
		Window: d.win,
		Type:   m.atom,
		Data:   xproto.ClientMessageDataUnionData32New([]uint32{tok, 0, 0, 0, 0}),
	}
	// An empty event mask delivers the event to the window's creator: us.
	xproto.SendEvent(d.conn, false, d.win, 0, string(ev.Bytes()))
	m.mu.Unlock()

	t := time.NewTimer(damageSyncTimeout)
	defer t.Stop()
	for {
		m.mu.Lock()
		done, progress := int32(m.seen-tok) >= 0, m.progress
		m.mu.Unlock()
		if done {
			return m.count.Load(), nil
		}
		select {
		case <-progress:
		case <-ctx.Done():
			return 0, ctxErr(ctx)
		case <-d.dead:
			return 0, fmt.Errorf("x11: damage sequence: connection lost: %w", errdefs.ErrUnavailable)
		case <-t.C:
			return 0, fmt.Errorf("x11: damage sequence: no answer within %s: %w", damageSyncTimeout, errdefs.ErrUnavailable)
		}
	}
}
