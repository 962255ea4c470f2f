package aci

import (
	"context"

	aciv1 "github.com/forkfleet/forkfleet/api/gen/forkfleet/aci/v1"
)

type subscriber struct {
	ch   chan *aciv1.Event
	stop func() bool
}

// Events subscribes to pushed events (readiness, screencast frames, cursor).
// The channel is closed when ctx is done or the session closes. A subscriber
// that falls behind loses its oldest queued events (counted by
// EventsDropped); the session never blocks on a slow subscriber.
// Events survive reconnects: a subscription spans connections.
func (s *Session) Events(ctx context.Context) <-chan *aciv1.Event {
	sub := &subscriber{ch: make(chan *aciv1.Event, s.cfg.eventBuffer)}
	s.subsMu.Lock()
	if s.subs == nil { // session closed
		s.subsMu.Unlock()
		close(sub.ch)
		return sub.ch
	}
	s.subs[sub] = struct{}{}
	// Set under the lock: closeSubscribers reads it. The AfterFunc runs on
	// its own goroutine, so it simply waits for the lock.
	sub.stop = context.AfterFunc(ctx, func() { s.unsubscribe(sub) })
	s.subsMu.Unlock()
	return sub.ch
}

// OnEvent calls fn for every pushed event, in order, on a goroutine of its
// own (a slow fn loses the oldest events, never stalls the session), until
// the returned cancel is called or the session closes.
func (s *Session) OnEvent(fn func(*aciv1.Event)) (cancel func()) {
	ctx, cancel := context.WithCancel(context.Background())
	ch := s.Events(ctx)
	go func() {
		for ev := range ch {
			fn(ev)
		}
	}()
	return cancel
}

// EventsDropped is how many events were discarded because a subscriber's
// buffer was full.
func (s *Session) EventsDropped() uint64 { return s.dropped.Load() }

func (s *Session) unsubscribe(sub *subscriber) {
	s.subsMu.Lock()
	_, ok := s.subs[sub]
	if ok {
		delete(s.subs, sub)
		close(sub.ch)
	}
	s.subsMu.Unlock()
}

func (s *Session) closeSubscribers() {
	s.subsMu.Lock()
	subs := s.subs
	s.subs = nil
	stops := make([]func() bool, 0, len(subs))
	for sub := range subs {
		close(sub.ch)
		stops = append(stops, sub.stop)
	}
	s.subsMu.Unlock()
	for _, stop := range stops {
		stop()
	}
}

// dispatch runs on the reader goroutine, the only sender on subscriber
// channels, so the drop-oldest dance below cannot race another sender.
func (s *Session) dispatch(ev *aciv1.Event) {
	s.subsMu.RLock()
	defer s.subsMu.RUnlock()
	for sub := range s.subs {
		for {
			select {
			case sub.ch <- ev:
			default:
				select {
				case <-sub.ch:
					s.dropped.Add(1)
				default:
				}
				continue
			}
			break
		}
	}
}
