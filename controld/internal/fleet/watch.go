package fleet

import (
	"context"
	"slices"
	"strings"
	"sync"

	"google.golang.org/protobuf/proto"

	"github.com/forkfleet/forkfleet/api/errdefs"
	controldv1 "github.com/forkfleet/forkfleet/api/gen/forkfleet/controld/v1"
	"github.com/forkfleet/forkfleet/api/rules"
)

// Watch is one subscriber to sandbox lifecycle events. Events arrive on C;
// when C closes, Err says why (nil after Close). A watcher that does not keep
// up is dropped (C closes, Err is ResourceExhausted) instead of slowing the
// manager down.
type Watch struct {
	m      *registry
	C      <-chan *controldv1.WatchSandboxesResponse
	ch     chan *controldv1.WatchSandboxesResponse
	ids    map[string]bool
	labels map[string]string

	mu     sync.Mutex
	err    error
	closed bool
}

func (w *Watch) matches(s *controldv1.Sandbox) bool {
	if len(w.ids) > 0 && !w.ids[s.GetId()] {
		return false
	}
	return rules.MatchLabels(s.GetLabels(), w.labels)
}

// Err returns why C closed.
func (w *Watch) Err() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.err
}

// send delivers ev without blocking; false means the buffer was full.
func (w *Watch) send(ev *controldv1.WatchSandboxesResponse) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.closed {
		return true
	}
	select {
	case w.ch <- ev:
		return true
	default:
		return false
	}
}

func (w *Watch) closeWith(err error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.closed {
		return
	}
	w.closed = true
	w.err = err
	close(w.ch)
}

// Close unsubscribes.
func (w *Watch) Close() {
	w.m.wmu.Lock()
	delete(w.m.watchers, w)
	w.m.wmu.Unlock()
	w.closeWith(nil)
}

// WatchSandboxes subscribes to lifecycle events of the matching sandboxes;
// the first events are EXISTING ones for every matching sandbox. The watch
// ends with ctx.
func (m *Manager) WatchSandboxes(ctx context.Context, req *controldv1.WatchSandboxesRequest) (*Watch, error) {
	for i, id := range req.GetIds() {
		if err := rules.SandboxID(rules.FieldIndex("ids", i), id); err != nil {
			return nil, err
		}
	}
	if err := rules.Labels("labels", req.GetLabels()); err != nil {
		return nil, err
	}
	ch := make(chan *controldv1.WatchSandboxesResponse, m.opts.WatchBuffer)
	w := &Watch{m: m.registry, C: ch, ch: ch, labels: copyMap(req.GetLabels())}
	if len(req.GetIds()) > 0 {
		w.ids = map[string]bool{}
		for _, id := range req.GetIds() {
			w.ids[id] = true
		}
	}
	// Snapshot and subscribe atomically with respect to state changes
	// (publishers take wmu after changing state), so no event falls between.
	m.mu.Lock()
	if err := m.checkOpen(); err != nil {
		m.mu.Unlock()
		return nil, err
	}
	var existing []*controldv1.Sandbox
	for _, sb := range m.sandboxes {
		if !sb.deleting && w.matches(sb.rec.Sandbox) {
			existing = append(existing, proto.Clone(sb.rec.Sandbox).(*controldv1.Sandbox))
		}
	}
	m.wmu.Lock()
	m.mu.Unlock()
	if m.watchesClosed {
		m.wmu.Unlock()
		return nil, errdefs.WithReason(errdefs.ErrUnavailable, "SHUTTING_DOWN", "controld is shutting down")
	}
	slices.SortFunc(existing, func(a, b *controldv1.Sandbox) int { return strings.Compare(rules.SandboxKey(a), rules.SandboxKey(b)) })
	if len(existing) > cap(ch) {
		m.wmu.Unlock()
		return nil, errdefs.WithReason(errdefs.ErrResourceExhausted, "WATCH_TOO_LARGE",
			"%d sandboxes match, more than a watch buffers (%d); narrow the watch with ids or labels", len(existing), cap(ch))
	}
	for _, s := range existing {
		ch <- &controldv1.WatchSandboxesResponse{Type: controldv1.SandboxEventType_SANDBOX_EVENT_TYPE_EXISTING, Sandbox: s}
	}
	m.watchers[w] = struct{}{}
	m.wmu.Unlock()
	context.AfterFunc(ctx, w.Close)
	return w, nil
}

// publish fans ev out to every matching watcher without blocking.
func (m *registry) publish(ev *controldv1.WatchSandboxesResponse) {
	m.wmu.Lock()
	defer m.wmu.Unlock()
	for w := range m.watchers {
		if !w.matches(ev.Sandbox) {
			continue
		}
		if !w.send(ev) {
			delete(m.watchers, w)
			m.metrics.WatchDropped.Inc()
			w.closeWith(errdefs.WithReason(errdefs.ErrResourceExhausted, "WATCH_TOO_SLOW",
				"watch fell more than %d events behind and was dropped; watch again", cap(w.ch)))
		}
	}
}

// CloseWatches ends every watch (clients see Unavailable and re-watch),
// e.g. before a graceful stop that would otherwise wait for the streams.
func (m *Manager) CloseWatches() {
	m.wmu.Lock()
	defer m.wmu.Unlock()
	m.watchesClosed = true
	for w := range m.watchers {
		w.closeWith(errdefs.WithReason(errdefs.ErrUnavailable, "SHUTTING_DOWN", "controld is shutting down"))
		delete(m.watchers, w)
	}
}
