package controldfake

import (
	"slices"

	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"

	controldv1 "github.com/forkfleet/forkfleet/api/gen/forkfleet/controld/v1"
	"github.com/forkfleet/forkfleet/api/rules"
)

// watcher is one WatchSandboxes stream. Events queue without bound (a fake
// has few) so emit never blocks while holding f.mu.
type watcher struct {
	req    *controldv1.WatchSandboxesRequest
	queue  []*controldv1.WatchSandboxesResponse
	notify chan struct{}
	done   chan struct{}
}

func (w *watcher) matches(sb *controldv1.Sandbox) bool {
	if len(w.req.GetIds()) > 0 && !slices.Contains(w.req.GetIds(), sb.GetId()) {
		return false
	}
	return rules.MatchLabels(sb.GetLabels(), w.req.GetLabels())
}

// emit queues an event for every matching watcher; the caller holds f.mu.
func (f *Fake) emit(t controldv1.SandboxEventType, sb *controldv1.Sandbox, phase *controldv1.BootPhase) {
	for w := range f.watchers {
		if !w.matches(sb) {
			continue
		}
		w.queue = append(w.queue, &controldv1.WatchSandboxesResponse{Type: t, Sandbox: proto.CloneOf(sb), Phase: proto.CloneOf(phase)})
		select {
		case w.notify <- struct{}{}:
		default:
		}
	}
}

func (f *Fake) WatchSandboxes(req *controldv1.WatchSandboxesRequest, stream grpc.ServerStreamingServer[controldv1.WatchSandboxesResponse]) error {
	for i, id := range req.GetIds() {
		if err := rules.SandboxID(rules.FieldIndex("ids", i), id); err != nil {
			return rpcErr(err)
		}
	}
	if err := rules.Labels("labels", req.GetLabels()); err != nil {
		return rpcErr(err)
	}
	w := &watcher{req: req, notify: make(chan struct{}, 1), done: make(chan struct{})}
	f.mu.Lock()
	if f.closed {
		f.mu.Unlock()
		return nil
	}
	var ids []string
	for id, sb := range f.sandboxes {
		if w.matches(sb) {
			ids = append(ids, id)
		}
	}
	slices.Sort(ids)
	for _, id := range ids {
		w.queue = append(w.queue, &controldv1.WatchSandboxesResponse{
			Type: controldv1.SandboxEventType_SANDBOX_EVENT_TYPE_EXISTING, Sandbox: proto.CloneOf(f.sandboxes[id])})
	}
	f.watchers[w] = struct{}{}
	f.mu.Unlock()
	defer func() {
		f.mu.Lock()
		delete(f.watchers, w)
		f.mu.Unlock()
	}()
	for {
		f.mu.Lock()
		batch := w.queue
		w.queue = nil
		f.mu.Unlock()
		for _, ev := range batch {
			if err := stream.Send(ev); err != nil {
				return err
			}
		}
		select {
		case <-w.notify:
		case <-w.done:
			return nil
		case <-stream.Context().Done():
			return nil
		}
	}
}
