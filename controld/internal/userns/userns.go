//go:build linux

// Package userns gives every sandbox a user namespace of its own: its uids
// and gids 0..65535 are a range of host ids that no other sandbox on the
// host holds, so root in a sandbox is an unprivileged user of the host, and
// a different one in each sandbox. The ranges are cut from the subordinate
// ids that /etc/subuid and /etc/subgid give the user "forkfleet"
// (deploy/host-setup.sh reserves them there, so that no other tool hands
// them out), 65536 ids each.
//
// Ranges are reserved host-wide, so that several runtimes (two controlds,
// tests in their own containerd namespaces) never hand out the same one:
// one file per reserved range in a directory on a tmpfs (the reservations
// die with the boot, as the sandboxes do), created exclusively and naming
// its owner, "<containerd namespace>/<sandbox id>".
package userns

import (
	"bufio"
	"errors"
	"fmt"
	"io/fs"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/forkfleet/forkfleet/api/errdefs"
)

// Size is how many uids (and gids) a sandbox has: 0..65535, nobody (65534)
// included.
const Size = 65536

// SubIDUser is the name whose subordinate ids sandboxes get.
const SubIDUser = "forkfleet"

// Default places of the subordinate id files and of the reservations.
const (
	SubUIDFile = "/etc/subuid"
	SubGIDFile = "/etc/subgid"
	DefaultDir = "/run/forkfleet/userns"
)

// Range is one sandbox's ids on the host: its uid (gid) n is UID+n (GID+n).
type Range struct {
	UID, GID uint32
}

// HostUID returns the host uid of the sandbox's uid id.
func (r Range) HostUID(id uint32) uint32 { return r.UID + id }

// HostGID returns the host gid of the sandbox's gid id.
func (r Range) HostGID(id uint32) uint32 { return r.GID + id }

// SandboxIDs maps a host owner to the sandbox's own ids; an id outside the
// range (which no process of the sandbox can give a file) becomes nobody
// (65534), as the kernel shows it inside.
func (r Range) SandboxIDs(uid, gid uint32) (uint32, uint32) {
	in := func(id, base uint32) uint32 {
		if id >= base && id-base < Size {
			return id - base
		}
		return Nobody
	}
	return in(uid, r.UID), in(gid, r.GID)
}

// Nobody is the overflow id.
const Nobody = 65534

// Config says where the ranges come from.
type Config struct {
	// SubUID and SubGID are the subordinate id files (SubUIDFile,
	// SubGIDFile when empty); the user's first entry in each is used.
	SubUID, SubGID string
	// User owns the subordinate ids (SubIDUser when empty).
	User string
	// Dir holds the reservations (DefaultDir when empty); on a tmpfs.
	Dir string
}

// Pool hands out ranges. Safe for concurrent use, and across processes.
type Pool struct {
	uid, gid uint32 // first host uid and gid of range 0
	n        int    // ranges
	dir      string
}

// Load reads the user's subordinate ids and prepares the reservation
// directory. The uid and gid entries must hold at least one range each;
// the pool has as many ranges as the smaller holds.
func Load(cfg Config) (*Pool, error) {
	if cfg.SubUID == "" {
		cfg.SubUID = SubUIDFile
	}
	if cfg.SubGID == "" {
		cfg.SubGID = SubGIDFile
	}
	if cfg.User == "" {
		cfg.User = SubIDUser
	}
	if cfg.Dir == "" {
		cfg.Dir = DefaultDir
	}
	uid, nu, err := subordinate(cfg.SubUID, cfg.User)
	if err != nil {
		return nil, err
	}
	gid, ng, err := subordinate(cfg.SubGID, cfg.User)
	if err != nil {
		return nil, err
	}
	n := min(nu, ng) / Size
	if n < 1 {
		return nil, fmt.Errorf("%w: the subordinate ids of %s (%s: %d, %s: %d) hold no range of %d ids",
			errdefs.ErrFailedPrecondition, cfg.User, cfg.SubUID, nu, cfg.SubGID, ng, Size)
	}
	if err := os.MkdirAll(cfg.Dir, 0o700); err != nil {
		return nil, fmt.Errorf("user namespace reservations: %w", err)
	}
	return &Pool{uid: uid, gid: gid, n: int(n), dir: cfg.Dir}, nil
}

// subordinate returns the first entry of user in a subid file: its first
// id and how many there are.
func subordinate(path, user string) (uint32, uint64, error) {
	f, err := os.Open(path)
	if err != nil {
		return 0, 0, fmt.Errorf("%w: subordinate ids: %w (deploy/host-setup.sh reserves %s's)", errdefs.ErrFailedPrecondition, err, user)
	}
	defer f.Close()
	s := bufio.NewScanner(f)
	for s.Scan() {
		name, rest, ok := strings.Cut(strings.TrimSpace(s.Text()), ":")
		if !ok || name != user {
			continue
		}
		first, count, ok := strings.Cut(rest, ":")
		start, err1 := strconv.ParseUint(first, 10, 32)
		n, err2 := strconv.ParseUint(count, 10, 32)
		if !ok || err1 != nil || err2 != nil || start == 0 || start+n > 1<<32-1 {
			return 0, 0, fmt.Errorf("%w: %s: malformed entry %q", errdefs.ErrFailedPrecondition, path, s.Text())
		}
		return uint32(start), n, nil
	}
	if err := s.Err(); err != nil {
		return 0, 0, fmt.Errorf("%w: %s: %w", errdefs.ErrFailedPrecondition, path, err)
	}
	return 0, 0, fmt.Errorf("%w: %s gives %s no subordinate ids (deploy/host-setup.sh adds them)", errdefs.ErrFailedPrecondition, path, user)
}

// Ranges is how many sandboxes the pool can hold at once.
func (p *Pool) Ranges() int { return p.n }

// Contains reports whether r is one of the pool's ranges.
func (p *Pool) Contains(r Range) bool {
	_, ok := p.index(r)
	return ok
}

func (p *Pool) index(r Range) (int, bool) {
	if r.UID < p.uid || (r.UID-p.uid)%Size != 0 {
		return 0, false
	}
	i := int((r.UID - p.uid) / Size)
	return i, i < p.n && r.GID == p.gid+uint32(i)*Size
}

func (p *Pool) rangeOf(i int) Range {
	return Range{UID: p.uid + uint32(i)*Size, GID: p.gid + uint32(i)*Size}
}

func (p *Pool) file(i int) string { return filepath.Join(p.dir, strconv.Itoa(i)) }

// ErrExhausted is returned when every range is reserved.
var ErrExhausted = errors.New("every user namespace range is taken")

// Take reserves a free range for owner. When none is free it reclaims the
// reservations older than a minute whose owner gone reports gone (nil:
// none), then tries once more.
func (p *Pool) Take(owner string, gone func(owner string) bool) (Range, error) {
	if err := checkOwner(owner); err != nil {
		return Range{}, err
	}
	r, err := p.take(owner)
	if errors.Is(err, ErrExhausted) && gone != nil {
		if n := p.Reclaim(gone); n > 0 {
			r, err = p.take(owner)
		}
	}
	return r, err
}

func (p *Pool) take(owner string) (Range, error) {
	// From a random start: concurrent takers rarely race for one file.
	start := rand.IntN(p.n)
	for k := range p.n {
		i := (start + k) % p.n
		f, err := os.OpenFile(p.file(i), os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
		if errors.Is(err, fs.ErrExist) {
			continue
		}
		if err != nil {
			return Range{}, fmt.Errorf("%w: reserve user namespace range %d: %w", errdefs.ErrInternal, i, err)
		}
		_, werr := f.WriteString(owner)
		if cerr := f.Close(); werr == nil {
			werr = cerr
		}
		if werr != nil {
			os.Remove(p.file(i))
			return Range{}, fmt.Errorf("%w: reserve user namespace range %d: %w", errdefs.ErrInternal, i, werr)
		}
		return p.rangeOf(i), nil
	}
	return Range{}, fmt.Errorf("%w: %w (%d of %d ids each, from %s's subordinate ids)", errdefs.ErrResourceExhausted, ErrExhausted, p.n, Size, SubIDUser)
}

// Release gives back owner's range r, if owner still holds it.
func (p *Pool) Release(owner string, r Range) error {
	i, ok := p.index(r)
	if !ok {
		return fmt.Errorf("%w: %+v is not a range of this pool", errdefs.ErrInvalidArgument, r)
	}
	b, err := os.ReadFile(p.file(i))
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("user namespace range %d: %w", i, err)
	}
	if string(b) != owner {
		return nil // reclaimed and taken again since
	}
	if err := os.Remove(p.file(i)); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("user namespace range %d: %w", i, err)
	}
	return nil
}

// Reserved returns the owners of every reserved range and their ranges.
func (p *Pool) Reserved() (map[string]Range, error) {
	ents, err := os.ReadDir(p.dir)
	if err != nil {
		return nil, fmt.Errorf("user namespace reservations: %w", err)
	}
	out := make(map[string]Range, len(ents))
	for _, e := range ents {
		i, err := strconv.Atoi(e.Name())
		if err != nil || i < 0 || i >= p.n || strconv.Itoa(i) != e.Name() {
			continue
		}
		b, err := os.ReadFile(p.file(i))
		if err != nil {
			continue // released meanwhile
		}
		out[string(b)] = p.rangeOf(i)
	}
	return out, nil
}

// Reclaim releases the reservations whose owner is gone (its sandbox has
// no container: a crash between a reservation and its container, or
// between a container's deletion and its release) and returns how many.
// Reservations younger than a minute are kept: a reservation is made just
// before its container.
func (p *Pool) Reclaim(gone func(owner string) bool) int {
	owned, err := p.Reserved()
	if err != nil {
		return 0
	}
	n := 0
	for owner, r := range owned {
		i, _ := p.index(r)
		st, err := os.Stat(p.file(i))
		if err != nil || time.Since(st.ModTime()) < reservationGrace || !gone(owner) {
			continue
		}
		if p.Release(owner, r) == nil {
			n++
		}
	}
	return n
}

// reservationGrace is how long a new reservation is kept from Reclaim.
const reservationGrace = time.Minute

func checkOwner(owner string) error {
	if owner == "" || len(owner) > 512 || strings.ContainsAny(owner, "\x00\n") {
		return fmt.Errorf("%w: user namespace owner %q", errdefs.ErrInvalidArgument, owner)
	}
	return nil
}
