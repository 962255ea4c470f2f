package rules

import (
	"context"
	"crypto/sha256"
	"fmt"
	"sync"
	"time"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"

	"github.com/forkfleet/forkfleet/api/errdefs"
)

// RequestIDTTL is how long a request id is remembered: a repeat within it
// returns the first call's result, after it is a new request.
const RequestIDTTL = 24 * time.Hour

// MaxRequestID bounds a request id's length.
const MaxRequestID = 128

// RequestID checks an optional request id: 1..MaxRequestID characters of
// [A-Za-z0-9._:-] (a UUID fits).
func RequestID(field, id string) error {
	if len(id) > MaxRequestID {
		return errdefs.InvalidField(field, "longer than %d characters", MaxRequestID)
	}
	for _, c := range id {
		switch {
		case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9', c == '.', c == '_', c == ':', c == '-':
		default:
			return errdefs.InvalidField(field, "must be characters of [A-Za-z0-9._:-]")
		}
	}
	return nil
}

// Fingerprint is what identifies a request's content: the SHA-256 of its
// deterministic encoding with the fields named in skip cleared (request_id
// itself, page tokens). Two requests with equal fingerprints ask for the
// same thing.
func Fingerprint(m proto.Message, skip ...protoreflect.Name) []byte {
	c := proto.Clone(m)
	fields := c.ProtoReflect().Descriptor().Fields()
	for _, name := range skip {
		if fd := fields.ByName(name); fd != nil {
			c.ProtoReflect().Clear(fd)
		}
	}
	b, err := proto.MarshalOptions{Deterministic: true}.Marshal(c)
	if err != nil {
		// Only a message with invalid UTF-8 in a string fails to encode,
		// and the server decoded it: report it as such rather than panic.
		b = fmt.Appendf(nil, "unencodable: %v", err)
	}
	sum := sha256.Sum256(b)
	return sum[:]
}

// RequestRecord is a finished request as its store keeps it.
type RequestRecord struct {
	// Key is the method's full name, "/", the request id.
	Key         string
	Fingerprint []byte
	// Response is the first call's response (protobuf encoding).
	Response []byte
	Expires  time.Time
}

// RequestStore keeps finished requests (controld: its durable store; the
// fake: memory). Get returns nil for an unknown key.
type RequestStore interface {
	GetRequest(key string) (*RequestRecord, error)
	PutRequest(*RequestRecord) error
}

// Dedup makes creating calls idempotent by request id: a repeat returns
// the first call's response, waits for a first call still running, and
// runs again only after a first call that failed without leaving what it
// created (Do's recover says). Safe for concurrent use.
type Dedup struct {
	Store RequestStore
	Now   func() time.Time // nil: time.Now

	mu      sync.Mutex
	flights map[string]*flight
	wg      sync.WaitGroup // answers being stored
}

type flight struct {
	fp   []byte
	done chan struct{}
	resp proto.Message // set on success before done closes
}

// Recover looks for what a first call with this key left (after it failed,
// or controld restarted while it ran): ok with the response it would have
// returned, or not ok to run the call again. A recovered resource created
// from another request (fingerprint) is the caller's error to report.
type Recover func(ctx context.Context, key string, fp []byte) (resp proto.Message, ok bool, err error)

// Request identifies a call with a request id to what it creates (a
// resource tagged with it is found by Recover); zero without a request id.
type Request struct {
	Key         string
	Fingerprint []byte
}

// Call is the work of a creating call.
type Call func(ctx context.Context, r Request) (proto.Message, error)

// Do runs call once per (method, request id). Without a request id it just
// runs it. newResp returns an empty response message to decode a stored
// one into; recover may be nil.
func (d *Dedup) Do(ctx context.Context, method, requestID string, req proto.Message, newResp func() proto.Message,
	recover Recover, call Call) (proto.Message, error) {
	if requestID == "" {
		return call(ctx, Request{})
	}
	if err := RequestID("request_id", requestID); err != nil {
		return nil, err
	}
	key := RequestKey(method, requestID)
	fp := Fingerprint(req, "request_id")
	for {
		d.mu.Lock()
		if f, running := d.flights[key]; running {
			d.mu.Unlock()
			if string(f.fp) != string(fp) {
				return nil, reused(requestID)
			}
			select {
			case <-f.done:
			case <-ctx.Done():
				return nil, ctx.Err()
			}
			if f.resp != nil {
				return proto.Clone(f.resp), nil
			}
			continue // it failed: look again (recover), or run
		}
		f := &flight{fp: fp, done: make(chan struct{})}
		if d.flights == nil {
			d.flights = map[string]*flight{}
		}
		d.flights[key] = f
		d.mu.Unlock()
		resp, store, err := d.lead(ctx, key, fp, newResp, recover, call)
		d.mu.Lock()
		f.resp = resp
		close(f.done)
		if store == nil {
			delete(d.flights, key)
		}
		d.mu.Unlock()
		if store != nil {
			// The answer goes to the caller now and to the store behind it
			// (a durable write costs a disk flush: not on the call's path).
			// Until it is there the flight answers repeats; a crash in
			// between leaves recover to find the work.
			d.wg.Add(1)
			go func() {
				defer d.wg.Done()
				store()
				d.mu.Lock()
				delete(d.flights, key)
				d.mu.Unlock()
			}()
		}
		return resp, err
	}
}

// Wait returns once the answers given so far are stored (tests, shutdown).
func (d *Dedup) Wait() { d.wg.Wait() }

// lead is the one call of a key running now: the stored response, what
// recover finds, or a fresh run, stored on success.
func (d *Dedup) lead(ctx context.Context, key string, fp []byte, newResp func() proto.Message, recover Recover,
	call Call) (resp proto.Message, store func(), err error) {
	now := time.Now
	if d.Now != nil {
		now = d.Now
	}
	rec, err := d.Store.GetRequest(key)
	if err != nil {
		return nil, nil, err
	}
	if rec != nil && now().Before(rec.Expires) {
		if string(rec.Fingerprint) != string(fp) {
			return nil, nil, reused(key)
		}
		resp := newResp()
		if err := proto.Unmarshal(rec.Response, resp); err != nil {
			return nil, nil, fmt.Errorf("%w: stored response of %s: %w", errdefs.ErrInternal, key, err)
		}
		return resp, nil, nil
	}
	if recover != nil {
		r, ok, err := recover(ctx, key, fp)
		if err != nil {
			return nil, nil, err
		}
		if ok {
			resp = r
		}
	}
	if resp == nil {
		if resp, err = call(ctx, Request{Key: key, Fingerprint: fp}); err != nil {
			return nil, nil, err
		}
	}
	b, err := proto.MarshalOptions{Deterministic: true}.Marshal(resp)
	if err != nil {
		return resp, nil, nil // never stored: repeats find the work through recover
	}
	rec = &RequestRecord{Key: key, Fingerprint: fp, Response: b, Expires: now().Add(RequestIDTTL)}
	// The work is done whether or not the write lands: a repeat that finds
	// no record finds the work through recover.
	return resp, func() { _ = d.Store.PutRequest(rec) }, nil
}

func reused(key string) error {
	return errdefs.InvalidField("request_id", "%s was used for a different request within %v", key, RequestIDTTL)
}

// RequestKey is the key of a request id of method (what Recover gets).
func RequestKey(method, requestID string) string { return method + "/" + requestID }

// CheckFingerprint returns the request_id error when a resource recovered
// for a key was created by a request with another fingerprint.
func CheckFingerprint(key string, want, have []byte) error {
	if string(want) != string(have) {
		return reused(key)
	}
	return nil
}
