// Package suiteapi is the contract between benchd and its suites: what a
// suite is (Suite, Peered), what it gets from benchd (Env), how it skips
// (SkipError), and the registry benchd runs from. The suites themselves
// live in benchd/internal/suites, one file each.
package suiteapi

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"sync"
	"time"

	"github.com/forkfleet/forkfleet/benchd/internal/result"
	oteltrace "go.opentelemetry.io/otel/trace"
)

// Suite is one benchmark.
type Suite interface {
	Name() string
	// Description is one line for `benchd list`.
	Description() string
	// Flags registers the suite's own flags (names unique across suites, so
	// `run --suite all` can accept every suite's flags at once).
	Flags(fs *flag.FlagSet)
	// Check returns a *SkipError when a prerequisite is missing.
	Check(ctx context.Context, env *Env) error
	// Run measures and returns the rows.
	Run(ctx context.Context, env *Env) ([]result.Row, error)
}

// Peered is a suite that measures peers (named in benchd/internal/peers).
// The runner resolves them before Run, after the flags are parsed: a
// promised peer that is missing fails the suite unless Env.SkipMissingPeers.
type Peered interface {
	Peers() []string
}

// SkipError reports a missing prerequisite: the suite is skipped, not failed.
type SkipError struct{ Reason string }

func (e *SkipError) Error() string { return "skipped: " + e.Reason }

// Skipf builds a SkipError.
func Skipf(format string, a ...any) error { return &SkipError{Reason: fmt.Sprintf(format, a...)} }

// IsSkip reports whether err is a skip, returning its reason.
func IsSkip(err error) (string, bool) {
	var s *SkipError
	if errors.As(err, &s) {
		return s.Reason, true
	}
	return "", false
}

// Env is what a running suite gets from benchd.
type Env struct {
	// N overrides each suite's default sample count when > 0.
	N int
	// Warmup overrides the default warm-up count when >= 0.
	Warmup int
	// Self is benchd's own executable, for re-executing helper processes.
	Self string
	// RepoRoot is the monorepo root ("" when unknown).
	RepoRoot string
	// GuestdBin is the guestd binary to run on the host ("" to build it).
	GuestdBin string
	// ControldSocket is controld's gRPC unix socket.
	ControldSocket string
	// WorkDir is a scratch directory removed after the run.
	WorkDir string
	// SkipMissingPeers runs a suite whose promised peers are missing,
	// without their rows (and says so loudly), instead of failing it.
	SkipMissingPeers bool
	Tracer           oteltrace.Tracer
	Log              io.Writer

	mu    sync.Mutex
	notes []string
	peers map[string]string // peer name -> binary, set by the runner
}

// SetPeers records the binaries of the suite's installed peers (runner).
func (e *Env) SetPeers(paths map[string]string) {
	e.mu.Lock()
	e.peers = paths
	e.mu.Unlock()
}

// Peer returns the binary of a peer the suite promised, or false when it
// is not installed (the run was told to skip missing peers).
func (e *Env) Peer(name string) (string, bool) {
	e.mu.Lock()
	defer e.mu.Unlock()
	p, ok := e.peers[name]
	return p, ok
}

// Samples returns the sample count for a cell: the --n override or def.
func (e *Env) Samples(def int) int {
	if e.N > 0 {
		return e.N
	}
	return def
}

// Warmups returns the warm-up count: the --warmup override or def.
func (e *Env) Warmups(def int) int {
	if e.Warmup >= 0 {
		return e.Warmup
	}
	return def
}

// Progressf writes one progress line to stderr.
func (e *Env) Progressf(format string, a ...any) {
	if e.Log == nil {
		return
	}
	fmt.Fprintf(e.Log, "[%s] "+format+"\n", append([]any{time.Now().Format("15:04:05")}, a...)...)
}

// Notef records something the run could not measure and why; it ends up in
// the result's notes and on stderr.
func (e *Env) Notef(format string, a ...any) {
	msg := fmt.Sprintf(format, a...)
	e.mu.Lock()
	e.notes = append(e.notes, msg)
	e.mu.Unlock()
	e.Progressf("note: %s", msg)
}

// Notes returns the recorded notes.
func (e *Env) Notes() []string {
	e.mu.Lock()
	defer e.mu.Unlock()
	return append([]string(nil), e.notes...)
}

var (
	regMu    sync.Mutex
	registry []Suite
)

// Register adds a suite; the registration order is the `--suite all` order.
func Register(s Suite) {
	regMu.Lock()
	defer regMu.Unlock()
	for _, o := range registry {
		if o.Name() == s.Name() {
			panic("suite registered twice: " + s.Name())
		}
	}
	registry = append(registry, s)
}

// All returns the registered suites in order.
func All() []Suite {
	regMu.Lock()
	defer regMu.Unlock()
	return append([]Suite(nil), registry...)
}

// Lookup finds a suite by name.
func Lookup(name string) (Suite, bool) {
	for _, s := range All() {
		if s.Name() == name {
			return s, true
		}
	}
	return nil, false
}

// Measure runs warmups discarded calls then n measured calls of fn into s;
// fn learns whether its call is a warm-up (to keep side series clean);
// fn returns the sample value, or an error for a failed sample. An error
// wrapping ErrUnverified counts the sample as unverified instead. A
// context cancellation stops early and is returned.
func Measure(ctx context.Context, s *result.Series, warmups, n int, fn func(warm bool) (float64, error)) error {
	for i := 0; i < warmups; i++ {
		if err := ctx.Err(); err != nil {
			return err
		}
		_, _ = fn(true)
		s.Warmup()
	}
	for i := 0; i < n; i++ {
		if err := ctx.Err(); err != nil {
			return err
		}
		v, err := fn(false)
		if errors.Is(err, ErrUnverified) {
			s.Unverified()
			continue
		}
		if err != nil {
			s.Fail()
			continue
		}
		s.Add(v)
	}
	return nil
}

// ErrUnverified marks a sample whose operation succeeded but whose result
// could not be verified (a wrong image, a replica without the state).
var ErrUnverified = errors.New("result failed verification")

// Ms converts a duration to float milliseconds.
func Ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
