package lazypages

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/forkfleet/forkfleet/controld/internal/testenv"
)

// The CRIU helper: a process holding criuMB of patterned memory (every
// holeEvery-th page left untouched: the dump has no data for it), dumped
// and restored lazily by the test. Once restored it reads its last
// workingSet pages (last: CRIU's daemon completes pages in address order,
// so a working set at the front would be in before it is read), forks a child that checks every page it inherited
// still missing, checks every page itself, and reports.
const (
	holeEvery  = 64
	workingSet = 1100 // pages: a replica's verification reads about this many
)

// criuMB is the helper's memory: FORKFLEET_LAZYPAGES_MB, default 64.
func criuMB(t *testing.T) int {
	s := os.Getenv("FORKFLEET_LAZYPAGES_MB")
	if s == "" {
		return 64
	}
	n, err := strconv.Atoi(s)
	if err != nil || n < 8 || n > 2048 {
		t.Fatalf("FORKFLEET_LAZYPAGES_MB=%q: want 8 to 2048", s)
	}
	return n
}

// criuWords is what word i of the helper's memory holds.
//
//go:nosplit
func criuWord(i uint64) uint64 {
	if (i*8/pageSize)%holeEvery == holeEvery-1 {
		return 0
	}
	return i*0x9E3779B97F4A7C15 + 7
}

//go:nosplit
func criuCheck(words []uint64) uintptr { return criuCheckFrom(words, 0) }

// criuCheckFrom checks words, the helper's memory from word first on.
//
//go:nosplit
func criuCheckFrom(words []uint64, first uint64) uintptr {
	for i := range words {
		if words[i] != criuWord(first+uint64(i)) {
			return 1
		}
	}
	return 0
}

// criuHelper is the helper's main: args are its size in MiB, the trigger
// file and the result file. It prints "ready" on stdout when filled.
func criuHelper(args []string) error {
	mb, _ := strconv.Atoi(args[0])
	trigger, result := args[1], args[2]
	n := mb << 20
	p, err := unix.MmapPtr(-1, 0, nil, uintptr(n), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		return err
	}
	words := unsafe.Slice((*uint64)(p), n/8)
	for i := range words {
		if w := criuWord(uint64(i)); w != 0 {
			words[i] = w
		}
	}
	fmt.Println("ready")
	for {
		if _, err := os.Stat(trigger); err == nil {
			break
		}
		time.Sleep(2 * time.Millisecond)
	}
	t0 := time.Now()
	ws := len(words) - min(len(words), workingSet*pageSize/8)
	if criuCheckFrom(words[ws:], uint64(ws)) != 0 {
		return os.WriteFile(result, []byte("fail: working set\n"), 0o600)
	}
	t1 := time.Now()
	pid, _, e := unix.RawSyscall(unix.SYS_FORK, 0, 0, 0)
	if e != 0 {
		return e
	}
	if pid == 0 {
		unix.RawSyscall(unix.SYS_EXIT_GROUP, criuCheck(words), 0, 0)
	}
	var st unix.WaitStatus
	if _, err := unix.Wait4(int(pid), &st, 0, nil); err != nil {
		return err
	}
	if !st.Exited() || st.ExitStatus() != 0 {
		return os.WriteFile(result, []byte("fail: the child read wrong bytes\n"), 0o600)
	}
	t2 := time.Now()
	if criuCheck(words) != 0 {
		return os.WriteFile(result, []byte("fail: parent\n"), 0o600)
	}
	t3 := time.Now()
	line := fmt.Sprintf("ok %d %d %d %d\n", t0.UnixNano(), t1.UnixNano(), t2.UnixNano(), t3.UnixNano())
	if err := os.WriteFile(result, []byte(line), 0o600); err != nil {
		return err
	}
	select {} // the test kills it
}

// restoreRun is one lazy restore of the helper's dump, timed from the
// restore's start.
type restoreRun struct {
	restored   time.Duration // `criu restore` returned
	sawTrigger time.Duration // the helper ran again
	workingSet time.Duration // its first workingSet pages read
	childDone  time.Duration // its child checked every page
	allRead    time.Duration // it read every page itself
	complete   time.Duration // the page server finished (every page in)
}

func TestIntegrationCRIULazyRestore(t *testing.T) {
	if !testenv.Enabled() {
		t.Skip("set " + testenv.EnvIntegration + "=1 to restore with CRIU")
	}
	if os.Geteuid() != 0 {
		t.Fatal(testenv.EnvIntegration + "=1 needs root (CRIU)")
	}
	criu, err := exec.LookPath("criu")
	if err != nil {
		t.Fatalf("%s=1 but no criu on PATH (deploy/host-setup.sh installs it): %v", testenv.EnvIntegration, err)
	}
	leakCheck(t)
	// The restored helper is reparented to us when `criu restore -d` exits,
	// so the test can reap it.
	if err := unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0); err != nil {
		t.Fatal(err)
	}
	mb := criuMB(t)
	dir := t.TempDir()
	images := filepath.Join(dir, "images")
	if err := os.Mkdir(images, 0o700); err != nil {
		t.Fatal(err)
	}
	trigger := filepath.Join(dir, "trigger")
	helper := startCRIUHelper(t, dir, mb, trigger)
	runCRIU(t, criu, images, "dump", "-t", strconv.Itoa(helper.Process.Pid), "-D", images, "-o", "dump.log", "-v2")
	helper.Wait() // CRIU killed it
	if err := os.WriteFile(trigger, nil, 0o600); err != nil {
		t.Fatal(err)
	}

	im, err := Open(images)
	if err != nil {
		t.Fatal(err)
	}
	defer im.Close()
	// CRIU names images, and sends over the socket, the pid inside the
	// namespace: the helper is 1 there.
	if pids := im.Processes(); len(pids) != 1 || pids[0] != 1 {
		t.Fatalf("images of pids %v, want [1]", pids)
	}
	if im.LazyBytes() < int64(mb)<<20*(holeEvery-1)/holeEvery {
		t.Fatalf("LazyBytes %d for %d MiB of touched memory", im.LazyBytes(), mb)
	}

	own := restoreOwn(t, criu, dir, images, im)
	peer := restoreDaemon(t, criu, dir, images)
	t.Logf("%d MiB, %d lazy MiB: ms from restore start  restored / running / %d pages read / child checked all / parent read all / every page in",
		mb, im.LazyBytes()>>20, workingSet)
	for _, r := range []struct {
		name string
		r    restoreRun
	}{{"lazypages", own}, {"criu lazy-pages", peer}} {
		ms := func(d time.Duration) string { return strconv.FormatFloat(float64(d)/1e6, 'f', 1, 64) }
		t.Logf("%-16s %s / %s / %s / %s / %s / %s", r.name, ms(r.r.restored), ms(r.r.sawTrigger),
			ms(r.r.workingSet), ms(r.r.childDone), ms(r.r.allRead), ms(r.r.complete))
	}
}

// startCRIUHelper starts the helper as the init of its own pid namespace
// (the restores recreate one, so its pid never collides with the host's,
// and it is pid 1 as a sandbox's first process is) and session (no
// terminal for CRIU to care about), and waits for it to fill its memory.
func startCRIUHelper(t *testing.T, dir string, mb int, trigger string) *exec.Cmd {
	t.Helper()
	out := filepath.Join(dir, "helper.out")
	f, err := os.Create(out)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	cmd := exec.Command(os.Args[0], "-test.run=^$", strconv.Itoa(mb), trigger, filepath.Join(dir, "result"))
	cmd.Env = append(os.Environ(), helperEnv+"=criu")
	cmd.Stdout, cmd.Stderr = f, f
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true, Cloneflags: syscall.CLONE_NEWPID}
	// No fd of ours but stdio may reach it (a flock'd file, make's
	// jobserver pipes): CRIU would refuse or dump them.
	if err := unix.CloseRange(3, math.MaxUint32, unix.CLOSE_RANGE_CLOEXEC); err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	deadline := time.Now().Add(60 * time.Second)
	for {
		b, _ := os.ReadFile(out)
		if bytes.Contains(b, []byte("ready")) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("helper not ready: %s", b)
		}
		time.Sleep(5 * time.Millisecond)
	}
	return cmd
}

// runCRIU runs criu in dir, where its -o log goes.
func runCRIU(t *testing.T, criu, dir string, args ...string) {
	t.Helper()
	cmd := exec.Command(criu, args...)
	cmd.Dir = dir
	if out, err := cmd.CombinedOutput(); err != nil {
		log, _ := os.ReadFile(filepath.Join(dir, args[0]+".log"))
		t.Fatalf("criu %s: %v\n%s\n%s", args[0], err, out, tail(log, 40))
	}
}

func tail(b []byte, lines int) []byte {
	l := bytes.Split(b, []byte("\n"))
	return bytes.Join(l[max(0, len(l)-lines):], []byte("\n"))
}

// restore runs `criu restore --lazy-pages` of the dump with its page server
// listening in work and waits for the helper's report. The caller reaps
// the helper (reap) once the page server is done.
func restore(t *testing.T, criu, dir, images, work string, start time.Time) (restoreRun, int) {
	t.Helper()
	result := filepath.Join(dir, "result")
	os.Remove(result)
	pidfile := filepath.Join(work, "restored.pid")
	cmd := exec.Command(criu, "restore", "-d", "--lazy-pages", "-D", images, "--work-dir", work, "-o", "restore.log", "-v2", "--pidfile", pidfile)
	out, err := cmd.CombinedOutput()
	restored := time.Since(start)
	if err != nil {
		log, _ := os.ReadFile(filepath.Join(work, "restore.log"))
		t.Fatalf("criu restore: %v\n%s\n%s", err, out, tail(log, 40))
	}
	b, _ := os.ReadFile(pidfile)
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		t.Fatalf("criu restore's pidfile: %q", b)
	}
	t.Cleanup(func() { reap(pid) })
	var line string
	deadline := time.Now().Add(60 * time.Second)
	for {
		b, _ := os.ReadFile(result)
		if line = string(b); strings.HasSuffix(line, "\n") {
			break
		}
		if time.Now().After(deadline) {
			hout, _ := os.ReadFile(filepath.Join(dir, "helper.out"))
			t.Fatalf("no report from the restored helper after 60 s: %q\n%s", line, hout)
		}
		time.Sleep(2 * time.Millisecond)
	}
	var ts [4]int64
	if _, err := fmt.Sscanf(line, "ok %d %d %d %d", &ts[0], &ts[1], &ts[2], &ts[3]); err != nil {
		t.Fatalf("restored helper: %s", line)
	}
	since := func(ns int64) time.Duration { return time.Unix(0, ns).Sub(start) }
	return restoreRun{restored: restored, sawTrigger: since(ts[0]), workingSet: since(ts[1]), childDone: since(ts[2]), allRead: since(ts[3])}, pid
}

// reap kills the restored helper, its pid namespace's init (our child: we
// are its subreaper).
func reap(pid int) {
	unix.Kill(pid, unix.SIGKILL)
	var ws unix.WaitStatus
	for {
		_, err := unix.Wait4(pid, &ws, 0, nil)
		if !errors.Is(err, unix.EINTR) {
			return
		}
	}
}

func restoreOwn(t *testing.T, criu, dir, images string, im *Images) restoreRun {
	t.Helper()
	work := filepath.Join(dir, "work-own")
	if err := os.Mkdir(work, 0o700); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	start := time.Now()
	var opts []Option
	if c, err := strconv.Atoi(os.Getenv("FORKFLEET_LAZYPAGES_CHUNK_KB")); err == nil {
		opts = append(opts, WithFaultChunk(c<<10))
	}
	s, err := Listen(ctx, im, work, opts...)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	r, pid := restore(t, criu, dir, images, work, start)
	s.Complete()
	select {
	case <-s.Done():
	case <-time.After(60 * time.Second):
		t.Fatalf("not done 60 s after Complete: %+v", s.Stats())
	}
	if err := s.Err(); err != nil {
		t.Fatal(err)
	}
	st := s.Stats()
	r.complete = st.Done
	reap(pid)
	t.Logf("lazypages stats: %+v", st)
	if st.Processes < 2 || st.Forks < 1 || st.Faults == 0 || st.FaultPages+st.BackgroundPages == 0 {
		t.Fatalf("stats: %+v", st)
	}
	return r
}

// restoreDaemon restores the same dump with CRIU's own `criu lazy-pages`,
// the peer the page server replaces.
func restoreDaemon(t *testing.T, criu, dir, images string) restoreRun {
	t.Helper()
	work := filepath.Join(dir, "work-criu")
	if err := os.Mkdir(work, 0o700); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	d := exec.Command(criu, "lazy-pages", "-D", images, "--work-dir", work, "-o", "lazy-pages.log", "-v2")
	if err := d.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- d.Wait() }()
	defer func() {
		d.Process.Kill()
		<-exited
	}()
	for {
		if _, err := os.Stat(filepath.Join(work, SocketName)); err == nil {
			break
		}
		if time.Since(start) > 10*time.Second {
			t.Fatal("criu lazy-pages: no socket after 10 s")
		}
		time.Sleep(time.Millisecond)
	}
	r, pid := restore(t, criu, dir, images, work, start)
	select {
	case err := <-exited:
		r.complete = time.Since(start)
		exited <- err
		if err != nil {
			log, _ := os.ReadFile(filepath.Join(work, "lazy-pages.log"))
			t.Logf("criu lazy-pages: %v\n%s", err, tail(log, 20))
		}
	case <-time.After(60 * time.Second):
		t.Fatal("criu lazy-pages still running 60 s after the restore")
	}
	reap(pid)
	return r
}
