package lazypages

import (
	"encoding/binary"
	"unsafe"

	"golang.org/x/sys/unix"
)

// The userfaultfd ABI (linux/userfaultfd.h) that golang.org/x/sys does not
// carry. amd64 layout; the package builds only there (CRIU's images here are
// x86-64 too).
const (
	pageSize = 4096

	uffdAPI = 0xAA

	ioctlAPI        = 0xC018AA3F // _IOWR(0xAA, 0x3F, struct uffdio_api)
	ioctlRegister   = 0xC020AA00 // _IOWR(0xAA, 0x00, struct uffdio_register)
	ioctlUnregister = 0x8010AA01 // _IOR(0xAA, 0x01, struct uffdio_range)
	ioctlWake       = 0x8010AA02 // _IOR(0xAA, 0x02, struct uffdio_range)
	ioctlCopy       = 0xC028AA03 // _IOWR(0xAA, 0x03, struct uffdio_copy)
	ioctlZeropage   = 0xC020AA04 // _IOWR(0xAA, 0x04, struct uffdio_zeropage)

	eventPagefault = 0x12
	eventFork      = 0x13
	eventRemap     = 0x14
	eventRemove    = 0x15
	eventUnmap     = 0x16

	featureEventFork   = 1 << 1
	featureEventRemap  = 1 << 2
	featureEventRemove = 1 << 3
	featureEventUnmap  = 1 << 6

	// needFeatures is CRIU's NEED_UFFD_API_FEATURES: what `criu restore
	// --lazy-pages` asks for when it opens a task's uffd.
	needFeatures = featureEventFork | featureEventRemap | featureEventRemove | featureEventUnmap

	registerModeMissing = 1

	msgSize = 32 // sizeof(struct uffd_msg)
)

type uffdioAPI struct {
	API      uint64
	Features uint64
	Ioctls   uint64
}

type uffdioRange struct {
	Start uint64
	Len   uint64
}

type uffdioRegister struct {
	Range  uffdioRange
	Mode   uint64
	Ioctls uint64
}

type uffdioCopy struct {
	Dst  uint64
	Src  uint64
	Len  uint64
	Mode uint64
	Copy int64
}

type uffdioZeropage struct {
	Range    uffdioRange
	Mode     uint64
	Zeropage int64
}

func ioctl(fd int, req uintptr, arg unsafe.Pointer) error {
	_, _, e := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), req, uintptr(arg))
	if e != 0 {
		return e
	}
	return nil
}

// uffdCopy copies len bytes from src (an address in this process: the
// pages image's mapping) to dst in the faulting process and wakes it. It
// returns the bytes copied, which the kernel reports also on error.
func uffdCopy(fd int, dst, src, n uint64) (uint64, error) {
	c := uffdioCopy{Dst: dst, Src: src, Len: n}
	err := ioctl(fd, ioctlCopy, unsafe.Pointer(&c))
	return doneBytes(c.Copy, n, err)
}

// uffdZero maps the zero page over [dst, dst+n) and wakes the faulting thread.
func uffdZero(fd int, dst, n uint64) (uint64, error) {
	z := uffdioZeropage{Range: uffdioRange{Start: dst, Len: n}}
	err := ioctl(fd, ioctlZeropage, unsafe.Pointer(&z))
	return doneBytes(z.Zeropage, n, err)
}

func doneBytes(done int64, n uint64, err error) (uint64, error) {
	if err == nil {
		return n, nil
	}
	if done > 0 {
		return uint64(done), err
	}
	return 0, err
}

func uffdWake(fd int, start, n uint64) error {
	r := uffdioRange{Start: start, Len: n}
	return ioctl(fd, ioctlWake, unsafe.Pointer(&r))
}

func uffdUnregister(fd int, start, n uint64) error {
	r := uffdioRange{Start: start, Len: n}
	return ioctl(fd, ioctlUnregister, unsafe.Pointer(&r))
}

// uffdMsg is a decoded struct uffd_msg.
type uffdMsg struct {
	event uint8
	// pagefault: a = address; fork: a = child's uffd; remap: a = from,
	// b = to, c = len; remove/unmap: a = start, b = end.
	a, b, c uint64
}

func decodeMsg(p []byte) uffdMsg {
	m := uffdMsg{event: p[0]}
	arg := p[8:32]
	switch m.event {
	case eventPagefault:
		m.a = binary.LittleEndian.Uint64(arg[8:16])
	case eventFork:
		m.a = uint64(binary.LittleEndian.Uint32(arg[0:4]))
	default:
		m.a = binary.LittleEndian.Uint64(arg[0:8])
		m.b = binary.LittleEndian.Uint64(arg[8:16])
		m.c = binary.LittleEndian.Uint64(arg[16:24])
	}
	return m
}
