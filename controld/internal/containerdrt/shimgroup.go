package containerdrt

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"strconv"
	"sync"

	"github.com/containerd/containerd/v2/client"
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
//     fixed path (a hash of the namespace and the group). When binding it
//     fails because the file exists, `start` dials it: an answer means "join
//     that daemon"; no answer means "stale", and `start` removes the file and
//     binds again.
//   - The daemon exits when containerd asks it to (Shutdown, sent after every
//     task Delete, and after a failed task create) and it holds no container:
//     it stops listening, then removes its socket file.
//
// So a daemon whose last container is deleted dies while a new fork may be
// in `start` for its group: the fork's start finds the file of a daemon
// that no longer answers and fails removing it ("remove pre-existing
// socket: no such file or directory", the failure that reverted the first
// version, whose group was chosen by time alone), or hands containerd the
// address of a daemon that is going, or removes the dying daemon's file and
// binds a new daemon whose file the dying one then removes.
//
// Hence shimGroups counts, for every group, the forks between choosing it
// and the end of their task create (joining) and those whose task its daemon
// holds (live). Deleting a group's last live fork closes the group (no fork
// chooses it again) and waits for its joining forks before the task delete
// that lets the daemon exit: no start can overlap a delete that empties the
// daemon. What remains is a task create that fails in a group with no live
// fork: containerd's cleanup sends that daemon Shutdown, and other forks
// starting in it may fail. A failed create therefore closes its group, and
// a grouped fork whose create failed is created again once, in a shim of
// its own (createTask).
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
}

type shimMember struct {
	g       *shimGroup
	created bool // its task create succeeded: the daemon holds it
}

// join gives fork id a group, to be set in its spec before NewTask. The
// fork counts as joining until created or leave.
func (gs *shimGroups) join(id string) string {
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
	if g == nil || g.closed || g.joined >= shimGroupSize {
		gs.seq++
		g = &shimGroup{name: "forkfleet-fork-" + gs.salt + "-" + strconv.FormatUint(gs.seq, 10)}
		gs.open = g
	}
	g.joined++
	g.joining.Add(1)
	gs.members[id] = &shimMember{g: g}
	return g.name
}

// grouped reports whether fork id is joining a group.
func (gs *shimGroups) grouped(id string) bool {
	gs.mu.Lock()
	defer gs.mu.Unlock()
	m := gs.members[id]
	return m != nil && !m.created
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
func (gs *shimGroups) dropLocked(m *shimMember) {
	if m.created {
		m.g.live--
		if m.g.live == 0 {
			m.g.closed = true
		}
		return
	}
	m.g.joining.Done()
}

// withShimGroup puts a fork's shim group in its spec.
func withShimGroup(s *specs.Spec, group string) {
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
