// Package guestconn implements fleet.Guest, controld's admin session with a
// sandbox's guestd, on top of the Go ACI client (api/aci) over guestd's unix
// socket.
package guestconn

import (
	"context"
	"fmt"
	"io/fs"
	"strings"
	"sync"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/forkfleet/forkfleet/api/aci"
	"github.com/forkfleet/forkfleet/api/errdefs"
	aciv1 "github.com/forkfleet/forkfleet/api/gen/forkfleet/aci/v1"
	"github.com/forkfleet/forkfleet/api/guestsock"
	"github.com/forkfleet/forkfleet/controld/internal/fleet"
)

// adminReadLimit is the largest message controld reads from a guestd, and
// markerLimit the largest file it reads back (a checkpoint's marker).
const (
	adminReadLimit = 4 << 20
	markerLimit    = 64 << 10
)

// settleTimeout bounds how long guestd waits for a still screen.
const settleTimeout = 3 * time.Second

// Dialer opens admin sessions; the zero value is ready to use.
type Dialer struct {
	// ClientName is announced in the Hello; "controld" when empty.
	ClientName string
}

var _ fleet.GuestDialer = Dialer{}

// DialGuest implements fleet.GuestDialer. aci classifies a socket that is
// absent or refusing as ErrUnavailable and a rejected token as
// ErrPermissionDenied, which is the contract fleet retries on.
func (d Dialer) DialGuest(ctx context.Context, addr guestsock.Addr, token string) (fleet.Guest, error) {
	name := d.ClientName
	if name == "" {
		name = "controld"
	}
	// controld's requests get small replies (readiness, hashes, marker
	// files): a guestd, as hostile as its sandbox, gets no room for more.
	s, err := aci.DialSandbox(ctx, addr, token, aci.WithClientName(name), aci.WithReadLimit(adminReadLimit))
	if err != nil {
		return nil, err
	}
	return &guest{s: s}, nil
}

type guest struct {
	s    *aci.Session
	once sync.Once
	err  error
}

func readyState(r *aciv1.ReadyResponse) fleet.ReadyState {
	return fleet.ReadyState{
		Ready: r.GetReady(), XUp: r.GetXUp(), WMUp: r.GetWmUp(), Painted: r.GetRootPainted(),
		XUpMs: r.GetXUpMs(), WMUpMs: r.GetWmUpMs(), PaintedMs: r.GetPaintedMs(),
		WindowsMappedMs: r.GetWindowsMappedMs(), ContentReadyMs: r.GetContentReadyMs(), FocusedMs: r.GetFocusedMs(),
		WaitingFor: printable(r.GetWaitingFor(), fleet.MaxWaitingFor),
	}
}

// printable makes text from the sandbox safe for errors and logs: valid
// UTF-8 without control characters, at most limit bytes.
func printable(s string, limit int) string {
	s = strings.Map(func(r rune) rune {
		if unicode.IsControl(r) || r == utf8.RuneError {
			return -1
		}
		return r
	}, strings.ToValidUTF8(s, ""))
	if len(s) > limit {
		s = strings.ToValidUTF8(s[:limit], "") + "…"
	}
	return s
}

// WaitReady asks once, then follows guestd's pushed ReadyEvents.
func (g *guest) WaitReady(ctx context.Context, onState func(fleet.ReadyState)) (fleet.ReadyState, error) {
	evctx, cancel := context.WithCancel(ctx)
	defer cancel()
	// Subscribe before asking, so a push between the two is not lost.
	events := g.s.Events(evctx)
	r, err := g.s.Ready(ctx)
	if err != nil {
		return fleet.ReadyState{}, fmt.Errorf("ready: %w", err)
	}
	st := readyState(r)
	if onState != nil {
		onState(st)
	}
	for !st.Ready {
		select {
		case <-ctx.Done():
			if st.WaitingFor != "" {
				return st, fmt.Errorf("desktop not usable, waiting for %s: %w", st.WaitingFor, ctx.Err())
			}
			return st, ctx.Err()
		case <-g.s.Done():
			return st, fmt.Errorf("guestd closed the session before the desktop was ready: %w", aci.ErrConnectionLost)
		case ev, ok := <-events:
			if !ok {
				if ctx.Err() != nil {
					return st, ctx.Err()
				}
				return st, fmt.Errorf("guestd session ended before the desktop was ready: %w", aci.ErrConnectionLost)
			}
			r := ev.GetReady().GetState()
			if r == nil {
				continue
			}
			st = readyState(r)
			if onState != nil {
				onState(st)
			}
		}
	}
	return st, nil
}

func (g *guest) MemoryMark(ctx context.Context, value []byte) error {
	return g.s.MemoryMark(ctx, value)
}

func (g *guest) MemoryChallenge(ctx context.Context, nonce []byte) ([]byte, error) {
	return g.s.MemoryChallenge(ctx, nonce)
}

func (g *guest) NetProbeListen(ctx context.Context, value []byte) (uint32, error) {
	return g.s.NetProbeListen(ctx, value)
}

func (g *guest) NetProbe(ctx context.Context, port uint32, nonce []byte) ([]byte, error) {
	return g.s.NetProbe(ctx, port, nonce)
}

func (g *guest) FrameHash(ctx context.Context, settle time.Duration) ([]byte, error) {
	req := &aciv1.ScreenshotRequest{Format: aciv1.ImageFormat_IMAGE_FORMAT_NONE}
	if settle > 0 {
		req.SettleMs = uint32(settle / time.Millisecond)
		req.SettleTimeoutMs = uint32(settleTimeout / time.Millisecond)
	}
	// Through Do, not Screenshot: the session's frame cache must not turn
	// the answer into not_modified.
	m, err := g.s.Do(ctx, &aciv1.ClientMessage{Request: &aciv1.ClientMessage_Screenshot{Screenshot: req}})
	if err != nil {
		return nil, err
	}
	r := m.GetScreenshot()
	if r == nil || len(r.GetFrameHash()) == 0 {
		return nil, fmt.Errorf("screenshot reply without a frame hash: %w", aci.ErrProtocol)
	}
	return r.GetFrameHash(), nil
}

func (g *guest) PutFile(ctx context.Context, path string, data []byte, mode uint32) error {
	return g.s.PutFile(ctx, path, data, aci.FileMode(fs.FileMode(mode)), aci.MakeParents())
}

func (g *guest) GetFile(ctx context.Context, path string) ([]byte, error) {
	return g.s.GetFile(ctx, path, aci.UpTo(markerLimit))
}

func (g *guest) Restored(ctx context.Context, r fleet.RestoredInfo) (fleet.RestoredResult, error) {
	if !g.s.HasCapability(capRestoredAdminToken) {
		// Its checkpoint's admin token would open this replica for good:
		// refuse the replica rather than hand it out.
		return fleet.RestoredResult{}, errdefs.WithReason(errdefs.ErrFailedPrecondition, "GUEST_CANNOT_ROTATE_TOKENS",
			"the restored guestd (%s) cannot replace its admin token (no %q capability): retake the checkpoint with a current guestd",
			g.s.Welcome().GetServerVersion(), capRestoredAdminToken)
	}
	resp, err := g.s.Restored(ctx, &aciv1.RestoredRequest{SandboxId: r.SandboxID, Token: r.Token, AdminToken: r.AdminToken,
		Generation: r.Generation, Entropy: r.Entropy, HoldApps: r.HoldApps})
	if err != nil {
		return fleet.RestoredResult{}, err
	}
	return fleet.RestoredResult{FrameHash: resp.GetFrameHash()}, nil
}

// capRestoredAdminToken: guestd replaces its admin token on Restored.
const capRestoredAdminToken = "restored.admin_token"

func (g *guest) CheckpointPrepare(ctx context.Context, hold, settle time.Duration) ([]byte, error) {
	var opts []aci.PrepareOption
	if settle > 0 {
		opts = append(opts, aci.WithSettle(settle, settleTimeout))
	}
	r, err := g.s.CheckpointPrepare(ctx, hold, opts...)
	if err != nil {
		return nil, err
	}
	if len(r.GetFrameHash()) == 0 {
		return nil, fmt.Errorf("checkpoint_prepare reply without a frame hash (no display attached): %w", aci.ErrProtocol)
	}
	return r.GetFrameHash(), nil
}

func (g *guest) CheckpointDone(ctx context.Context) error { return g.s.CheckpointDone(ctx) }

func (g *guest) ReleaseScratch(ctx context.Context) error {
	_, err := g.s.ReleaseScratch(ctx)
	return err
}

// ResumeApps falls back to a ping on a guestd without "apps.hold" (a
// checkpoint taken before it): such a guestd never held its apps.
func (g *guest) ResumeApps(ctx context.Context) error {
	if !g.s.HasCapability(capAppsHold) {
		return g.Ping(ctx)
	}
	_, err := g.s.ResumeApps(ctx)
	return err
}

// capAppsHold: guestd stops its apps for a dump and serves resume_apps.
const capAppsHold = "apps.hold"

func (g *guest) Ping(ctx context.Context) error {
	_, err := g.s.Ping(ctx, nil)
	return err
}

func (g *guest) Hello() fleet.GuestHello {
	h := g.s.Welcome()
	return fleet.GuestHello{SandboxID: h.GetSandboxId(), Generation: h.GetGeneration(), BootID: h.GetBootId()}
}

func (g *guest) Close() error {
	g.once.Do(func() { g.err = g.s.Close() })
	return g.err
}
