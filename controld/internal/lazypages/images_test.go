package lazypages

import (
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"
	"google.golang.org/protobuf/encoding/protowire"

	"github.com/forkfleet/forkfleet/api/errdefs"
)

// testEntry is a pagemap entry for a crafted image.
type testEntry struct {
	vaddr, nr uint64
	flags     uint32
	noFlags   bool // write no flags field (an old image: present)
	inParent  bool
}

type testVMA struct {
	start, end   uint64
	flags        uint32
	status       uint32
	skipEndField bool
}

const anonPrivate = mapAnonymous | mapPrivate

func imageFile(magic uint32, msgs ...[]byte) []byte {
	b := binary.LittleEndian.AppendUint32(nil, imgCommonMagic)
	b = binary.LittleEndian.AppendUint32(b, magic)
	for _, m := range msgs {
		b = binary.LittleEndian.AppendUint32(b, uint32(len(m)))
		b = append(b, m...)
	}
	return b
}

func varintField(b []byte, num protowire.Number, v uint64) []byte {
	b = protowire.AppendTag(b, num, protowire.VarintType)
	return protowire.AppendVarint(b, v)
}

func pagemapFile(pagesID uint32, entries []testEntry) []byte {
	msgs := [][]byte{varintField(nil, 1, uint64(pagesID))}
	for _, e := range entries {
		var m []byte
		m = varintField(m, 1, e.vaddr)
		m = varintField(m, 2, e.nr&0xffffffff)
		if e.inParent {
			m = varintField(m, 3, 1)
		}
		if !e.noFlags {
			m = varintField(m, 4, uint64(e.flags))
		}
		m = varintField(m, 5, e.nr)
		msgs = append(msgs, m)
	}
	return imageFile(pagemapMagic, msgs...)
}

func mmFile(vmas []testVMA) []byte {
	var mm []byte
	mm = varintField(mm, 1, 0x400000)
	for _, v := range vmas {
		var e []byte
		e = varintField(e, 1, v.start)
		if !v.skipEndField {
			e = varintField(e, 2, v.end)
		}
		e = varintField(e, 3, 0)
		e = varintField(e, 4, 0)
		e = varintField(e, 5, 3)
		e = varintField(e, 6, uint64(v.flags))
		e = varintField(e, 7, uint64(v.status|1))
		e = protowire.AppendTag(e, 8, protowire.VarintType)
		e = protowire.AppendVarint(e, protowire.EncodeZigZag(-1))
		mm = protowire.AppendTag(mm, 14, protowire.BytesType)
		mm = protowire.AppendBytes(mm, e)
	}
	return imageFile(mmMagic, mm)
}

// writeImages writes one process's images; pages is pages-<pagesID>.img.
func writeImages(t testing.TB, dir string, pid int, pagesID uint32, vmas []testVMA, entries []testEntry, pages []byte) {
	t.Helper()
	must := func(name string, b []byte) {
		if err := os.WriteFile(filepath.Join(dir, name), b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	must(fmt.Sprintf("pagemap-%d.img", pid), pagemapFile(pagesID, entries))
	must(fmt.Sprintf("mm-%d.img", pid), mmFile(vmas))
	if pages != nil {
		must(fmt.Sprintf("pages-%d.img", pagesID), pages)
	}
}

// pattern is page content no page shares: the page's address and offset.
func pattern(addr uint64, n int) []byte {
	b := make([]byte, n)
	for i := 0; i+8 <= n; i += 8 {
		binary.LittleEndian.PutUint64(b[i:], (addr+uint64(i))*0x9E3779B97F4A7C15+1)
	}
	return b
}

func TestOpenSharesPages(t *testing.T) {
	dir := t.TempDir()
	const base = 0x7f0000000000
	vmas := []testVMA{{start: base, end: base + 64*pageSize, flags: anonPrivate}, {start: base + 64*pageSize, end: base + 96*pageSize, flags: anonPrivate}}
	// Present but not lazy (restored eagerly), then lazy across the VMA
	// boundary, then lazy again: offsets count the eager pages too.
	entries := []testEntry{
		{vaddr: base, nr: 2, flags: pePresent},
		{vaddr: base + 4*pageSize, nr: 70, flags: pePresent | peLazy},
		{vaddr: base + 80*pageSize, nr: 1, flags: pePresent | peLazy},
	}
	pages := make([]byte, 73*pageSize)
	writeImages(t, dir, 7, 1, vmas, entries, pages)
	writeImages(t, dir, 9, 1, vmas, entries[:1], nil) // shares pages-1.img (its prefix)
	im, err := Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer im.Close()
	if got, want := im.LazyBytes(), int64(71*pageSize); got != want {
		t.Fatalf("LazyBytes %d, want %d", got, want)
	}
	if got := im.Processes(); len(got) != 2 || got[0] != 7 || got[1] != 9 {
		t.Fatalf("Processes %v", got)
	}
	want := []span{
		{start: base + 4*pageSize, end: base + 64*pageSize, off: 2 * pageSize},
		{start: base + 64*pageSize, end: base + 74*pageSize, off: 62 * pageSize},
		{start: base + 80*pageSize, end: base + 81*pageSize, off: 72 * pageSize},
	}
	if got := im.procs[7].runs; fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("runs %v, want %v", got, want)
	}
	if len(im.maps) != 1 || &im.procs[7].pages[0] != &im.procs[9].pages[0] {
		t.Fatalf("pages-1.img mapped %d times, want once and shared", len(im.maps))
	}
	if im.procs[9].runs != nil {
		t.Fatalf("process 9 has no lazy pages, got %v", im.procs[9].runs)
	}
}

func TestOpenCompatEntries(t *testing.T) {
	dir := t.TempDir()
	const base = 0x10000
	vmas := []testVMA{{start: base, end: base + 8*pageSize, flags: anonPrivate}}
	// An entry without flags is present (init_compat_pagemap_entry).
	entries := []testEntry{{vaddr: base, nr: 1, noFlags: true}, {vaddr: base + pageSize, nr: 1, flags: pePresent | peLazy}}
	writeImages(t, dir, 1, 3, vmas, entries, make([]byte, 2*pageSize))
	im, err := Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer im.Close()
	if r := im.procs[1].runs; len(r) != 1 || r[0].off != pageSize {
		t.Fatalf("runs %v: the flagless entry must count as present", r)
	}
}

func TestOpenHostile(t *testing.T) {
	const base = 0x7f0000000000
	okVMAs := []testVMA{{start: base, end: base + 16*pageSize, flags: anonPrivate}}
	lazy := func(vaddr, nr uint64) testEntry { return testEntry{vaddr: vaddr, nr: nr, flags: pePresent | peLazy} }
	cases := []struct {
		name  string
		setup func(t *testing.T, dir string)
		class error
	}{
		{"no pagemap", func(t *testing.T, dir string) {}, errdefs.ErrInvalidArgument},
		{"unaligned entry", func(t *testing.T, dir string) {
			writeImages(t, dir, 1, 1, okVMAs, []testEntry{lazy(base+1, 1)}, make([]byte, pageSize))
		}, errdefs.ErrInvalidArgument},
		{"overlapping entries", func(t *testing.T, dir string) {
			writeImages(t, dir, 1, 1, okVMAs, []testEntry{lazy(base, 2), lazy(base+pageSize, 1)}, make([]byte, 3*pageSize))
		}, errdefs.ErrInvalidArgument},
		{"unordered entries", func(t *testing.T, dir string) {
			writeImages(t, dir, 1, 1, okVMAs, []testEntry{lazy(base+4*pageSize, 1), lazy(base, 1)}, make([]byte, 2*pageSize))
		}, errdefs.ErrInvalidArgument},
		{"more pages than the pages file", func(t *testing.T, dir string) {
			writeImages(t, dir, 1, 1, okVMAs, []testEntry{lazy(base, 4)}, make([]byte, 3*pageSize))
		}, errdefs.ErrInvalidArgument},
		{"huge count", func(t *testing.T, dir string) {
			writeImages(t, dir, 1, 1, okVMAs, []testEntry{lazy(base, 1<<62)}, make([]byte, pageSize))
		}, errdefs.ErrInvalidArgument},
		{"wrapping address", func(t *testing.T, dir string) {
			writeImages(t, dir, 1, 1, okVMAs, []testEntry{lazy(^uint64(0)&^(pageSize-1), 2)}, make([]byte, 2*pageSize))
		}, errdefs.ErrInvalidArgument},
		{"zero pages", func(t *testing.T, dir string) {
			writeImages(t, dir, 1, 1, okVMAs, []testEntry{lazy(base, 0)}, make([]byte, pageSize))
		}, errdefs.ErrInvalidArgument},
		{"unknown flags", func(t *testing.T, dir string) {
			writeImages(t, dir, 1, 1, okVMAs, []testEntry{{vaddr: base, nr: 1, flags: 1 << 9}}, make([]byte, pageSize))
		}, errdefs.ErrInvalidArgument},
		{"lazy page outside lazy VMAs", func(t *testing.T, dir string) {
			writeImages(t, dir, 1, 1, okVMAs, []testEntry{lazy(base+15*pageSize, 2)}, make([]byte, 2*pageSize))
		}, errdefs.ErrInvalidArgument},
		{"lazy page in a shared VMA", func(t *testing.T, dir string) {
			writeImages(t, dir, 1, 1, []testVMA{{start: base, end: base + pageSize, flags: mapAnonymous | 0x01}},
				[]testEntry{lazy(base, 1)}, make([]byte, pageSize))
		}, errdefs.ErrInvalidArgument},
		{"overlapping VMAs", func(t *testing.T, dir string) {
			writeImages(t, dir, 1, 1, []testVMA{{start: base, end: base + 4*pageSize, flags: anonPrivate}, {start: base + pageSize, end: base + 8*pageSize, flags: anonPrivate}},
				nil, nil)
		}, errdefs.ErrInvalidArgument},
		{"VMA without end", func(t *testing.T, dir string) {
			writeImages(t, dir, 1, 1, []testVMA{{start: base, flags: anonPrivate, skipEndField: true}}, nil, nil)
		}, errdefs.ErrInvalidArgument},
		{"parent pages", func(t *testing.T, dir string) {
			writeImages(t, dir, 1, 1, okVMAs, []testEntry{{vaddr: base, nr: 1, inParent: true}}, nil)
		}, errdefs.ErrFailedPrecondition},
		{"lazy pages not in the images", func(t *testing.T, dir string) {
			writeImages(t, dir, 1, 1, okVMAs, []testEntry{{vaddr: base, nr: 1, flags: peLazy}}, nil)
		}, errdefs.ErrFailedPrecondition},
		{"missing pages file", func(t *testing.T, dir string) {
			writeImages(t, dir, 1, 1, okVMAs, []testEntry{lazy(base, 1)}, nil)
		}, errdefs.ErrNotFound},
		{"missing mm", func(t *testing.T, dir string) {
			writeImages(t, dir, 1, 1, okVMAs, nil, nil)
			os.Remove(filepath.Join(dir, "mm-1.img"))
		}, errdefs.ErrNotFound},
		{"pagemap is a symlink", func(t *testing.T, dir string) {
			writeImages(t, dir, 1, 1, okVMAs, nil, nil)
			os.Rename(filepath.Join(dir, "pagemap-1.img"), filepath.Join(dir, "elsewhere"))
			os.Symlink("elsewhere", filepath.Join(dir, "pagemap-1.img"))
		}, errdefs.ErrInvalidArgument},
		{"pages is a FIFO", func(t *testing.T, dir string) {
			writeImages(t, dir, 1, 1, okVMAs, []testEntry{lazy(base, 1)}, nil)
			if err := unix.Mkfifo(filepath.Join(dir, "pages-1.img"), 0o600); err != nil {
				t.Fatal(err)
			}
		}, errdefs.ErrInvalidArgument},
		{"pages not whole pages", func(t *testing.T, dir string) {
			writeImages(t, dir, 1, 1, okVMAs, []testEntry{lazy(base, 1)}, make([]byte, pageSize+1))
		}, errdefs.ErrInvalidArgument},
		{"pagemap is a directory", func(t *testing.T, dir string) {
			os.Mkdir(filepath.Join(dir, "pagemap-1.img"), 0o700)
		}, errdefs.ErrInvalidArgument},
		{"bad magic", func(t *testing.T, dir string) {
			writeImages(t, dir, 1, 1, okVMAs, nil, nil)
			os.WriteFile(filepath.Join(dir, "pagemap-1.img"), imageFile(mmMagic, varintField(nil, 1, 1)), 0o600)
		}, errdefs.ErrInvalidArgument},
		{"message longer than the file", func(t *testing.T, dir string) {
			writeImages(t, dir, 1, 1, okVMAs, nil, nil)
			b := pagemapFile(1, nil)
			b = binary.LittleEndian.AppendUint32(b, 1000)
			os.WriteFile(filepath.Join(dir, "pagemap-1.img"), b, 0o600)
		}, errdefs.ErrInvalidArgument},
		{"wrong wire type", func(t *testing.T, dir string) {
			writeImages(t, dir, 1, 1, okVMAs, nil, nil)
			m := protowire.AppendTag(nil, 1, protowire.BytesType)
			m = protowire.AppendBytes(m, []byte("x"))
			os.WriteFile(filepath.Join(dir, "pagemap-1.img"), imageFile(pagemapMagic, varintField(nil, 1, 1), m), 0o600)
		}, errdefs.ErrInvalidArgument},
		{"pagemap too big", func(t *testing.T, dir string) {
			writeImages(t, dir, 1, 1, okVMAs, nil, nil)
			f, _ := os.OpenFile(filepath.Join(dir, "pagemap-1.img"), os.O_WRONLY, 0)
			f.Truncate(maxMetaFile + 1)
			f.Close()
		}, errdefs.ErrInvalidArgument},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			dir := t.TempDir()
			c.setup(t, dir)
			im, err := Open(dir)
			if err == nil {
				im.Close()
				t.Fatal("Open accepted it")
			}
			if !errors.Is(err, c.class) {
				t.Fatalf("error %v, want class %v", err, c.class)
			}
		})
	}
}

func FuzzParsePagemap(f *testing.F) {
	f.Add(pagemapFile(1, []testEntry{{vaddr: 0x1000, nr: 3, flags: pePresent | peLazy}, {vaddr: 0x8000, nr: 1, noFlags: true}}))
	f.Add(pagemapFile(2, nil))
	f.Add(mmFile([]testVMA{{start: 0x1000, end: 0x9000, flags: anonPrivate}}))
	f.Fuzz(func(t *testing.T, b []byte) {
		_, entries, err := parsePagemap("fuzz", b)
		if err == nil {
			var end uint64
			for i, e := range entries {
				if e.vaddr%pageSize != 0 || e.nrPages == 0 || (i > 0 && e.vaddr < end) {
					t.Fatalf("accepted entry %d: %+v", i, e)
				}
				end = e.vaddr + e.nrPages*pageSize
				if end > maxUserAddress {
					t.Fatalf("accepted entry %d past user space: %+v", i, e)
				}
			}
		} else if !errors.Is(err, errdefs.ErrInvalidArgument) && !errors.Is(err, errdefs.ErrFailedPrecondition) {
			t.Fatalf("untyped error %v", err)
		}
		vmas, err := parseMM("fuzz", b)
		if err == nil {
			if _, err := lazyRuns("fuzz", entries, vmas); err != nil && !errors.Is(err, errdefs.ErrInvalidArgument) {
				t.Fatalf("untyped error %v", err)
			}
		}
	})
}
