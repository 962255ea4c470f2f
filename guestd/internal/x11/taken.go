//go:build linux

package x11

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/jezek/xgb/res"
	"github.com/jezek/xgb/xproto"

	"github.com/forkfleet/forkfleet/api/errdefs"
	"github.com/forkfleet/forkfleet/guestd/internal/fscred"
)

// keysTakenTimeout bounds the wait for a client to translate the keys sent
// to it before a spare keycode is reused. A client that takes longer is
// hung or starved: TypeText then fails (TIMEOUT) rather than type a wrong
// character.
var keysTakenTimeout = 10 * time.Second

// keyRecipient returns the pid of the client that receives key events now:
// the owner of the focus window, or under PointerRoot focus of the window
// under the pointer. 0: nobody gets them (focus None, or the root); -1: a
// client guestd cannot watch (no X-Resource, another pid namespace, or
// guestd itself).
func (d *Desktop) keyRecipient() (int, error) {
	w, err := d.keyWindow()
	if err != nil {
		return 0, err
	}
	if w == d.root || w == 0 {
		return 0, nil
	}
	if !d.hasRes {
		return -1, nil
	}
	r, err := res.QueryClientIds(d.conn, 1, []res.ClientIdSpec{{Client: uint32(w), Mask: res.ClientIdMaskLocalClientPID}}).Reply()
	if err != nil || r == nil {
		return -1, nil // the window went away, or the server cannot tell
	}
	for _, id := range r.Ids {
		if id.Spec.Mask&res.ClientIdMaskLocalClientPID != 0 && len(id.Value) > 0 {
			if pid := int(id.Value[0]); pid > 0 && pid != os.Getpid() {
				return pid, nil
			}
		}
	}
	return -1, nil
}

// windowUnderPointer is the deepest window containing the pointer.
func (d *Desktop) windowUnderPointer() (xproto.Window, error) {
	w := d.root
	for range 64 { // the X window tree is shallow; bound it anyway
		r, err := xproto.QueryPointer(d.conn, w).Reply()
		if err != nil {
			return 0, xerr("QueryPointer", err)
		}
		if r == nil || r.Child == 0 {
			return w, nil
		}
		w = r.Child
	}
	return w, nil
}

// keysTaken returns once client pid has translated every key event sent
// to it so far. The X protocol has no acknowledgement for that, so it is
// read from the client's process: its main thread (where X clients run
// their event loop) is asleep waiting for input (poll, select or epoll)
// and did not wake while two round trips through the server flushed
// everything the server still held for it. An event loop sleeps only with
// its event queue empty, and a client that had unread events would have
// woken, so everything sent before was translated. pid 0 needs no wait;
// -1 (a client guestd cannot see) gets remapFallbackDelay.
func (d *Desktop) keysTaken(pid int) error {
	switch {
	case pid == 0:
		return nil
	case pid < 0:
		if err := d.sync(); err != nil {
			return err
		}
		time.Sleep(remapFallbackDelay)
		return nil
	}
	deadline := time.Now().Add(keysTakenTimeout)
	delay := 500 * time.Microsecond
	for {
		idle, err := d.idleAcrossSync(pid)
		if errors.Is(err, fs.ErrNotExist) {
			return nil // the client is gone, and its events with it
		}
		if err != nil {
			return err
		}
		if idle {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("x11: the application receiving the keys (pid %d) has not taken those typed so far within %s: %w",
				pid, keysTakenTimeout, errdefs.ErrDeadlineExceeded)
		}
		time.Sleep(delay)
		delay = min(2*delay, 16*time.Millisecond)
	}
}

func (d *Desktop) idleAcrossSync(pid int) (bool, error) {
	a, err := readTask(pid)
	if err != nil || !a.waiting {
		return false, err
	}
	for range 2 {
		if err := d.sync(); err != nil {
			return false, err
		}
	}
	if f := d.keySync.Load(); f != nil {
		// An error (no bus, no registry) means nobody there to wait for.
		_ = (*f)()
	}
	b, err := readTask(pid)
	if err != nil {
		return false, err
	}
	return b.waiting && a.switches == b.switches, nil
}

// task is what keysTaken reads of a client's main thread.
type task struct {
	waiting  bool   // asleep in an input wait
	switches uint64 // context switches so far: unchanged means it never ran
}

// readTask reads /proc/<pid>/task/<pid>/{status,syscall}. status is
// world-readable; syscall needs ptrace-level access, which guestd (root
// without CAP_SYS_PTRACE) has only with the client's own uid and gid as its
// filesystem identity. Without it, sleeping (state S) has to do.
func readTask(pid int) (task, error) {
	dir := "/proc/" + strconv.Itoa(pid) + "/task/" + strconv.Itoa(pid)
	st, err := os.ReadFile(dir + "/status")
	if err != nil {
		return task{}, err
	}
	var t task
	var state string
	var uid, gid int = -1, -1
	sc := bufio.NewScanner(bytes.NewReader(st))
	for sc.Scan() {
		k, v, _ := strings.Cut(sc.Text(), ":")
		f := strings.Fields(v)
		if len(f) == 0 {
			continue
		}
		switch k {
		case "State":
			state = f[0]
		case "Uid":
			uid, _ = strconv.Atoi(f[0])
		case "Gid":
			gid, _ = strconv.Atoi(f[0])
		case "voluntary_ctxt_switches", "nonvoluntary_ctxt_switches":
			n, _ := strconv.ParseUint(f[0], 10, 64)
			t.switches += n
		}
	}
	if state != "S" || uid < 0 || gid < 0 {
		return t, nil
	}
	var sys []byte
	err = fscred.Do(fscred.Cred{UID: uid, GID: gid}, func() error {
		var err error
		sys, err = os.ReadFile(dir + "/syscall")
		return err
	})
	switch {
	case errors.Is(err, fs.ErrPermission):
		t.waiting = true
		return t, nil
	case err != nil:
		return task{}, err
	}
	f := strings.Fields(string(sys))
	if len(f) == 0 {
		return t, nil
	}
	nr, err := strconv.Atoi(f[0])
	t.waiting = err == nil && slices.Contains(inputWaitSyscalls, nr)
	return t, nil
}
