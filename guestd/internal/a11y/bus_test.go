package a11y

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/godbus/dbus/v5"

	aciv1 "github.com/forkfleet/forkfleet/api/gen/forkfleet/aci/v1"
	"github.com/forkfleet/forkfleet/guestd/internal/acierr"
	"github.com/forkfleet/forkfleet/guestd/internal/desktop"
)

// testBus runs a private dbus-daemon (Debian's dbus-daemon, which
// deploy/host-setup.sh installs) with the image's kind of configuration.
func testBus(t testing.TB) string {
	t.Helper()
	const daemon = "/usr/bin/dbus-daemon"
	if _, err := os.Stat(daemon); err != nil {
		t.Fatalf("%s is missing (deploy/host-setup.sh installs dbus-daemon): %v", daemon, err)
	}
	dir := t.TempDir()
	sock := filepath.Join(dir, "bus")
	conf := filepath.Join(dir, "bus.conf")
	os.WriteFile(conf, []byte(`<busconfig><type>session</type><listen>unix:path=`+sock+`</listen><auth>EXTERNAL</auth>
<policy context="default"><allow user="*"/><allow send_destination="*" eavesdrop="true"/><allow eavesdrop="true"/><allow own="*"/></policy>
<limit name="max_replies_per_connection">65536</limit></busconfig>`), 0o644)
	cmd := exec.Command(daemon, "--nofork", "--nopidfile", "--nosyslog", "--config-file="+conf)
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	// The socket file appears at bind, before the daemon listens: wait
	// until it accepts.
	for i := 0; i < 400; i++ {
		if c, err := net.Dial("unix", sock); err == nil {
			c.Close()
			return "unix:path=" + sock
		}
		time.Sleep(5 * time.Millisecond)
	}
	t.Fatal("dbus-daemon did not listen")
	return ""
}

// fakeToolkit is an application on the bus the way atk-bridge shows one:
// objects under rootPath and /n/<i>, a frame with n children, each a
// button with an action (no Cache interface, like Chromium's).
type fakeToolkit struct {
	conn  *dbus.Conn
	n     int
	stall chan struct{} // when set, every call waits on it (a stopped app)
	// getActions counts Action.GetActions calls; getRole, getState and
	// getChildren theirs.
	getActions, getRole, getState, getChildren atomic.Int32
	// mu guards names (by node: a renamed button) and extra (buttons
	// added after n).
	mu    sync.Mutex
	names map[int]string
	extra int
	// scroll moves every element's bounds up (a page scrolled, which
	// toolkits send no event for); checked marks buttons CHECKED.
	scroll  atomic.Int32
	checked map[int]bool
	// firstIsDoc makes button 0 a document (a browser's page).
	firstIsDoc bool
}

// check marks button i checked and says so (object:state-changed:checked).
func (f *fakeToolkit) check(t testing.TB, i int) {
	f.mu.Lock()
	f.checked[i] = true
	f.mu.Unlock()
	f.emit(t, dbus.ObjectPath(fmt.Sprintf("/n/%d", i)), "StateChanged", "checked")
}

// rename changes button i's name; with event, the toolkit says so as
// atk-bridge does (object:property-change:accessible-name).
func (f *fakeToolkit) rename(t testing.TB, i int, name string, event bool) {
	f.mu.Lock()
	f.names[i] = name
	f.mu.Unlock()
	if event {
		f.emit(t, dbus.ObjectPath(fmt.Sprintf("/n/%d", i)), "PropertyChange", "accessible-name")
	}
}

// add appends a button to the window and says so (children-changed:add).
func (f *fakeToolkit) add(t testing.TB) {
	f.mu.Lock()
	f.extra++
	f.mu.Unlock()
	f.emit(t, "/frame", "ChildrenChanged", "add")
}

func (f *fakeToolkit) emit(t testing.TB, path dbus.ObjectPath, member, detail string) {
	t.Helper()
	if err := f.conn.Emit(path, eventIface+"."+member, detail, int32(0), int32(0), dbus.MakeVariant(""), map[string]dbus.Variant{}); err != nil {
		t.Fatal(err)
	}
}

func (f *fakeToolkit) count() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.n + f.extra
}

// dref is a ref as godbus marshals it, (so).
type dref struct {
	Bus  string
	Path dbus.ObjectPath
}

func connect(t testing.TB, addr string) *dbus.Conn {
	t.Helper()
	c, err := dbus.Connect(addr, dbus.WithAuth(dbus.AuthExternal(strconv.Itoa(os.Getuid()))))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func startToolkit(t testing.TB, addr string, n int, stall chan struct{}) *fakeToolkit {
	f := &fakeToolkit{conn: connect(t, addr), n: n, stall: stall, names: map[int]string{}, checked: map[int]bool{}}
	self := f.conn.Names()[0]
	node := func(msg dbus.Message) int {
		p := string(msg.Headers[dbus.FieldPath].Value().(dbus.ObjectPath))
		if f.stall != nil {
			<-f.stall
		}
		switch {
		case p == string(rootPath):
			return -2
		case p == "/frame":
			return -1
		}
		i, err := strconv.Atoi(strings.TrimPrefix(p, "/n/"))
		if err != nil || i >= f.count() {
			return -3
		}
		return i
	}
	unknown := dbus.NewError("org.freedesktop.DBus.Error.UnknownObject", []any{"no such object"})
	acc := map[string]any{
		"GetRole": func(msg dbus.Message) (uint32, *dbus.Error) {
			f.getRole.Add(1)
			switch node(msg) {
			case -2:
				return roleApplication, nil
			case -1:
				return 23, nil
			case -3:
				return 0, unknown
			case 0:
				if f.firstIsDoc {
					return 95, nil
				}
			}
			return 43, nil
		},
		"GetState": func(msg dbus.Message) ([]uint32, *dbus.Error) {
			f.getState.Add(1)
			i := node(msg)
			if i == -3 {
				return nil, unknown
			}
			st := uint32(1<<StateShowing | 1<<stateFocusable | 1<<StateVisible)
			f.mu.Lock()
			if f.checked[i] {
				st |= 1 << 4
			}
			f.mu.Unlock()
			return []uint32{st, 0}, nil
		},
		"GetInterfaces": func(msg dbus.Message) ([]string, *dbus.Error) {
			return []string{ifAccessible, ifComponent, ifAction}, nil
		},
		"GetChildren": func(msg dbus.Message) ([]dref, *dbus.Error) {
			f.getChildren.Add(1)
			switch node(msg) {
			case -2:
				return []dref{{self, "/frame"}}, nil
			case -1:
				kids := make([]dref, f.count())
				for i := range kids {
					kids[i] = dref{self, dbus.ObjectPath(fmt.Sprintf("/n/%d", i))}
				}
				return kids, nil
			}
			return nil, nil
		},
	}
	props := map[string]any{
		"GetAll": func(msg dbus.Message, iface string) (map[string]dbus.Variant, *dbus.Error) {
			i := node(msg)
			name, count := fmt.Sprintf("button %d", i), int32(0)
			f.mu.Lock()
			if s, ok := f.names[i]; ok {
				name = s
			}
			f.mu.Unlock()
			switch i {
			case -2:
				name, count = "fake", 1
			case -1:
				name, count = "Fake window", int32(f.count())
			}
			return map[string]dbus.Variant{"Name": dbus.MakeVariant(name), "Description": dbus.MakeVariant(""), "ChildCount": dbus.MakeVariant(count)}, nil
		},
	}
	comp := map[string]any{
		"GetExtents": func(msg dbus.Message, coord uint32) (struct{ X, Y, W, H int32 }, *dbus.Error) {
			i := int32(node(msg))
			return struct{ X, Y, W, H int32 }{10, 20 + 30*max(i, 0) - f.scroll.Load(), 100, 25}, nil
		},
	}
	act := map[string]any{
		"GetActions": func(msg dbus.Message) ([]struct{ Name, Desc, Key string }, *dbus.Error) {
			node(msg)
			f.getActions.Add(1)
			return []struct{ Name, Desc, Key string }{{}}, nil // unnamed, as Chromium's
		},
		"GetName": func(msg dbus.Message, i int32) (string, *dbus.Error) { node(msg); return "press", nil },
	}
	for iface, table := range map[string]map[string]any{ifAccessible: acc, ifProperties: props, ifComponent: comp, ifAction: act} {
		for _, p := range []dbus.ObjectPath{dbus.ObjectPath(rootPath), "/frame", "/n"} {
			if err := f.conn.ExportSubtreeMethodTable(table, p, iface); err != nil {
				t.Fatal(err)
			}
		}
	}
	return f
}

// startRegistry owns the registry's name and lists apps as the desktop's
// children.
func startRegistry(t testing.TB, addr string, apps ...*fakeToolkit) {
	c := connect(t, addr)
	var refs []dref
	for _, a := range apps {
		refs = append(refs, dref{a.conn.Names()[0], dbus.ObjectPath(rootPath)})
	}
	if err := c.ExportMethodTable(map[string]any{
		"GetChildren": func() ([]dref, *dbus.Error) { return refs, nil },
	}, dbus.ObjectPath(rootPath), ifAccessible); err != nil {
		t.Fatal(err)
	}
	if err := c.ExportMethodTable(map[string]any{
		"RegisterEvent": func(event string, props []string, app string) *dbus.Error { return nil },
	}, "/org/a11y/atspi/registry", registryName); err != nil {
		t.Fatal(err)
	}
	if r, err := c.RequestName(registryName, dbus.NameFlagDoNotQueue); err != nil || r != dbus.RequestNameReplyPrimaryOwner {
		t.Fatalf("registry name: %v %v", r, err)
	}
}

func TestTreeOverDBus(t *testing.T) {
	addr := testBus(t)
	app := startToolkit(t, addr, 50, nil)
	startRegistry(t, addr, app)
	c := New(addr)
	defer c.Close()
	if err := c.WaitRegistry(context.Background()); err != nil {
		t.Fatal(err)
	}
	r, err := c.Tree(context.Background(), opts(), nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(r.Nodes) != 53 || r.Partial || !r.Bus {
		t.Fatalf("%d nodes (partial %v, bus %v), want desktop, app, frame and 50 buttons", len(r.Nodes), r.Partial, r.Bus)
	}
	b := r.Nodes[3]
	if b.Role != "push button" || b.Name != "button 0" || b.Bounds.GetY() != 20 || len(b.Actions) != 1 || b.Actions[0] != "press" || b.Window != 2 || b.App != 1 {
		t.Errorf("first button: %v", b)
	}
	if r.Apps[0].Pid != int32(os.Getpid()) || r.Apps[0].Name != "fake" {
		t.Errorf("app: %v", r.Apps[0])
	}
	// Actions go to the element by ref.
	if err := c.Action(context.Background(), &aciv1.A11YActionRequest{Ref: b.Ref, Kind: aciv1.A11YActionKind_A11Y_ACTION_KIND_DO, Action: "open"}, nil); err == nil || !strings.Contains(err.Error(), "no action") {
		t.Errorf("unknown action: %v", err)
	}
	gone := strings.Replace(b.Ref, "/n/0", "/n/999", 1)
	if err := c.Action(context.Background(), &aciv1.A11YActionRequest{Ref: gone, Kind: aciv1.A11YActionKind_A11Y_ACTION_KIND_FOCUS}, nil); err == nil || !strings.Contains(err.Error(), "NOT_FOUND") {
		t.Errorf("gone element: %v", err)
	}
}

// A second tree reuses the action names of the first (same role and
// states): no Action calls.
func TestTreeReusesActionNames(t *testing.T) {
	addr := testBus(t)
	app := startToolkit(t, addr, 20, nil)
	startRegistry(t, addr, app)
	c := New(addr)
	defer c.Close()
	for i := range 2 {
		r, err := c.Tree(context.Background(), opts(), nil)
		if err != nil {
			t.Fatal(err)
		}
		if got := r.Nodes[3].Actions; len(got) != 1 || got[0] != "press" {
			t.Fatalf("tree %d: actions %q", i, got)
		}
		if n := app.getActions.Swap(0); (i == 0) != (n > 0) {
			t.Fatalf("tree %d: %d GetActions calls", i, n)
		}
	}
}

// An application listing more children than max_nodes has only max_nodes
// of them read.
func TestTreeMaxNodesBoundsReads(t *testing.T) {
	addr := testBus(t)
	app := startToolkit(t, addr, 5000, nil)
	startRegistry(t, addr, app)
	c := New(addr)
	defer c.Close()
	o := opts()
	o.MaxNodes = 100
	r, err := c.Tree(context.Background(), o, nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(r.Nodes) != 100 || !r.Truncated {
		t.Fatalf("%d nodes, truncated %v", len(r.Nodes), r.Truncated)
	}
}

// A stopped application costs its timeout and leaves a partial tree; the
// others are whole, and the next tree is not held up by its queue.
func TestTreeStoppedApp(t *testing.T) {
	addr := testBus(t)
	stall := make(chan struct{})
	live := startToolkit(t, addr, 5, nil)
	stopped := startToolkit(t, addr, 5, stall)
	startRegistry(t, addr, live, stopped)
	c := New(addr)
	defer c.Close()
	o := opts()
	o.AppTimeout = 200 * time.Millisecond
	t0 := time.Now()
	r, err := c.Tree(context.Background(), o, nil)
	took := time.Since(t0)
	close(stall)
	if err != nil {
		t.Fatal(err)
	}
	if !r.Partial || r.Apps[0].TimedOut || !r.Apps[1].TimedOut {
		t.Fatalf("partial %v apps %v", r.Partial, r.Apps)
	}
	if took > 2*time.Second {
		t.Errorf("a stopped app held the tree %v with a 200 ms timeout", took)
	}
	if n := len(r.Nodes); n != 1+1+1+5+1 {
		t.Errorf("%d nodes: want the live app's 7 and the stopped app's node", n)
	}
}

func BenchmarkTreeOverDBus(b *testing.B) {
	addr := testBus(b)
	app := startToolkit(b, addr, 1000, nil)
	startRegistry(b, addr, app)
	c := New(addr)
	defer c.Close()
	o := opts()
	o.AppTimeout = 30 * time.Second
	o.Timeout = 30 * time.Second
	b.ResetTimer()
	for range b.N {
		if r, err := c.Tree(context.Background(), o, nil); err != nil || len(r.Nodes) != 1003 {
			b.Fatal(err)
		}
	}
}

func TestSyncRegistry(t *testing.T) {
	addr := testBus(t)
	c := New(addr)
	defer c.Close()
	if err := c.SyncRegistry(); err == nil {
		t.Fatal("ping without a registry succeeded")
	}
	startRegistry(t, addr)
	if err := c.SyncRegistry(); err != nil {
		t.Fatal(err)
	}
}

// fakeEntry is a web input as Chromium shows one: Text without
// EditableText, EDITABLE, focused by GrabFocus; fakeKeyboard types into it
// while its window holds the focus. maxLen > 0 cuts what it takes (an
// input's maxlength).
type fakeEntry struct {
	mu       sync.Mutex
	text     string
	focused  bool
	selected bool
	maxLen   int
}

func exportEntry(t *testing.T, conn *dbus.Conn, e *fakeEntry, path dbus.ObjectPath) {
	t.Helper()
	tables := map[string]map[string]any{
		ifAccessible: {
			"GetRole": func() (uint32, *dbus.Error) { return 79, nil },
			"GetState": func() ([]uint32, *dbus.Error) {
				e.mu.Lock()
				defer e.mu.Unlock()
				st := uint32(1<<StateShowing | 1<<StateEditable | 1<<stateFocusable)
				if e.focused {
					st |= 1 << StateFocused
				}
				return []uint32{st, 0}, nil
			},
		},
		ifComponent: {"GrabFocus": func() (bool, *dbus.Error) {
			// Chromium focuses asynchronously: the state follows later.
			time.AfterFunc(30*time.Millisecond, func() { e.mu.Lock(); e.focused = true; e.mu.Unlock() })
			return true, nil
		}},
		ifText: {"GetText": func(start, end int32) (string, *dbus.Error) {
			e.mu.Lock()
			defer e.mu.Unlock()
			return e.text, nil
		}},
	}
	for iface, table := range tables {
		if err := conn.ExportMethodTable(table, path, iface); err != nil {
			t.Fatal(err)
		}
	}
}

type fakeKeyboard struct {
	e        *fakeEntry
	focusPID int
	keys     []string
}

func (k *fakeKeyboard) ListWindows() ([]desktop.Window, error) {
	return []desktop.Window{{ID: 0x400001, PID: k.focusPID, Focused: true, Mapped: true}}, nil
}

func (k *fakeKeyboard) KeyCombo(keys []string) error {
	k.keys = append(k.keys, strings.Join(keys, "+"))
	k.e.mu.Lock()
	defer k.e.mu.Unlock()
	if !k.e.focused {
		return nil // the keys went elsewhere
	}
	switch strings.Join(keys, "+") {
	case "ctrl+a":
		k.e.selected = true
	case "BackSpace":
		if k.e.selected {
			k.e.text, k.e.selected = "", false
		}
	}
	return nil
}

func (k *fakeKeyboard) TypeText(s string) error {
	k.keys = append(k.keys, "type:"+s)
	k.e.mu.Lock()
	defer k.e.mu.Unlock()
	if !k.e.focused {
		return nil
	}
	if k.e.selected {
		k.e.text, k.e.selected = "", false
	}
	k.e.text += s
	if k.e.maxLen > 0 && len(k.e.text) > k.e.maxLen {
		k.e.text = k.e.text[:k.e.maxLen]
	}
	return nil
}

// SET_TEXT on an input without EditableText (Chromium's) focuses it,
// selects its content and types the text; typed errors when it cannot.
func TestSetTextByTyping(t *testing.T) {
	addr := testBus(t)
	app := connect(t, addr)
	entry := &fakeEntry{text: "old"}
	exportEntry(t, app, entry, "/entry")
	button := startToolkit(t, addr, 1, nil)
	c := New(addr)
	defer c.Close()
	ctx := context.Background()
	ref := app.Names()[0] + ":/entry"
	set := func(text string, kb Keyboard) error {
		return c.Action(ctx, &aciv1.A11YActionRequest{Ref: ref, Kind: aciv1.A11YActionKind_A11Y_ACTION_KIND_SET_TEXT, Text: text, TimeoutMs: 1000}, kb)
	}
	kb := &fakeKeyboard{e: entry, focusPID: os.Getpid()}
	if err := set("héllo wörld", kb); err != nil {
		t.Fatal(err)
	}
	if entry.text != "héllo wörld" || strings.Join(kb.keys, ",") != "ctrl+a,type:héllo wörld" {
		t.Fatalf("entry holds %q after keys %q", entry.text, kb.keys)
	}
	if err := set("", kb); err != nil || entry.text != "" {
		t.Fatalf("empty text: %v, entry holds %q", err, entry.text)
	}
	// No display to type on.
	if err := set("x", nil); !isCode(err, aciv1.ErrorCode_ERROR_CODE_UNAVAILABLE) {
		t.Errorf("no keyboard: %v, want UNAVAILABLE", err)
	}
	// Another application's window holds the focus: nothing is typed.
	other := &fakeKeyboard{e: entry, focusPID: os.Getpid() + 1}
	if err := set("x", other); !isCode(err, aciv1.ErrorCode_ERROR_CODE_FAILED_PRECONDITION) || len(other.keys) != 0 {
		t.Errorf("focus elsewhere: %v after keys %q, want FAILED_PRECONDITION and no keys", err, other.keys)
	}
	// The field takes less than the text (maxlength).
	entry.mu.Lock()
	entry.maxLen = 3
	entry.mu.Unlock()
	if err := set("abcdef", kb); !isCode(err, aciv1.ErrorCode_ERROR_CODE_FAILED_PRECONDITION) || !strings.Contains(err.Error(), `"abc"`) {
		t.Errorf("cut text: %v, want FAILED_PRECONDITION naming what it shows", err)
	}
	// An element that is not editable.
	bref := button.conn.Names()[0] + ":/n/0"
	if err := c.Action(ctx, &aciv1.A11YActionRequest{Ref: bref, Kind: aciv1.A11YActionKind_A11Y_ACTION_KIND_SET_TEXT, Text: "x"}, kb); !isCode(err, aciv1.ErrorCode_ERROR_CODE_FAILED_PRECONDITION) || !strings.Contains(err.Error(), "not editable") {
		t.Errorf("button: %v, want FAILED_PRECONDITION not editable", err)
	}
}

func isCode(err error, c aciv1.ErrorCode) bool {
	var e *acierr.Error
	return errors.As(err, &e) && e.Code == c
}
