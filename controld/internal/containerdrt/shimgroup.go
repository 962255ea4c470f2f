//go:build linux

package containerdrt

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"strconv"
	"sync"

	"github.com/containerd/containerd/api/types/runc/options"
	"github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/pkg/cio"
	specs "github.com/opencontainers/runtime-spec/specs-go"
)

// Forks share containerd shims. Every container otherwise gets its own
// containerd-shim-runc-v2 daemon: containerd execs the shim's `start`, which
// starts the daemon (a second Go process with its ttrpc server) and exits.
// That daemon's start was a large part of a replica's CPU in a fan-out
// (forks.md, "Fan-out"). The runc shim serves several containers when their
// specs carry the same group annotation (as Kubernetes pods' containers
// share one): `start` finds the group's daemon listening and hands
// containerd its address instead of starting another.
//
// The shim's rules (containerd 2.4, cmd/containerd-shim-runc-v2/manager and
// pkg/shim) decide how a group must be kept:
//   - `start` reads the group from the bundle's config.json, that is from the
//     container's spec as it is when NewTask runs; the group's socket is a
//     fixed path (a hash of the namespace and the group). It makes it with
//     net.Listen, that is bind then listen. When binding fails because the
//     file exists, `start` dials it: an answer means "join that daemon"; no
//     answer means "stale", and `start` removes the file and binds again.
//   - The daemon exits when containerd asks it to (Shutdown, sent after every
//     task Delete, and after a failed task create) and it holds no container:
//     it stops listening, then removes its socket file.
//
// Three races follow, and each rule below closes one:
//
// 1. Two `start`s of a group with no daemon yet. A socket bound but not yet
// listening refuses connections, so when the first start is preempted
// between its bind and its listen, the second takes the file for stale,
// removes it and binds its own; the first then listens on an unlinked socket
// and starts a daemon that containerd never reaches (it is handed the path,
// which leads to the second's daemon), so no Shutdown ever ends it: a daemon
// leaked per group (the CI failure that reverted the second version). A third
// start in that window may lose the race to remove the file and fail
// ("remove pre-existing socket: no such file or directory", the failure that
// reverted the first). Hence a group takes its second member only after its
// first member's task create returned (its daemon listens and has answered
// containerd): forks that find that create still running wait for it before
// their own (await), and go ungrouped, each in a shim of its own, when it
// failed.
//
// 2. A group's last container deleted while a fork's `start` runs for it:
// the start finds the file of a daemon that no longer answers, or hands
// containerd the address of a daemon that is going, or binds a new daemon
// whose file the dying one then removes. Hence shimGroups counts, for every
// group, the forks between choosing it and the end of their task create
// (joining) and those whose task its daemon holds (live). Deleting a group's
// last live fork closes the group (no fork chooses it again) and waits for
// its joining forks before the task delete that lets the daemon exit.
//
// 3. A task create that fails in a group with no live fork: containerd's
// cleanup sends that daemon Shutdown, and other forks starting in it may
// fail. A failed create therefore closes its group, and a grouped fork whose
// create failed is created again once, in a shim of its own (createTask).
//
// A group takes shimGroupSize forks at most, so one daemon is the failure
// domain of that many replicas (a shim killed takes its containers'
// management with it, as it does for one). Group names carry a
// per-process random salt: after a restart of controld new forks do not
// join the groups of older ones, whose members this process does not count.
const (
	shimGroupAnnotation = "io.containerd.runc.v2.group"
	shimGroupSize       = 16
)

// shimGroups hands out fork shim groups and keeps their daemons alive while
// forks join them; the zero value is ready.
type shimGroups struct {
	// off: forks are not grouped (each gets a shim of its own).
	off bool
	// concurrentFirst (tests only) lets a group's members start while its
	// first member's create still runs: race 1 above, which the wait in
	// await prevents.
	concurrentFirst bool

	mu      sync.Mutex
	salt    string
	seq     uint64
	open    *shimGroup             // the group the next fork joins (nil: a new one)
	members map[string]*shimMember // sandbox id -> its place in a group
}

type shimGroup struct {
	name    string
	joined  int  // forks ever given this group (at most shimGroupSize)
	live    int  // forks whose task its daemon holds, not being deleted
	closed  bool // no fork joins it any more: its daemon may be exiting
	joining sync.WaitGroup
	// first is closed once the first member's task create returned (or it
	// left before); firstOK says the create succeeded: the daemon listens.
	first   chan struct{}
	firstOK bool
}

type shimMember struct {
	g       *shimGroup
	first   bool // the member whose create starts the group's daemon
	created bool // its task create succeeded: the daemon holds it
}

// join gives fork id a group, to be set in its spec before NewTask ("":
// none, groups are off). The fork counts as joining until created or leave.
func (gs *shimGroups) join(id string) string {
	if gs.off {
		return ""
	}
	gs.mu.Lock()
	defer gs.mu.Unlock()
	if gs.salt == "" {
		var b [6]byte
		rand.Read(b[:])
		gs.salt = hex.EncodeToString(b[:])
		gs.members = map[string]*shimMember{}
	}
	if m := gs.members[id]; m != nil {
		gs.dropLocked(m) // an earlier sandbox of the id never left: not ours any more
		delete(gs.members, id)
	}
	g := gs.open
	first := g == nil || g.closed || g.joined >= shimGroupSize
	if first {
		gs.seq++
		g = &shimGroup{name: "forkfleet-fork-" + gs.salt + "-" + strconv.FormatUint(gs.seq, 10), first: make(chan struct{})}
		gs.open = g
	}
	g.joined++
	g.joining.Add(1)
	gs.members[id] = &shimMember{g: g, first: first}
	return g.name
}

// grouped reports whether fork id is joining a group.
func (gs *shimGroups) grouped(id string) bool {
	gs.mu.Lock()
	defer gs.mu.Unlock()
	m := gs.members[id]
	return m != nil && !m.created
}

// await returns once fork id may create its task in its group: at once for
// the group's first member (its create starts the daemon) and for a fork
// in no group, after the first member's create for the others. It reports
// false when id must create its task in a shim of its own: the first
// create failed (or its fork left before it), or ctx ended; id is then out
// of the group.
func (gs *shimGroups) await(ctx context.Context, id string) bool {
	gs.mu.Lock()
	m := gs.members[id]
	if m == nil || m.created || m.first || gs.concurrentFirst {
		gs.mu.Unlock()
		return true
	}
	g := m.g
	gs.mu.Unlock()
	select {
	case <-g.first:
	case <-ctx.Done():
	}
	gs.mu.Lock()
	defer gs.mu.Unlock()
	if ctx.Err() == nil && g.firstOK {
		return true
	}
	if gs.members[id] == m {
		gs.dropLocked(m)
		delete(gs.members, id)
	}
	return false
}

// created ends fork id's join: its task create succeeded (ok), or failed,
// which closes the group (containerd's cleanup of the failed create may
// have ended a daemon with no live fork) and takes id out of it.
func (gs *shimGroups) created(id string, ok bool) {
	gs.mu.Lock()
	defer gs.mu.Unlock()
	m := gs.members[id]
	if m == nil || m.created {
		return
	}
	if !ok {
		m.g.closed = true
		gs.dropLocked(m)
		delete(gs.members, id)
		return
	}
	m.created = true
	m.g.live++
	m.g.joining.Done()
	if m.first {
		m.g.firstOK = true
		close(m.g.first)
	}
}

// leave takes fork id out of its group before its task is deleted. When it
// is the group's last live fork, the group closes and leave waits (until ctx
// ends) for the forks still joining it: once they are created the daemon
// holds them and the delete does not end it; had the delete come first, the
// daemon would exit under their start.
func (gs *shimGroups) leave(ctx context.Context, id string) {
	gs.mu.Lock()
	m := gs.members[id]
	if m == nil {
		gs.mu.Unlock()
		return
	}
	delete(gs.members, id)
	if !m.created {
		gs.dropLocked(m) // it never reached the daemon
		gs.mu.Unlock()
		return
	}
	g := m.g
	g.live--
	last := g.live == 0
	if last {
		g.closed = true
	}
	gs.mu.Unlock()
	if !last {
		return
	}
	done := make(chan struct{})
	go func() {
		g.joining.Wait()
		close(done)
	}()
	select {
	case <-done:
	case <-ctx.Done():
	}
}

// dropLocked ends the membership of a fork that is no longer the daemon's.
// A first member that leaves before its create succeeded fails the group's
// first create: the forks waiting for it go to shims of their own.
func (gs *shimGroups) dropLocked(m *shimMember) {
	if m.created {
		m.g.live--
		if m.g.live == 0 {
			m.g.closed = true
		}
		return
	}
	m.g.joining.Done()
	if m.first {
		m.g.closed = true
		close(m.g.first)
	}
}

// withShimGroup puts a fork's shim group in its spec ("": none).
func withShimGroup(s *specs.Spec, group string) {
	if group == "" {
		return
	}
	if s.Annotations == nil {
		s.Annotations = map[string]string{}
	}
	s.Annotations[shimGroupAnnotation] = group
}

// ungroup takes a container's spec out of its shim group: its next task
// create starts a shim of its own.
func ungroup(ctx context.Context, c client.Container) error {
	s, err := c.Spec(ctx)
	if err != nil {
		return err
	}
	delete(s.Annotations, shimGroupAnnotation)
	return c.Update(ctx, client.UpdateContainerOpts(client.WithSpec(s)))
}

// newGroupedTask creates a task as newTask does, in its fork's shim group
// when it has one: after the group's first create (await), and once more
// in a shim of its own when the create fails in the group's shim (another
// fork's failed create may have ended it, race 3) or the group's first
// create failed.
func (r *Runtime) newGroupedTask(ctx context.Context, c client.Container, id, layer string, stdio cio.Creator, opts *options.Options) (client.Task, error) {
	if !r.forkShims.grouped(id) {
		return r.newTask(ctx, c, id, layer, stdio, opts)
	}
	if !r.forkShims.await(ctx, id) {
		if err := ungroup(ctx, c); err != nil {
			return nil, err
		}
		return r.newTask(ctx, c, id, layer, stdio, opts)
	}
	t, err := r.newTask(ctx, c, id, layer, stdio, opts)
	if err != nil && r.forkShims.grouped(id) {
		r.forkShims.created(id, false)
		r.log.WarnContext(ctx, "fork task create failed in a shared shim; again in its own", "sandbox", id, "error", err)
		if err = ungroup(ctx, c); err == nil {
			t, err = r.newTask(ctx, c, id, layer, stdio, opts)
		}
	}
	r.forkShims.created(id, err == nil)
	return t, err
}
