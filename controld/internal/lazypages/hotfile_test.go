package lazypages

import (
	"encoding/binary"
	"errors"
	"hash/crc32"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"reflect"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/forkfleet/forkfleet/api/errdefs"
)

// hotImages writes a checkpoint of three processes: pages-1.img (42 pages,
// 2 present then 40 lazy), pages-2.img (70 lazy pages: two bitmap words)
// and an empty pages-3.img.
func hotImages(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	const base = 0x7f0000000000
	vmas := []testVMA{{start: base, end: base + 96*pageSize, flags: anonPrivate}}
	writeImages(t, dir, 7, 1, vmas, []testEntry{{vaddr: base, nr: 2, flags: pePresent}, {vaddr: base + 4*pageSize, nr: 40, flags: pePresent | peLazy}}, make([]byte, 42*pageSize))
	writeImages(t, dir, 9, 2, vmas, []testEntry{{vaddr: base, nr: 70, flags: pePresent | peLazy}}, make([]byte, 70*pageSize))
	writeImages(t, dir, 11, 3, vmas, nil, []byte{})
	return dir
}

func openHot(t *testing.T, dir string) *Images {
	t.Helper()
	im, err := Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { im.Close() })
	return im
}

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

// learnHot adds pages [from, to) of pages image id to im's hot set, as a
// verified session does.
func learnHot(im *Images, id uint32, from, to uint64) {
	pi := im.pagesByID[id]
	rec := make([]uint64, words(pi.pages))
	setBits(rec, from, to)
	if pi.hot.add(rec) {
		im.keep.changed(im)
	}
}

func withWriteDelay(t *testing.T, d time.Duration) {
	old := HotWriteDelay
	HotWriteDelay = d
	t.Cleanup(func() { HotWriteDelay = old })
}

// A set written by one Images is the set of the next one of the same
// images: the same pages, the same spans per process.
func TestHotSetPersists(t *testing.T) {
	withWriteDelay(t, 500*time.Millisecond)
	dir := hotImages(t)
	path := filepath.Join(t.TempDir(), "state", "hot")
	im := openHot(t, dir)
	if err := im.KeepHot(path, quiet, nil); err != nil {
		t.Fatalf("no file: %v", err)
	}
	learnHot(im, 1, 5, 10)
	learnHot(im, 2, 0, 4)
	learnHot(im, 2, 64, 70)
	learnHot(im, 2, 1, 3) // nothing new: no write for it
	if _, err := os.Stat(path); !errors.Is(err, os.ErrNotExist) || im.hotWrites() != 0 {
		t.Fatalf("written before the delay: %v", err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for im.hotWrites() == 0 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	time.Sleep(100 * time.Millisecond)
	if n := im.hotWrites(); n != 1 {
		t.Fatalf("%d writes for one delay's changes, want 1", n)
	}
	st, err := os.Stat(path)
	if err != nil || st.Size() != im.hotFileSize() || st.Mode().Perm() != 0o600 {
		t.Fatalf("file %v, err %v; want %d bytes, 0600", st, err, im.hotFileSize())
	}

	again := openHot(t, dir)
	if err := again.KeepHot(path, quiet, nil); err != nil {
		t.Fatal(err)
	}
	if got, want := again.HotPages(), im.HotPages(); got != 15 || got != want {
		t.Fatalf("loaded %d hot pages, want %d (15)", got, want)
	}
	for pid, p := range im.procs {
		if got, want := again.procs[pid].hot.spans(again.procs[pid].runs), p.hot.spans(p.runs); !reflect.DeepEqual(got, want) {
			t.Fatalf("process %d: spans %v, want %v", pid, got, want)
		}
	}
	// Close writes what changed since; nothing after it.
	learnHot(again, 1, 30, 32)
	again.Close()
	if n := again.hotWrites(); n != 1 {
		t.Fatalf("Close wrote %d times, want once", n)
	}
	learnHot(again, 1, 33, 35)
	time.Sleep(700 * time.Millisecond) // past the delay
	if n := again.hotWrites(); n != 1 {
		t.Fatalf("written after Close (%d writes)", n)
	}
	third := openHot(t, dir)
	if err := third.KeepHot(path, quiet, nil); err != nil || third.HotPages() != 17 {
		t.Fatalf("after Close: %d hot pages, err %v; want 17", third.HotPages(), err)
	}
	if err := RemoveHot(path); err != nil {
		t.Fatal(err)
	}
	if err := RemoveHot(path); err != nil {
		t.Fatalf("remove again: %v", err)
	}
}

// A file that is not exactly these images' set is ignored with its reason
// and removed, and the set starts empty: never a panic, never an error
// from Open.
func TestHotSetCorrupt(t *testing.T) {
	dir := hotImages(t)
	im := openHot(t, dir)
	learnHot(im, 1, 5, 10)
	learnHot(im, 2, 60, 70)
	good := im.encodeHot()
	resum := func(b []byte) []byte {
		binary.LittleEndian.PutUint32(b[len(b)-4:], crc32.Checksum(b[:len(b)-4], castagnoli))
		return b
	}
	edit := func(f func(b []byte) []byte) []byte { return f(append([]byte(nil), good...)) }
	// Offsets: magic 8, version 4, count 4; image 1 at 16 (id, pages, 1
	// word), image 2 at 36 (id, pages, 2 words), image 3 at 64 (id, pages).
	cases := map[string]struct {
		file []byte
		want HotSetReason
	}{
		"empty":         {nil, HotSetTruncated},
		"magic":         {edit(func(b []byte) []byte { b[0] = 'X'; return b }), HotSetFormat},
		"version":       {edit(func(b []byte) []byte { b[8] = 2; return resum(b) }), HotSetVersion},
		"bit flip":      {edit(func(b []byte) []byte { b[30] ^= 1; return b }), HotSetChecksum},
		"checksum":      {edit(func(b []byte) []byte { b[len(b)-1] ^= 0x80; return b }), HotSetChecksum},
		"too large":     {append(append([]byte(nil), good...), 0), HotSetTooLarge},
		"count":         {edit(func(b []byte) []byte { b[12] = 2; return b[:64] }), HotSetTruncated},
		"fewer images":  {edit(func(b []byte) []byte { b[12] = 2; return resum(append(b[:64], 0, 0, 0, 0)) }), HotSetMismatch},
		"other length":  {edit(func(b []byte) []byte { b[20] = 41; return resum(b) }), HotSetMismatch},
		"other id":      {edit(func(b []byte) []byte { b[36] = 5; b[64] = 6; return resum(b) }), HotSetMismatch},
		"ids unordered": {edit(func(b []byte) []byte { b[36] = 0; return resum(b) }), HotSetFormat},
		"not lazy":      {edit(func(b []byte) []byte { b[28] |= 1; return resum(b) }), HotSetStrayPages}, // image 1's page 0: present, not lazy
		"past the end":  {edit(func(b []byte) []byte { b[63] |= 0x80; return resum(b) }), HotSetStrayPages},
		"huge count":    {edit(func(b []byte) []byte { b[15] = 0xff; return resum(b) }), HotSetFormat},
	}
	for i := range len(good) - 1 {
		cases["prefix "+string(rune('0'+i/10))+string(rune('0'+i%10))] = struct {
			file []byte
			want HotSetReason
		}{good[:i], ""}
	}
	for name, c := range cases {
		t.Run(name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "hot")
			if err := os.WriteFile(path, c.file, 0o600); err != nil {
				t.Fatal(err)
			}
			fresh := openHot(t, dir)
			err := fresh.KeepHot(path, quiet, nil)
			var he *HotSetError
			if !errors.As(err, &he) || !errors.Is(err, errdefs.ErrInvalidArgument) {
				t.Fatalf("KeepHot: %v, want a HotSetError", err)
			}
			if c.want != "" && he.Reason != c.want {
				t.Fatalf("reason %s (%v), want %s", he.Reason, err, c.want)
			}
			if n := fresh.HotPages(); n != 0 {
				t.Fatalf("%d hot pages from an ignored file", n)
			}
			if _, err := os.Stat(path); !errors.Is(err, os.ErrNotExist) {
				t.Fatalf("the ignored file is still there: %v", err)
			}
		})
	}
	// The set itself loads.
	path := filepath.Join(t.TempDir(), "hot")
	if err := os.WriteFile(path, good, 0o600); err != nil {
		t.Fatal(err)
	}
	if fresh := openHot(t, dir); fresh.KeepHot(path, quiet, nil) != nil || fresh.HotPages() != 15 {
		t.Fatalf("the good file: %d hot pages", fresh.HotPages())
	}
}

// Not a regular file: a symbolic link is not followed, a directory or a
// FIFO not read.
func TestHotSetNotAFile(t *testing.T) {
	dir := hotImages(t)
	tmp := t.TempDir()
	good := filepath.Join(tmp, "good")
	im := openHot(t, dir)
	learnHot(im, 1, 5, 10)
	if err := os.WriteFile(good, im.encodeHot(), 0o600); err != nil {
		t.Fatal(err)
	}
	link := filepath.Join(tmp, "link")
	if err := os.Symlink(good, link); err != nil {
		t.Fatal(err)
	}
	fifo := filepath.Join(tmp, "fifo")
	if err := mkfifo(fifo); err != nil {
		t.Fatal(err)
	}
	sub := filepath.Join(tmp, "dir", "x")
	if err := os.MkdirAll(sub, 0o700); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{link, fifo, filepath.Dir(sub)} {
		fresh := openHot(t, dir)
		var he *HotSetError
		if err := fresh.KeepHot(p, quiet, nil); !errors.As(err, &he) || he.Reason != HotSetUnreadable || fresh.HotPages() != 0 {
			t.Fatalf("%s: %v, %d hot pages; want unreadable", p, err, fresh.HotPages())
		}
	}
	if _, err := os.Stat(good); err != nil {
		t.Fatalf("the link's target went: %v", err)
	}
}

// A write that fails (its directory is a file) keeps the set, and the
// next change writes it; KeepHot's wrote hears of both.
func TestHotSetWriteFails(t *testing.T) {
	withWriteDelay(t, time.Millisecond)
	dir := hotImages(t)
	tmp := t.TempDir()
	blocker := filepath.Join(tmp, "state")
	if err := os.WriteFile(blocker, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(blocker, "hot")
	im := openHot(t, dir)
	var mu sync.Mutex
	var wrote []error
	record := func(err error) {
		mu.Lock()
		defer mu.Unlock()
		wrote = append(wrote, err)
	}
	var he *HotSetError
	if err := im.KeepHot(path, quiet, record); !errors.As(err, &he) || he.Reason != HotSetUnreadable {
		t.Fatalf("KeepHot under a file: %v, want unreadable (ENOTDIR)", err)
	}
	learnHot(im, 1, 5, 10)
	time.Sleep(50 * time.Millisecond)
	if n := im.hotWrites(); n != 0 {
		t.Fatalf("%d writes under a file", n)
	}
	if err := os.Remove(blocker); err != nil {
		t.Fatal(err)
	}
	learnHot(im, 1, 11, 12)
	deadline := time.Now().Add(5 * time.Second)
	for im.hotWrites() == 0 && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	fresh := openHot(t, dir)
	if err := fresh.KeepHot(path, quiet, nil); err != nil || fresh.HotPages() != 6 {
		t.Fatalf("after the failed write: %d hot pages, %v; want 6", fresh.HotPages(), err)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(wrote) < 2 || wrote[0] == nil || wrote[len(wrote)-1] != nil {
		t.Fatalf("wrote heard %v; want a failure first, a write last", wrote)
	}
	for _, err := range wrote[1 : len(wrote)-1] {
		if err == nil {
			t.Fatalf("wrote heard %v: a write before the last", wrote)
		}
	}
}

func mkfifo(path string) error { return unix.Mkfifo(path, 0o600) }

func FuzzDecodeHot(f *testing.F) {
	f.Add([]byte(hotMagic + "\x01\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00"))
	f.Add([]byte(hotMagic + "\x01\x00\x00\x00\x01\x00\x00\x00\x01\x00\x00\x00\x41\x00\x00\x00\x00\x00\x00\x00"))
	f.Fuzz(func(t *testing.T, b []byte) {
		sets, reason, _ := decodeHot(b)
		if reason == "" && len(b) < len(hotMagic)+12 {
			t.Fatalf("accepted %d bytes: %v", len(b), sets)
		}
	})
}
