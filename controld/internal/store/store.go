// Package store keeps controld's durable records (sandboxes, checkpoints,
// pools) in one bbolt file. Every write is committed (fsync) before the call
// returns, so a record an RPC reported is never lost to a crash. Concurrent
// writers share commits (group commit, see Update): a burst of N writes costs
// about one fsync, not N in a row. Pool claims are durable sooner, through a
// journal replayed at Open (Claim, claims.go).
package store

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync/atomic"
	"time"

	bolt "go.etcd.io/bbolt"
	"google.golang.org/protobuf/encoding/protojson"

	controldv1 "github.com/forkfleet/forkfleet/api/gen/forkfleet/controld/v1"
	"github.com/forkfleet/forkfleet/api/guestsock"
	"github.com/forkfleet/forkfleet/api/rules"
	"github.com/forkfleet/forkfleet/controld/internal/runtime"
)

var (
	bucketSandboxes   = []byte("sandboxes")
	bucketCheckpoints = []byte("checkpoints")
	bucketPools       = []byte("pools")
	bucketMeta        = []byte("meta")
	bucketRequests    = []byte("requests")
)

// schemaVersion is bumped on incompatible record changes.
const schemaVersion = "1"

// SandboxRecord is a sandbox: its public API view plus what only controld
// may know (tokens, where guestd listens).
type SandboxRecord struct {
	Sandbox    *controldv1.Sandbox
	Env        map[string]string
	ACIToken   string
	AdminToken string
	// ACISocket is where guestd listens, as the host reaches it.
	ACISocket guestsock.Addr
	// Pooled: warm in its pool (Sandbox.PoolId), not claimed yet.
	Pooled bool
	// Ports are the sandbox's exposed TCP ports and their tokens.
	Ports map[uint32]string
	// Request names the call with a request id that created (or claimed)
	// it, for a repeat of that call.
	Request *RequestTag
}

// RequestTag marks what a call with a request id created, durable with the
// thing itself: a repeat of the call after it failed, or after a restart of
// controld, finds the result there when no response was stored.
type RequestTag struct {
	Key         string `json:"key"` // rules.RequestKey
	Fingerprint []byte `json:"fp"`
	// Index is a fork replica's position; Hit says a claim was served warm.
	Index int  `json:"index,omitempty"`
	Hit   bool `json:"hit,omitempty"`
}

// CheckpointRecord is a checkpoint with the proofs its forks are verified
// against and the admin token its memory image holds.
type CheckpointRecord struct {
	Checkpoint *controldv1.Checkpoint
	Ref        runtime.CheckpointRef
	Env        map[string]string
	// AdminToken is the source's: a memory-tier replica runs the source's
	// guestd, which only knows that token until it is told otherwise.
	AdminToken  string
	Generation  uint64
	FrameHash   []byte
	MarkerPath  string
	MarkerValue []byte
	MemoryValue []byte
	// NetPort and NetValue are the network proof: the port of guestd's
	// probe listener on the source's loopback and its key.
	NetPort  uint32
	NetValue []byte
	// FSDigest is the filesystem proof: the digest of the source's files
	// outside volatile paths at the checkpoint.
	FSDigest []byte
	// Request names the CreateCheckpoint call with a request id that made
	// it.
	Request *RequestTag
	// ImportedDigest is the manifest digest of the registry image a fork
	// of a checkpoint_reference imported this checkpoint from: later forks
	// of that digest reuse it.
	ImportedDigest string `json:",omitempty"`
	// Pool is the image pool that made this checkpoint of one of its
	// members and forks its misses from it ("" for every other one).
	Pool string
	// Retired: the pool is gone or made a newer one; the checkpoint goes
	// once no fork of it is left.
	Retired bool
}

// PoolRecord is a warm pool.
type PoolRecord struct {
	Pool *controldv1.Pool
	Env  map[string]string
}

// lockTimeout bounds the wait for the file lock another process holds.
var lockTimeout = 5 * time.Second

// Store is the bbolt-backed record store. Safe for concurrent use.
type Store struct {
	db     *bolt.DB
	writes groupCommit[*write] // Update's queue: one bbolt commit a batch
	claims *journal
	// journaling counts the claims whose frames are on their way into the
	// journal, and journaled is when the last of them was synced (unix
	// ns): lazy writes wait for them (holdLazy).
	journaling atomic.Int32
	journaled  atomic.Int64
	heldSince  time.Time // when the lazy writes at the queue's head began to wait (writes.mu)
}

// write is one Update waiting for a commit. A lazy write is already safe
// without it for a while (a claim's records: the journal holds them; a
// finished request's answer: the request's flight answers repeats until
// it lands, and what it made is found after a crash): it may wait for
// the claims around it (holdLazy).
type write struct {
	fn   func(*Tx) error
	done chan error
	lazy bool
}

// A queue of lazy writes only waits to commit until no claim has been
// journaled for claimQuiet, at most claimHold; any other write ends the
// wait (it commits with them, in order). A bbolt commit is tens of
// microseconds of JSON and page writes and two fdatasyncs (each a VM exit
// on these hosts), and a claim's records' write followed its claim by a
// journal sync: in a burst of claims it ran on the same 2 vCPUs as the
// burst's next claims and its clients' first requests. Held, the burst's
// records share one commit after it. Variables for tests.
var (
	claimQuiet = 10 * time.Millisecond
	claimHold  = 100 * time.Millisecond
)

// holdLazy is writes.hold: how much longer the queue q waits.
func (s *Store) holdLazy(q []*write) time.Duration {
	now := time.Now()
	for _, w := range q {
		if !w.lazy {
			s.heldSince = time.Time{}
			return 0
		}
	}
	if s.heldSince.IsZero() {
		s.heldSince = now
	}
	wait := claimQuiet - now.Sub(time.Unix(0, s.journaled.Load()))
	if s.journaling.Load() > 0 {
		wait = claimQuiet
	}
	if wait = min(wait, s.heldSince.Add(claimHold).Sub(now)); wait <= 0 {
		s.heldSince = time.Time{}
		return 0
	}
	return wait
}

// maxBatch bounds the writes one commit carries, so a retry after a failing
// write redoes a bounded amount of work.
const maxBatch = 64

// Open opens (creating when needed) the store file at path.
func Open(path string) (*Store, error) {
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return nil, fmt.Errorf("store: %w", err)
	}
	// NoFreelistSync: the freelist is rebuilt from the pages at open instead
	// of being written by every commit, which halves the pages a small write
	// touches. Records are as durable either way: the data and meta pages
	// are still synced before a commit returns.
	db, err := bolt.Open(path, 0o600, &bolt.Options{
		Timeout: lockTimeout, NoFreelistSync: true, FreelistType: bolt.FreelistMapType,
	})
	if err != nil {
		if errors.Is(err, bolt.ErrTimeout) {
			return nil, fmt.Errorf("store %s: locked by another process (is another controld running?)", path)
		}
		return nil, fmt.Errorf("store %s: %w", path, err)
	}
	err = db.Update(func(tx *bolt.Tx) error {
		for _, b := range [][]byte{bucketSandboxes, bucketCheckpoints, bucketPools, bucketMeta, bucketRequests} {
			if _, err := tx.CreateBucketIfNotExists(b); err != nil {
				return err
			}
		}
		meta := tx.Bucket(bucketMeta)
		switch v := meta.Get([]byte("schema")); {
		case v == nil:
			return meta.Put([]byte("schema"), []byte(schemaVersion))
		case string(v) != schemaVersion:
			return fmt.Errorf("schema version %q, this controld reads %q", v, schemaVersion)
		}
		return nil
	})
	if err != nil {
		db.Close()
		return nil, fmt.Errorf("store %s: %w", path, err)
	}
	s := &Store{db: db}
	s.writes.take = func(q []*write) int { return min(len(q), maxBatch) }
	s.writes.commit = s.commit
	s.writes.hold = s.holdLazy
	if s.claims, err = openJournal(ClaimJournalPath(path), claimJournalSize, s); err != nil {
		db.Close()
		return nil, fmt.Errorf("store %s: claim journal: %w", path, err)
	}
	// Before anything reads the records. Once applied (committed), the
	// journal is written from its start again.
	if _, err := s.replayClaims(); err != nil {
		s.claims.f.Close()
		db.Close()
		return nil, fmt.Errorf("store %s: replay claim journal: %w", path, err)
	}
	return s, nil
}

// Close waits for the writes queued so far (a claim's records' write may
// still be) and closes the files.
func (s *Store) Close() error {
	err := s.Ping()
	if cerr := s.claims.f.Close(); err == nil {
		err = cerr
	}
	if cerr := s.db.Close(); err == nil {
		err = cerr
	}
	return err
}

// Tx is a write transaction spanning several records, committed at once.
type Tx struct{ tx *bolt.Tx }

// Update runs fn in a durable write transaction and returns once it is
// committed (fsync'd). Writes that arrive while a commit is in progress are
// grouped into the next one, so concurrent writers share an fsync; a lone
// writer waits for nothing but its own commit.
//
// fn runs on the committer goroutine, in a transaction it may share with
// other writers: it must only read and write through the Tx, must not wait
// for anything (locks included) another writer may hold while calling
// Update, and may run more than once (when another write of its batch fails,
// the batch is rolled back and redone without it). An fn error aborts only
// that write and is returned from its Update.
func (s *Store) Update(fn func(*Tx) error) error { return <-s.enqueue(fn) }

// enqueue queues fn for the next commit; its outcome is sent on the channel
// returned. Writes commit in the order they were queued.
func (s *Store) enqueue(fn func(*Tx) error) <-chan error {
	w := &write{fn: fn, done: make(chan error, 1)}
	s.writes.add(w)
	return w.done
}

// enqueueLazy is enqueue for a lazy write (see write).
func (s *Store) enqueueLazy(fn func(*Tx) error) <-chan error {
	w := &write{fn: fn, done: make(chan error, 1), lazy: true}
	s.writes.add(w)
	return w.done
}

// batchError names the write of a batch whose fn failed.
type batchError struct {
	index int
	err   error
}

func (e *batchError) Error() string { return e.err.Error() }

// commit applies batch in one transaction. A write whose fn fails gets its
// error; the others are redone without it.
func (s *Store) commit(batch []*write) {
	for len(batch) > 0 {
		err := s.db.Update(func(tx *bolt.Tx) error {
			t := &Tx{tx: tx}
			for i, w := range batch {
				if err := w.fn(t); err != nil {
					return &batchError{index: i, err: err}
				}
			}
			return nil
		})
		var be *batchError
		if !errors.As(err, &be) {
			// Committed, or the commit itself failed: same outcome for all.
			for _, w := range batch {
				w.done <- err
			}
			return
		}
		batch[be.index].done <- be.err
		batch = append(batch[:be.index:be.index], batch[be.index+1:]...)
	}
}

func (t *Tx) put(bucket []byte, id string, v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return fmt.Errorf("store: encode %s/%s: %w", bucket, id, err)
	}
	return t.tx.Bucket(bucket).Put([]byte(id), b)
}

// Ping commits an empty write: the health check that the store (its file
// lock, its disk, the group-commit queue) still takes writes.
func (s *Store) Ping() error { return s.Update(func(*Tx) error { return nil }) }

// GetRequest returns the finished request stored under key, or nil
// (rules.RequestStore).
func (s *Store) GetRequest(key string) (*rules.RequestRecord, error) {
	var out *rules.RequestRecord
	err := s.db.View(func(tx *bolt.Tx) error {
		v := tx.Bucket(bucketRequests).Get([]byte(key))
		if v == nil {
			return nil
		}
		out = new(rules.RequestRecord)
		return json.Unmarshal(v, out)
	})
	return out, err
}

// PutRequest stores a finished request (rules.RequestStore).
// It is lazy: Dedup stores the answer after the call returned, and until
// it lands its flight answers repeats.
func (s *Store) PutRequest(r *rules.RequestRecord) error {
	return <-s.enqueueLazy(func(tx *Tx) error { return tx.put(bucketRequests, r.Key, r) })
}

// DeleteExpiredRequests forgets the requests that expired before now and
// returns how many.
func (s *Store) DeleteExpiredRequests(now time.Time) (int, error) {
	var expired [][]byte
	err := s.db.View(func(tx *bolt.Tx) error {
		return tx.Bucket(bucketRequests).ForEach(func(k, v []byte) error {
			var r rules.RequestRecord
			if json.Unmarshal(v, &r) != nil || now.After(r.Expires) {
				expired = append(expired, append([]byte(nil), k...))
			}
			return nil
		})
	})
	if err != nil || len(expired) == 0 {
		return 0, err
	}
	err = s.Update(func(tx *Tx) error {
		b := tx.tx.Bucket(bucketRequests)
		for _, k := range expired {
			if err := b.Delete(k); err != nil {
				return err
			}
		}
		return nil
	})
	return len(expired), err
}

// PutSandbox writes a sandbox record.
func (t *Tx) PutSandbox(r *SandboxRecord) error {
	return t.put(bucketSandboxes, r.Sandbox.GetId(), r)
}

// DeleteSandbox removes a sandbox record (absent is fine).
func (t *Tx) DeleteSandbox(id string) error { return t.tx.Bucket(bucketSandboxes).Delete([]byte(id)) }

// PutCheckpoint writes a checkpoint record.
func (t *Tx) PutCheckpoint(r *CheckpointRecord) error {
	return t.put(bucketCheckpoints, r.Checkpoint.GetId(), r)
}

// DeleteCheckpoint removes a checkpoint record.
func (t *Tx) DeleteCheckpoint(id string) error {
	return t.tx.Bucket(bucketCheckpoints).Delete([]byte(id))
}

// PutPool writes a pool record.
func (t *Tx) PutPool(r *PoolRecord) error { return t.put(bucketPools, r.Pool.GetId(), r) }

// DeletePool removes a pool record.
func (t *Tx) DeletePool(id string) error { return t.tx.Bucket(bucketPools).Delete([]byte(id)) }

// HasPool reports whether a pool record exists, so a write that must not
// bring back a deleted pool can check in the same transaction.
func (t *Tx) HasPool(id string) bool { return t.tx.Bucket(bucketPools).Get([]byte(id)) != nil }

// PutSandbox writes one sandbox record durably.
func (s *Store) PutSandbox(r *SandboxRecord) error {
	return s.Update(func(t *Tx) error { return t.PutSandbox(r) })
}

// DeleteSandbox removes one sandbox record durably.
func (s *Store) DeleteSandbox(id string) error {
	return s.Update(func(t *Tx) error { return t.DeleteSandbox(id) })
}

// PutPool writes one pool record durably.
func (s *Store) PutPool(r *PoolRecord) error {
	return s.Update(func(t *Tx) error { return t.PutPool(r) })
}

// Sandboxes returns every sandbox record.
func (s *Store) Sandboxes() ([]*SandboxRecord, error) {
	return loadAll[SandboxRecord](s, bucketSandboxes)
}

// Checkpoints returns every checkpoint record.
func (s *Store) Checkpoints() ([]*CheckpointRecord, error) {
	return loadAll[CheckpointRecord](s, bucketCheckpoints)
}

// Pools returns every pool record.
func (s *Store) Pools() ([]*PoolRecord, error) { return loadAll[PoolRecord](s, bucketPools) }

func loadAll[T any](s *Store, bucket []byte) ([]*T, error) {
	var out []*T
	err := s.db.View(func(tx *bolt.Tx) error {
		return tx.Bucket(bucket).ForEach(func(k, v []byte) error {
			r := new(T)
			if err := json.Unmarshal(v, r); err != nil {
				return fmt.Errorf("store: decode %s/%s: %w", bucket, k, err)
			}
			out = append(out, r)
			return nil
		})
	})
	return out, err
}

// The API messages are stored in their protojson form, so field names stay
// stable across regenerations of the Go code.

var (
	pjMarshal   = protojson.MarshalOptions{UseProtoNames: true}
	pjUnmarshal = protojson.UnmarshalOptions{DiscardUnknown: true}
)

type sandboxJSON struct {
	Sandbox    json.RawMessage   `json:"sandbox"`
	Env        map[string]string `json:"env,omitempty"`
	ACIToken   string            `json:"aci_token"`
	AdminToken string            `json:"admin_token"`
	// aci_addr replaced aci_socket (a plain host path): a record of an older
	// controld has none until reconciliation refreshes it from the runtime.
	ACISocket *addrJSON         `json:"aci_addr,omitempty"`
	Pooled    bool              `json:"pooled,omitempty"`
	Ports     map[uint32]string `json:"ports,omitempty"`
	Request   *RequestTag       `json:"request,omitempty"`
}

// MarshalJSON implements json.Marshaler.
func (r *SandboxRecord) MarshalJSON() ([]byte, error) {
	pb, err := pjMarshal.Marshal(r.Sandbox)
	if err != nil {
		return nil, err
	}
	j := sandboxJSON{Sandbox: pb, Env: r.Env, ACIToken: r.ACIToken, AdminToken: r.AdminToken, Pooled: r.Pooled, Ports: r.Ports, Request: r.Request}
	if !r.ACISocket.IsZero() {
		j.ACISocket = &addrJSON{PID: r.ACISocket.PID, Start: r.ACISocket.Start, Path: r.ACISocket.Path}
	}
	return json.Marshal(j)
}

// UnmarshalJSON implements json.Unmarshaler.
func (r *SandboxRecord) UnmarshalJSON(b []byte) error {
	var j sandboxJSON
	if err := json.Unmarshal(b, &j); err != nil {
		return err
	}
	r.Sandbox = new(controldv1.Sandbox)
	if err := pjUnmarshal.Unmarshal(j.Sandbox, r.Sandbox); err != nil {
		return err
	}
	r.Env, r.ACIToken, r.AdminToken, r.Pooled, r.Ports, r.Request = j.Env, j.ACIToken, j.AdminToken, j.Pooled, j.Ports, j.Request
	r.ACISocket = guestsock.Addr{}
	if a := j.ACISocket; a != nil {
		r.ACISocket = guestsock.Addr{PID: a.PID, Start: a.Start, Path: a.Path}
	}
	return nil
}

type addrJSON struct {
	PID   uint32 `json:"pid"`
	Start uint64 `json:"start"`
	Path  string `json:"path"`
}

type checkpointJSON struct {
	Checkpoint  json.RawMessage       `json:"checkpoint"`
	Ref         runtime.CheckpointRef `json:"ref"`
	Env         map[string]string     `json:"env,omitempty"`
	AdminToken  string                `json:"admin_token"`
	Generation  uint64                `json:"generation"`
	FrameHash   []byte                `json:"frame_hash,omitempty"`
	MarkerPath  string                `json:"marker_path,omitempty"`
	MarkerValue []byte                `json:"marker_value,omitempty"`
	MemoryValue []byte                `json:"memory_value,omitempty"`
	NetPort     uint32                `json:"net_port,omitempty"`
	NetValue    []byte                `json:"net_value,omitempty"`
	FSDigest    []byte                `json:"fs_digest,omitempty"`
	Request     *RequestTag           `json:"request,omitempty"`
	Imported    string                `json:"imported_digest,omitempty"`
	Pool        string                `json:"pool,omitempty"`
	Retired     bool                  `json:"retired,omitempty"`
}

// MarshalJSON implements json.Marshaler.
func (r *CheckpointRecord) MarshalJSON() ([]byte, error) {
	pb, err := pjMarshal.Marshal(r.Checkpoint)
	if err != nil {
		return nil, err
	}
	return json.Marshal(checkpointJSON{pb, r.Ref, r.Env, r.AdminToken, r.Generation, r.FrameHash, r.MarkerPath, r.MarkerValue, r.MemoryValue,
		r.NetPort, r.NetValue, r.FSDigest, r.Request, r.ImportedDigest, r.Pool, r.Retired})
}

// UnmarshalJSON implements json.Unmarshaler.
func (r *CheckpointRecord) UnmarshalJSON(b []byte) error {
	var j checkpointJSON
	if err := json.Unmarshal(b, &j); err != nil {
		return err
	}
	r.Checkpoint = new(controldv1.Checkpoint)
	if err := pjUnmarshal.Unmarshal(j.Checkpoint, r.Checkpoint); err != nil {
		return err
	}
	r.Ref, r.Env, r.AdminToken, r.Generation = j.Ref, j.Env, j.AdminToken, j.Generation
	r.FrameHash, r.MarkerPath, r.MarkerValue, r.MemoryValue = j.FrameHash, j.MarkerPath, j.MarkerValue, j.MemoryValue
	r.NetPort, r.NetValue, r.FSDigest, r.Request = j.NetPort, j.NetValue, j.FSDigest, j.Request
	r.ImportedDigest, r.Pool, r.Retired = j.Imported, j.Pool, j.Retired
	return nil
}

type poolJSON struct {
	Pool json.RawMessage   `json:"pool"`
	Env  map[string]string `json:"env,omitempty"`
}

// MarshalJSON implements json.Marshaler.
func (r *PoolRecord) MarshalJSON() ([]byte, error) {
	pb, err := pjMarshal.Marshal(r.Pool)
	if err != nil {
		return nil, err
	}
	return json.Marshal(poolJSON{pb, r.Env})
}

// UnmarshalJSON implements json.Unmarshaler.
func (r *PoolRecord) UnmarshalJSON(b []byte) error {
	var j poolJSON
	if err := json.Unmarshal(b, &j); err != nil {
		return err
	}
	r.Pool = new(controldv1.Pool)
	if err := pjUnmarshal.Unmarshal(j.Pool, r.Pool); err != nil {
		return err
	}
	r.Env = j.Env
	return nil
}
