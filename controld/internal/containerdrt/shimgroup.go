package containerdrt

import (
	"crypto/rand"
	"encoding/hex"
	"strconv"
	"sync"
	"time"
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
// Forks are grouped as they are made, shimGroupSize to a group, so one shim
// daemon is the failure domain of at most that many replicas (a shim
// killed takes its containers' management with it, as it does for one). A
// group's daemon exits once its last container is deleted; a fork joins a
// group only while the group's previous fork is younger than shimGroupWindow,
// so it does not race a daemon whose containers are all gone (forks of one
// call or burst share, a later fork starts a group of its own). The group
// names carry a per-process random salt: after a restart of controld new
// forks do not join the groups of older ones.
const (
	shimGroupAnnotation = "io.containerd.runc.v2.group"
	shimGroupSize       = 16
	shimGroupWindow     = time.Second
)

// shimGroups hands out fork shim groups; the zero value is ready.
type shimGroups struct {
	mu    sync.Mutex
	salt  string
	group uint64    // the current group
	n     int       // forks in it
	last  time.Time // when the last of them was made
}

// next is the group of a fork made now.
func (g *shimGroups) next() string { return g.nextAt(time.Now()) }

func (g *shimGroups) nextAt(now time.Time) string {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.salt == "" {
		var b [6]byte
		rand.Read(b[:])
		g.salt = hex.EncodeToString(b[:])
	}
	if g.n >= shimGroupSize || now.Sub(g.last) > shimGroupWindow {
		g.group++
		g.n = 0
	}
	g.n++
	g.last = now
	return "forkfleet-fork-" + g.salt + "-" + strconv.FormatUint(g.group, 10)
}
