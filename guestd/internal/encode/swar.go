package encode

import (
	"encoding/binary"
	"unsafe"
)

// load32/store32 are the unchecked little-endian word accesses of the
// filter loops; callers prove the bounds once per row. encoding/binary
// compiles to a single unaligned move on every supported architecture,
// the unsafe slice only drops the per-pixel bounds checks.
func load32(p unsafe.Pointer, off int) uint32 {
	return binary.LittleEndian.Uint32((*[4]byte)(unsafe.Add(p, off))[:])
}

func store32(p unsafe.Pointer, off int, v uint32) {
	binary.LittleEndian.PutUint32((*[4]byte)(unsafe.Add(p, off))[:], v)
}
