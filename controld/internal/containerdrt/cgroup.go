//go:build linux

package containerdrt

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"golang.org/x/sys/unix"
)

// Freezer states (cgroup v1).
const (
	freezerFrozen   = "FROZEN"
	freezerFreezing = "FREEZING"
	freezerThawed   = "THAWED"
)

// errNoFreezer means the sandbox has no v1 freezer cgroup at the expected
// path (cgroup v2 host, a different driver): callers fall back to
// containerd's task.Pause/Resume.
var errNoFreezer = errors.New("no cgroup v1 freezer for the sandbox")

// freezerDir is the sandbox's v1 freezer cgroup: it holds every process of
// the sandbox, as the freezer must.
func (r *Runtime) freezerDir(id string) string {
	return filepath.Join(r.cfg.CgroupRoot, "freezer", r.cgroupsPath(id))
}

func (r *Runtime) freezerStateFile(id string) string {
	return filepath.Join(r.freezerDir(id), "freezer.state")
}

// procsFile lists the sandbox's processes.
func (r *Runtime) procsFile(id string) string {
	return filepath.Join(r.freezerDir(id), "cgroup.procs")
}

// freezerState reads the sandbox's freezer state.
func (r *Runtime) freezerState(id string) (string, error) {
	b, err := os.ReadFile(r.freezerStateFile(id))
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return "", errNoFreezer
		}
		return "", err
	}
	return string(bytes.TrimSpace(b)), nil
}

// setFreezer writes the freezer state directly (about 0.5 ms, against 10 to
// 13 ms through containerd's Pause/Resume) and waits until the kernel
// reports it reached. Writing FROZEN again while FREEZING retries tasks that
// were in uninterruptible sleep.
//
// A freeze can also wait forever: a thread that execs while its process has
// other threads (guestd does, to become tini's child) waits in the kernel
// for them to exit, unfreezable, while they, frozen, never do (cgroup v1
// does not let a frozen task die). So a freeze still FREEZING after
// freezeRetry is thawed and written again: the exec completes in between.
// The retries back off (a freeze that is only slow is restarted less and
// less often) and end with ctx.
func (r *Runtime) setFreezer(ctx context.Context, id, want string) error {
	path := r.freezerStateFile(id)
	write := func(state string) error {
		f, err := os.OpenFile(path, os.O_WRONLY, 0)
		if err != nil {
			if errors.Is(err, fs.ErrNotExist) {
				return errNoFreezer
			}
			return err
		}
		_, werr := f.WriteString(state)
		cerr := f.Close()
		if werr != nil {
			return werr
		}
		return cerr
	}
	if err := write(want); err != nil {
		return err
	}
	delay := 50 * time.Microsecond
	start := time.Now()
	retry, written, retries := freezeRetry, start, 0
	for i := 0; ; i++ {
		st, err := r.freezerState(id)
		if err != nil {
			return err
		}
		if st == want {
			if retries > 0 && r.log != nil {
				r.log.Info("sandbox froze after thawing and freezing it again", "sandbox", id, "retries", retries, "took", time.Since(start))
			}
			return nil
		}
		if err := ctx.Err(); err != nil {
			return fmt.Errorf("cgroup freezer of %s stuck in %s: %w", id, st, err)
		}
		time.Sleep(delay)
		if delay < 5*time.Millisecond {
			delay *= 2
		}
		switch {
		case want == freezerFrozen && time.Since(written) >= retry:
			if err := write(freezerThawed); err != nil {
				return err
			}
			if err := write(want); err != nil {
				return err
			}
			retry, written = min(2*retry, maxFreezeRetry), time.Now()
			retries++
			if r.freezeRetries != nil {
				r.freezeRetries.Inc()
			}
		case i%8 == 7:
			if err := write(want); err != nil {
				return err
			}
		}
	}
}

// A freeze still FREEZING after freezeRetry is thawed and retried, then
// after twice that, up to maxFreezeRetry (setFreezer). A desktop freezes in
// under a millisecond; a loaded host takes tens.
const (
	freezeRetry    = 20 * time.Millisecond
	maxFreezeRetry = 640 * time.Millisecond
)

// killAll kills every process of the sandbox as `runc kill --all` does
// (freeze, signal, thaw), without starting runc: a Go program, 5 to 8 ms
// of CPU on these hosts, in every sandbox's delete. The cgroup is left
// thawed, so the kills land. errNoFreezer: no v1 freezer (the caller asks
// containerd).
func (r *Runtime) killAll(ctx context.Context, id string) error {
	if err := r.setFreezer(ctx, id, freezerFrozen); err != nil {
		if !errors.Is(err, errNoFreezer) {
			// Stuck in FREEZING until ctx ended: let the caller's fallback
			// find it running.
			_ = r.setFreezer(context.WithoutCancel(ctx), id, freezerThawed)
		}
		return err
	}
	kerr := r.killFrozen(id)
	if err := r.setFreezer(ctx, id, freezerThawed); err != nil {
		return errors.Join(kerr, err)
	}
	return kerr
}

// killFrozen sends SIGKILL to every process of the sandbox's frozen
// freezer cgroup and its child cgroups; the signals land at the thaw.
//
// The pids are the kernel's list, and each is signalled through a pidfd
// opened before the list is read again: a process that is still listed
// then is a member of the frozen cgroup, which no process leaves and none
// is born into, so the pidfd is that member and not a process that reused
// a pid freed in between (an exiting member its parent outside the cgroup
// reaped).
func (r *Runtime) killFrozen(id string) error {
	dir := r.freezerDir(id)
	before, err := cgroupPids(dir, 0)
	if err != nil {
		return err
	}
	fds := make(map[int]int, len(before))
	defer func() {
		for _, fd := range fds {
			unix.Close(fd)
		}
	}()
	for _, pid := range before {
		fd, err := unix.PidfdOpen(pid, 0)
		if err != nil {
			if errors.Is(err, unix.ESRCH) {
				continue
			}
			return fmt.Errorf("pidfd of %d: %w", pid, err)
		}
		fds[pid] = fd
	}
	after, err := cgroupPids(dir, 0)
	if err != nil {
		return err
	}
	var errs []error
	for _, pid := range after {
		fd, ok := fds[pid]
		if !ok {
			continue // joined since: none can, short of the host's root
		}
		if err := unix.PidfdSendSignal(fd, unix.SIGKILL, nil, 0); err != nil && !errors.Is(err, unix.ESRCH) {
			errs = append(errs, fmt.Errorf("kill %d: %w", pid, err))
		}
	}
	return errors.Join(errs...)
}

// maxCgroupDepth bounds the walk of a sandbox's cgroup tree: its cgroup
// file systems are read-only inside, so it has no child cgroups of its
// own making.
const maxCgroupDepth = 8

// cgroupPids lists the processes of the v1 cgroup dir and its children.
func cgroupPids(dir string, depth int) ([]int, error) {
	if depth > maxCgroupDepth {
		return nil, fmt.Errorf("cgroup %s: nested deeper than %d", dir, maxCgroupDepth)
	}
	b, err := os.ReadFile(filepath.Join(dir, "cgroup.procs"))
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) && depth == 0 {
			return nil, errNoFreezer
		}
		return nil, err
	}
	var pids []int
	for _, f := range bytes.Fields(b) {
		pid, err := strconv.Atoi(string(f))
		if err != nil || pid <= 0 {
			return nil, fmt.Errorf("cgroup %s: bad pid %q", dir, f)
		}
		pids = append(pids, pid)
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	for _, e := range entries {
		if e.IsDir() {
			sub, err := cgroupPids(filepath.Join(dir, e.Name()), depth+1)
			if err != nil {
				return nil, err
			}
			pids = append(pids, sub...)
		}
	}
	return pids, nil
}

// removeCgroups removes the sandbox's cgroup directories left in any v1
// hierarchy (runc removes them on delete; a crash can leave them).
func (r *Runtime) removeCgroups(id string) error {
	entries, err := os.ReadDir(r.cfg.CgroupRoot)
	if err != nil {
		return err
	}
	var errs []error
	for _, e := range entries {
		if !e.IsDir() { // cpu and cpuacct are symlinks to cpu,cpuacct
			continue
		}
		dir := filepath.Join(r.cfg.CgroupRoot, e.Name(), r.cgroupsPath(id))
		if err := removeCgroupTree(dir); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// removeCgroupTree removes dir and its child cgroups, deepest first. cgroup
// directories are removed with rmdir only (their files cannot be unlinked).
func removeCgroupTree(dir string) error {
	entries, err := os.ReadDir(dir)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return nil
		}
		return err
	}
	for _, e := range entries {
		if e.IsDir() {
			if err := removeCgroupTree(filepath.Join(dir, e.Name())); err != nil {
				return err
			}
		}
	}
	// A cgroup whose last task just died can report EBUSY for a moment.
	var rmErr error
	for range 50 {
		rmErr = os.Remove(dir)
		if rmErr == nil || errors.Is(rmErr, fs.ErrNotExist) {
			return nil
		}
		time.Sleep(2 * time.Millisecond)
	}
	return fmt.Errorf("remove cgroup %s: %w", dir, rmErr)
}
