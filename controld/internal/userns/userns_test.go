//go:build linux

package userns

import (
	"errors"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/forkfleet/forkfleet/api/errdefs"
)

func testPool(t *testing.T, subuid, subgid string) (*Pool, error) {
	t.Helper()
	dir := t.TempDir()
	u, g := filepath.Join(dir, "subuid"), filepath.Join(dir, "subgid")
	if err := os.WriteFile(u, []byte(subuid), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(g, []byte(subgid), 0o644); err != nil {
		t.Fatal(err)
	}
	return Load(Config{SubUID: u, SubGID: g, Dir: filepath.Join(dir, "reserved")})
}

func TestLoad(t *testing.T) {
	p, err := testPool(t, "alice:100000:65536\nforkfleet:1073741824:262144\n", "forkfleet:2147418112:196608\nforkfleet:1:65536\n")
	if err != nil {
		t.Fatal(err)
	}
	// The smaller entry decides: 3 ranges; gids from their own entry.
	if p.Ranges() != 3 || p.rangeOf(2) != (Range{UID: 1073741824 + 2*Size, GID: 2147418112 + 2*Size}) {
		t.Errorf("ranges %d, range 2 %+v", p.Ranges(), p.rangeOf(2))
	}
	for name, files := range map[string][2]string{
		"no entry":     {"alice:100000:65536\n", "forkfleet:1:65536\n"},
		"too small":    {"forkfleet:100000:65535\n", "forkfleet:100000:65536\n"},
		"malformed":    {"forkfleet:x:65536\n", "forkfleet:1:65536\n"},
		"past 2^32":    {"forkfleet:4294901760:131072\n", "forkfleet:1:65536\n"},
		"from root id": {"forkfleet:0:65536\n", "forkfleet:1:65536\n"},
	} {
		if _, err := testPool(t, files[0], files[1]); !errors.Is(err, errdefs.ErrFailedPrecondition) {
			t.Errorf("%s: %v, want FailedPrecondition", name, err)
		}
	}
	if _, err := Load(Config{SubUID: "/nonexistent", Dir: t.TempDir()}); !errors.Is(err, errdefs.ErrFailedPrecondition) {
		t.Errorf("no subuid file: %v", err)
	}
}

func TestRange(t *testing.T) {
	r := Range{UID: 1 << 30, GID: 1<<30 + Size}
	if r.HostUID(1000) != 1<<30+1000 || r.HostGID(5) != 1<<30+Size+5 {
		t.Errorf("host ids %d %d", r.HostUID(1000), r.HostGID(5))
	}
	for _, c := range []struct{ uid, gid, wu, wg uint32 }{
		{1 << 30, 1<<30 + Size, 0, 0},
		{1<<30 + 1000, 1<<30 + Size + 1000, 1000, 1000},
		{1<<30 + Size - 1, 1<<30 + 2*Size - 1, Size - 1, Size - 1},
		{0, 0, Nobody, Nobody},                         // the host's root: not the sandbox's
		{1<<30 + Size, 1<<30 + 2*Size, Nobody, Nobody}, // the next sandbox's root
		{1<<30 - 1, 1<<30 + Size - 1, Nobody, Nobody},
	} {
		if u, g := r.SandboxIDs(c.uid, c.gid); u != c.wu || g != c.wg {
			t.Errorf("SandboxIDs(%d, %d) = %d, %d, want %d, %d", c.uid, c.gid, u, g, c.wu, c.wg)
		}
	}
}

// Every range is handed out once, across pools sharing the reservations (as
// runtimes of different processes do), until it is released.
func TestTakeRelease(t *testing.T) {
	p, err := testPool(t, "forkfleet:1000000:327680\n", "forkfleet:1000000:327680\n")
	if err != nil {
		t.Fatal(err)
	}
	other := *p // another process: the same files
	var mu sync.Mutex
	got := map[Range]string{}
	var wg sync.WaitGroup
	for i := range 5 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			pool := p
			if i%2 == 1 {
				pool = &other
			}
			owner := "ns/sb-" + string(rune('a'+i))
			r, err := pool.Take(owner, nil)
			if err != nil {
				t.Error(err)
				return
			}
			mu.Lock()
			defer mu.Unlock()
			if prev, ok := got[r]; ok {
				t.Errorf("range %+v handed to %s and %s", r, prev, owner)
			}
			got[r] = owner
		}()
	}
	wg.Wait()
	if len(got) != 5 {
		t.Fatalf("%d ranges for 5 sandboxes", len(got))
	}
	if _, err := p.Take("ns/sixth", nil); !errors.Is(err, ErrExhausted) || !errors.Is(err, errdefs.ErrResourceExhausted) {
		t.Errorf("sixth take: %v, want ErrExhausted (RESOURCE_EXHAUSTED)", err)
	}
	var freed Range
	for r, owner := range got {
		// Another owner's release leaves it; its own frees it.
		if err := p.Release("ns/intruder", r); err != nil {
			t.Fatal(err)
		}
		if _, err := p.Take("ns/sixth", nil); err == nil {
			t.Fatal("a release by another owner freed a range")
		}
		if err := p.Release(owner, r); err != nil {
			t.Fatal(err)
		}
		freed = r
		break
	}
	r, err := p.Take("ns/sixth", nil)
	if err != nil || r != freed {
		t.Errorf("take after a release: %+v, %v, want %+v", r, err, freed)
	}
	if err := p.Release("ns/sixth", Range{UID: 12, GID: 12}); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Errorf("release of a foreign range: %v", err)
	}
	if _, err := p.Take("", nil); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Errorf("take without an owner: %v", err)
	}
}

// Reservations of sandboxes that are gone come back: at once when they are
// older than the grace, never while younger (a create in flight).
func TestReclaim(t *testing.T) {
	p, err := testPool(t, "forkfleet:1000000:131072\n", "forkfleet:1000000:131072\n")
	if err != nil {
		t.Fatal(err)
	}
	a, err := p.Take("ns/a", nil)
	if err != nil {
		t.Fatal(err)
	}
	b, err := p.Take("other/b", nil)
	if err != nil {
		t.Fatal(err)
	}
	gone := func(owner string) bool { return owner != "other/b" }
	if _, err := p.Take("ns/c", gone); !errors.Is(err, ErrExhausted) {
		t.Fatalf("a reservation younger than the grace was reclaimed: %v", err)
	}
	old := time.Now().Add(-2 * reservationGrace)
	for _, r := range []Range{a, b} {
		i, _ := p.index(r)
		if err := os.Chtimes(p.file(i), old, old); err != nil {
			t.Fatal(err)
		}
	}
	c, err := p.Take("ns/c", gone)
	if err != nil || c != a {
		t.Fatalf("take with a gone owner's range: %+v, %v, want %+v", c, err, a)
	}
	owned, err := p.Reserved()
	if err != nil || len(owned) != 2 || owned["ns/c"] != a || owned["other/b"] != b {
		t.Errorf("reserved %v, %v", owned, err)
	}
}
