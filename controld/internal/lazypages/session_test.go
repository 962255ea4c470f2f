package lazypages

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"
	"unsafe"

	"go.uber.org/goleak"
	"golang.org/x/sys/unix"

	"github.com/forkfleet/forkfleet/api/errdefs"
)

// needUffd skips unless this process may open a userfaultfd with the
// events CRIU asks for (root: CAP_SYS_PTRACE, as controld has).
func needUffd(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("userfaultfd with EVENT_FORK needs root (CAP_SYS_PTRACE)")
	}
}

// openUffd opens a userfaultfd as `criu restore --lazy-pages` does in a
// restored task.
func openUffd(t *testing.T) int {
	t.Helper()
	fd, _, e := unix.Syscall(unix.SYS_USERFAULTFD, unix.O_CLOEXEC|unix.O_NONBLOCK, 0, 0)
	if e != 0 {
		t.Fatalf("userfaultfd: %v", e)
	}
	api := uffdioAPI{API: uffdAPI, Features: needFeatures}
	if err := ioctl(int(fd), ioctlAPI, unsafe.Pointer(&api)); err != nil {
		t.Fatalf("UFFDIO_API: %v", err)
	}
	if api.Features&needFeatures != needFeatures {
		t.Fatalf("kernel lacks uffd features: %#x", api.Features)
	}
	return int(fd)
}

func register(t *testing.T, fd int, addr, n uint64) {
	t.Helper()
	r := uffdioRegister{Range: uffdioRange{Start: addr, Len: n}, Mode: registerModeMissing}
	if err := ioctl(fd, ioctlRegister, unsafe.Pointer(&r)); err != nil {
		t.Fatalf("UFFDIO_REGISTER: %v", err)
	}
}

// fakeRestore speaks CRIU's side of lazy-pages.socket.
type fakeRestore struct {
	t    *testing.T
	conn *net.UnixConn
}

func dialRestore(t *testing.T, workDir string) *fakeRestore {
	t.Helper()
	c, err := net.DialUnix("unix", nil, &net.UnixAddr{Name: filepath.Join(workDir, SocketName), Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return &fakeRestore{t: t, conn: c}
}

func (f *fakeRestore) sendInt(v uint32) {
	if _, err := f.conn.Write(binary.NativeEndian.AppendUint32(nil, v)); err != nil {
		f.t.Fatal(err)
	}
}

func (f *fakeRestore) sendTask(pid int32, uffd int) {
	f.sendInt(uint32(pid))
	if _, _, err := f.conn.WriteMsgUnix([]byte{0}, unix.UnixRights(uffd), nil); err != nil {
		f.t.Fatal(err)
	}
}

func (f *fakeRestore) finish() { f.sendInt(restoreFinished) }

func fdCount(t *testing.T) int {
	t.Helper()
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	return len(ents)
}

// leakCheck fails t if goroutines or fds outlive it.
func leakCheck(t *testing.T) {
	before := fdCount(t)
	running := goleak.IgnoreCurrent()
	t.Cleanup(func() {
		goleak.VerifyNone(t, running)
		if after := fdCount(t); after != before {
			t.Errorf("%d fds open after the test, %d before", after, before)
		}
	})
}

// region is test memory the test serves to itself through a uffd. It is
// mapped and unmapped with raw system calls: unix.Munmap takes whole
// mappings only, and a hole left in it could be the Go runtime's by the
// time the test ends.
type region struct {
	mem  []byte
	base uint64
}

func mapRegion(t *testing.T, pages int) *region {
	t.Helper()
	p, err := unix.MmapPtr(-1, 0, nil, uintptr(pages*pageSize), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		t.Fatal(err)
	}
	r := &region{mem: unsafe.Slice((*byte)(p), pages*pageSize), base: uint64(uintptr(p))}
	t.Cleanup(func() { unix.Syscall(unix.SYS_MUNMAP, uintptr(r.base), uintptr(len(r.mem)), 0) })
	return r
}

func (r *region) page(i int) []byte { return r.mem[i*pageSize : (i+1)*pageSize] }
func (r *region) addr(i int) uint64 { return r.base + uint64(i)*pageSize }

// sysRead reads mem through the kernel (write to a memfd, read back): a
// page missing in mem faults in kernel mode inside a system call. Reading
// it from Go code here would fault in user mode, where the thread cannot
// stop for the garbage collector, and the session (in this same process)
// could wait for the collector: a deadlock only an in-process test has.
func sysRead(t *testing.T, s *Session, mem []byte) []byte {
	t.Helper()
	fd, err := unix.MemfdCreate("lazypages-test", unix.MFD_CLOEXEC)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	done := make(chan error, 1)
	go func() {
		_, err := unix.Write(fd, mem)
		done <- err
	}()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		s.Close() // releases the uffd: the fault ends (with zeros)
		<-done
		t.Fatalf("no page after 10 s (session err %v)", s.Err())
	}
	got := make([]byte, len(mem))
	if _, err := unix.Pread(fd, got, 0); err != nil {
		t.Fatal(err)
	}
	return got
}

// statsWhen waits for the session's counters to satisfy ok: a faulting
// thread runs on as soon as its page is in, before the session counts it.
func statsWhen(t *testing.T, s *Session, ok func(Stats) bool) Stats {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		st := s.Stats()
		if ok(st) || time.Now().After(deadline) {
			return st
		}
		time.Sleep(time.Millisecond)
	}
}

func wantPattern(t *testing.T, what string, got []byte, addr uint64) {
	t.Helper()
	if want := pattern(addr, len(got)); !bytes.Equal(got, want) {
		t.Errorf("%s: wrong bytes", what)
	}
}

func wantZeros(t *testing.T, what string, got []byte) {
	t.Helper()
	if !bytes.Equal(got, make([]byte, len(got))) {
		t.Errorf("%s: not zeros", what)
	}
}

// The layout of the served region, in pages.
const (
	lazyA     = 0   // [0, 100) lazy
	holeStart = 100 // [100, 110) not in the images: zeros
	eager     = 110 // [110, 112) restored eagerly (the test writes them)
	lazyB     = 112 // [112, 256) lazy
	regionLen = 256
)

// layoutImages writes images of the layout above for a region at base,
// as if dumped from pid 1.
func layoutImages(t *testing.T, base uint64) string {
	t.Helper()
	dir := t.TempDir()
	addr := func(i int) uint64 { return base + uint64(i)*pageSize }
	var pages []byte
	for _, span := range [][2]int{{lazyA, holeStart}, {eager, regionLen}} {
		pages = append(pages, pattern(addr(span[0]), (span[1]-span[0])*pageSize)...)
	}
	writeImages(t, dir, 1, 1,
		[]testVMA{{start: base, end: addr(regionLen), flags: anonPrivate}},
		[]testEntry{
			{vaddr: addr(lazyA), nr: holeStart, flags: pePresent | peLazy},
			{vaddr: addr(eager), nr: 2, flags: pePresent},
			{vaddr: addr(lazyB), nr: regionLen - lazyB, flags: pePresent | peLazy},
		}, pages)
	return dir
}

// serveSelf maps a region, writes images for it as if dumped from pid 1,
// registers it with a uffd and hands the uffd to a new session.
func serveSelf(t *testing.T, opts ...Option) (*region, *Images, *Session) {
	t.Helper()
	r := mapRegion(t, regionLen)
	dir := layoutImages(t, r.base)
	copy(r.mem[eager*pageSize:lazyB*pageSize], pattern(r.addr(eager), 2*pageSize))

	im, err := Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { im.Close() })
	s, err := Listen(context.Background(), im, t.TempDir(), opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	uffd := openUffd(t)
	register(t, uffd, r.base, regionLen*pageSize)
	f := dialRestore(t, filepath.Dir(s.path))
	f.sendInt(uint32(-5 & 0xffffffff)) // a zombie first
	f.sendTask(1, uffd)
	unix.Close(uffd) // the restorer closes its copy too
	f.finish()
	return r, im, s
}

func TestSessionServes(t *testing.T) {
	needUffd(t)
	leakCheck(t)
	r, im, s := serveSelf(t, WithFaultChunk(16*pageSize), WithBackgroundChunk(8*pageSize))

	wantPattern(t, "page 5", sysRead(t, s, r.page(5)), r.addr(5))
	st := statsWhen(t, s, func(st Stats) bool { return st.FaultPages > 0 })
	if st.Faults != 1 || st.FaultPages != 16 || st.FirstFault == 0 {
		t.Fatalf("one fault should bring 16 pages: %+v", st)
	}
	if st.Processes != 1 || st.Zombies != 1 || st.LazyPages != holeStart+regionLen-lazyB || st.RestoreFinished == 0 {
		t.Fatalf("restore counters: %+v", st)
	}
	wantPattern(t, "pages 6-20", sysRead(t, s, r.mem[6*pageSize:21*pageSize]), r.addr(6))
	if st := s.Stats(); st.Faults != 1 {
		t.Fatalf("the window's pages faulted again: %+v", st)
	}
	// What is left of a run, when small, comes whole: pages 0-4 for a
	// fault at 3.
	wantPattern(t, "page 3", sysRead(t, s, r.page(3)), r.addr(3))
	wantPattern(t, "pages 0-4", sysRead(t, s, r.mem[:5*pageSize]), r.addr(0))
	if st := statsWhen(t, s, func(st Stats) bool { return st.FaultPages >= 21 }); st.Faults != 2 || st.FaultPages != 21 {
		t.Fatalf("a fault at 3 should bring 0-4: %+v", st)
	}
	wantZeros(t, "page 103", sysRead(t, s, r.page(103)))
	if st := statsWhen(t, s, func(st Stats) bool { return st.ZeroPages > 0 }); st.ZeroPages != eager-103 {
		t.Fatalf("zero pages %d, want the hole's rest, %d", st.ZeroPages, eager-103)
	}
	wantPattern(t, "page 110", sysRead(t, s, r.page(eager)), r.addr(eager))

	// madvise(DONTNEED): the pages read as zeros from now on.
	if err := unix.Madvise(r.mem[120*pageSize:130*pageSize], unix.MADV_DONTNEED); err != nil {
		t.Fatal(err)
	}
	wantZeros(t, "removed pages", sysRead(t, s, r.mem[120*pageSize:130*pageSize]))
	// munmap of the region's end: those pages leave the set.
	if _, _, e := unix.Syscall(unix.SYS_MUNMAP, uintptr(r.addr(250)), (regionLen-250)*pageSize, 0); e != 0 {
		t.Fatal(e)
	}
	r.mem = r.mem[:250*pageSize]
	// mremap: pages 200-239 move (DONTUNMAP keeps their old range mapped,
	// empty); their bytes must follow them.
	dst := mapRegion(t, 40)
	moved, _, e := unix.Syscall6(unix.SYS_MREMAP, uintptr(r.addr(200)), 40*pageSize, 40*pageSize,
		unix.MREMAP_MAYMOVE|unix.MREMAP_FIXED|unix.MREMAP_DONTUNMAP, uintptr(dst.base), 0)
	if e != 0 || uint64(moved) != dst.base {
		t.Fatalf("mremap: %v", e)
	}
	for i := 0; i < 40; i += 7 {
		wantPattern(t, "moved page", sysRead(t, s, dst.page(i)), r.addr(200+i))
	}

	select {
	case <-s.Done():
		t.Fatalf("done before Complete: %v", s.Err())
	default:
	}
	completeSession(t, s)
	st = s.Stats()
	if st.BackgroundPages == 0 || st.Done == 0 || st.Completing == 0 {
		t.Fatalf("background: %+v", st)
	}
	// The uffd is closed now: had a page been left out, it reads zeros here.
	for i := 0; i < regionLen; i++ {
		switch {
		case i >= 250 || (i >= 200 && i < 240):
		case i >= 120 && i < 130, i >= holeStart && i < eager:
			wantZeros(t, "page", r.page(i))
		default:
			wantPattern(t, "page", r.page(i), r.addr(i))
		}
	}
	for i := 0; i < 40; i++ {
		wantPattern(t, "moved page", dst.page(i), r.addr(200+i))
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	im.Close()
	if im.maps != nil {
		t.Fatal("the pages stay mapped after the images and their last session closed")
	}
}

// A fault's neighbourhood past its first 64 KiB comes in the background
// of faults: lazy pages, then the hole after them as zero pages, up to a
// page already there.
func TestSessionPrefetch(t *testing.T) {
	needUffd(t)
	leakCheck(t)
	r, _, s := serveSelf(t, WithFaultChunk(64*pageSize))
	wantPattern(t, "page 30", sysRead(t, s, r.page(30)), r.addr(30))
	st := statsWhen(t, s, func(st Stats) bool { return st.FaultPages >= 64 })
	if st.Faults != 1 || st.FaultPages != 64 {
		t.Fatalf("a fault at 30 should bring 30-93: %+v", st)
	}
	wantPattern(t, "pages 30-93", sysRead(t, s, r.mem[30*pageSize:94*pageSize]), r.addr(30))
	if st := s.Stats(); st.Faults != 1 {
		t.Fatalf("the neighbourhood faulted again: %+v", st)
	}
	// Far from the last fault: the end of the run (moved back to stay
	// inside it), then the hole as zeros, up to the eager pages.
	wantPattern(t, "page 99", sysRead(t, s, r.page(99)), r.addr(99))
	st = statsWhen(t, s, func(st Stats) bool { return st.ZeroPages >= eager-holeStart })
	if st.Faults != 2 || st.ZeroPages != eager-holeStart {
		t.Fatalf("a fault at 99 should bring the hole: %+v", st)
	}
	wantZeros(t, "hole", sysRead(t, s, r.mem[holeStart*pageSize:eager*pageSize]))
	if st := s.Stats(); st.Faults != 2 {
		t.Fatalf("the hole faulted again: %+v", st)
	}
}

func TestSessionFork(t *testing.T) {
	needUffd(t)
	leakCheck(t)
	im, err := Open(layoutImages(t, helperBase))
	if err != nil {
		t.Fatal(err)
	}
	defer im.Close()
	work := t.TempDir()
	s, err := Listen(context.Background(), im, work, WithFaultChunk(8*pageSize))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	// The helper plays a restored task: its region comes through the
	// session, and it forks twice with pages missing.
	out, err := runHelper(t, "fork", work)
	if err != nil {
		t.Fatalf("helper: %v\n%s", err, out)
	}
	st := statsWhen(t, s, func(st Stats) bool { return st.Forks == 2 })
	if st.Forks != 2 || st.Processes != 3 || st.Zombies != 1 {
		t.Fatalf("forks not seen: %+v", st)
	}
	completeSession(t, s)
}

// Replicas of one checkpoint share its Images, and the images stay
// readable for them after the owner closed it (a deleted checkpoint).
func TestSessionsShareImages(t *testing.T) {
	needUffd(t)
	leakCheck(t)
	im, err := Open(layoutImages(t, helperBase))
	if err != nil {
		t.Fatal(err)
	}
	var works [2]string
	var sessions [2]*Session
	for i := range sessions {
		works[i] = t.TempDir()
		if sessions[i], err = Listen(context.Background(), im, works[i]); err != nil {
			t.Fatal(err)
		}
	}
	im.Close()
	errs := make(chan error, 2)
	for i := range sessions {
		go func() {
			out, err := runHelper(t, "fork", works[i])
			if err != nil {
				err = fmt.Errorf("replica %d: %v\n%s", i, err, out)
			}
			errs <- err
		}()
	}
	for range sessions {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	for i, s := range sessions {
		if st := s.Stats(); st.Forks != 2 || st.Faults == 0 {
			t.Fatalf("replica %d: %+v", i, st)
		}
		s.Close()
		if i == 0 && im.maps == nil {
			t.Fatal("the images went with the first session")
		}
	}
	if im.maps != nil {
		t.Fatal("the images stay mapped after their owner and every session closed")
	}
}

func TestSessionFailures(t *testing.T) {
	needUffd(t)
	leakCheck(t)
	dir := t.TempDir()
	writeImages(t, dir, 1, 1, []testVMA{{start: 0x10000, end: 0x20000, flags: anonPrivate}},
		[]testEntry{{vaddr: 0x10000, nr: 1, flags: pePresent | peLazy}}, make([]byte, pageSize))
	im, err := Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer im.Close()
	wait := func(t *testing.T, s *Session) error {
		t.Helper()
		select {
		case <-s.Done():
			return s.Err()
		case <-time.After(10 * time.Second):
			t.Fatal("the session hangs")
			return nil
		}
	}

	t.Run("connection closed early", func(t *testing.T) {
		s, err := Listen(context.Background(), im, t.TempDir())
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		f := dialRestore(t, filepath.Dir(s.path))
		f.sendInt(uint32(-3 & 0xffffffff))
		f.conn.Close()
		if err := wait(t, s); !errors.Is(err, errdefs.ErrUnavailable) {
			t.Fatalf("err %v", err)
		}
	})
	t.Run("context ends before the restore", func(t *testing.T) {
		ctx, cancel := context.WithCancel(context.Background())
		s, err := Listen(ctx, im, t.TempDir())
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		cancel()
		if err := wait(t, s); !errors.Is(err, context.Canceled) {
			t.Fatalf("err %v", err)
		}
		if _, err := os.Lstat(s.path); !errors.Is(err, os.ErrNotExist) {
			t.Fatalf("socket left: %v", err)
		}
	})
	t.Run("not a uffd", func(t *testing.T) {
		s, err := Listen(context.Background(), im, t.TempDir())
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		var p [2]int
		if err := unix.Pipe2(p[:], unix.O_CLOEXEC); err != nil {
			t.Fatal(err)
		}
		dialRestore(t, filepath.Dir(s.path)).sendTask(1, p[0])
		unix.Close(p[0])
		unix.Close(p[1])
		if err := wait(t, s); !errors.Is(err, errdefs.ErrInvalidArgument) {
			t.Fatalf("err %v", err)
		}
	})
	t.Run("unknown pid", func(t *testing.T) {
		s, err := Listen(context.Background(), im, t.TempDir())
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		uffd := openUffd(t)
		dialRestore(t, filepath.Dir(s.path)).sendTask(42, uffd)
		unix.Close(uffd)
		if err := wait(t, s); !errors.Is(err, errdefs.ErrInvalidArgument) {
			t.Fatalf("err %v", err)
		}
	})
	t.Run("garbage", func(t *testing.T) {
		s, err := Listen(context.Background(), im, t.TempDir())
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		dialRestore(t, filepath.Dir(s.path)).sendInt(0)
		if err := wait(t, s); !errors.Is(err, errdefs.ErrInvalidArgument) {
			t.Fatalf("err %v", err)
		}
	})
	t.Run("closed before done", func(t *testing.T) {
		s, err := Listen(context.Background(), im, t.TempDir())
		if err != nil {
			t.Fatal(err)
		}
		s.Close()
		if err := wait(t, s); !errors.Is(err, errdefs.ErrCanceled) {
			t.Fatalf("err %v", err)
		}
	})
	t.Run("path too long", func(t *testing.T) {
		_, err := Listen(context.Background(), im, "/"+string(bytes.Repeat([]byte("d"), 120)))
		if !errors.Is(err, errdefs.ErrInvalidArgument) {
			t.Fatalf("err %v", err)
		}
	})
	t.Run("images closed", func(t *testing.T) {
		dir2 := t.TempDir()
		writeImages(t, dir2, 1, 1, []testVMA{{start: 0x10000, end: 0x20000, flags: anonPrivate}}, nil, []byte{})
		im2, err := Open(dir2)
		if err != nil {
			t.Fatal(err)
		}
		im2.Close()
		if _, err := Listen(context.Background(), im2, t.TempDir()); !errors.Is(err, errdefs.ErrFailedPrecondition) {
			t.Fatalf("err %v", err)
		}
	})
}

// A checkpoint's later replicas get the pages its first replica's faults
// brought in before it was verified, in bulk, as soon as the restore has
// registered their memory, before the restore ends: they run without
// those faults.
func TestSessionHotSet(t *testing.T) {
	needUffd(t)
	leakCheck(t)
	const base = 0x7e5b00000000
	im, err := Open(layoutImages(t, base))
	if err != nil {
		t.Fatal(err)
	}
	defer im.Close()
	mapAt := func() *region {
		p, err := unix.MmapPtr(-1, 0, unsafe.Add(nil, base), regionLen*pageSize, unix.PROT_READ|unix.PROT_WRITE,
			unix.MAP_PRIVATE|unix.MAP_ANONYMOUS|unix.MAP_FIXED_NOREPLACE)
		if err != nil || uintptr(p) != base {
			t.Fatalf("mmap at %#x: %v", base, err)
		}
		r := &region{mem: unsafe.Slice((*byte)(p), regionLen*pageSize), base: base}
		copy(r.mem[eager*pageSize:lazyB*pageSize], pattern(r.addr(eager), 2*pageSize))
		return r
	}
	unmap := func(r *region) { unix.Syscall(unix.SYS_MUNMAP, uintptr(r.base), uintptr(len(r.mem)), 0) }

	// The first replica faults at pages 5 and 130, 16 pages each.
	r := mapAt()
	s1, err := Listen(context.Background(), im, t.TempDir(), WithFaultChunk(16*pageSize))
	if err != nil {
		t.Fatal(err)
	}
	uffd := openUffd(t)
	register(t, uffd, r.base, regionLen*pageSize)
	f := dialRestore(t, filepath.Dir(s1.path))
	f.sendTask(1, uffd)
	unix.Close(uffd)
	f.finish()
	wantPattern(t, "page 5", sysRead(t, s1, r.page(5)), r.addr(5))
	wantPattern(t, "page 130", sysRead(t, s1, r.page(130)), r.addr(130))
	statsWhen(t, s1, func(st Stats) bool { return st.FaultPages >= 32 })
	if n := im.HotPages(); n != 0 {
		t.Fatalf("a replica not yet verified taught %d hot pages", n)
	}
	completeSession(t, s1)
	s1.Close()
	if n := im.HotPages(); n != 32 {
		t.Fatalf("hot set of %d pages after the first replica, want its 32 fault pages", n)
	}
	unmap(r)

	// The next replica: its uffd comes before its memory is registered (as
	// CRIU sends it before the restorer runs); the hot set waits for the
	// registration, then comes in before the restore has finished.
	r = mapAt()
	defer unmap(r)
	s2, err := Listen(context.Background(), im, t.TempDir(), WithFaultChunk(16*pageSize))
	if err != nil {
		t.Fatal(err)
	}
	defer s2.Close()
	uffd = openUffd(t)
	f = dialRestore(t, filepath.Dir(s2.path))
	f.sendTask(1, uffd)
	time.Sleep(20 * time.Millisecond)
	if st := s2.Stats(); st.HotSet != 32 || st.HotPages != 0 || s2.Err() != nil {
		t.Fatalf("before the registration: %+v, err %v", st, s2.Err())
	}
	register(t, uffd, r.base, regionLen*pageSize)
	unix.Close(uffd)
	if st := statsWhen(t, s2, func(st Stats) bool { return st.HotPages == 32 }); st.HotPages != 32 || st.HotDone == 0 || st.RestoreFinished != 0 {
		t.Fatalf("the hot set should be in before the restore finished: %+v", st)
	}
	f.finish()
	wantPattern(t, "pages 5-20", sysRead(t, s2, r.mem[5*pageSize:21*pageSize]), r.addr(5))
	wantPattern(t, "pages 130-145", sysRead(t, s2, r.mem[130*pageSize:146*pageSize]), r.addr(130))
	if st := s2.Stats(); st.Faults != 0 {
		t.Fatalf("hot pages faulted: %+v", st)
	}
	wantPattern(t, "page 50", sysRead(t, s2, r.page(50)), r.addr(50))
	completeSession(t, s2)
	if st := s2.Stats(); st.Faults != 1 || st.HotPages != 32 {
		t.Fatalf("after completion: %+v", st)
	}
	for i := 0; i < regionLen; i++ {
		if i >= holeStart && i < eager {
			continue // never touched: no zero page was asked for
		}
		wantPattern(t, "page", r.page(i), r.addr(i))
	}
	// Its own fault (page 50, 16 pages) joins the set.
	if n := im.HotPages(); n != 48 {
		t.Fatalf("hot set of %d pages after the second replica, want 48", n)
	}
}

// completeSession calls Complete and waits for s to finish without error.
func completeSession(t *testing.T, s *Session) {
	t.Helper()
	s.Complete()
	select {
	case <-s.Done():
	case <-time.After(10 * time.Second):
		t.Fatalf("not done 10 s after Complete: %+v", s.Stats())
	}
	if err := s.Err(); err != nil {
		t.Fatal(err)
	}
}
