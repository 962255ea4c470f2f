//go:build linux

package containerdrt

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/core/containers"

	"github.com/forkfleet/forkfleet/api/errdefs"
	"github.com/forkfleet/forkfleet/controld/internal/runtime"
)

// Lazy restore (BootSpec.LazyRestore): a memory-tier replica's CRIU
// restores its processes with their anonymous memory left empty
// ("lazy-pages" in the replica's CRIU config), hands each restored task's
// userfaultfd to a page server over <restore work dir>/lazy-pages.socket,
// and the replica runs at once: the server fills every page at its first
// touch. Once the replica is verified, CompleteRestore has the server copy
// the rest in the background. The page server is controld's own
// (controld/internal/lazypages, unless Config.PageServer); a task's uffd comes
// from /dev/userfaultfd (userfaultfd.go).
//
// While any replica of a checkpoint still fetches pages the checkpoint's
// images are pinned (lazyCheckpoint): DeleteCheckpoint completes them and
// waits, or fails. A replica whose page source fails is killed: a missing
// page would read as zeros. Its container carries labelLazyRestore until
// every page is in, so a controld restart, which ends the page server,
// finds and removes replicas it left incomplete (Instance.LazyPending).

// PageServer serves lazy restores' pages: controld/internal/lazypages, whose
// Images and Session satisfy PageImages and PageSession.
type PageServer interface {
	// Open reads one checkpoint's CRIU images (imagesDir), shared by all of
	// its lazy replicas.
	Open(imagesDir string) (PageImages, error)
}

// PageImages are one checkpoint's images, open for its lazy replicas.
type PageImages interface {
	// LazyBytes is the memory a lazy restore leaves to the page server.
	LazyBytes() int64
	// Listen binds workDir's lazy-pages.socket for one restore; ctx bounds
	// the restore (not the session after it).
	Listen(ctx context.Context, workDir string) (PageSession, error)
	Close() error
}

// PageSession serves one replica's pages.
type PageSession interface {
	// Complete starts copying the pages not touched yet.
	Complete()
	// Done is closed when every page is in, or the session failed (Err).
	Done() <-chan struct{}
	Err() error
	// Stats is what the session did so far.
	Stats() runtime.LazyStats
	// Close ends the session: only once the replica is gone or Done.
	Close() error
}

// labelLazyRestore marks a lazy replica whose pages are not all in yet.
const labelLazyRestore = "forkfleet.lazy-restore"

// lazyCheckpoint is a checkpoint's open images and the replicas using them.
type lazyCheckpoint struct {
	images PageImages
	refs   int
	// deleting: DeleteCheckpoint waits for the refs to go; no new replica.
	deleting bool
	gone     chan struct{} // closed when refs reaches 0 while deleting
}

// lazyReplica is one lazy replica's session.
type lazyReplica struct {
	dir     string // its checkpoint
	session PageSession
	closed  chan struct{}
}

// lazyState is the runtime's lazy restores.
type lazyState struct {
	mu          sync.Mutex
	checkpoints map[string]*lazyCheckpoint // by checkpoint dir
	replicas    map[string]*lazyReplica    // by sandbox id
	bytes       sync.Map                   // checkpoint dir -> its LazyBytes
}

// LazyBytes implements runtime.LazyRestorer: what a lazy restore of ref
// would leave to the page server, or why forks of ref cannot restore lazily
// here (FAILED_PRECONDITION).
func (r *Runtime) LazyBytes(ctx context.Context, ref runtime.CheckpointRef) (int64, error) {
	if ref.Tier != runtime.TierMemory {
		return 0, errdefs.InvalidField("restore_mode", "lazy restore applies to memory-tier checkpoints")
	}
	if err := r.lazyAvailable(); err != nil {
		return 0, err
	}
	if err := r.validateCheckpointDir("from.dir", ref.Dir); err != nil {
		return 0, err
	}
	if n, ok := r.lazy.bytes.Load(ref.Dir); ok {
		return n.(int64), nil // a checkpoint does not change
	}
	im, err := r.acquireLazy(ref.Dir)
	if err != nil {
		return 0, err
	}
	defer r.releaseLazy(ref.Dir)
	n := im.LazyBytes()
	r.lazy.bytes.Store(ref.Dir, n)
	return n, nil
}

// lazyAvailable says why this runtime cannot restore lazily, if it cannot.
func (r *Runtime) lazyAvailable() error {
	dev, err := openUserfaultfd()
	if err != nil {
		return err
	}
	return dev.Close()
}

// acquireLazy opens (or shares) dir's images for one more replica (or
// LazyBytes).
func (r *Runtime) acquireLazy(dir string) (PageImages, error) {
	l := &r.lazy
	l.mu.Lock()
	defer l.mu.Unlock()
	ck := l.checkpoints[dir]
	if ck != nil && ck.deleting {
		return nil, errdefs.WithReason(errdefs.ErrFailedPrecondition, "CHECKPOINT_DELETING", "checkpoint %s is being deleted", dir)
	}
	if ck == nil {
		im, err := r.cfg.PageServer.Open(filepath.Join(dir, criuImageDir))
		if err != nil {
			return nil, fmt.Errorf("checkpoint %s: page server: %w", dir, err)
		}
		ck = &lazyCheckpoint{images: im}
		l.checkpoints[dir] = ck
	}
	ck.refs++
	return ck.images, nil
}

// releaseLazy drops one replica's hold on dir's images. They stay open
// for the checkpoint's next lazy forks (parsed and mapped once) until it is
// deleted: then the last replica closes them.
func (r *Runtime) releaseLazy(dir string) {
	l := &r.lazy
	l.mu.Lock()
	defer l.mu.Unlock()
	ck := l.checkpoints[dir]
	if ck == nil {
		return
	}
	if ck.refs--; ck.refs > 0 || !ck.deleting {
		return
	}
	r.closeImagesLocked(dir, ck)
}

// closeImagesLocked closes a checkpoint's images nothing uses any more.
func (r *Runtime) closeImagesLocked(dir string, ck *lazyCheckpoint) {
	delete(r.lazy.checkpoints, dir)
	if err := ck.images.Close(); err != nil {
		r.log.Warn("close checkpoint images", "checkpoint", dir, "err", err)
	}
	if ck.gone != nil {
		close(ck.gone)
	}
}

// lazyRestore is one lazy restore being started.
type lazyRestore struct {
	r       *Runtime
	id, dir string
	images  PageImages
	uffd    *userfaultfdServer
	session PageSession
}

// startLazy prepares a lazy restore of sandbox id from dir whose CRIU runs
// in work: its page session listening and /dev/userfaultfd offered, both in
// work (controld's own directory, created here).
func (r *Runtime) startLazy(ctx context.Context, id, dir, work string) (*lazyRestore, error) {
	im, err := r.acquireLazy(dir)
	if err != nil {
		return nil, err
	}
	lr := &lazyRestore{r: r, id: id, dir: dir, images: im}
	if err := os.MkdirAll(work, 0o700); err != nil {
		lr.abort()
		return nil, fmt.Errorf("restore work dir: %w: %w", errdefs.ErrInternal, err)
	}
	if lr.uffd, err = serveUserfaultfd(work); err != nil {
		lr.abort()
		return nil, err
	}
	if lr.session, err = im.Listen(ctx, work); err != nil {
		lr.abort()
		return nil, fmt.Errorf("sandbox %s: page server: %w", id, err)
	}
	return lr, nil
}

// abort undoes startLazy for a restore that did not run or failed (its
// processes are gone: runc removes what a failed restore made).
func (lr *lazyRestore) abort() {
	lr.uffd.Close()
	if lr.session != nil {
		lr.session.Close()
	}
	lr.r.releaseLazy(lr.dir)
}

// restored hands a started replica's session to the runtime: it is
// watched until Done, and killed if its pages fail.
func (lr *lazyRestore) restored(ctx context.Context) {
	lr.uffd.Close() // every task made its uffd before the restore ended
	r := lr.r
	rep := &lazyReplica{dir: lr.dir, session: lr.session, closed: make(chan struct{})}
	r.lazy.mu.Lock()
	r.lazy.replicas[lr.id] = rep
	r.lazy.mu.Unlock()
	go r.watchLazy(context.WithoutCancel(ctx), lr.id, rep)
}

// watchLazy waits for a replica's pages. All in: its label goes. Failed:
// the replica is killed (its exit is reported as any other), then the
// session closed.
func (r *Runtime) watchLazy(ctx context.Context, id string, rep *lazyReplica) {
	select {
	case <-rep.session.Done():
	case <-rep.closed: // the replica was deleted first
		return
	}
	if err := rep.session.Err(); err != nil {
		r.log.Error("lazy restore's page source failed: killing the replica", "sandbox", id, "err", err)
		if kerr := r.killTask(ctx, id); kerr != nil {
			r.log.Error("kill replica whose pages failed", "sandbox", id, "err", kerr)
		}
	} else {
		st := rep.session.Stats()
		r.log.Info("lazy restore complete", "sandbox", id, "lazy_pages", st.LazyPages, "faults", st.Faults,
			"fault_pages", st.FaultPages, "hot_pages", st.HotPages, "background_pages", st.BackgroundPages,
			"hot_done", st.HotDone, "restore_finished", st.RestoreFinished, "first_fault", st.FirstFault)
		if err := r.clearLazyLabel(ctx, id); err != nil {
			r.log.Warn("clear lazy restore label", "sandbox", id, "err", err)
		}
	}
	r.endLazy(id)
}

// endLazy closes a replica's session (its pages are in, or the replica is
// gone) and releases its checkpoint.
func (r *Runtime) endLazy(id string) {
	r.lazy.mu.Lock()
	rep := r.lazy.replicas[id]
	delete(r.lazy.replicas, id)
	r.lazy.mu.Unlock()
	if rep == nil {
		return
	}
	close(rep.closed)
	if err := rep.session.Close(); err != nil {
		r.log.Warn("close page session", "sandbox", id, "err", err)
	}
	r.releaseLazy(rep.dir)
}

// CompleteRestore implements runtime.LazyRestorer: a verified lazy
// replica's remaining pages are copied in the background. No-op for any
// other sandbox.
func (r *Runtime) CompleteRestore(id string) {
	r.lazy.mu.Lock()
	rep := r.lazy.replicas[id]
	r.lazy.mu.Unlock()
	if rep != nil {
		rep.session.Complete()
	}
}

// LazyStats implements runtime.LazyRestorer.
func (r *Runtime) LazyStats(id string) (runtime.LazyStats, bool) {
	s, ok := r.lazySession(id)
	if !ok {
		return runtime.LazyStats{}, false
	}
	return s.Stats(), true
}

// lazySession is the session of a lazy replica still fetching pages
// (false when there is none).
func (r *Runtime) lazySession(id string) (PageSession, bool) {
	r.lazy.mu.Lock()
	defer r.lazy.mu.Unlock()
	rep := r.lazy.replicas[id]
	if rep == nil {
		return nil, false
	}
	return rep.session, true
}

// killTask sends SIGKILL to a sandbox's processes.
func (r *Runtime) killTask(ctx context.Context, id string) error {
	ctx = r.ctx(ctx)
	c, err := r.client.LoadContainer(ctx, id)
	if err != nil {
		return convertErr(err)
	}
	t, err := c.Task(ctx, nil)
	if err != nil {
		return convertErr(err)
	}
	return convertErr(t.Kill(ctx, syscall.SIGKILL, client.WithKillAll))
}

// clearLazyLabel removes labelLazyRestore from a replica whose pages are in.
func (r *Runtime) clearLazyLabel(ctx context.Context, id string) error {
	ctx = r.ctx(ctx)
	_, err := r.client.ContainerService().Update(ctx, containers.Container{ID: id, Labels: map[string]string{}}, "labels."+labelLazyRestore)
	return convertErr(err)
}

// waitLazyReplicas is DeleteCheckpoint's first step: no new lazy replica
// of dir starts, the ones fetching from it complete now, and the delete
// waits for them (FAILED_PRECONDITION when ctx ends first: the checkpoint
// stays, its images whole).
func (r *Runtime) waitLazyReplicas(ctx context.Context, dir string) error {
	l := &r.lazy
	l.mu.Lock()
	ck := l.checkpoints[dir]
	if ck == nil {
		l.mu.Unlock()
		return nil
	}
	ck.deleting = true
	l.bytes.Delete(dir)
	if ck.gone == nil {
		ck.gone = make(chan struct{})
	}
	gone := ck.gone
	if ck.refs == 0 {
		r.closeImagesLocked(dir, ck)
	}
	var sessions []PageSession
	for _, rep := range l.replicas {
		if rep.dir == dir {
			sessions = append(sessions, rep.session)
		}
	}
	l.mu.Unlock()
	for _, s := range sessions {
		s.Complete()
	}
	t := time.NewTimer(lazyDeleteWait)
	defer t.Stop()
	select {
	case <-gone:
		return nil
	case <-ctx.Done():
	case <-t.C:
	}
	l.mu.Lock()
	if l.checkpoints[dir] == ck {
		ck.deleting = false // the delete gave up: forks may use it again
	}
	l.mu.Unlock()
	return errdefs.WithReason(errdefs.ErrFailedPrecondition, "CHECKPOINT_IN_USE",
		"checkpoint %s: lazy replicas are still fetching its pages; delete again once they are complete", dir)
}

// lazyDeleteWait bounds DeleteCheckpoint's wait for lazy replicas;
// lazyCloseWait Close's.
const (
	lazyDeleteWait = 30 * time.Second
	lazyCloseWait  = 5 * time.Second
)

// closeLazy ends every page session (Close): replicas still fetching get
// lazyCloseWait to complete; those that do not are killed, since their
// missing pages would read as zeros once the page server is gone.
func (r *Runtime) closeLazy(ctx context.Context) {
	r.lazy.mu.Lock()
	reps := make(map[string]*lazyReplica, len(r.lazy.replicas))
	for id, rep := range r.lazy.replicas {
		reps[id] = rep
		rep.session.Complete()
	}
	r.lazy.mu.Unlock()
	deadline := time.NewTimer(lazyCloseWait)
	defer deadline.Stop()
	for _, rep := range reps {
		select {
		case <-rep.session.Done():
		case <-rep.closed:
		case <-deadline.C:
		case <-ctx.Done():
		}
	}
	for id, rep := range reps {
		select {
		case <-rep.session.Done():
			if rep.session.Err() == nil {
				// Complete: its label goes now, before the client does.
				if err := r.clearLazyLabel(ctx, id); err != nil {
					r.log.Warn("clear lazy restore label", "sandbox", id, "err", err)
				}
				r.endLazy(id)
				continue
			}
		default:
		}
		if err := r.killTask(ctx, id); err != nil && !errors.Is(err, errdefs.ErrNotFound) {
			r.log.Warn("kill incomplete lazy replica", "sandbox", id, "err", err)
		}
		r.endLazy(id)
	}
	r.lazy.mu.Lock()
	for dir, ck := range r.lazy.checkpoints {
		ck.deleting = true
		if ck.refs == 0 {
			r.closeImagesLocked(dir, ck)
		}
	}
	r.lazy.mu.Unlock()
}

// LazySafe implements runtime.LazyRestorer: unless
// vm.overcommit_memory=2. CRIU premaps a lazy restore's private mappings
// writable before their pages come; the heuristic (0) refuses a single
// mapping larger than the host's memory, which Chromium's reservations are,
// and the CRIU preload (deploy/criu/uffd.c) makes such a refused premap
// again without reserving it; strict accounting (2) ignores that and would
// refuse the browser's restore (criu/mem.c "Unable to map ANON_VMA").
func (r *Runtime) LazySafe() bool {
	b, err := os.ReadFile("/proc/sys/vm/overcommit_memory")
	return err == nil && strings.TrimSpace(string(b)) != "2"
}
