// Package ready decides when a desktop is usable by an agent: the image's
// readiness conditions (guestd.json "ready", config.Ready) checked against
// the top-level windows and the window holding the input focus. The ACI
// server combines them with its X-level milestones (X up, window manager,
// painted root) into the ReadyResponse.
package ready

import (
	"fmt"
	"regexp"

	"github.com/forkfleet/forkfleet/guestd/internal/config"
	"github.com/forkfleet/forkfleet/guestd/internal/desktop"
)

// Conditions is one image's definition of usable. The zero value (or nil)
// names no window: every Status field is then true.
type Conditions struct {
	windows []window
}

type window struct {
	name  string
	class string
	title *regexp.Regexp // nil: any title
	focus bool
}

// New compiles the conditions (config validation already checked them).
func New(r config.Ready) (*Conditions, error) {
	c := &Conditions{}
	for i, w := range r.Windows {
		cw := window{name: w.Name, class: w.Class, focus: w.Focus}
		if w.Title != "" {
			re, err := regexp.Compile(w.Title)
			if err != nil {
				return nil, fmt.Errorf("ready.windows[%d].title: %w", i, err)
			}
			cw.title = re
		}
		c.windows = append(c.windows, cw)
	}
	return c, nil
}

// NeedsWindows reports whether checking takes the window list.
func (c *Conditions) NeedsWindows() bool { return c != nil && len(c.windows) > 0 }

// Status is how far the conditions hold.
type Status struct {
	// WindowsMapped: every named window is mapped (and not minimized).
	WindowsMapped bool
	// ContentReady: every named window's title matches its pattern.
	ContentReady bool
	// Focused: the window named for focus holds the input focus.
	Focused bool
	// WaitingFor says what is missing, for humans ("" when all hold).
	WaitingFor string
}

// Holds reports whether every condition holds.
func (s Status) Holds() bool { return s.WindowsMapped && s.ContentReady && s.Focused }

// Check evaluates the conditions against the top-level windows ws and the
// top-level window holding the input focus (0: none).
func (c *Conditions) Check(ws []desktop.Window, focus uint32) Status {
	st := Status{WindowsMapped: true, ContentReady: true, Focused: true}
	if c == nil {
		return st
	}
	var waits []string
	for _, cw := range c.windows {
		mapped, loaded, focused := false, false, false
		for _, w := range ws {
			if !w.Mapped || w.Minimized || (cw.class != "" && w.Class != cw.class && w.Instance != cw.class) {
				continue
			}
			titled := cw.title == nil || cw.title.MatchString(w.Title)
			if cw.class == "" && !titled {
				continue // a title pattern alone names the window by its title
			}
			mapped = true
			loaded = loaded || titled
			focused = focused || w.ID == focus
		}
		switch {
		case !mapped:
			st.WindowsMapped = false
			waits = append(waits, fmt.Sprintf("%s to be mapped", cw.describe()))
		case !loaded:
			waits = append(waits, fmt.Sprintf("the title of %s to match %q", cw.describe(), cw.title))
		}
		if !loaded && cw.title != nil {
			st.ContentReady = false
		}
		if cw.focus && !focused {
			st.Focused = false
			if mapped {
				waits = append(waits, fmt.Sprintf("%s to hold the input focus", cw.describe()))
			}
		}
	}
	for i, w := range waits {
		if i == 0 {
			st.WaitingFor = w
		} else {
			st.WaitingFor += "; " + w
		}
	}
	return st
}

func (cw window) describe() string {
	switch {
	case cw.name != "" && cw.class != "" && cw.class != cw.name:
		return fmt.Sprintf("window %s (class %s)", cw.name, cw.class)
	case cw.name != "":
		return "window " + cw.name
	case cw.class != "":
		return "the window of class " + cw.class
	}
	return fmt.Sprintf("the window titled %q", cw.title)
}

// HasTitles reports whether some named window has a title pattern.
func (c *Conditions) HasTitles() bool {
	if c == nil {
		return false
	}
	for _, w := range c.windows {
		if w.title != nil {
			return true
		}
	}
	return false
}

// HasFocus reports whether a window is named for the input focus.
func (c *Conditions) HasFocus() bool {
	if c == nil {
		return false
	}
	for _, w := range c.windows {
		if w.focus {
			return true
		}
	}
	return false
}
