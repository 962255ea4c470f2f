//go:build linux

package containerdrt

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/forkfleet/forkfleet/controld/internal/runtime"
)

// lazyTestRuntime is a runtime whose lazy restores use ps (nil:
// controld's own page server).
func lazyTestRuntime(t *testing.T, ps PageServer) *Runtime {
	t.Helper()
	if _, err := os.Stat(userfaultfdDevice); err != nil {
		t.Fatalf("lazy restore needs %s: %v", userfaultfdDevice, err)
	}
	r := newTestRuntime(t, testNamespace, func(c *Config) { c.PageServer = ps })
	importTestImage(t, r)
	return r
}

// sandboxFds lists the targets of every open fd of the processes in a
// sandbox's cgroup (pids v1 hierarchy).
func sandboxFdTargets(t *testing.T, r *Runtime, id string) []string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(r.cfg.CgroupRoot, "pids", r.cfg.CgroupParent, id, "cgroup.procs"))
	if err != nil {
		t.Fatalf("sandbox %s processes: %v", id, err)
	}
	var out []string
	for _, pid := range strings.Fields(string(b)) {
		des, _ := os.ReadDir("/proc/" + pid + "/fd")
		for _, de := range des {
			if l, err := os.Readlink("/proc/" + pid + "/fd/" + de.Name()); err == nil {
				out = append(out, pid+":"+l)
			}
		}
	}
	return out
}

// TestIntegrationLazyRestore forks a sandbox holding 64 MiB lazily: its
// memory reads back whole, no restored process holds /dev/userfaultfd, the
// replica is marked pending until its pages are in, and a restart's view
// (another runtime without its session) reports it LazyPending.
func TestIntegrationLazyRestore(t *testing.T) {
	integration(t)
	r := lazyTestRuntime(t, nil)
	ctx := context.Background()
	src := bootT(t, r, testSpec(uniqueID("lazysrc")))
	mustCall(t, src, "set lazy-value")
	mustCall(t, src, "fill 64")
	want := mustCall(t, src, "sum")
	// A reservation larger than the host, as Chromium's: a lazy restore
	// premaps it writable, which the heuristic overcommit refuses unless
	// the CRIU preload makes it MAP_NORESERVE (deploy/criu/uffd.c).
	if got := mustCall(t, src, fmt.Sprintf("reserve %d", hostMemoryGiB(t)*2)); got != "ok" {
		t.Fatalf("reserve: %s", got)
	}
	res := checkpointT(t, r, src.ID, runtime.TierMemory, false)

	if n, err := r.LazyBytes(ctx, res.Ref); err != nil || n < 64<<20 {
		t.Fatalf("LazyBytes = %d, %v; want at least 64 MiB", n, err)
	}
	spec := testSpec(uniqueID("lazyf"))
	spec.LazyRestore = true
	f := restoreT(t, r, spec, res.Ref)
	if got := mustCall(t, f, "get"); got != "lazy-value" {
		t.Errorf("lazy replica value %q", got)
	}
	if got := mustCall(t, f, "sum"); got != want {
		t.Errorf("lazy replica's 64 MiB sum %s, want %s", got, want)
	}
	for _, l := range sandboxFdTargets(t, r, f.ID) {
		if strings.Contains(l, "userfaultfd") && !strings.Contains(l, "anon_inode") {
			t.Errorf("a restored process holds %s", l)
		}
	}
	// Another controld's view: the session is not its own.
	other := newTestRuntime(t, testNamespace)
	if in, err := other.Get(ctx, f.ID); err != nil || (!in.LazyPending && r.lazyPendingLabel(t, f.ID)) {
		t.Errorf("restart view of a pending lazy replica: %+v, %v", in, err)
	}
	r.CompleteRestore(f.ID)
	waitLazyDone(t, r, f.ID)
	if r.lazyPendingLabel(t, f.ID) {
		t.Error("lazy replica still labelled pending after its pages are in")
	}
	if in, err := other.Get(ctx, f.ID); err != nil || in.LazyPending {
		t.Errorf("restart view of a complete lazy replica: %+v, %v", in, err)
	}
	if got := mustCall(t, f, "sum"); got != want {
		t.Errorf("completed lazy replica's sum %s, want %s", got, want)
	}
	// A checkpoint of the lazy replica dumps every page (its dump takes the
	// eager CRIU config): its own fork holds them all.
	res2 := checkpointT(t, r, f.ID, runtime.TierMemory, false)
	g := restoreT(t, r, testSpec(uniqueID("lazyg")), res2.Ref)
	if got := mustCall(t, g, "sum"); got != want {
		t.Errorf("fork of the lazy replica's checkpoint: sum %s, want %s", got, want)
	}
	// A fork slot made for a lazy restore, started lazily.
	pspec := testSpec(uniqueID("lazyp"))
	pspec.LazyRestore = true
	if err := r.PrecreateRestore(ctx, pspec, res.Ref); err != nil {
		t.Fatalf("precreate a lazy fork: %v", err)
	}
	p := restoreT(t, r, pspec, res.Ref)
	if got := mustCall(t, p, "sum"); got != want {
		t.Errorf("lazy replica from a fork slot: sum %s, want %s", got, want)
	}
	if _, live := r.lazySession(p.ID); !live {
		t.Error("a lazy replica from a fork slot has no page session")
	}
	// f was verified (CompleteRestore) after it read its 64 MiB: the
	// checkpoint's working set, which p got ahead of its faults.
	if st, _ := r.LazyStats(p.ID); st.HotPages < 16<<20/4096 {
		t.Errorf("lazy replica after a verified one: %d hot pages, want its working set: %+v", st.HotPages, st)
	}
	// An eager fork of the same checkpoint, side by side.
	e := restoreT(t, r, testSpec(uniqueID("eagerf")), res.Ref)
	if got := mustCall(t, e, "sum"); got != want {
		t.Errorf("eager replica's sum %s, want %s", got, want)
	}
}

// TestIntegrationLazyDeleteCheckpoint deletes a checkpoint while a
// lazy replica still fetches from it: the delete waits for the pages, and
// the replica's memory is whole after.
func TestIntegrationLazyDeleteCheckpoint(t *testing.T) {
	integration(t)
	r := lazyTestRuntime(t, nil)
	ctx := context.Background()
	src := bootT(t, r, testSpec(uniqueID("lazydsrc")))
	mustCall(t, src, "fill 32")
	want := mustCall(t, src, "sum")
	res := checkpointT(t, r, src.ID, runtime.TierMemory, false)
	spec := testSpec(uniqueID("lazydf"))
	spec.LazyRestore = true
	f := restoreT(t, r, spec, res.Ref)
	if err := r.DeleteCheckpoint(ctx, res.Ref); err != nil {
		t.Fatalf("DeleteCheckpoint with a lazy replica: %v", err)
	}
	if _, live := r.lazySession(f.ID); live {
		t.Error("DeleteCheckpoint returned with the replica's session live")
	}
	if got := mustCall(t, f, "sum"); got != want {
		t.Errorf("lazy replica's sum after its checkpoint went %s, want %s", got, want)
	}
	// A lazy fork of a deleted checkpoint fails clearly.
	spec2 := testSpec(uniqueID("lazydf2"))
	spec2.LazyRestore = true
	if _, err := r.Restore(ctx, spec2, res.Ref); err == nil {
		t.Error("lazy Restore of a deleted checkpoint succeeded")
	}
}

// TestIntegrationLazySourceFails ends a lazy replica's page source
// before its pages are in: the replica is killed, not left running with
// zero pages.
func TestIntegrationLazySourceFails(t *testing.T) {
	integration(t)
	ps := &failingPageServer{}
	r := lazyTestRuntime(t, ps)
	src := bootT(t, r, testSpec(uniqueID("lazyxsrc")))
	mustCall(t, src, "fill 32")
	res := checkpointT(t, r, src.ID, runtime.TierMemory, false)
	spec := testSpec(uniqueID("lazyxf"))
	spec.LazyRestore = true
	f := restoreT(t, r, spec, res.Ref)
	ps.fail(errors.New("page source gone"))
	deadline := time.Now().Add(10 * time.Second)
	for {
		in, err := r.Get(context.Background(), f.ID)
		if err == nil && in.Status == runtime.StatusStopped {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("replica whose page source failed still %+v, %v", in, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if _, live := r.lazySession(f.ID); live {
		t.Error("failed session still held")
	}
}

// failingPageServer serves through controld's page server and fails its
// sessions on demand (a session reports an error while its replica runs).
type failingPageServer struct {
	mu       sync.Mutex
	sessions []*failingSession
}

func (p *failingPageServer) Open(dir string) (PageImages, error) {
	im, err := lazyPagesServer{}.Open(dir)
	if err != nil {
		return nil, err
	}
	return &failingImages{PageImages: im, p: p}, nil
}

func (p *failingPageServer) fail(err error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, s := range p.sessions {
		s.failOnce.Do(func() { s.err = err; close(s.done) })
	}
}

type failingImages struct {
	PageImages
	p *failingPageServer
}

func (im *failingImages) Listen(ctx context.Context, work string) (PageSession, error) {
	s, err := im.PageImages.Listen(ctx, work)
	if err != nil {
		return nil, err
	}
	fs := &failingSession{PageSession: s, done: make(chan struct{})}
	im.p.mu.Lock()
	im.p.sessions = append(im.p.sessions, fs)
	im.p.mu.Unlock()
	return fs, nil
}

type failingSession struct {
	PageSession
	done     chan struct{}
	err      error
	failOnce sync.Once
}

func (s *failingSession) Done() <-chan struct{} { return s.done }
func (s *failingSession) Err() error            { <-s.done; return s.err }

func (r *Runtime) lazyPendingLabel(t *testing.T, id string) bool {
	t.Helper()
	c, err := r.client.ContainerService().Get(r.ctx(context.Background()), id)
	if err != nil {
		t.Fatal(err)
	}
	return c.Labels[labelLazyRestore] != ""
}

func waitLazyDone(t *testing.T, r *Runtime, id string) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		if _, live := r.lazySession(id); !live {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("lazy replica %s: pages not all in after 30 s", id)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// hostMemoryGiB is the host's memory and swap, in GiB rounded up.
func hostMemoryGiB(t *testing.T) int {
	t.Helper()
	b, err := os.ReadFile("/proc/meminfo")
	if err != nil {
		t.Fatal(err)
	}
	var kib int
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) >= 2 && (f[0] == "MemTotal:" || f[0] == "SwapTotal:") {
			n, _ := strconv.Atoi(f[1])
			kib += n
		}
	}
	return kib>>20 + 1
}
