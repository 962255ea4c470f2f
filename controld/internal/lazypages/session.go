package lazypages

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/forkfleet/forkfleet/api/errdefs"
)

// SocketName is the socket `criu restore --lazy-pages` connects to in its
// --work-dir.
const SocketName = "lazy-pages.socket"

// restoreFinished is CRIU's LAZY_PAGES_RESTORE_FINISHED ("RSTF"), sent on
// the socket once every task is restored. It cannot be a pid (pid_max is
// at most 2^22).
const restoreFinished = 0x52535446

// Defaults, measured (see the package doc).
const (
	DefaultFaultChunk      = 1 << 20
	DefaultBackgroundChunk = 512 << 10
	// wakeChunk bounds a fault's first copy, the one that wakes it.
	wakeChunk = 64 << 10
	// maxLive bounds the uffds one session holds: restored tasks and the
	// forks they make before their pages are all in.
	maxLive = 4096
)

// Option configures a Session.
type Option func(*Session)

// WithFaultChunk sets how much one fault brings in from the faulting page
// on (rounded to pages, at least one page): lazy pages, and zero pages for
// the holes between them; a lazy run up to that size comes whole. The
// first 64 KiB wake the faulting thread.
func WithFaultChunk(bytes int) Option {
	return func(s *Session) { s.chunk = pagesOf(bytes) }
}

// WithBackgroundChunk sets the size of one background copy: a fault waits
// for at most one of them.
func WithBackgroundChunk(bytes int) Option {
	return func(s *Session) { s.bgChunk = pagesOf(bytes) }
}

func pagesOf(bytes int) uint64 {
	if bytes < pageSize {
		return pageSize
	}
	return uint64(bytes) &^ (pageSize - 1)
}

// Stats is what a session did, for a fork's waterfall. Durations count from
// Listen; zero means not yet.
type Stats struct {
	Processes       int   // uffds served: restored tasks and their forks
	Forks           int   // forks seen (UFFD_EVENT_FORK); those with pages missing count in Processes
	Zombies         int   // restored tasks without memory (negative pids)
	LazyPages       int64 // lazy pages of the restored tasks
	Faults          int64 // page faults handled
	FaultPages      int64 // pages copied in for faults
	ZeroPages       int64 // pages zero-filled (not in the images)
	BackgroundPages int64 // pages copied in by background completion
	HotSet          int64 // pages of the checkpoint's hot set (hot.go) the restored tasks miss
	HotPages        int64 // pages copied in from the hot set, ahead of faults
	Bytes           int64 // bytes copied from the images
	FirstFault      time.Duration
	HotDone         time.Duration // the hot set all in (or its processes gone)
	RestoreFinished time.Duration // CRIU's "restore finished"
	Completing      time.Duration // Complete called
	Done            time.Duration // every page in, the session ended
}

// Session serves the lazy pages of one restore: `criu restore
// --lazy-pages --work-dir W` connects to W/lazy-pages.socket, hands over a
// uffd per restored task, and this session copies pages in on faults until
// Complete, then completes them in the background and ends (Done).
//
// The rule the caller keeps: a uffd closed with pages still missing makes
// them read as zeros in the replica. A session that ends without Done
// succeeding (Close before, or Err set) has done that, so the caller kills
// the replica before (or right after) it closes such a session and never
// lets it run on.
type Session struct {
	im      *Images
	chunk   uint64
	bgChunk uint64
	start   time.Time
	path    string

	lfd    int // listening socket, until the restore connects
	wakeMu sync.Mutex
	wake   int // eventfd: Complete, Close, the restore's context; -1 once closed

	completing atomic.Bool
	closing    atomic.Bool
	stopCtx    func() bool

	done     chan struct{}
	exited   chan struct{}
	closeOne sync.Once

	mu    sync.Mutex
	err   error
	stats Stats
}

// Listen binds workDir/lazy-pages.socket for one restore of im's
// checkpoint and serves it. ctx bounds the restore: if it ends before CRIU
// says the restore finished, the session fails; after that only Close
// stops it. The session holds a reference on im until it is closed.
func Listen(ctx context.Context, im *Images, workDir string, opts ...Option) (*Session, error) {
	s := &Session{
		im:      im,
		chunk:   DefaultFaultChunk,
		bgChunk: DefaultBackgroundChunk,
		path:    filepath.Join(workDir, SocketName),
		lfd:     -1,
		wake:    -1,
		done:    make(chan struct{}),
		exited:  make(chan struct{}),
	}
	for _, o := range opts {
		o(s)
	}
	if len(s.path) >= len(unix.RawSockaddrUnix{}.Path) {
		return nil, fmt.Errorf("lazypages: socket path %s is longer than a unix socket address: %w", s.path, errdefs.ErrInvalidArgument)
	}
	if err := im.acquire(); err != nil {
		return nil, err
	}
	if err := s.bind(); err != nil {
		s.closeFDs()
		im.release()
		return nil, err
	}
	s.start = time.Now()
	l := &loop{s: s, ctx: ctx, procs: map[int]*proc{}, pids: map[int32]bool{}, epfd: -1, conn: -1, rec: map[*hotSet][]uint64{}}
	if err := l.init(); err != nil {
		l.cleanup()
		s.closeFDs()
		im.release()
		return nil, err
	}
	s.stopCtx = context.AfterFunc(ctx, s.poke)
	go l.run()
	return s, nil
}

func (s *Session) bind() error {
	if st, err := os.Lstat(s.path); err == nil {
		if st.Mode().Type() != os.ModeSocket {
			return fmt.Errorf("lazypages: %s exists and is not a socket: %w", s.path, errdefs.ErrAlreadyExists)
		}
		if err := os.Remove(s.path); err != nil {
			return fmt.Errorf("lazypages: remove stale %s: %w", s.path, err)
		}
	}
	fd, err := unix.Socket(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC|unix.SOCK_NONBLOCK, 0)
	if err != nil {
		return fmt.Errorf("lazypages: socket: %w", err)
	}
	s.lfd = fd
	if err := unix.Bind(fd, &unix.SockaddrUnix{Name: s.path}); err != nil {
		return fmt.Errorf("lazypages: bind %s: %w", s.path, err)
	}
	if err := unix.Listen(fd, 4); err != nil {
		return fmt.Errorf("lazypages: listen %s: %w", s.path, err)
	}
	s.wake, err = unix.Eventfd(0, unix.EFD_CLOEXEC|unix.EFD_NONBLOCK)
	if err != nil {
		return fmt.Errorf("lazypages: eventfd: %w", err)
	}
	return nil
}

// closeFDs closes what Listen opened before the loop owned it.
func (s *Session) closeFDs() {
	if s.lfd >= 0 {
		unix.Close(s.lfd)
		os.Remove(s.path)
		s.lfd = -1
	}
	if s.wake >= 0 {
		unix.Close(s.wake)
		s.wake = -1
	}
}

func (s *Session) poke() {
	s.wakeMu.Lock()
	defer s.wakeMu.Unlock()
	if s.wake < 0 {
		return
	}
	var one [8]byte
	binary.NativeEndian.PutUint64(one[:], 1)
	_, _ = unix.Write(s.wake, one[:])
}

// Complete starts background completion: from now on, between faults, the
// session copies in every page still missing, and ends once all are in.
// Call it once the replica is verified (its working set came in by faults).
func (s *Session) Complete() {
	if s.completing.CompareAndSwap(false, true) {
		s.mu.Lock()
		s.stats.Completing = time.Since(s.start)
		s.mu.Unlock()
		s.poke()
	}
}

// Done is closed when the session ends: every page in after Complete, a
// failure (Err), or Close.
func (s *Session) Done() <-chan struct{} { return s.done }

// Err is why the session failed; nil while it serves and after it
// completed.
func (s *Session) Err() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.err
}

// Stats returns the session's counters so far.
func (s *Session) Stats() Stats {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.stats
}

// Close stops serving and releases everything: the socket, the uffds (a
// replica with pages missing then reads zeros: kill it first, see
// Session) and the session's reference on its Images. It waits for the
// serving goroutine and is safe to call more than once.
func (s *Session) Close() error {
	s.closeOne.Do(func() {
		s.closing.Store(true)
		s.poke()
		<-s.exited
		s.stopCtx()
		s.wakeMu.Lock()
		unix.Close(s.wake)
		s.wake = -1
		s.wakeMu.Unlock()
		s.im.release()
	})
	return nil
}

func (s *Session) fail(err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.err == nil {
		s.err = err
	}
}

// proc is one uffd: a restored task or a fork of one.
type proc struct {
	pid   int32 // dumped pid (forks keep their parent's: they read its images)
	fd    int
	pages []byte
	img   *procImage
	miss  *missing
	// hot is what is left to copy of the checkpoint's hot set (hot.go), in
	// address order; hotWait is when to try again after its memory was not
	// registered yet.
	hot     []span
	hotWait time.Time
	retry   []uint64 // fault addresses whose copy met EAGAIN (the mm was changing)
	// lastFault is the page of its latest fault.
	lastFault uint64
}

// loop is the session's one goroutine: it owns every fd but the eventfd.
type loop struct {
	s     *Session
	ctx   context.Context
	epfd  int
	conn  int // the restore's connection
	procs map[int]*proc
	order []*proc // background order: restore order, then forks
	pids  map[int32]bool

	finished bool   // CRIU said the restore finished
	buf      []byte // restore protocol bytes not parsed yet
	fds      []int  // uffds received, not yet matched to a pid
	wantFD   int32  // pid waiting for its uffd
	msg      [msgSize]byte
	pre      []prefetchJob // faults' neighbourhoods still to fill, newest last

	// rec is what faults brought in, per pages image, until Complete; then
	// (learned) it goes to the checkpoint's hot set.
	rec     map[*hotSet][]uint64
	learned bool
	hadHot  bool
}

func (l *loop) init() error {
	var err error
	if l.epfd, err = unix.EpollCreate1(unix.EPOLL_CLOEXEC); err != nil {
		return fmt.Errorf("lazypages: epoll: %w", err)
	}
	if err := l.watch(l.s.wake); err != nil {
		return err
	}
	return l.watch(l.s.lfd)
}

func (l *loop) watch(fd int) error {
	ev := unix.EpollEvent{Events: unix.EPOLLIN, Fd: int32(fd)}
	if err := unix.EpollCtl(l.epfd, unix.EPOLL_CTL_ADD, fd, &ev); err != nil {
		return fmt.Errorf("lazypages: epoll add: %w", err)
	}
	return nil
}

func (l *loop) unwatch(fd int) { _ = unix.EpollCtl(l.epfd, unix.EPOLL_CTL_DEL, fd, nil) }

func (l *loop) run() {
	err := l.serve()
	s := l.s
	if err != nil {
		s.fail(err)
	} else {
		s.mu.Lock()
		s.stats.Done = time.Since(s.start)
		s.mu.Unlock()
	}
	l.cleanup()
	close(s.done)
	close(s.exited)
}

var errClosed = fmt.Errorf("lazypages: session closed before every page was in: %w", errdefs.ErrCanceled)

func (l *loop) serve() error {
	s := l.s
	events := make([]unix.EpollEvent, 64)
	for {
		if !l.learned && s.completing.Load() {
			l.learn()
		}
		hot, hotWaits := l.hotNext(time.Now())
		timeout := -1
		switch {
		case len(l.pre) > 0 || hot != nil:
			timeout = 0
		case l.retrying() || hotWaits:
			timeout = 1 // ms: an mm change (fork, mremap, madvise) is completing, or a restorer registering
		case l.finished && s.completing.Load():
			timeout = 0
		}
		n, err := unix.EpollWait(l.epfd, events, timeout)
		if err != nil {
			if errors.Is(err, unix.EINTR) {
				continue
			}
			return fmt.Errorf("lazypages: epoll wait: %w", err)
		}
		for _, ev := range events[:n] {
			fd := int(ev.Fd)
			switch {
			case fd == s.wake:
				var b [8]byte
				_, _ = unix.Read(s.wake, b[:])
				if s.closing.Load() {
					return errClosed
				}
				if !l.finished && l.ctx.Err() != nil {
					return fmt.Errorf("lazypages: the restore did not finish: %w", l.ctx.Err())
				}
			case fd == s.lfd:
				if err := l.accept(); err != nil {
					return err
				}
			case fd == l.conn:
				if err := l.readConn(); err != nil {
					return err
				}
			default:
				p := l.procs[fd]
				if p == nil {
					continue
				}
				if ev.Events&unix.EPOLLERR != 0 {
					// Only an uffd without UFFDIO_API polls so; never drop its
					// pages silently (they would read as zeros).
					return fmt.Errorf("lazypages: uffd of task %d in error: %w", p.pid, errdefs.ErrInternal)
				}
				if err := l.readUffd(p); err != nil {
					return err
				}
			}
		}
		for _, p := range slices.Clone(l.order) {
			if len(p.retry) > 0 {
				if err := l.retry(p); err != nil {
					return err
				}
			}
		}
		// Faults first, then their neighbourhoods, then the hot set, then
		// (once asked) the rest.
		if n == 0 && len(l.pre) > 0 {
			if err := l.prefetch(); err != nil {
				return err
			}
			continue
		}
		if n == 0 {
			if p, _ := l.hotNext(time.Now()); p != nil {
				if err := l.hotStep(p); err != nil {
					return err
				}
				continue
			}
		}
		if !l.finished || !s.completing.Load() {
			continue
		}
		if n == 0 {
			if err := l.background(); err != nil {
				return err
			}
		}
		if l.complete() {
			return nil
		}
	}
}

func (l *loop) retrying() bool {
	for _, p := range l.order {
		if len(p.retry) > 0 {
			return true
		}
	}
	return false
}

func (l *loop) complete() bool {
	if len(l.pre) > 0 {
		return false
	}
	for _, p := range l.order {
		if !p.miss.empty() || len(p.retry) > 0 {
			return false
		}
	}
	return true
}

func (l *loop) cleanup() {
	for _, p := range l.order {
		unix.Close(p.fd)
	}
	l.order, l.procs = nil, nil
	for _, fd := range l.fds {
		unix.Close(fd)
	}
	l.fds = nil
	if l.conn >= 0 {
		unix.Close(l.conn)
		l.conn = -1
	}
	if l.s.lfd >= 0 {
		unix.Close(l.s.lfd)
		os.Remove(l.s.path)
		l.s.lfd = -1
	}
	if l.epfd >= 0 {
		unix.Close(l.epfd)
		l.epfd = -1
	}
}

// accept takes the restore's connection: the first peer that is root (CRIU
// runs as root) or this process's user. The listener closes then, as
// CRIU's daemon does: one restore per session.
func (l *loop) accept() error {
	s := l.s
	fd, _, err := unix.Accept4(s.lfd, unix.SOCK_CLOEXEC|unix.SOCK_NONBLOCK)
	if err != nil {
		if errors.Is(err, unix.EAGAIN) || errors.Is(err, unix.ECONNABORTED) || errors.Is(err, unix.EINTR) {
			return nil
		}
		return fmt.Errorf("lazypages: accept: %w", err)
	}
	cred, err := unix.GetsockoptUcred(fd, unix.SOL_SOCKET, unix.SO_PEERCRED)
	if err != nil || (cred.Uid != 0 && int(cred.Uid) != os.Geteuid()) {
		unix.Close(fd)
		return nil
	}
	l.unwatch(s.lfd)
	unix.Close(s.lfd)
	os.Remove(s.path)
	s.lfd = -1
	l.conn = fd
	ev := unix.EpollEvent{Events: unix.EPOLLIN | unix.EPOLLRDHUP, Fd: int32(fd)}
	if err := unix.EpollCtl(l.epfd, unix.EPOLL_CTL_ADD, fd, &ev); err != nil {
		return fmt.Errorf("lazypages: epoll add: %w", err)
	}
	return nil
}

func protoErr(format string, args ...any) error {
	return fmt.Errorf("lazypages: restore protocol: %s: %w", fmt.Sprintf(format, args...), errdefs.ErrInvalidArgument)
}

// readConn reads CRIU's side of the socket: per task a native-endian int
// pid, then (pid > 0) one byte carrying the uffd in SCM_RIGHTS; a negative
// pid is a task without memory (a zombie); then restoreFinished.
func (l *loop) readConn() error {
	var data [64]byte
	oob := make([]byte, unix.CmsgSpace(4*4))
	for {
		n, oobn, flags, _, err := unix.Recvmsg(l.conn, data[:], oob, unix.MSG_CMSG_CLOEXEC|unix.MSG_DONTWAIT)
		if err != nil {
			if errors.Is(err, unix.EAGAIN) || errors.Is(err, unix.EINTR) {
				return nil
			}
			return fmt.Errorf("lazypages: read from the restore: %w", err)
		}
		if oobn > 0 {
			if err := l.takeFDs(oob[:oobn]); err != nil {
				return err
			}
		}
		if flags&unix.MSG_CTRUNC != 0 {
			return protoErr("control message truncated")
		}
		if n == 0 {
			l.unwatch(l.conn)
			unix.Close(l.conn)
			l.conn = -1
			if !l.finished {
				return fmt.Errorf("lazypages: the restore closed its connection before it finished: %w", errdefs.ErrUnavailable)
			}
			return nil
		}
		l.buf = append(l.buf, data[:n]...)
		if err := l.parse(); err != nil {
			return err
		}
	}
}

func (l *loop) takeFDs(oob []byte) error {
	cmsgs, err := unix.ParseSocketControlMessage(oob)
	if err != nil {
		return protoErr("bad control message: %v", err)
	}
	for _, c := range cmsgs {
		fds, err := unix.ParseUnixRights(&c)
		if err != nil {
			continue
		}
		l.fds = append(l.fds, fds...)
	}
	if len(l.fds) > 1 {
		return protoErr("%d file descriptors at once", len(l.fds))
	}
	return nil
}

func (l *loop) parse() error {
	for {
		if l.finished {
			if len(l.buf) > 0 || len(l.fds) > 0 {
				return protoErr("data after restore finished")
			}
			return nil
		}
		if l.wantFD != 0 {
			if len(l.buf) < 1 {
				return nil
			}
			if len(l.fds) != 1 {
				return protoErr("task %d: no uffd with its message", l.wantFD)
			}
			fd := l.fds[0]
			l.fds, l.buf = l.fds[:0], l.buf[1:]
			pid := l.wantFD
			l.wantFD = 0
			if err := l.addTask(pid, fd); err != nil {
				return err
			}
			continue
		}
		if len(l.buf) < 4 {
			// A uffd comes on the byte after its pid (one recvmsg may read
			// both): here none may be waiting.
			if len(l.fds) > 0 {
				return protoErr("a file descriptor without a pid")
			}
			return nil
		}
		v := int32(binary.NativeEndian.Uint32(l.buf))
		l.buf = l.buf[4:]
		switch {
		case uint32(v) == restoreFinished:
			l.finished = true
			l.s.stopCtx()
			l.s.mu.Lock()
			l.s.stats.RestoreFinished = time.Since(l.s.start)
			l.s.mu.Unlock()
		case v < 0 && v != -1<<31:
			l.s.mu.Lock()
			l.s.stats.Zombies++
			l.s.mu.Unlock()
		case v > 0:
			l.wantFD = v
		default:
			return protoErr("pid %d", v)
		}
	}
}

// isUffd reports whether fd is a userfaultfd: only those get our ioctls.
func isUffd(fd int) bool {
	target, err := os.Readlink("/proc/self/fd/" + strconv.Itoa(fd))
	return err == nil && target == "anon_inode:[userfaultfd]"
}

func (l *loop) addTask(pid int32, fd int) error {
	if !isUffd(fd) {
		unix.Close(fd)
		return protoErr("task %d: the descriptor is not a userfaultfd", pid)
	}
	pi := l.s.im.procs[pid]
	if pi == nil {
		unix.Close(fd)
		return fmt.Errorf("lazypages: restored task %d has no pagemap-%d.img in %s: %w", pid, pid, l.s.im.dir, errdefs.ErrInvalidArgument)
	}
	if l.pids[pid] {
		unix.Close(fd)
		return protoErr("task %d sent twice", pid)
	}
	l.pids[pid] = true
	p := &proc{pid: pid, fd: fd, pages: pi.pages, img: pi, miss: newMissing(pi.runs), hot: pi.hot.spans(pi.runs)}
	if err := l.add(p); err != nil {
		return err
	}
	var hot uint64
	for _, h := range p.hot {
		hot += (h.end - h.start) / pageSize
	}
	l.hadHot = l.hadHot || hot > 0
	l.s.mu.Lock()
	l.s.stats.LazyPages += int64(p.miss.pages())
	l.s.stats.HotSet += int64(hot)
	l.s.mu.Unlock()
	return nil
}

func (l *loop) add(p *proc) error {
	if len(l.order) >= maxLive {
		unix.Close(p.fd)
		return fmt.Errorf("lazypages: more than %d processes with lazy pages: %w", maxLive, errdefs.ErrResourceExhausted)
	}
	if err := l.watch(p.fd); err != nil {
		unix.Close(p.fd)
		return err
	}
	l.procs[p.fd] = p
	l.order = append(l.order, p)
	l.s.mu.Lock()
	l.s.stats.Processes++
	l.s.mu.Unlock()
	return nil
}

// gone forgets a process whose mm went away (exit, exec).
func (l *loop) gone(p *proc) {
	if l.procs[p.fd] != p {
		return
	}
	l.unwatch(p.fd)
	unix.Close(p.fd)
	delete(l.procs, p.fd)
	for i, q := range l.order {
		if q == p {
			l.order = append(l.order[:i], l.order[i+1:]...)
			break
		}
	}
	p.miss, p.retry, p.hot = newMissing(nil), nil, nil
}

// readUffd handles p's messages one read at a time, as CRIU's daemon
// does: a message must be handled before the next is read. The kernel
// fails copies into a process with EAGAIN only until its fork (or remap,
// unmap, remove) event is read; a copy made after reading that event but
// before handling it would take from the parent's set pages its child
// still misses (the child would read zeros), or drop a page that moved.
func (l *loop) readUffd(p *proc) error {
	for l.procs[p.fd] == p {
		n, err := unix.Read(p.fd, l.msg[:])
		if err != nil {
			if errors.Is(err, unix.EAGAIN) || errors.Is(err, unix.EINTR) {
				return nil
			}
			return fmt.Errorf("lazypages: read uffd of task %d: %w", p.pid, err)
		}
		if n != msgSize {
			return fmt.Errorf("lazypages: read uffd of task %d: %d bytes: %w", p.pid, n, errdefs.ErrInternal)
		}
		if err := l.event(p, decodeMsg(l.msg[:])); err != nil {
			return err
		}
	}
	return nil
}

func (l *loop) event(p *proc, m uffdMsg) error {
	switch m.event {
	case eventPagefault:
		l.s.mu.Lock()
		l.s.stats.Faults++
		if l.s.stats.FirstFault == 0 {
			l.s.stats.FirstFault = time.Since(l.s.start)
		}
		l.s.mu.Unlock()
		return l.fault(p, m.a&^(pageSize-1))
	case eventFork:
		// The child's mm is the parent's as of the fork: the pages the parent
		// still misses, the child misses too (copies into the parent since
		// the fork failed with EAGAIN until this event was read).
		fd := int(m.a)
		unix.CloseOnExec(fd)
		l.s.mu.Lock()
		l.s.stats.Forks++
		l.s.mu.Unlock()
		if p.miss.empty() {
			// Nothing lazy left to miss: the child's uffd is not needed (its
			// never-touched pages fill with zeros as without one).
			unix.Close(fd)
			return nil
		}
		child := &proc{pid: p.pid, fd: fd, pages: p.pages, img: p.img, miss: p.miss.clone()}
		return l.add(child)
	case eventRemap:
		p.miss.remap(m.a, m.b, m.c)
		return nil
	case eventRemove:
		// madvise(DONTNEED/REMOVE): the pages read as zeros from now on.
		// Unregister as CRIU does so their faults do not come here; ENOMEM
		// means the mm is gone. Dropping them is what keeps them correct.
		if m.b > m.a {
			if err := uffdUnregister(p.fd, m.a, m.b-m.a); errors.Is(err, unix.ENOMEM) {
				l.gone(p)
				return nil
			}
		}
		p.miss.drop(m.a, m.b)
		return nil
	case eventUnmap:
		p.miss.drop(m.a, m.b)
		return nil
	default:
		return fmt.Errorf("lazypages: task %d: unexpected uffd event %#x: %w", p.pid, m.event, errdefs.ErrInternal)
	}
}

func (l *loop) retry(p *proc) error {
	addrs := p.retry
	p.retry = nil
	for _, a := range addrs {
		if l.procs[p.fd] != p {
			return nil
		}
		if err := l.fault(p, a); err != nil {
			return err
		}
	}
	return nil
}

// fault serves a fault at page addr: a small window of its lazy run (or
// zero pages up to the next lazy page when addr has no data in the
// images), which wakes the faulting thread; the rest of its neighbourhood
// is queued (prefetch), to be filled while no other fault waits, so one
// process's neighbourhood never delays another's fault.
func (l *loop) fault(p *proc, addr uint64) error {
	// A fault inside (or right after) the neighbourhood of the process's
	// previous one is a stream (a framebuffer hash, a heap walk) outrunning
	// the prefetch: it gets the whole chunk at once, holes included.
	first := min(l.s.chunk, wakeChunk)
	stream := addr >= p.lastFault && addr <= p.lastFault+l.s.chunk
	if stream {
		first = l.s.chunk
	}
	p.lastFault = addr
	end := min(addr+l.s.chunk, p.miss.next(addr), addr+first)
	var ok bool
	var err error
	if r, found := p.miss.find(addr); found {
		var start uint64
		start, end = window(r, addr, first)
		ok, err = l.copy(p, start, end, addr)
		if ok && err == nil && r.start < start && r.end-r.start <= l.s.chunk {
			// A run up to the chunk comes whole: its part before the fault too.
			l.queue(p, r.start, start)
		}
	} else {
		ok, err = l.zero(p, addr, end, true)
	}
	if err != nil || !ok {
		return err
	}
	if stream {
		_, _, err = l.ahead(p, end, addr+l.s.chunk)
		return err
	}
	l.queue(p, end, addr+l.s.chunk)
	return nil
}

// prefetchJob is the rest of a fault's neighbourhood, [from, to) of p.
type prefetchJob struct {
	p        *proc
	from, to uint64
}

// maxPrefetch bounds the queue: the oldest neighbourhoods go first, the
// newest faults' are the likeliest read next.
const maxPrefetch = 256

func (l *loop) queue(p *proc, from, to uint64) {
	if from >= to {
		return
	}
	if len(l.pre) == maxPrefetch {
		l.pre = append(l.pre[:0], l.pre[1:]...)
	}
	l.pre = append(l.pre, prefetchJob{p, from, to})
}

// prefetch fills one piece (wakeChunk) of the newest queued neighbourhood.
func (l *loop) prefetch() error {
	j := &l.pre[len(l.pre)-1]
	if l.procs[j.p.fd] != j.p {
		l.pre = l.pre[:len(l.pre)-1]
		return nil
	}
	to := min(j.to, j.from+wakeChunk)
	next, ok, err := l.ahead(j.p, j.from, to)
	j.from = next
	if err != nil || !ok || j.from >= j.to {
		l.pre = l.pre[:len(l.pre)-1]
	}
	return err
}

// ahead fills [from, to): lazy pages from the images, the holes between
// them with zero pages. It stops at the first page it cannot fill (a VMA's
// end, a page already there, an mm changing) and says how far it got.
func (l *loop) ahead(p *proc, from, to uint64) (uint64, bool, error) {
	for from < to {
		if l.procs[p.fd] != p {
			return from, false, nil
		}
		var ok bool
		var err error
		if r, found := p.miss.find(from); found {
			end := min(r.end, to)
			ok, err = l.copy(p, from, end, prefetch)
			from = end
		} else {
			end := min(p.miss.next(from), to)
			ok, err = l.zero(p, from, end, false)
			from = end
		}
		if err != nil || !ok {
			return from, false, err
		}
	}
	return from, true, nil
}

// Values of copy's fault argument that are not a faulting page.
const (
	noFault  = ^uint64(0)     // background completion
	prefetch = ^uint64(0) - 1 // a fault's neighbourhood
	hotFetch = ^uint64(0) - 2 // the checkpoint's hot set
)

// copy copies [start, end), all missing, from the images, handling the
// races CRIU's daemon handles: EEXIST (a page is there already), EAGAIN
// (the mm is changing: retry after its event), ENOENT (not one registered
// VMA any more), ESRCH/ENOSPC (the mm is gone). fault is the faulting
// page, or noFault for background copies.
func (l *loop) copy(p *proc, start, end, fault uint64) (bool, error) {
	for start < end {
		r, ok := p.miss.find(start)
		if !ok {
			return false, fmt.Errorf("lazypages: task %d: %#x is not missing: %w", p.pid, start, errdefs.ErrInternal)
		}
		end = min(end, r.end)
		src := uint64(uintptr(unsafe.Pointer(&p.pages[r.off+(start-r.start)])))
		n, err := uffdCopy(p.fd, start, src, end-start)
		n &^= pageSize - 1
		if n > 0 {
			l.record(p, r.off+(start-r.start), n, fault)
			p.miss.drop(start, start+n)
			l.count(fault, int64(n))
			start += n
		}
		switch {
		case err == nil:
			return true, nil
		case errors.Is(err, unix.EEXIST):
			// The page is there (a duplicate fault, or a race): it is no
			// longer missing; wake a faulter that may wait on it.
			p.miss.drop(start, start+pageSize)
			_ = uffdWake(p.fd, start, pageSize)
			start += pageSize
		case errors.Is(err, unix.EAGAIN):
			if isFault(fault) && fault >= start && fault < end {
				p.retry = append(p.retry, fault)
			}
			return false, nil
		case errors.Is(err, unix.ENOENT) && fault == hotFetch && !l.finished:
			// Not registered yet: CRIU's restorer registers a task's lazy
			// memory once it has moved it into place, after it sent the uffd.
			// Nothing is dropped; the hot set tries again.
			return false, nil
		case errors.Is(err, unix.ENOENT):
			if end-start > pageSize {
				// A VMA was split (mprotect): fall back to the faulting page,
				// or to one page for the background.
				if isFault(fault) && fault >= start && fault < end {
					start = fault
				}
				end = start + pageSize
				continue
			}
			// One page, no registered VMA: unmapped or unregistered (its event
			// may still be queued). Nothing can wait on it; drop it.
			p.miss.drop(start, end)
			_ = uffdWake(p.fd, start, pageSize)
			return false, nil
		case errors.Is(err, unix.ESRCH) || errors.Is(err, unix.ENOSPC):
			l.gone(p)
			return false, nil
		default:
			return false, fmt.Errorf("lazypages: task %d: UFFDIO_COPY %#x+%d: %w", p.pid, start, end-start, err)
		}
	}
	return true, nil
}

func isFault(addr uint64) bool { return addr != noFault && addr != prefetch && addr != hotFetch }

// zero maps the zero page over [start, end), none of it lazy: pages the
// dump found empty. It reports whether all of it is done; a page already
// there or a VMA's end stops it. fault says start is a faulting page, which
// must be resolved (woken) whatever happens.
func (l *loop) zero(p *proc, start, end uint64, fault bool) (bool, error) {
	for {
		n, err := uffdZero(p.fd, start, end-start)
		n &^= pageSize - 1
		if n > 0 {
			l.s.mu.Lock()
			l.s.stats.ZeroPages += int64(n / pageSize)
			l.s.mu.Unlock()
		}
		switch {
		case err == nil:
			return true, nil
		case errors.Is(err, unix.EEXIST):
			if n == 0 && fault {
				_ = uffdWake(p.fd, start, pageSize)
			}
			return false, nil
		case errors.Is(err, unix.EAGAIN):
			if n == 0 && fault {
				p.retry = append(p.retry, start)
			}
			return false, nil
		case errors.Is(err, unix.ENOENT):
			if n > 0 || !fault {
				return false, nil
			}
			if end-start > pageSize {
				end = start + pageSize // a registered VMA ends inside the window
				continue
			}
			_ = uffdWake(p.fd, start, pageSize)
			return false, nil
		case errors.Is(err, unix.ESRCH) || errors.Is(err, unix.ENOSPC):
			l.gone(p)
			return false, nil
		default:
			return false, fmt.Errorf("lazypages: task %d: UFFDIO_ZEROPAGE %#x+%d: %w", p.pid, start, end-start, err)
		}
	}
}

func (l *loop) count(fault uint64, bytes int64) {
	s := l.s
	s.mu.Lock()
	switch fault {
	case noFault:
		s.stats.BackgroundPages += bytes / pageSize
	case hotFetch:
		s.stats.HotPages += bytes / pageSize
	default:
		s.stats.FaultPages += bytes / pageSize
	}
	s.stats.Bytes += bytes
	s.mu.Unlock()
}

// background copies one chunk of the first process with pages missing.
func (l *loop) background() error {
	for _, p := range l.order {
		if p.miss.empty() || len(p.retry) > 0 {
			continue
		}
		r := p.miss.s[0]
		_, err := l.copy(p, r.start, min(r.end, r.start+l.s.bgChunk), noFault)
		return err
	}
	return nil
}

// record notes pages [off, off+n) of p's pages image as brought in by a
// fault (or its neighbourhood), until the session learned (Complete).
func (l *loop) record(p *proc, off, n, fault uint64) {
	if l.learned || fault == noFault || fault == hotFetch || p.img == nil {
		return
	}
	rec := l.rec[p.img.hot]
	if rec == nil {
		rec = make([]uint64, words(p.pages))
		l.rec[p.img.hot] = rec
	}
	setBits(rec, off/pageSize, (off+n)/pageSize)
}

// learn adds what this replica's faults brought in before it was verified
// to its checkpoint's hot set, for the next replicas.
func (l *loop) learn() {
	l.learned = true
	grew := false
	for h, rec := range l.rec {
		grew = h.add(rec) || grew
	}
	l.rec = nil
	if grew {
		l.s.im.keep.changed(l.s.im) // persisted later, off the replica's path (hotfile.go)
	}
}

// hotChunk bounds one copy of the hot set: a fault waits for at most one.
const hotChunk = 256 << 10

// hotNext is the process whose hot set to copy next (restore order), or
// nil; waits says whether one waits for its restorer to register its
// memory. Once no process has any left, HotDone is noted.
func (l *loop) hotNext(now time.Time) (next *proc, waits bool) {
	for _, p := range l.order {
		if len(p.hot) == 0 {
			continue
		}
		if now.Before(p.hotWait) {
			waits = true
			continue
		}
		return p, false
	}
	if !waits && l.hadHot {
		l.hadHot = false
		l.s.mu.Lock()
		l.s.stats.HotDone = time.Since(l.s.start)
		l.s.mu.Unlock()
	}
	return nil, waits
}

// hotStep copies one chunk of p's hot set, skipping pages that are in
// already. A copy that does not go through before the restore finished
// (p's restorer has not registered that memory yet) is tried again a
// millisecond later; after it, copy has dropped what is gone, and an mm
// changing has its event read before the next step.
func (l *loop) hotStep(p *proc) error {
	for len(p.hot) > 0 {
		h := &p.hot[0]
		r, found := p.miss.find(h.start)
		if !found {
			if next := p.miss.next(h.start); next < h.end {
				h.start = next
			} else {
				p.hot = p.hot[1:]
			}
			continue
		}
		end := min(h.end, r.end, h.start+hotChunk)
		ok, err := l.copy(p, h.start, end, hotFetch)
		if err != nil || !ok {
			if !l.finished {
				p.hotWait = time.Now().Add(time.Millisecond)
			}
			return err
		}
		if h.start = end; h.start >= h.end {
			p.hot = p.hot[1:]
		}
		return nil
	}
	return nil
}
