//go:build linux

package x11

import (
	"context"
	"fmt"
	"image"
	"sync"

	"github.com/jezek/xgb/damage"
	"github.com/jezek/xgb/xfixes"
	"github.com/jezek/xgb/xproto"

	"github.com/forkfleet/forkfleet/api/errdefs"
)

// maxPendingRects is how many rectangles a slow watcher may have queued
// before they collapse into their bounding box.
const maxPendingRects = 32

// damager tracks screen changes with one DAMAGE object on the root at
// report level NonEmpty: the server sends one event when damage appears,
// then stays quiet until the damage is subtracted. A worker subtracts it
// into a region (so nothing drawn between the event and the subtract is
// lost), fetches the rectangles and hands them to the watchers. With no
// watchers the damage is left non-empty, so an idle desktop costs nothing.
type damager struct {
	dmg    damage.Damage
	region xfixes.Region
	wake   chan struct{}

	mu       sync.Mutex
	watchers map[*watcher]struct{}
	fresh    bool // first watcher registered: discard stale damage
}

type watcher struct {
	mu      sync.Mutex
	pending []image.Rectangle
	signal  chan struct{}
}

func (m *damager) init(d *Desktop) error {
	m.wake = make(chan struct{}, 1)
	m.watchers = map[*watcher]struct{}{}
	var err error
	if m.dmg, err = damage.NewDamageId(d.conn); err != nil {
		return xerr("allocate damage id", err)
	}
	if m.region, err = xfixes.NewRegionId(d.conn); err != nil {
		return xerr("allocate region id", err)
	}
	if err := xfixes.CreateRegionChecked(d.conn, m.region, nil).Check(); err != nil {
		return xerr("XFIXES CreateRegion", err)
	}
	if err := damage.CreateChecked(d.conn, m.dmg, xproto.Drawable(d.root), damage.ReportLevelNonEmpty).Check(); err != nil {
		return xerr("DAMAGE Create", err)
	}
	return nil
}

// kick wakes the worker; called from the event goroutine, never blocks.
func (m *damager) kick() {
	select {
	case m.wake <- struct{}{}:
	default:
	}
}

func (m *damager) loop(d *Desktop) {
	for {
		select {
		case <-d.dead:
			return
		case <-m.wake:
		}
		m.mu.Lock()
		n, fresh := len(m.watchers), m.fresh
		m.fresh = false
		m.mu.Unlock()
		if n == 0 {
			continue // leave the damage set: no more events until re-armed
		}
		if fresh {
			damage.Subtract(d.conn, m.dmg, 0, 0)
			continue
		}
		damage.Subtract(d.conn, m.dmg, 0, m.region)
		r, err := xfixes.FetchRegion(d.conn, m.region).Reply()
		if err != nil || r == nil {
			continue // connection loss ends the loop through d.dead
		}
		rects := make([]image.Rectangle, 0, len(r.Rectangles))
		for _, x := range r.Rectangles {
			rects = append(rects, image.Rect(int(x.X), int(x.Y), int(x.X)+int(x.Width), int(x.Y)+int(x.Height)))
		}
		if len(rects) > maxPendingRects {
			e := r.Extents
			rects = append(rects[:0], image.Rect(int(e.X), int(e.Y), int(e.X)+int(e.Width), int(e.Y)+int(e.Height)))
		}
		m.mu.Lock()
		for w := range m.watchers {
			w.push(rects)
		}
		m.mu.Unlock()
	}
}

func (w *watcher) push(rects []image.Rectangle) {
	if len(rects) == 0 {
		return
	}
	w.mu.Lock()
	w.pending = append(w.pending, rects...)
	if len(w.pending) > maxPendingRects {
		u := w.pending[0]
		for _, r := range w.pending[1:] {
			u = u.Union(r)
		}
		w.pending = append(w.pending[:0], u)
	}
	w.mu.Unlock()
	select {
	case w.signal <- struct{}{}:
	default:
	}
}

func (w *watcher) take() []image.Rectangle {
	w.mu.Lock()
	defer w.mu.Unlock()
	p := w.pending
	w.pending = nil
	return p
}

// WatchDamage delivers the rectangles of screen changes (root
// coordinates) to ch until ctx ends, then returns ctx.Err(); it returns
// an error wrapping errdefs.ErrUnavailable if the connection is lost. It
// blocks, so run it in its own goroutine. When ch is not drained,
// rectangles queue up and coalesce into their bounding box; the X event
// goroutine never waits. ch is not closed. Any number of watchers may run.
func (d *Desktop) WatchDamage(ctx context.Context, ch chan<- image.Rectangle) error {
	if ch == nil {
		return fmt.Errorf("x11: watch damage: nil channel: %w", errdefs.ErrInvalidArgument)
	}
	if !d.alive() {
		return fmt.Errorf("x11: watch damage: connection lost: %w", errdefs.ErrUnavailable)
	}
	w := &watcher{signal: make(chan struct{}, 1)}
	m := &d.dmg
	m.mu.Lock()
	m.watchers[w] = struct{}{}
	first := len(m.watchers) == 1
	if first {
		m.fresh = true
	}
	m.mu.Unlock()
	if first {
		// Re-arm: the damage may have stayed set while nobody watched.
		m.kick()
	}
	defer func() {
		m.mu.Lock()
		delete(m.watchers, w)
		m.mu.Unlock()
	}()
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-d.dead:
			return fmt.Errorf("x11: watch damage: connection lost: %w", errdefs.ErrUnavailable)
		case <-w.signal:
		}
		for _, r := range w.take() {
			select {
			case ch <- r:
			case <-ctx.Done():
				return ctx.Err()
			case <-d.dead:
				return fmt.Errorf("x11: watch damage: connection lost: %w", errdefs.ErrUnavailable)
			}
		}
	}
}
