package aci

import (
	"context"
	"time"

	aciv1 "github.com/forkfleet/forkfleet/api/gen/forkfleet/aci/v1"
	"github.com/forkfleet/forkfleet/guestd/internal/desktop"
	"github.com/forkfleet/forkfleet/guestd/internal/ready"
)

// ReadyWindows is what the image's window conditions need of a Desktop
// beyond ListWindows (x11.Desktop has it). A desktop without it cannot
// satisfy window conditions.
type ReadyWindows interface {
	// InputFocus is the top-level window holding the keyboard focus (0:
	// none).
	InputFocus() (uint32, error)
	// WatchWindows sends on kick, without blocking, whenever windows,
	// titles or the focus may have changed, until ctx ends.
	WatchWindows(ctx context.Context, kick chan<- struct{}) error
}

// readiness is one look at the desktop.
type readiness struct {
	x    desktop.ReadyState
	apps ready.Status
}

func (r readiness) xReady() bool { return r.x.XUp && r.x.WMUp && r.x.RootPainted }

// waitingFor names the first thing missing.
func (r readiness) waitingFor() string {
	switch {
	case !r.x.XUp:
		return "the X server"
	case !r.x.WMUp:
		return "the window manager"
	case !r.x.RootPainted:
		return "the root window to be painted"
	}
	return r.apps.WaitingFor
}

type milestones struct{ xUp, wmUp, painted, windows, content, focused time.Duration }

// probeReady looks at d: the X-level probe, then (once X answers) the
// image's window conditions.
func (s *Server) probeReady(ctx context.Context, d Desktop) (readiness, error) {
	st, err := d.Ready(ctx)
	if err != nil {
		return readiness{}, err
	}
	r := readiness{x: st, apps: ready.Status{WindowsMapped: true, ContentReady: true, Focused: true}}
	c := s.opts.Ready
	if !c.NeedsWindows() {
		return r, nil
	}
	r.apps = ready.Status{WaitingFor: "the X server"}
	if !st.XUp {
		return r, nil
	}
	rw, ok := d.(ReadyWindows)
	if !ok {
		r.apps.WaitingFor = "windows (this desktop cannot report them)"
		return r, nil
	}
	ws, err := d.ListWindows()
	if err != nil {
		return readiness{}, err
	}
	focus, err := rw.InputFocus()
	if err != nil {
		return readiness{}, err
	}
	r.apps = c.Check(ws, focus)
	return r, nil
}

// watchReady probes d until the desktop is ready, then pushes a
// ReadyEvent to every session. The X-level probe is polled (1 ms doubling
// to 50 ms: a fresh desktop is announced within a few ms); the window
// conditions also wake on X window events (a window mapped, retitled or
// focused), so the moment an app becomes usable is not lost to polling.
func (s *Server) watchReady(ctx context.Context, d Desktop) {
	kick := make(chan struct{}, 1)
	if rw, ok := d.(ReadyWindows); ok && s.opts.Ready.NeedsWindows() {
		wctx, cancel := context.WithCancel(ctx)
		done := make(chan struct{})
		go func() {
			defer close(done)
			if err := rw.WatchWindows(wctx, kick); err != nil && wctx.Err() == nil {
				s.log.Debug("window watch ended; readiness polls", "err", err)
			}
		}()
		defer func() { cancel(); <-done }()
	}
	delay := time.Millisecond
	t := time.NewTimer(0)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		case <-kick:
		}
		if r, err := s.probeReady(ctx, d); err == nil {
			if resp := s.noteReady(r); resp != nil {
				s.broadcast(&aciv1.ServerMessage{Reply: &aciv1.ServerMessage_Event{Event: &aciv1.Event{
					Event: &aciv1.Event_Ready{Ready: &aciv1.ReadyEvent{State: resp}}}}})
				return
			}
		}
		t.Reset(delay)
		if delay < 50*time.Millisecond {
			delay *= 2
		}
	}
}

// noteReady records first-seen milestones and, on the transition to ready,
// returns the state to announce.
func (s *Server) noteReady(r readiness) *aciv1.ReadyResponse {
	now := s.since()
	c := s.opts.Ready
	s.mu.Lock()
	defer s.mu.Unlock()
	m := &s.milest
	first := func(at *time.Duration, reached bool) {
		if reached && *at == 0 {
			*at = now
		}
	}
	first(&m.xUp, r.x.XUp)
	first(&m.wmUp, r.x.WMUp)
	first(&m.painted, r.x.RootPainted)
	first(&m.windows, c.NeedsWindows() && r.x.XUp && r.apps.WindowsMapped)
	first(&m.content, c.HasTitles() && r.x.XUp && r.apps.ContentReady)
	first(&m.focused, c.HasFocus() && r.x.XUp && r.apps.Focused)
	if s.ready != nil || !r.xReady() || !r.apps.Holds() {
		return nil
	}
	s.ready = s.readyLocked(r)
	return s.ready
}

// readyLocked is the ReadyResponse for r: the X-level parts and the app
// conditions as they are now; ready once the app conditions all held at
// once (they may lapse later: an agent closing the app does not make the
// desktop unready, a replica of it is usable).
func (s *Server) readyLocked(r readiness) *aciv1.ReadyResponse {
	ms := func(d time.Duration) uint64 {
		if d == 0 {
			return 0
		}
		return uint64(max(d.Milliseconds(), 1))
	}
	m := &s.milest
	resp := &aciv1.ReadyResponse{
		Ready: r.xReady() && (s.ready != nil || r.apps.Holds()), XUp: r.x.XUp, WmUp: r.x.WMUp, RootPainted: r.x.RootPainted,
		XUpMs: ms(m.xUp), WmUpMs: ms(m.wmUp), PaintedMs: ms(m.painted),
		WindowsMapped: r.apps.WindowsMapped, ContentReady: r.apps.ContentReady, Focused: r.apps.Focused,
		WindowsMappedMs: ms(m.windows), ContentReadyMs: ms(m.content), FocusedMs: ms(m.focused),
	}
	if !resp.Ready {
		resp.WaitingFor = r.waitingFor()
	}
	return resp
}

// readyState answers a ReadyRequest with a fresh look at the desktop.
func (s *Server) readyState(ctx context.Context) *aciv1.ReadyResponse {
	var r readiness
	if d, err := s.desktop(); err == nil {
		if p, err := s.probeReady(ctx, d); err == nil {
			r = p
			if resp := s.noteReady(r); resp != nil {
				// The probe saw readiness before the watcher did: announce it now.
				s.broadcast(&aciv1.ServerMessage{Reply: &aciv1.ServerMessage_Event{Event: &aciv1.Event{
					Event: &aciv1.Event_Ready{Ready: &aciv1.ReadyEvent{State: resp}}}}})
			}
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.readyLocked(r)
}
