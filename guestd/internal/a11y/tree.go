package a11y

import (
	"context"
	"errors"
	"slices"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/forkfleet/forkfleet/api/aci/a11yrules"
	aciv1 "github.com/forkfleet/forkfleet/api/gen/forkfleet/aci/v1"
	"github.com/forkfleet/forkfleet/guestd/internal/desktop"
)

// Bounds of a tree request (docs/aci-spec.md, "a11y_tree"; the rules guestd
// shares with its fake are in api/aci/a11yrules).
const (
	DefaultMaxDepth   = a11yrules.DefaultMaxDepth
	MaxDepth          = a11yrules.MaxDepth
	DefaultMaxNodes   = a11yrules.DefaultMaxNodes
	MaxNodes          = a11yrules.MaxNodes
	DefaultTimeout    = a11yrules.DefaultTimeout
	DefaultAppTimeout = a11yrules.DefaultAppTimeout
	MaxTimeout        = a11yrules.MaxTimeout
	// MaxApps bounds the applications one tree reads (the rest are listed
	// as not read).
	MaxApps = 64
	// maxString bounds a name, description or text; maxActions the actions
	// of one element.
	maxString  = 4096
	maxActions = 32
	// DefaultMaxBytes is the reply's byte budget: nodes past it are left
	// out (truncated), so a tree always fits a message with room to spare.
	DefaultMaxBytes = 8 << 20
)

// TreeOptions is a validated A11yTreeRequest (the rules guestd and the
// fake share) and the reply's byte budget, which is guestd's own.
type TreeOptions struct {
	a11yrules.Tree
	MaxBytes int
}

// Fields is the set of optional node fields to fill.
type Fields = a11yrules.Fields

// AllFields fills every optional field.
const AllFields = a11yrules.AllFields

// WindowSource gives the X windows (list_windows) for the roots that name
// one: the focused window, a window id, the window at a point.
type WindowSource func() ([]desktop.Window, error)

// item is what the tree knows of one accessible object.
type item struct {
	ref      ref
	parent   ref
	index    int32
	count    int32 // children the application reports; -1: it manages them
	ifaces   uint32
	name     string
	desc     string
	role     uint32
	states   uint64
	children []ref
	known    bool // children is the complete list
	// Filled by fill.
	bounds  *aciv1.Rect
	text    string
	value   *float64
	actions []string
	fill    *fillCalls // the calls of the fields, in flight
	// actionsKnown: actions came from the Client's action names (no call).
	actionsKnown bool
	// entry is the cache entry the item was made from (cache.go), nil
	// when it was read (or came from GetItems); statesCached: its states
	// came from the entry too (no call).
	entry        *cachedItem
	statesCached bool
	loadOK       bool // a read item whose every call answered
}

// Interface bits of item.ifaces.
const (
	hasComponent = 1 << iota
	hasAction
	hasText
	hasEditable
	hasValue
	// ifacesUnread: the interfaces were not asked (an element read one by
	// one): its fields are asked by what its role and states say, and an
	// interface it lacks answers an error, which costs what asking would.
	ifacesUnread
)

func ifaceBits(names []string) uint32 {
	var b uint32
	for _, n := range names {
		switch n {
		case ifComponent:
			b |= hasComponent
		case ifAction:
			b |= hasAction
		case ifText:
			b |= hasText
		case ifEditable:
			b |= hasEditable
		case ifValue:
			b |= hasValue
		}
	}
	return b
}

// cacheItem is one element of org.a11y.atspi.Cache.GetItems,
// a((so)(so)(so)iiassusau).
type cacheItem struct {
	Obj, App, Parent ref
	Index, Count     int32
	Ifaces           []string
	Name             string
	Role             uint32
	Desc             string
	States           []uint32
}

// app is one application's part of a tree.
type app struct {
	ref      ref
	pid      int32
	items    map[objectPath]*item
	parentOf map[objectPath]ref // of objects not in the cache
	// named are the action names the Client knows of this application's
	// elements (read only during a read).
	named map[objectPath]actionNames
	// cache is the Client's cache of the application (cache.go), nil
	// when the read does without; staleStates: its states are not used
	// (the page moved: every element is asked its states).
	cache       map[objectPath]*cachedItem
	staleStates bool
	now         time.Time // the read's start, against the cache's expiries
	timedOut    bool
	err         error
}

// Tree reads the accessibility tree opts asks for.
func (c *Client) Tree(ctx context.Context, opts TreeOptions, windows WindowSource) (*aciv1.A11YTreeResponse, error) {
	t0 := time.Now()
	ctx, cancel := context.WithTimeout(ctx, opts.Timeout)
	defer cancel()
	resp := &aciv1.A11YTreeResponse{Bus: c.HasBus()}
	desktopNode := &item{name: "main", role: roleDesktop, known: true}
	if !c.HasBus() {
		if opts.Root != aciv1.A11YRoot_A11Y_ROOT_DESKTOP && opts.Root != aciv1.A11YRoot_A11Y_ROOT_UNSPECIFIED {
			return nil, ErrNoBus
		}
		return finish(resp, build(desktopNode, nil, desktopNode, opts), opts, t0), nil
	}
	conn, err := c.get(ctx)
	if err != nil {
		return nil, err
	}
	// Everything below runs in its own goroutine: a bus that stops reading
	// can block a write, which no context interrupts. Past the deadline the
	// connection is dropped (its close unblocks the writer) and the caller
	// answers at once.
	type result struct {
		resp *aciv1.A11YTreeResponse
		err  error
	}
	done := make(chan result, 1)
	go func() {
		r, err := c.tree(ctx, conn, opts, windows, desktopNode)
		done <- result{r, err}
	}()
	select {
	case r := <-done:
		if r.err != nil {
			return nil, r.err
		}
		return finish(r.resp, nil, opts, t0), nil
	case <-ctx.Done():
		c.drop(conn)
		return nil, ctx.Err()
	}
}

func (c *Client) tree(ctx context.Context, conn *wireConn, opts TreeOptions, windows WindowSource, desktopNode *item) (*aciv1.A11YTreeResponse, error) {
	// The applications: the registry's children of the desktop.
	var appRefs []ref
	rctx, cancel := context.WithTimeout(ctx, opts.AppTimeout)
	err := call(rctx, conn, ref{registryName, rootPath}, ifAccessible+".GetChildren", nil, &appRefs)
	cancel()
	if err != nil {
		if errors.Is(err, context.DeadlineExceeded) {
			return nil, errTimeout("the accessibility registry did not answer within %v", opts.AppTimeout)
		}
		return nil, errors.Join(ErrNoBus, err)
	}
	appRefs = slices.DeleteFunc(appRefs, ref.null)
	skipped := 0
	if len(appRefs) > MaxApps {
		skipped = len(appRefs) - MaxApps
		appRefs = appRefs[:MaxApps]
	}
	desktopNode.children = appRefs

	// Which application (and top-level object) the root needs.
	want, err := c.pickRoot(ctx, conn, opts, windows, appRefs)
	if err != nil {
		return nil, err
	}
	// Bounds are read whatever the request: the element at a point is
	// found by them, and the cache trusts its states while the showing
	// elements keep theirs (build leaves them out when not asked).
	readOpts := opts
	readOpts.Fields |= 1 << aciv1.A11YField_A11Y_FIELD_BOUNDS
	apps := make([]*app, len(appRefs))
	c.names.keep(appRefs)
	c.cache.keep(ctx, appRefs)
	var wg sync.WaitGroup
	for i, r := range appRefs {
		apps[i] = &app{ref: r, named: c.names.of(r.Bus)}
		if want.app != "" && r.Bus != want.app {
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			actx, cancel := context.WithTimeout(ctx, opts.AppTimeout)
			defer cancel()
			apps[i].read(withWindow(actx), c, conn, readOpts, want.top)
		}()
	}
	wg.Wait()

	var root *item
	switch {
	case want.app == "":
		root = desktopNode
	default:
		for _, a := range apps {
			if a.ref.Bus == want.app && a.items != nil {
				root = a.items[want.top.Path]
			}
		}
		if root == nil {
			return nil, errTimeout("the window's application did not answer within %v", opts.AppTimeout)
		}
	}
	if opts.Root == aciv1.A11YRoot_A11Y_ROOT_POINT {
		root = deepestAt(root, apps, opts.X, opts.Y)
	}
	resp := build(root, apps, desktopNode, opts)
	resp.Bus = true
	if skipped > 0 {
		resp.Partial = true
	}
	return resp, nil
}

// rootWant says which application (unique bus name) and top-level object a
// tree starts from; empty app: the desktop.
type rootWant struct {
	app string
	top ref
}

func (c *Client) pickRoot(ctx context.Context, conn *wireConn, opts TreeOptions, windows WindowSource, apps []ref) (rootWant, error) {
	switch opts.Root {
	case aciv1.A11YRoot_A11Y_ROOT_UNSPECIFIED, aciv1.A11YRoot_A11Y_ROOT_DESKTOP:
		return rootWant{}, nil
	}
	ws, err := windows()
	if err != nil {
		return rootWant{}, err
	}
	var win *desktop.Window
	switch opts.Root {
	case aciv1.A11YRoot_A11Y_ROOT_FOCUSED_WINDOW:
		for i := range ws {
			if ws[i].Focused {
				win = &ws[i]
			}
		}
		if win == nil {
			return rootWant{}, errNotFound("no window holds the focus")
		}
	case aciv1.A11YRoot_A11Y_ROOT_WINDOW:
		for i := range ws {
			if ws[i].ID == opts.WindowID {
				win = &ws[i]
			}
		}
		if win == nil {
			return rootWant{}, errNotFoundField("a11y_tree.window_id", "no window %#x", opts.WindowID)
		}
	case aciv1.A11YRoot_A11Y_ROOT_POINT:
		// The focused window when it holds the point, else the last mapped
		// one listed that does (the client list is in mapping order).
		for i := range ws {
			w := &ws[i]
			if !w.Mapped || w.Minimized || opts.X < w.X || opts.Y < w.Y || opts.X >= w.X+w.Width || opts.Y >= w.Y+w.Height {
				continue
			}
			if win == nil || !win.Focused {
				win = w
			}
		}
		if win == nil {
			return rootWant{}, errNotFoundField("a11y_tree.point", "no window at (%d,%d)", opts.X, opts.Y)
		}
	}
	return c.topFor(ctx, conn, opts, win, apps)
}

// topFor finds the top-level accessible of X window w: the application whose
// bus connection belongs to the window's process, then, among its top-level
// objects, the ACTIVE one for the focused window, else the one whose bounds
// overlap the window's most.
func (c *Client) topFor(ctx context.Context, conn *wireConn, opts TreeOptions, w *desktop.Window, apps []ref) (rootWant, error) {
	ctx, cancel := context.WithTimeout(ctx, opts.AppTimeout)
	defer cancel()
	pids := make([]pending, len(apps))
	for i, a := range apps {
		pids[i] = start(ctx, conn, busRef, "org.freedesktop.DBus.GetConnectionUnixProcessID", a.Bus)
	}
	for i, a := range apps {
		var pid uint32
		if pids[i].wait(ctx, &pid) != nil || int(pid) != w.PID || w.PID == 0 {
			continue
		}
		var tops []ref
		if err := call(ctx, conn, a, ifAccessible+".GetChildren", nil, &tops); err != nil {
			return rootWant{}, errTimeoutOr(err, "application %s", a.Bus)
		}
		type cand struct {
			r       ref
			states  uint64
			overlap int
		}
		var best *cand
		for _, t := range tops {
			var st []uint32
			var ext [4]int32
			if call(ctx, conn, t, ifAccessible+".GetState", nil, &st) != nil {
				continue
			}
			_ = call(ctx, conn, t, ifComponent+".GetExtents", []any{coordScreen}, &ext)
			cd := &cand{r: t, states: states(st), overlap: overlap(ext, w)}
			better := best == nil
			if !better && w.Focused && has(cd.states, StateActive) != has(best.states, StateActive) {
				better = has(cd.states, StateActive)
			} else if !better && has(cd.states, StateShowing) != has(best.states, StateShowing) {
				better = has(cd.states, StateShowing)
			} else if !better {
				better = cd.overlap > best.overlap
			}
			if better {
				best = cd
			}
		}
		if best != nil {
			return rootWant{app: a.Bus, top: best.r}, nil
		}
	}
	return rootWant{}, errNotFound("window %#x (pid %d) has no accessible application", w.ID, w.PID)
}

func overlap(ext [4]int32, w *desktop.Window) int {
	x0, y0 := max(int(ext[0]), w.X), max(int(ext[1]), w.Y)
	x1, y1 := min(int(ext[0]+ext[2]), w.X+w.Width), min(int(ext[1]+ext[3]), w.Y+w.Height)
	if x1 <= x0 || y1 <= y0 {
		return 0
	}
	return (x1 - x0) * (y1 - y0)
}

// read loads one application's objects: its cache in one call
// (Cache.GetItems), then, level by level, the children the cache lacks, and
// finally the optional fields of what the tree will show, each level's
// calls sent at once. from: the object to walk from (the application when
// null). Past ctx's deadline the application is marked timed out and keeps
// what it had.
func (a *app) read(ctx context.Context, c *Client, conn *wireConn, opts TreeOptions, from ref) {
	defer func() {
		if a.err != nil && (errors.Is(a.err, context.DeadlineExceeded) || errors.Is(ctx.Err(), context.DeadlineExceeded)) {
			a.timedOut, a.err = true, nil
		}
	}()
	bus := conn
	pid := start(ctx, conn, busRef, "org.freedesktop.DBus.GetConnectionUnixProcessID", a.ref.Bus)
	// The cache first: its ping is answered by the application.
	view, useCache := c.cache.view(ctx, bus, a.ref.Bus)
	if useCache {
		a.cache, a.now = view.items, time.Now()
	}
	// The bus answers the pid, the application does not have to.
	var upid uint32
	if pid.wait(ctx, &upid) == nil {
		a.pid = int32(upid)
	}
	// The application's own server when it has one: its calls skip the bus.
	conn = c.peer(ctx, conn, a.ref.Bus, a.pid)
	var cached []cacheItem
	asked := false
	whole := from.null()
	if from.null() {
		from = ref{a.ref.Bus, rootPath}
	}
	for pass := 0; ; pass++ {
		if !asked && !warm(a.cache, a.now) {
			// The toolkit's own cache: every element it holds in one call.
			asked = true
			err := call(ctx, conn, ref{a.ref.Bus, cachePath}, ifCache+".GetItems", nil, &cached)
			if err != nil && !unsupportedError(err) && !goneError(err) {
				a.err = err
				return
			}
		}
		a.fromToolkitCache(cached)
		shown, cut, err := a.walk(ctx, conn, opts, from)
		if err != nil {
			a.err = err
			return
		}
		if err := finishFill(ctx, conn, shown); err != nil {
			a.err = err
			return
		}
		if pass == 0 && a.newDocument() {
			// A page loaded: the browser changes what shows its address
			// and more without events. Read it again without the cache.
			a.cache = nil
			continue
		}
		if pass == 0 && moved(shown) {
			// Its states came from the cache and the page moved (a
			// scroll, a resize: the toolkit sends nothing for what comes
			// into view): read again, asking every element its states.
			a.staleStates = true
			continue
		}
		if useCache {
			c.cache.store(bus, a.ref.Bus, view, a.items, a.now, whole && !cut && !opts.ShowingOnly)
		}
		c.names.learn(a.ref.Bus, shown)
		return
	}
}

// fromToolkitCache starts a.items afresh with the toolkit's cache
// (Cache.GetItems): its elements, and the children lists it holds whole.
func (a *app) fromToolkitCache(cached []cacheItem) {
	a.items = map[objectPath]*item{}
	a.parentOf = map[objectPath]ref{}
	for _, ci := range cached {
		if ci.Obj.Bus != a.ref.Bus || ci.Obj.null() {
			continue
		}
		a.items[ci.Obj.Path] = &item{ref: ci.Obj, parent: ci.Parent, index: ci.Index, count: ci.Count, loadOK: true,
			ifaces: ifaceBits(ci.Ifaces), name: clip(ci.Name), desc: clip(ci.Desc), role: ci.Role, states: states(ci.States)}
	}
	// Children from the cache: the objects naming a parent, in index order.
	for _, it := range a.items {
		if p, ok := a.items[it.parent.Path]; ok && it.parent.Bus == a.ref.Bus && p != it {
			p.children = append(p.children, it.ref)
		}
	}
	for _, it := range a.items {
		if len(it.children) > 1 {
			slices.SortStableFunc(it.children, func(x, y ref) int { return int(a.items[x.Path].index - a.items[y.Path].index) })
		}
		// Complete only when the count matches and the indexes are 0..n-1.
		it.known = it.count >= 0 && int(it.count) == len(it.children)
		for i, ch := range it.children {
			if it.known && a.items[ch.Path].index != int32(i) {
				it.known = false
			}
		}
	}
}

// newDocument: the read met a document the cache does not know, and the
// cache knew others (not the first read).
func (a *app) newDocument() bool {
	if len(a.cache) == 0 {
		return false
	}
	for p, it := range a.items {
		if documentRole(it.role) && a.cache[p] == nil {
			return true
		}
	}
	return false
}

// moved: an element whose states came from the cache shows other bounds
// than the cache has (or none).
func moved(shown []*item) bool {
	for _, it := range shown {
		if !it.statesCached || !has(it.states, StateShowing) {
			continue
		}
		b, e := it.bounds, it.entry
		if (b == nil) != !e.hasBounds || b != nil && (b.X != e.bounds[0] || b.Y != e.bounds[1] || b.Width != e.bounds[2] || b.Height != e.bounds[3]) {
			return true
		}
	}
	return false
}

// step is a walk's calls for one object in flight: loading it (role,
// state, properties) or, for an item, its children.
type step struct {
	r                  ref
	it                 *item
	depth              int
	role, state, props pending
	kids               pending
	// cached: the element as the cache knows it; only state is asked.
	cached *item
}

// walk reads the objects under from breadth first, fetching what the cache
// lacks, and returns the ones the tree shows with their fields asked
// (startFill). The calls stream: replies are taken in the order the calls
// were sent (an application answers in order), and each one sends the calls
// it makes possible at once, so the application always has calls queued.
// Level by level, every level (a page is about 15 deep) cost a round trip
// with an idle application and a drained queue.
func (a *app) walk(ctx context.Context, conn *wireConn, opts TreeOptions, from ref) (shown []*item, cut bool, err error) {
	var (
		fifo []*step
		seen = map[objectPath]bool{}
		// claimed: objects shown or being loaded. No more are read than
		// the reply can hold: an application listing a million children
		// costs max_nodes reads.
		claimed int
	)
	var expand func(it *item, depth int)
	visit := func(r ref, depth int) {
		if r.Bus != a.ref.Bus || seen[r.Path] {
			return
		}
		if claimed >= opts.MaxNodes {
			cut = true
			return
		}
		seen[r.Path] = true
		claimed++
		if it := a.items[r.Path]; it != nil {
			expand(it, depth)
			return
		}
		if ci := a.cache[r.Path]; ci != nil && ci.loaded && ci.fresh(a.now) {
			it := &item{ref: r, parent: ci.parent, count: ci.count, ifaces: ci.ifaces, name: ci.name, desc: ci.desc, role: ci.role, entry: ci}
			if ci.statesKnown && !a.staleStates {
				it.states, it.statesCached = ci.states, true
				a.items[r.Path] = it
				expand(it, depth)
				return
			}
			fifo = append(fifo, &step{r: r, depth: depth, cached: it, state: start(ctx, conn, r, ifAccessible+".GetState")})
			return
		}
		fifo = append(fifo, &step{r: r, depth: depth,
			role:  start(ctx, conn, r, ifAccessible+".GetRole"),
			state: start(ctx, conn, r, ifAccessible+".GetState"),
			props: start(ctx, conn, r, ifProperties+".GetAll", ifAccessible),
		})
	}
	expand = func(it *item, depth int) {
		if opts.ShowingOnly && it.role != roleApplication && !has(it.states, StateShowing) {
			claimed--
			return
		}
		shown = append(shown, it)
		a.startFill(ctx, conn, it, opts.Fields)
		if depth >= opts.MaxDepth || has(it.states, StateDefunct) {
			cut = cut || depth >= opts.MaxDepth && it.count != 0
			return
		}
		if ci := a.cache[it.ref.Path]; !it.known && ci != nil && ci.known && ci.fresh(a.now) && (it.count < 0 || int(it.count) == len(ci.children)) {
			// Its children as a tree read them before (no event since).
			it.children, it.known = ci.children, true
			for _, k := range it.children {
				a.parentOf[k.Path] = it.ref
			}
		}
		switch {
		case it.known:
			for _, ch := range it.children {
				visit(ch, depth+1)
			}
		case it.count == 0:
			// A leaf by its ChildCount: no call (most elements are leaves).
			it.known = true
		default:
			fifo = append(fifo, &step{it: it, depth: depth, kids: start(ctx, conn, it.ref, ifAccessible+".GetChildren")})
		}
	}
	visit(from, 0)
	for len(fifo) > 0 {
		s := fifo[0]
		fifo[0], fifo = nil, fifo[1:]
		if s.it != nil {
			kids, err := a.children(ctx, s)
			if err != nil {
				return shown, cut, err
			}
			for _, k := range kids {
				visit(k, s.depth+1)
			}
			continue
		}
		var it *item
		if s.cached != nil {
			it, err = a.refreshed(ctx, s)
		} else {
			it, err = a.loaded(ctx, s)
		}
		if err != nil {
			return shown, cut, err
		}
		if it == nil {
			claimed--
			continue
		}
		expand(it, s.depth)
	}
	return shown, cut, nil
}

// refreshed makes the item of a cached element from its states (the rest
// the cache knows); nil when the element is gone.
func (a *app) refreshed(ctx context.Context, s *step) (*item, error) {
	var st []uint32
	if err := s.state.wait(ctx, &st); err != nil {
		if goneError(err) || unsupportedError(err) {
			return nil, nil
		}
		return nil, err
	}
	it := s.cached
	it.states = states(st)
	a.items[s.r.Path] = it
	return it, nil
}

// loaded makes the item of a load step's replies; nil when the object is
// gone since its parent listed it.
func (a *app) loaded(ctx context.Context, s *step) (*item, error) {
	it := &item{ref: s.r, count: -1, parent: a.parentOf[s.r.Path]}
	var st []uint32
	var props map[string]any
	if err := s.role.wait(ctx, &it.role); err != nil {
		if goneError(err) || unsupportedError(err) {
			return nil, nil
		}
		return nil, err
	}
	err := errors.Join(s.state.wait(ctx, &st), s.props.wait(ctx, &props))
	if err != nil && ctx.Err() != nil {
		return nil, ctx.Err()
	}
	it.states, it.ifaces = states(st), ifacesUnread
	if v, ok := props["Name"].(string); ok {
		it.name = clip(v)
	}
	if v, ok := props["Description"].(string); ok {
		it.desc = clip(v)
	}
	if v, ok := props["ChildCount"].(int32); ok {
		it.count = v
	}
	it.loadOK = err == nil
	a.items[s.r.Path] = it
	return it, nil
}

// children stores the reply of a GetChildren step and returns the children.
func (a *app) children(ctx context.Context, s *step) ([]ref, error) {
	var kids []ref
	if err := s.kids.wait(ctx, &kids); err != nil {
		if goneError(err) || unsupportedError(err) {
			return nil, nil
		}
		return nil, err
	}
	for i := range kids {
		if kids[i].Bus == "" && kids[i].Path != "" {
			kids[i].Bus = a.ref.Bus // a direct connection may leave its own name out
		}
	}
	s.it.children = slices.DeleteFunc(kids, ref.null)
	s.it.known = true
	for _, k := range s.it.children {
		a.parentOf[k.Path] = s.it.ref
	}
	return s.it.children, nil
}

// fillCalls are the calls of an item's optional fields in flight.
type fillCalls struct {
	ext, text, val, action pending
}

// startFill sends the calls of it's optional fields: bounds, editable
// text, value and actions; finishFill stores their replies.
func (a *app) startFill(ctx context.Context, conn *wireConn, it *item, f Fields) {
	x := &fillCalls{}
	try := func(iface uint32) bool { return it.ifaces&(iface|ifacesUnread) != 0 }
	// Bounds of what is on screen only: an element off screen (most
	// of a long page) has no pixels to point at, and its extents are
	// the costliest call a browser answers.
	if f.Has(aciv1.A11YField_A11Y_FIELD_BOUNDS) && try(hasComponent) && has(it.states, StateShowing) {
		x.ext = start(ctx, conn, it.ref, ifComponent+".GetExtents", coordScreen)
	}
	// Editable: the EditableText interface, or the EDITABLE state
	// (Chromium's inputs have Text without EditableText).
	if f.Has(aciv1.A11YField_A11Y_FIELD_TEXT) && try(hasText) && (it.ifaces&hasEditable != 0 || has(it.states, StateEditable)) {
		x.text = start(ctx, conn, it.ref, ifText+".GetText", int32(0), int32(-1))
	}
	if f.Has(aciv1.A11YField_A11Y_FIELD_VALUE) && (it.ifaces&hasValue != 0 || it.ifaces&ifacesUnread != 0 && rangeRole(it.role)) {
		x.val = start(ctx, conn, it.ref, ifProperties+".Get", ifValue, "CurrentValue")
	}
	// Actions, like bounds, of what is on screen: naming a browser's
	// actions costs a call per action on top of GetActions (Chromium
	// leaves their names out of it), and an element off screen is
	// scrolled into view before an agent acts on it.
	if f.Has(aciv1.A11YField_A11Y_FIELD_ACTIONS) && try(hasAction) && has(it.states, StateShowing) && actionable(it) {
		if names, ok := a.named[it.ref.Path].match(it, time.Now()); ok {
			it.actions, it.actionsKnown = names, true
		} else {
			x.action = start(ctx, conn, it.ref, ifAction+".GetActions")
		}
	}
	if x.ext.wc != nil || x.text.wc != nil || x.val.wc != nil || x.action.wc != nil {
		it.fill = x
	}
}

// finishFill stores the replies of the items' field calls. Each field
// stands alone: an element that fails one (an interface it lists and does
// not serve) keeps the others; only the deadline stops.
func finishFill(ctx context.Context, conn *wireConn, items []*item) error {
	for _, it := range items {
		x := it.fill
		if x == nil {
			continue
		}
		it.fill = nil
		if x.ext.wc != nil {
			var e struct{ X, Y, W, H int32 }
			if x.ext.wait(ctx, &e) == nil && e.W > 0 && e.H > 0 {
				it.bounds = &aciv1.Rect{X: e.X, Y: e.Y, Width: e.W, Height: e.H}
			}
		}
		if x.text.wc != nil {
			var s string
			if x.text.wait(ctx, &s) == nil {
				it.text = clip(s)
			}
		}
		if x.val.wc != nil {
			var v any
			if x.val.wait(ctx, &v) == nil {
				if d, ok := v.(float64); ok {
					it.value = &d
				}
			}
		}
		if x.action.wc != nil {
			var acts []actionInfo
			if x.action.wait(ctx, &acts) == nil {
				it.actions = make([]string, min(len(acts), maxActions))
				for i := range it.actions {
					it.actions[i] = clip(acts[i].Name)
				}
			}
		}
		if err := ctx.Err(); err != nil {
			return err
		}
	}
	return nameActions(ctx, conn, items)
}

// actionable: elements whose actions an agent uses, the ones that take the
// focus or a selection, or have a control's role. The others' actions are
// the toolkit's generic ones (Chromium gives every element
// "showContextMenu", its text "clickAncestor"), and naming them costs
// calls on every element of a page.
func actionable(it *item) bool {
	if has(it.states, stateFocusable) || has(it.states, stateSelectable) {
		return true
	}
	switch it.role {
	case 7, 8, 11, 35, 37, 43, 44, 45, 51, 52, 62, 79, 88, 91, 32, 129:
		// check box, check menu item, combo box, menu item, page tab,
		// push button, radio button, radio menu item, slider, spin
		// button, toggle button, entry, link, tree item, list item, push
		// button menu
		return true
	}
	return false
}

// rangeRole: roles whose elements have a value (AtspiValue).
func rangeRole(r uint32) bool {
	switch r {
	case 15, 42, 48, 51, 52, 103: // dial, progress bar, scroll bar, slider, spin button, level bar
		return true
	}
	return false
}

// actionInfo is one element of Action.GetActions, a(sss).
type actionInfo struct{ Name, Desc, Key string }

// nameActions asks GetName for the actions GetActions left unnamed: the
// bridge fills GetActions with localized names, which Chromium leaves
// empty, so its actions are named one call each (all sent at once).
func nameActions(ctx context.Context, conn *wireConn, items []*item) error {
	type q struct {
		name *string
		p    pending
	}
	var qs []q
	for _, it := range items {
		for i := range it.actions {
			if it.actions[i] == "" {
				qs = append(qs, q{&it.actions[i], start(ctx, conn, it.ref, ifAction+".GetName", int32(i))})
			}
		}
	}
	for _, x := range qs {
		var s string
		if err := x.p.wait(ctx, &s); err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			continue
		}
		*x.name = clip(s)
	}
	return nil
}

// deepestAt is the deepest showing element under root whose bounds hold
// (x, y); its later siblings win (they are drawn above). root itself when
// none does.
func deepestAt(root *item, apps []*app, x, y int) *item {
	lookup := itemLookup(apps)
	cur := root
	for depth := 0; depth < MaxDepth; depth++ {
		var next *item
		for _, r := range cur.children {
			ch := lookup(r)
			if ch == nil || ch.bounds == nil || !has(ch.states, StateShowing) {
				continue
			}
			b := ch.bounds
			if x >= int(b.X) && y >= int(b.Y) && x < int(b.X+b.Width) && y < int(b.Y+b.Height) {
				next = ch
			}
		}
		if next == nil {
			return cur
		}
		cur = next
	}
	return cur
}

func itemLookup(apps []*app) func(ref) *item {
	byBus := map[string]*app{}
	for _, a := range apps {
		byBus[a.ref.Bus] = a
	}
	return func(r ref) *item {
		if a := byBus[r.Bus]; a != nil && a.items != nil {
			return a.items[r.Path]
		}
		return nil
	}
}

// build numbers the tree from root in pre-order (ids are positions in the
// reply), within the node, depth and byte limits.
func build(root *item, apps []*app, desktopNode *item, opts TreeOptions) *aciv1.A11YTreeResponse {
	resp := &aciv1.A11YTreeResponse{}
	lookup := itemLookup(apps)
	appIndex := map[string]uint32{}
	for i, a := range apps {
		appIndex[a.ref.Bus] = uint32(i + 1)
		pa := &aciv1.A11YApp{BusName: a.ref.Bus, Pid: a.pid, TimedOut: a.timedOut}
		if a.err != nil {
			pa.Error = a.err.Error()
		}
		if root := lookup(ref{a.ref.Bus, rootPath}); root != nil {
			pa.Name = root.name
		}
		if a.timedOut || a.err != nil {
			resp.Partial = true
		}
		resp.Apps = append(resp.Apps, pa)
	}
	bytes := 0
	seen := map[ref]bool{}
	var walk func(it *item, depth int, window uint32) uint32
	walk = func(it *item, depth int, window uint32) uint32 {
		id := uint32(len(resp.Nodes))
		n := &aciv1.A11YNode{Id: id, Role: RoleName(it.role), Name: it.name}
		if it != desktopNode {
			n.Ref = it.ref.String()
			n.App = appIndex[it.ref.Bus]
		}
		if window == 0 && isTopLevel(it) {
			window = id
		}
		n.Window = window
		if opts.Fields.Has(aciv1.A11YField_A11Y_FIELD_STATES) {
			n.States = it.states
		}
		if opts.Fields.Has(aciv1.A11YField_A11Y_FIELD_DESCRIPTION) {
			n.Description = it.desc
		}
		if opts.Fields.Has(aciv1.A11YField_A11Y_FIELD_BOUNDS) {
			n.Bounds = it.bounds
		}
		n.Text, n.Value, n.Actions = it.text, it.value, it.actions
		bytes += 48 + len(n.Role) + len(n.Name) + len(n.Description) + len(n.Text) + len(n.Ref)
		for _, a := range n.Actions {
			bytes += 2 + len(a)
		}
		resp.Nodes = append(resp.Nodes, n)
		if it.count != 0 && (!it.known || len(it.children) > 0) && depth >= opts.MaxDepth {
			n.ChildrenTruncated = true
			resp.Truncated = true
			return id
		}
		for _, r := range it.children {
			ch := lookup(r)
			if ch == nil {
				if it == desktopNode {
					// An application that timed out or failed before its
					// root was read: a node of its own, so the reply says
					// where the gap is.
					ch = &item{ref: ref{r.Bus, rootPath}, role: roleApplication, known: true}
				} else {
					n.ChildrenTruncated = true
					continue
				}
			}
			if seen[ch.ref] {
				continue // a cycle, or an object listed twice
			}
			if opts.ShowingOnly && ch.role != roleApplication && !has(ch.states, StateShowing) {
				continue
			}
			if len(resp.Nodes) >= opts.MaxNodes || bytes >= opts.MaxBytes {
				n.ChildrenTruncated = true
				resp.Truncated = true
				break
			}
			seen[ch.ref] = true
			n.Children = append(n.Children, walk(ch, depth+1, window))
		}
		if it != desktopNode && !it.known {
			n.ChildrenTruncated = true
		}
		return id
	}
	seen[root.ref] = true
	walk(root, 0, 0)
	appOf := map[string]int{}
	for i, a := range apps {
		appOf[ref{a.ref.Bus, rootPath}.String()] = i
	}
	for _, n := range resp.Nodes {
		if i, ok := appOf[n.Ref]; ok {
			resp.Apps[i].Node = n.Id
		}
	}
	return resp
}

// isTopLevel: a window an application shows (a child of its application
// object).
func isTopLevel(it *item) bool {
	return it.parent.Path == rootPath && it.role != roleApplication && it.role != roleDesktop
}

// finish hashes the tree and applies if_none_match.
func finish(resp, built *aciv1.A11YTreeResponse, opts TreeOptions, t0 time.Time) *aciv1.A11YTreeResponse {
	if built != nil {
		built.Bus = resp.Bus
		resp = built
	}
	a11yrules.Finish(resp, opts.IfNoneMatch)
	resp.DurationNs = uint64(time.Since(t0))
	return resp
}

// clip bounds a string from an application to maxString bytes, cut at a
// rune boundary, and makes it valid UTF-8 (proto strings must be).
func clip(s string) string {
	if len(s) > maxString {
		cut := maxString
		for cut > 0 && !utf8.RuneStart(s[cut]) {
			cut--
		}
		s = s[:cut]
	}
	return strings.ToValidUTF8(s, "\uFFFD")
}
