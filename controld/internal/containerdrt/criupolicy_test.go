//go:build linux

package containerdrt

import (
	"encoding/binary"
	"errors"
	"os"
	"path/filepath"
	"testing"

	criucore "github.com/checkpoint-restore/go-criu/v7/crit/images/criu-core"
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
