package store

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"os"
	"path/filepath"
	"time"

	bolt "go.etcd.io/bbolt"
	"golang.org/x/sys/unix"
)

// The claim journal makes a pool claim durable with one fdatasync instead
// of a bbolt commit's two (data pages, then the meta page: 0.7 ms against
// 0.26 ms on an idle ext4 disk, both several ms on a busy one). A claim is
// appended to a preallocated file beside the store (overwritten in place, so
// fdatasync has no file size or block allocation to commit); claims that
// arrive together share one write and one fdatasync (group commit, the same
// groupCommit as Update's), and each is answered only once its frame is
// synced. Only then is its bbolt write queued (behind every write before
// it, not waited for): the records' commit, two syncs of its own, does not
// compete with the journal's sync on the claim's path. At Open the journal
// is replayed into the records before anything reads them.
//
// Replay applies an entry only while the store still holds its sandbox as
// pooled: a claimed sandbox is never pooled again, and every later write of
// its record is queued after the claim's own bbolt write (Update is FIFO,
// and the caller queues that sandbox's writes one at a time), so a pooled
// record means that write never landed; anything else (the record claimed,
// changed since or gone) is newer than the entry. That makes replay
// idempotent, and the journal needs no truncation: entries left from
// before are skipped the same way.

// claimJournalSize is the journal's preallocated size: about 700 claims of
// 1.5 KB before it wraps (a wrap waits for the bbolt writes of the entries
// it overwrites, one commit). A variable for tests.
var claimJournalSize int64 = 1 << 20

// claimFrameHeader is a frame's length (uint32 LE) and CRC-32C of the
// payload (uint32 LE); a frame of length 0 or a bad checksum ends a replay.
const claimFrameHeader = 8

var crcTable = crc32.MakeTable(crc32.Castagnoli)

// claimEntry is a claimed sandbox's record and its pool's counters.
type claimEntry struct {
	Sandbox *SandboxRecord `json:"sandbox"`
	Pool    string         `json:"pool,omitempty"`
	Hits    uint64         `json:"hits,omitempty"`
	Misses  uint64         `json:"misses,omitempty"`
}

// journal is the claim journal's file and its group-commit queue.
type journal struct {
	f      *os.File
	size   int64
	st     *Store // the records: a synced frame's write is queued there
	frames groupCommit[*frame]
	off    int64 // where the next batch goes (committer only)
}

// frame is one claim on its way into the journal.
type frame struct {
	b     []byte
	write func(*Tx) error // the claim's records' write, queued once b is synced
	// done gets the outcome of the frame's sync, and once it succeeded,
	// applied the outcome of the records' write.
	done    chan error
	applied <-chan error
}

// syncJournal makes the journal's written frames durable. A variable so a
// test can crash a process between a batch's write and its sync.
var syncJournal = func(f *os.File) error { return unix.Fdatasync(int(f.Fd())) }

// openJournal opens the journal at path, preallocating it with zeros when it
// is new or short (written, not fallocated: the first write of an unwritten
// extent is a metadata change that fdatasync would commit).
func openJournal(path string, size int64, records *Store) (*journal, error) {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, err
	}
	st, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, err
	}
	if st.Size() < size {
		if _, err := f.WriteAt(make([]byte, size-st.Size()), st.Size()); err != nil {
			f.Close()
			return nil, err
		}
		if err := f.Sync(); err != nil {
			f.Close()
			return nil, err
		}
		if err := syncDir(filepath.Dir(path)); err != nil {
			f.Close()
			return nil, err
		}
	}
	j := &journal{f: f, size: size, st: records}
	// As many frames as fit in the journal at once (every frame does:
	// Claim admits only frames up to a quarter of it).
	j.frames.take = func(q []*frame) int {
		n, total := 0, 0
		for n < len(q) && int64(total+len(q[n].b)) <= j.size {
			total += len(q[n].b)
			n++
		}
		return n
	}
	j.frames.commit = j.commit
	return j, nil
}

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}

// entries reads the journal's frames from the start up to the first empty,
// torn or foreign one.
func (j *journal) entries() ([]claimEntry, error) {
	buf := make([]byte, j.size)
	if _, err := j.f.ReadAt(buf, 0); err != nil && !errors.Is(err, io.EOF) {
		return nil, err
	}
	var out []claimEntry
	for off := 0; off+claimFrameHeader <= len(buf); {
		n := int(binary.LittleEndian.Uint32(buf[off:]))
		sum := binary.LittleEndian.Uint32(buf[off+4:])
		if n == 0 || n > len(buf)-off-claimFrameHeader {
			break
		}
		payload := buf[off+claimFrameHeader : off+claimFrameHeader+n]
		if crc32.Checksum(payload, crcTable) != sum {
			break
		}
		var e claimEntry
		if json.Unmarshal(payload, &e) != nil || e.Sandbox == nil || e.Sandbox.Sandbox.GetId() == "" {
			break
		}
		out = append(out, e)
		off += claimFrameHeader + n
	}
	return out, nil
}

// commit writes batch at the journal's offset (wrapping to the start when
// it does not fit) and syncs it; then, in the frames' order, it queues
// their records' writes and answers them. A wrap first waits for the
// records' writes queued so far (those of every frame it may overwrite:
// this goroutine queued them, before it got here).
func (j *journal) commit(batch []*frame) {
	err := j.write(batch)
	for _, fr := range batch {
		if err == nil {
			fr.applied = j.st.enqueueLazy(fr.write)
		}
		fr.done <- err
	}
}

func (j *journal) write(batch []*frame) error {
	total := 0
	for _, fr := range batch {
		total += len(fr.b)
	}
	if j.off+int64(total) > j.size {
		if err := j.st.Ping(); err != nil {
			return fmt.Errorf("claim journal: wrap: %w", err)
		}
		j.off = 0
	}
	buf := make([]byte, 0, total)
	for _, fr := range batch {
		buf = append(buf, fr.b...)
	}
	if _, err := j.f.WriteAt(buf, j.off); err != nil {
		return fmt.Errorf("claim journal: %w", err)
	}
	if err := syncJournal(j.f); err != nil {
		return fmt.Errorf("claim journal: fdatasync: %w", err)
	}
	j.off += int64(total)
	return nil
}

// ClaimJournalPath is where the claim journal of the store at path lives.
func ClaimJournalPath(path string) string { return path + ".claims" }

// replayClaims applies the journal's entries (see the journal's comment)
// and reports how many claims it restored.
func (s *Store) replayClaims() (int, error) {
	entries, err := s.claims.entries()
	if err != nil || len(entries) == 0 {
		return 0, err
	}
	applied := 0
	err = s.db.Update(func(tx *bolt.Tx) error {
		applied = 0
		sbs, pools := tx.Bucket(bucketSandboxes), tx.Bucket(bucketPools)
		for _, e := range entries {
			id := e.Sandbox.Sandbox.GetId()
			v := sbs.Get([]byte(id))
			if v == nil {
				continue
			}
			var cur SandboxRecord
			if err := json.Unmarshal(v, &cur); err != nil {
				return fmt.Errorf("store: decode sandboxes/%s: %w", id, err)
			}
			if !cur.Pooled {
				continue
			}
			t := &Tx{tx: tx}
			if err := t.PutSandbox(e.Sandbox); err != nil {
				return err
			}
			applied++
			pv := pools.Get([]byte(e.Pool))
			if e.Pool == "" || pv == nil {
				continue
			}
			var p PoolRecord
			if err := json.Unmarshal(pv, &p); err != nil {
				return fmt.Errorf("store: decode pools/%s: %w", e.Pool, err)
			}
			p.Pool.Hits, p.Pool.Misses = max(p.Pool.Hits, e.Hits), max(p.Pool.Misses, e.Misses)
			if err := t.PutPool(&p); err != nil {
				return err
			}
		}
		return nil
	})
	return applied, err
}

// Claim makes a pool claim durable: the claimed sandbox's record and its
// pool's counters (as counters reports them when each write runs). It
// returns once the claim is in the journal (one fdatasync, shared by the
// claims that arrive together); the records' own write is then queued
// behind every write before it, and its outcome is sent on applied. A crash
// after Claim returned finds the sandbox claimed at the next Open. On an
// error the claim may or may not be found at the next Open (a frame written
// but not synced): never answered, it was never the caller's.
//
// The caller queues no other write of sb's record until Claim returned (so
// the records' write is ahead of them). pool may be nil; its record is
// written only while the pool exists.
func (s *Store) Claim(sb *SandboxRecord, pool *PoolRecord, counters func() (hits, misses uint64)) (applied <-chan error, err error) {
	e := claimEntry{Sandbox: sb}
	if pool != nil {
		e.Pool = pool.Pool.GetId()
		e.Hits, e.Misses = counters()
	}
	payload, err := json.Marshal(e)
	if err != nil {
		return nil, fmt.Errorf("store: encode claim of %s: %w", sb.Sandbox.GetId(), err)
	}
	write := func(tx *Tx) error {
		if err := tx.PutSandbox(sb); err != nil {
			return err
		}
		if pool == nil || !tx.HasPool(pool.Pool.GetId()) {
			return nil // deleted meanwhile: do not bring it back
		}
		// The counters as of this commit: a later claim's write may run
		// first in a shared commit.
		pool.Pool.Hits, pool.Pool.Misses = counters()
		return tx.PutPool(pool)
	}
	if int64(claimFrameHeader+len(payload)) > s.claims.size/4 {
		// Too large for the journal (labels and env at their limits):
		// durable through the records' own commit.
		err := <-s.enqueue(write)
		ch := make(chan error, 1)
		ch <- err
		return ch, err
	}
	b := make([]byte, claimFrameHeader+len(payload))
	binary.LittleEndian.PutUint32(b, uint32(len(payload)))
	binary.LittleEndian.PutUint32(b[4:], crc32.Checksum(payload, crcTable))
	copy(b[claimFrameHeader:], payload)
	fr := &frame{b: b, write: write, done: make(chan error, 1)}
	s.journaling.Add(1)
	s.claims.frames.add(fr)
	err = <-fr.done
	s.journaled.Store(time.Now().UnixNano())
	s.journaling.Add(-1)
	if err != nil {
		return nil, err
	}
	return fr.applied, nil
}
