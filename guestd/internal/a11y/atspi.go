// Package a11y reads and acts on the sandbox's accessibility tree: guestd
// speaks AT-SPI2 over D-Bus itself (no libatspi, no Python), on the bus it
// started (config "a11y"). Every call is bounded: each application gets its
// own deadline, so one that stops answering costs its timeout and leaves a
// partial tree, never a hung session.
package a11y

import (
	"strconv"

	"github.com/forkfleet/forkfleet/api/aci/a11yrules"
	"github.com/forkfleet/forkfleet/api/aci/wire"
)

// AT-SPI2 names (at-spi2-core's xml/ interface definitions).
const (
	registryName  = "org.a11y.atspi.Registry"
	rootPath      = objectPath("/org/a11y/atspi/accessible/root")
	nullPath      = objectPath("/org/a11y/atspi/null")
	cachePath     = objectPath("/org/a11y/atspi/cache")
	ifAccessible  = "org.a11y.atspi.Accessible"
	ifCache       = "org.a11y.atspi.Cache"
	ifComponent   = "org.a11y.atspi.Component"
	ifAction      = "org.a11y.atspi.Action"
	ifApplication = "org.a11y.atspi.Application"
	ifText        = "org.a11y.atspi.Text"
	ifEditable    = "org.a11y.atspi.EditableText"
	ifValue       = "org.a11y.atspi.Value"
	ifProperties  = "org.freedesktop.DBus.Properties"
	coordScreen   = uint32(0) // ATSPI_COORD_TYPE_SCREEN
	scrollAnyWher = uint32(4) // ATSPI_SCROLL_ANYWHERE
)

// AT-SPI states this package looks at (AtspiStateType bit numbers).
const (
	StateActive     = 1
	StateDefunct    = 6
	StateEditable   = 7
	StateFocused    = 12
	stateFocusable  = 11
	stateSelectable = 22
	StateShowing    = 25
	StateVisible    = 30
)

// AT-SPI roles this package looks at (AtspiRole).
const (
	roleApplication  = 75
	roleDesktop      = 14 // desktop frame
	rolePasswordText = 40
)

// roleNames are AtspiRole's names (atspi_role_get_name), by number.
var roleNames = [...]string{
	"invalid", "accelerator label", "alert", "animation", "arrow", "calendar", "canvas", "check box",
	"check menu item", "color chooser", "column header", "combo box", "date editor", "desktop icon",
	"desktop frame", "dial", "dialog", "directory pane", "drawing area", "file chooser", "filler",
	"focus traversable", "font chooser", "frame", "glass pane", "html container", "icon", "image",
	"internal frame", "label", "layered pane", "list", "list item", "menu", "menu bar", "menu item",
	"option pane", "page tab", "page tab list", "panel", "password text", "popup menu", "progress bar",
	"push button", "radio button", "radio menu item", "root pane", "row header", "scroll bar",
	"scroll pane", "separator", "slider", "spin button", "split pane", "status bar", "table",
	"table cell", "table column header", "table row header", "tear off menu item", "terminal", "text",
	"toggle button", "tool bar", "tool tip", "tree", "tree table", "unknown", "viewport", "window",
	"extended", "header", "footer", "paragraph", "ruler", "application", "autocomplete", "edit bar",
	"embedded", "entry", "chart", "caption", "document frame", "heading", "page", "section",
	"redundant object", "form", "link", "input method window", "table row", "tree item",
	"document spreadsheet", "document presentation", "document text", "document web", "document email",
	"comment", "list box", "grouping", "image map", "notification", "info bar", "level bar", "title bar",
	"block quote", "audio", "video", "definition", "article", "landmark", "log", "marquee", "math",
	"rating", "timer", "static", "math fraction", "math root", "subscript", "superscript",
	"description list", "description term", "description value", "footnote", "content deletion",
	"content insertion", "mark", "suggestion", "push button menu",
}

// RoleName is the name of AT-SPI role r ("role 200" for one this table
// predates).
func RoleName(r uint32) string {
	if int(r) < len(roleNames) {
		return roleNames[r]
	}
	return "role " + strconv.FormatUint(uint64(r), 10)
}

// StateNames are AtspiStateType's names, by bit number.
var StateNames = wire.A11yStates

// objectPath is a D-Bus object path.
type objectPath string

// IsValid: "/" or "/"-separated non-empty elements of [A-Za-z0-9_].
func (p objectPath) IsValid() bool { return a11yrules.ValidObjectPath(string(p)) }

// ref names one accessible object: its application's unique bus name and
// its object path.
type ref struct {
	Bus  string
	Path objectPath
}

func (r ref) null() bool { return r.Bus == "" || r.Path == nullPath || r.Path == "" }

// String is the handle a11y_action takes: "<bus name>:<path>".
func (r ref) String() string { return r.Bus + ":" + string(r.Path) }

// parseRef parses String's form (a11yrules.ParseRef: a unique bus name,
// which nothing else on the bus can take over, and a valid path).
func parseRef(s string) (ref, bool) {
	bus, path, ok := a11yrules.ParseRef(s)
	return ref{Bus: bus, Path: objectPath(path)}, ok
}

// states packs AT-SPI's two 32-bit words into one set.
func states(words []uint32) uint64 {
	var s uint64
	if len(words) > 0 {
		s = uint64(words[0])
	}
	if len(words) > 1 {
		s |= uint64(words[1]) << 32
	}
	return s
}

func has(set uint64, state int) bool { return set&(1<<state) != 0 }
