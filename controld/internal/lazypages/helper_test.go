package lazypages

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// The test binary re-executed as a helper process: a task whose memory
// the test serves from another process, as a restored replica's is.
const helperEnv = "LAZYPAGES_TEST_HELPER"

// helperBase is where the fork helper maps its region (fixed, so the test
// can write its images first).
const helperBase = 0x7e5a00000000

func TestMain(m *testing.M) {
	switch os.Getenv(helperEnv) {
	case "":
		os.Exit(m.Run())
	case "fork":
		if err := forkHelper(os.Args[len(os.Args)-1]); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		os.Exit(0)
	case "criu":
		if err := criuHelper(os.Args[len(os.Args)-3:]); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		os.Exit(0)
	default:
		fmt.Fprintln(os.Stderr, "unknown helper", os.Getenv(helperEnv))
		os.Exit(2)
	}
}

// runHelper runs the helper named mode with arg and returns its output.
func runHelper(t *testing.T, mode, arg string) ([]byte, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^$", arg)
	cmd.Env = append(os.Environ(), helperEnv+"="+mode)
	return cmd.CombinedOutput()
}

// forkHelper maps the layout's region, hands its uffd to the session at
// workDir as CRIU would, then forks children that check the pages they
// inherit still missing, and checks its own.
func forkHelper(workDir string) error {
	p, err := unix.MmapPtr(-1, 0, unsafe.Add(nil, helperBase), regionLen*pageSize, unix.PROT_READ|unix.PROT_WRITE,
		unix.MAP_PRIVATE|unix.MAP_ANONYMOUS|unix.MAP_FIXED_NOREPLACE)
	if err != nil || uintptr(p) != helperBase {
		return fmt.Errorf("mmap at %#x: %v", helperBase, err)
	}
	mem := unsafe.Slice((*byte)(p), regionLen*pageSize)
	addr := func(i int) uint64 { return helperBase + uint64(i)*pageSize }
	copy(mem[eager*pageSize:lazyB*pageSize], pattern(addr(eager), 2*pageSize))

	fd, _, e := unix.Syscall(unix.SYS_USERFAULTFD, unix.O_CLOEXEC|unix.O_NONBLOCK, 0, 0)
	if e != 0 {
		return fmt.Errorf("userfaultfd: %v", e)
	}
	api := uffdioAPI{API: uffdAPI, Features: needFeatures}
	if err := ioctl(int(fd), ioctlAPI, unsafe.Pointer(&api)); err != nil {
		return fmt.Errorf("UFFDIO_API: %v", err)
	}
	reg := uffdioRegister{Range: uffdioRange{Start: helperBase, Len: regionLen * pageSize}, Mode: registerModeMissing}
	if err := ioctl(int(fd), ioctlRegister, unsafe.Pointer(&reg)); err != nil {
		return fmt.Errorf("UFFDIO_REGISTER: %v", err)
	}
	c, err := net.DialUnix("unix", nil, &net.UnixAddr{Name: filepath.Join(workDir, SocketName), Net: "unix"})
	if err != nil {
		return err
	}
	defer c.Close()
	send := func(v uint32) error {
		_, err := c.Write(binary.NativeEndian.AppendUint32(nil, v))
		return err
	}
	if err := send(uint32(0xfffffffb)); err != nil { // a zombie, pid -5
		return err
	}
	if err := send(1); err != nil {
		return err
	}
	if _, _, err := c.WriteMsgUnix([]byte{0}, unix.UnixRights(int(fd)), nil); err != nil {
		return err
	}
	unix.Close(int(fd))
	if err := send(restoreFinished); err != nil {
		return err
	}

	check := func(what string, from, to int) error {
		if !bytes.Equal(mem[from*pageSize:to*pageSize], pattern(addr(from), (to-from)*pageSize)) {
			return fmt.Errorf("%s: pages %d-%d wrong", what, from, to)
		}
		return nil
	}
	if err := check("parent", 0, 1); err != nil {
		return err
	}
	// The first child inherits almost every lazy page missing.
	if err := forkCheck(mem, addr, lazyA, holeStart); err != nil {
		return err
	}
	if err := check("parent after the first fork", lazyA, holeStart); err != nil {
		return err
	}
	// The second, after the parent took [0, 100), misses the rest.
	if err := forkCheck(mem, addr, lazyB, regionLen); err != nil {
		return err
	}
	if err := check("parent after the second fork", eager, regionLen); err != nil {
		return err
	}
	if !bytes.Equal(mem[holeStart*pageSize:eager*pageSize], make([]byte, (eager-holeStart)*pageSize)) {
		return fmt.Errorf("hole not zero")
	}
	return nil
}

// checkWords reports whether words hold pattern(base): it runs in a forked
// child of a Go process, so it calls nothing (no allocation, no stack
// growth, no bounds-check panic).
//
//go:nosplit
func checkWords(words []uint64, base uint64) uintptr {
	for i := range words {
		if words[i] != (base+uint64(i)*8)*0x9E3779B97F4A7C15+1 {
			return 1
		}
	}
	return 0
}

// forkCheck forks; the child checks pages [from, to) and exits 0 if they
// hold their pattern.
func forkCheck(mem []byte, addr func(int) uint64, from, to int) error {
	words := unsafe.Slice((*uint64)(unsafe.Pointer(&mem[from*pageSize])), (to-from)*pageSize/8)
	base := addr(from)
	pid, _, e := unix.RawSyscall(unix.SYS_FORK, 0, 0, 0)
	if e != 0 {
		return fmt.Errorf("fork: %v", e)
	}
	if pid == 0 {
		unix.RawSyscall(unix.SYS_EXIT_GROUP, checkWords(words, base), 0, 0)
	}
	var ws unix.WaitStatus
	if _, err := unix.Wait4(int(pid), &ws, 0, nil); err != nil {
		return err
	}
	if !ws.Exited() || ws.ExitStatus() != 0 {
		return fmt.Errorf("a child read wrong bytes in pages %d-%d (status %v)", from, to, ws)
	}
	return nil
}
