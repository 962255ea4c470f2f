package fleet

import (
	"context"
	"time"

	"github.com/forkfleet/forkfleet/api/guestsock"
)

// Guest is an admin session with one sandbox's guestd, as the manager needs
// it. internal/guestconn implements it over the ACI; tests use fakes.
// Methods may be called concurrently; Close ends the session (idempotent).
type Guest interface {
	// WaitReady returns once guestd reports the desktop ready. It asks once
	// and then follows guestd's pushed ReadyEvents (never polls); onState, when
	// not nil, sees every state received, in order.
	WaitReady(ctx context.Context, onState func(ReadyState)) (ReadyState, error)
	// MemoryMark stores value in guestd's heap only (admin).
	MemoryMark(ctx context.Context, value []byte) error
	// MemoryChallenge returns HMAC-SHA256(key = the marked value, nonce).
	MemoryChallenge(ctx context.Context, nonce []byte) ([]byte, error)
	// NetProbeListen makes guestd hold a TCP listener on the sandbox's
	// loopback that answers nonces with HMAC-SHA256 keyed by value (admin);
	// it returns the listener's port.
	NetProbeListen(ctx context.Context, value []byte) (uint32, error)
	// NetProbe makes guestd connect to 127.0.0.1:port from inside its
	// sandbox and returns the listener's answer to nonce (admin).
	NetProbe(ctx context.Context, port uint32, nonce []byte) ([]byte, error)
	// FrameHash returns the frame hash of a capture without pixels (format
	// NONE), after the screen has been still for settle (0: no settling).
	FrameHash(ctx context.Context, settle time.Duration) ([]byte, error)
	// PutFile writes a file atomically, creating parent directories.
	PutFile(ctx context.Context, path string, data []byte, mode uint32) error
	// GetFile reads a whole (small) file.
	GetFile(ctx context.Context, path string) ([]byte, error)
	// Restored tells a freshly restored replica who it is now (admin): its
	// id, generation, entropy and its own tokens of both roles, after which
	// the checkpoint's tokens no longer open it. The replica answers with
	// the frame it was restored with. A guestd that cannot replace its
	// admin token fails with errdefs.ErrFailedPrecondition.
	Restored(ctx context.Context, r RestoredInfo) (RestoredResult, error)
	// CheckpointPrepare closes guestd's other sessions and holds off new
	// agent sessions for hold (until CheckpointDone or Restored), so the dump
	// finds no connection from outside the sandbox (admin). It then waits
	// until the screen has been still for settle (counting from the last
	// damage or input: a still desktop costs no wait) and returns the frame
	// hash a memory-tier replica is born with.
	CheckpointPrepare(ctx context.Context, hold, settle time.Duration) ([]byte, error)
	// CheckpointDone lifts the hold on a source that runs on (admin).
	CheckpointDone(ctx context.Context) error
	// ReleaseScratch gives guestd's idle scratch memory back to the kernel
	// before a replica is frozen (admin).
	ReleaseScratch(ctx context.Context) error
	// ResumeApps lets the apps that Restored with HoldApps kept stopped run
	// (admin); it answers once they were continued (nothing to do when none
	// are held). A claim of a frozen pool's replica sends it after the thaw:
	// the round trip that proves guestd runs.
	ResumeApps(ctx context.Context) error
	// Ping round-trips one small message.
	Ping(ctx context.Context) error
	// Hello is what guestd announced when the session opened.
	Hello() GuestHello
	Close() error
}

// GuestDialer opens admin sessions to guestd.
type GuestDialer interface {
	// DialGuest connects to guestd's ACI unix socket at addr (through
	// guestsock: never a plain path into the sandbox) and authenticates
	// with token. A socket that does not exist (yet) or refuses
	// the connection fails with an error wrapping errdefs.ErrUnavailable, so
	// the caller can retry; a rejected token wraps errdefs.ErrUnauthenticated
	// or errdefs.ErrPermissionDenied.
	DialGuest(ctx context.Context, addr guestsock.Addr, token string) (Guest, error)
}

// ReadyState is guestd's readiness report. The *Ms fields count
// milliseconds since guestd started (0: not reached yet).
type ReadyState struct {
	Ready, XUp, WMUp, Painted bool
	XUpMs, WMUpMs, PaintedMs  uint64
	// The image's readiness conditions (guestd.json "ready"): its windows
	// mapped, their titles matching (the start page loaded), the focus on
	// its focus window. 0: not yet, or the image names nothing of the kind.
	WindowsMappedMs, ContentReadyMs, FocusedMs uint64
	// WaitingFor is what readiness still waits for, as guestd says it:
	// printable, at most MaxWaitingFor bytes.
	WaitingFor string
}

// MaxWaitingFor bounds ReadyState.WaitingFor: guestd's bytes are the
// sandbox's and end up in errors and logs.
const MaxWaitingFor = 256

// GuestHello is the session's HelloResponse, as far as controld uses it.
type GuestHello struct {
	SandboxID  string
	Generation uint64
	BootID     string
}

// RestoredResult is what a replica reports on Restored.
type RestoredResult struct {
	// FrameHash is the hash of the replica's first frame, captured before
	// any of its apps drew (guestd holds the X server grab the dump
	// carried until then); empty from a guestd that predates it.
	FrameHash []byte
}

// RestoredInfo is what a replica learns right after a restore.
type RestoredInfo struct {
	SandboxID  string
	Token      string // the replica's own ACI token
	AdminToken string // the replica's own admin token
	Generation uint64
	Entropy    []byte
	// HoldApps stops the replica's apps (every process but guestd and the
	// X server) until ResumeApps: a pool's member, which waits frozen for
	// its claim.
	HoldApps bool
}
