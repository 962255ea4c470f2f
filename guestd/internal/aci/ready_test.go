package aci

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	aciv1 "github.com/forkfleet/forkfleet/api/gen/forkfleet/aci/v1"
	"github.com/forkfleet/forkfleet/guestd/internal/config"
	"github.com/forkfleet/forkfleet/guestd/internal/desktop"
	"github.com/forkfleet/forkfleet/guestd/internal/ready"
)

// windowDesktop is a fakeDesktop whose windows and focus a test sets; every
// change kicks the watchers, as X events would.
type windowDesktop struct {
	*fakeDesktop
	wmu     sync.Mutex
	windows []desktop.Window
	focus   uint32
	kicks   []chan<- struct{}
}

func (w *windowDesktop) set(ws []desktop.Window, focus uint32) {
	w.wmu.Lock()
	w.windows, w.focus = ws, focus
	kicks := append([]chan<- struct{}(nil), w.kicks...)
	w.wmu.Unlock()
	for _, k := range kicks {
		select {
		case k <- struct{}{}:
		default:
		}
	}
}

func (w *windowDesktop) ListWindows() ([]desktop.Window, error) {
	w.wmu.Lock()
	defer w.wmu.Unlock()
	return append([]desktop.Window(nil), w.windows...), nil
}

func (w *windowDesktop) InputFocus() (uint32, error) {
	w.wmu.Lock()
	defer w.wmu.Unlock()
	return w.focus, nil
}

func (w *windowDesktop) WatchWindows(ctx context.Context, kick chan<- struct{}) error {
	w.wmu.Lock()
	w.kicks = append(w.kicks, kick)
	w.wmu.Unlock()
	<-ctx.Done()
	return ctx.Err()
}

func TestReadyWaitsForTheImagesWindows(t *testing.T) {
	conds, err := ready.New(config.Ready{Windows: []config.ReadyWindow{
		{Name: "term", Class: "XTerm", Focus: true},
		{Name: "page", Class: "Chromium", Title: `^start page`},
	}})
	if err != nil {
		t.Fatal(err)
	}
	h := newHarness(t, func(o *Options) { o.Ready = conds })
	h.srv.SetDesktop(nil)
	h.srv.mu.Lock()
	h.srv.ready = nil
	h.srv.mu.Unlock()
	wd := &windowDesktop{fakeDesktop: h.desk}
	h.srv.SetDesktop(wd)
	c := h.session(aciToken)
	readyNow := func() *aciv1.ReadyResponse {
		t.Helper()
		return call(t, c, &aciv1.ClientMessage{Request: &aciv1.ClientMessage_Ready{Ready: &aciv1.ReadyRequest{}}}).GetReady()
	}
	r := readyNow()
	if r.GetReady() || !r.GetXUp() || r.GetWindowsMapped() || !strings.Contains(r.GetWaitingFor(), "window term (class XTerm) to be mapped") {
		t.Fatalf("no windows yet: %v", r)
	}
	term := desktop.Window{ID: 5, Class: "XTerm", Instance: "xterm", Title: "xterm", Mapped: true}
	page := desktop.Window{ID: 6, Class: "Chromium", Title: "loading", Mapped: true}
	wd.set([]desktop.Window{term, page}, 0)
	r = readyNow()
	if r.GetReady() || !r.GetWindowsMapped() || r.GetContentReady() || r.GetFocused() || r.GetWindowsMappedMs() == 0 ||
		!strings.Contains(r.GetWaitingFor(), `the title of window page (class Chromium) to match "^start page"`) ||
		!strings.Contains(r.GetWaitingFor(), "window term (class XTerm) to hold the input focus") {
		t.Fatalf("mapped, not loaded or focused: %v", r)
	}
	// A minimized window does not count; the focus on the wrong window
	// neither.
	min := term
	min.Minimized = true
	page.Title = "start page - Chromium"
	wd.set([]desktop.Window{min, page}, 6)
	if r = readyNow(); r.GetReady() || r.GetWindowsMapped() || !r.GetContentReady() {
		t.Fatalf("minimized term: %v", r)
	}
	// Everything at once: the watcher (woken by the window events) pushes
	// the ReadyEvent.
	wd.set([]desktop.Window{term, page}, 5)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	st, err := c.WaitReady(ctx)
	if err != nil || !st.GetReady() || st.GetFocusedMs() == 0 || st.GetContentReadyMs() == 0 || st.GetWaitingFor() != "" {
		t.Fatalf("ready event: %v %v", st, err)
	}
	// Usable once is usable: an agent closing the app later does not make
	// the desktop unready (a replica of it is usable too).
	wd.set(nil, 0)
	if r = readyNow(); !r.GetReady() || r.GetWindowsMapped() || r.GetFocused() {
		t.Fatalf("after the windows went: %v", r)
	}
}

func TestReadyWithoutConditions(t *testing.T) {
	h := newHarness(t)
	c := h.session(aciToken)
	r := call(t, c, &aciv1.ClientMessage{Request: &aciv1.ClientMessage_Ready{Ready: &aciv1.ReadyRequest{}}}).GetReady()
	if !r.GetReady() || !r.GetWindowsMapped() || !r.GetContentReady() || !r.GetFocused() ||
		r.GetWindowsMappedMs() != 0 || r.GetContentReadyMs() != 0 || r.GetFocusedMs() != 0 {
		t.Fatalf("an image naming no window: %v", r)
	}
}
