package ready

import (
	"testing"

	"github.com/forkfleet/forkfleet/guestd/internal/config"
	"github.com/forkfleet/forkfleet/guestd/internal/desktop"
)

func TestCheck(t *testing.T) {
	var none *Conditions
	if st := none.Check(nil, 0); !st.Holds() || st.WaitingFor != "" || none.NeedsWindows() {
		t.Fatalf("no conditions: %+v", st)
	}
	c, err := New(config.Ready{Windows: []config.ReadyWindow{
		{Title: `^Inbox`, Focus: true}, // a title alone names the window
		{Class: "xterm"},               // the instance matches too
	}})
	if err != nil {
		t.Fatal(err)
	}
	if !c.NeedsWindows() || !c.HasTitles() || !c.HasFocus() {
		t.Fatal("kinds")
	}
	term := desktop.Window{ID: 1, Class: "XTerm", Instance: "xterm", Mapped: true}
	mail := desktop.Window{ID: 2, Class: "Mail", Title: "Loading", Mapped: true}
	for _, tc := range []struct {
		name                     string
		ws                       []desktop.Window
		focus                    uint32
		mapped, content, focused bool
		waiting                  string
	}{
		{"nothing", nil, 0, false, false, false, `the window titled "^Inbox" to be mapped; the window of class xterm to be mapped`},
		{"title not yet", []desktop.Window{term, mail}, 2, false, false, false, `the window titled "^Inbox" to be mapped`},
		{"unmapped", []desktop.Window{{ID: 1, Class: "XTerm"}, {ID: 2, Title: "Inbox (3)", Mapped: true}}, 2, false, true, true, `the window of class xterm to be mapped`},
		{"focus elsewhere", []desktop.Window{term, {ID: 2, Title: "Inbox (3)", Mapped: true}}, 1, true, true, false, `the window titled "^Inbox" to hold the input focus`},
		{"all", []desktop.Window{term, {ID: 2, Title: "Inbox (3)", Mapped: true}}, 2, true, true, true, ``},
	} {
		st := c.Check(tc.ws, tc.focus)
		if st.WindowsMapped != tc.mapped || st.ContentReady != tc.content || st.Focused != tc.focused || st.WaitingFor != tc.waiting {
			t.Errorf("%s: %+v", tc.name, st)
		}
		if st.Holds() != (tc.mapped && tc.content && tc.focused) {
			t.Errorf("%s: Holds %v", tc.name, st.Holds())
		}
	}
}
