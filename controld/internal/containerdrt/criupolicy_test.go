//go:build linux

package containerdrt

import (
	"bytes"
	"encoding/binary"
	"errors"
	"os"
	"path/filepath"
	"testing"

	criucore "github.com/checkpoint-restore/go-criu/v7/crit/images/criu-core"
	criuseccomp "github.com/checkpoint-restore/go-criu/v7/crit/images/seccomp"
	"github.com/checkpoint-restore/go-criu/v7/magic"

	"github.com/forkfleet/forkfleet/api/errdefs"
)

// TestReadSingleEntryHostile: images from another host are read within
// bounds, and every malformed one is a FAILED_PRECONDITION, never a panic or
// a huge allocation.
func TestReadSingleEntryHostile(t *testing.T) {
	core := uint32(magic.LoadMagic().ByName["CORE"])
	common := uint32(magic.LoadMagic().ByName["IMG_COMMON"])
	img := func(words ...uint32) []byte {
		var b []byte
		for _, w := range words {
			b = binary.LittleEndian.AppendUint32(b, w)
		}
		return b
	}
	for name, data := range map[string][]byte{
		"empty":       nil,
		"wrong magic": img(common, 0x1234, 0),
		"huge entry":  img(common, core, 0xffffffff),
		"truncated":   append(img(common, core, 100), 1, 2, 3),
		"not proto":   append(img(common, core, 4), 0xff, 0xff, 0xff, 0xff),
	} {
		p := filepath.Join(t.TempDir(), "core-1.img")
		if err := os.WriteFile(p, data, 0o600); err != nil {
			t.Fatal(err)
		}
		var c criucore.CoreEntry
		if err := readSingleEntry(p, uint64(core), &c); !errors.Is(err, errdefs.ErrFailedPrecondition) {
			t.Errorf("%s: %v, want FailedPrecondition", name, err)
		}
	}
	if err := checkProcessState(t.TempDir(), processPolicy{}); !errors.Is(err, errdefs.ErrFailedPrecondition) {
		t.Errorf("images without a process: %v", err)
	}
}

func TestCapBits(t *testing.T) {
	if got := capBits([]uint32{0x1fb, 0}); got != 0x1fb {
		t.Errorf("capBits = %#x", got)
	}
	if got := capBits([]uint32{0, 1, 1}); got&(1<<63) == 0 {
		t.Errorf("a third word must never pass: %#x", got)
	}
}

// Two dumps of one sandbox spec under runc: the programs differ only in the
// order of the ENOSYS stub's architecture blocks, and name one filter.
func TestFilterDigestRuncStub(t *testing.T) {
	read := func(name string) []byte {
		b, err := os.ReadFile(filepath.Join("testdata", "seccomp", name))
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	a, b := read("runc-default-a.bin"), read("runc-default-b.bin")
	if bytes.Equal(a, b) {
		t.Fatal("the two captured programs are the same bytes")
	}
	digest := func(p []byte) string { return filterDigest(&criuseccomp.SeccompFilter{Filter: p}) }
	if digest(a) != digest(b) {
		t.Fatalf("one profile, two digests: stub lengths %d and %d", enosysStubLen(a), enosysStubLen(b))
	}
	n := enosysStubLen(a)
	if n == 0 {
		t.Fatal("runc's stub not recognized")
	}
	// The program without its stub is libseccomp's alone: hashed whole.
	if got := enosysStubLen(a[n*bpfInsnSize:]); got != 0 {
		t.Errorf("libseccomp's program taken for a stub of %d instructions", got)
	}

	// A prefix that could do more than refuse or fall through is hashed
	// with the rest, so it never matches the host's filter.
	set := func(p []byte, i int, code uint16, jt, jf uint8, k uint32) []byte {
		p = bytes.Clone(p)
		binary.LittleEndian.PutUint16(p[i*bpfInsnSize:], code)
		p[i*bpfInsnSize+2], p[i*bpfInsnSize+3] = jt, jf
		binary.LittleEndian.PutUint32(p[i*bpfInsnSize+4:], k)
		return p
	}
	const allow = 0x7fff0000 // SECCOMP_RET_ALLOW
	for name, p := range map[string][]byte{
		"returns allow":       set(a, n-1, bpfRetK, 0, 0, allow),
		"jumps past its end":  set(a, 3, bpfJmp|bpfJA, 0, 0, uint32(n+5)),
		"conditional too far": set(a, 1, bpfJmp|0x10, uint8(n+2), 0, 0x40000003),
		"stores to scratch":   set(a, 4, 0x02, 0, 0, 0),
		"loads into X":        set(a, 4, 0x01, 0, 0, 7),
		"jumps on X":          set(a, 1, bpfJmp|0x10|bpfSrcX, 2, 0, 0),
		"returns A":           set(a, n-1, 0x16, 0, 0, 0),
		"errno other than 38": set(a, n-1, bpfRetK, 0, 0, 0x00050001),
	} {
		if got := enosysStubLen(p); got != 0 {
			t.Errorf("%s: taken for a stub of %d instructions", name, got)
		}
		if digest(p) == digest(a) {
			t.Errorf("%s: same digest as the host's filter", name)
		}
	}
	if got := enosysStubLen(nil); got != 0 {
		t.Errorf("empty program: stub of %d", got)
	}
}
