package guestconn_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/forkfleet/forkfleet/api/aci/acitest"
	"github.com/forkfleet/forkfleet/api/aci/wire"
	"github.com/forkfleet/forkfleet/api/errdefs"
	aciv1 "github.com/forkfleet/forkfleet/api/gen/forkfleet/aci/v1"
	"github.com/forkfleet/forkfleet/api/guestsock"
	"github.com/forkfleet/forkfleet/controld/internal/fleet"
	"github.com/forkfleet/forkfleet/controld/internal/guestconn"
)

func TestGuestOverACI(t *testing.T) {
	t.Cleanup(func() { goleak.VerifyNone(t) })
	dir, err := os.MkdirTemp("", "gc")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(dir)
	sock, err := guestsock.Self(filepath.Join(dir, "aci.sock"))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()

	// Before guestd listens: Unavailable, so the manager retries.
	_, err = guestconn.Dialer{}.DialGuest(ctx, sock, "admin")
	if !errors.Is(err, errdefs.ErrUnavailable) {
		t.Fatalf("absent socket: %v", err)
	}
	srv, err := acitest.NewUnixServer(sock.Path)
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	srv.Token = "admin"
	srv.SandboxID = "sb-x"
	srv.SetReady(false)

	if _, err := (guestconn.Dialer{}).DialGuest(ctx, sock, "wrong"); !errors.Is(err, errdefs.ErrPermissionDenied) {
		t.Fatalf("wrong token: %v", err)
	}
	g, err := guestconn.Dialer{}.DialGuest(ctx, sock, "admin")
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	if g.Hello().SandboxID != "sb-x" {
		t.Fatalf("hello %+v", g.Hello())
	}
	// Readiness arrives as a push while WaitReady waits.
	go func() {
		time.Sleep(20 * time.Millisecond)
		srv.SetReady(true)
	}()
	var states []fleet.ReadyState
	st, err := g.WaitReady(ctx, func(s fleet.ReadyState) { states = append(states, s) })
	if err != nil || !st.Ready {
		t.Fatalf("wait ready: %+v %v", st, err)
	}
	if len(states) < 2 || states[0].Ready {
		t.Fatalf("states seen %+v: want a not-ready answer, then the pushed ready", states)
	}
	if err := g.Ping(ctx); err != nil {
		t.Fatal(err)
	}
	value := []byte("secret value")
	if err := g.MemoryMark(ctx, value); err != nil {
		t.Fatal(err)
	}
	nonce := []byte("nonce")
	mac, err := g.MemoryChallenge(ctx, nonce)
	if err != nil {
		t.Fatal(err)
	}
	if !wire.ProofOK(value, nonce, mac) {
		t.Fatal("memory challenge mismatch")
	}
	fh, err := g.FrameHash(ctx, 10*time.Millisecond)
	if err != nil || len(fh) == 0 {
		t.Fatalf("frame hash %x %v", fh, err)
	}
	fh2, err := g.FrameHash(ctx, 0)
	if err != nil || string(fh) != string(fh2) {
		t.Fatalf("second frame hash differs or fails (not_modified leak?): %x %v", fh2, err)
	}
	if err := g.PutFile(ctx, "/var/lib/forkfleet/markers/ck-x", []byte("marker"), 0o600); err != nil {
		t.Fatal(err)
	}
	b, err := g.GetFile(ctx, "/var/lib/forkfleet/markers/ck-x")
	if err != nil || string(b) != "marker" {
		t.Fatalf("get file %q %v", b, err)
	}
	if _, err := g.Restored(ctx, fleet.RestoredInfo{SandboxID: "sb-y", Token: "new", AdminToken: "new-admin", Generation: 2, Entropy: []byte{1}}); err != nil {
		t.Fatal(err)
	}
	if err := g.Close(); err != nil {
		t.Fatal(err)
	}
	// The restored tokens are refused, the new admin token opens it.
	if _, err := (guestconn.Dialer{}).DialGuest(ctx, sock, "admin"); !errors.Is(err, errdefs.ErrPermissionDenied) {
		t.Fatalf("old admin token after Restored: %v", err)
	}
	g, err = guestconn.Dialer{}.DialGuest(ctx, sock, "new-admin")
	if err != nil {
		t.Fatal(err)
	}
	g.Close()

	// A guestd that cannot replace its admin token is refused as a replica.
	srv.Capabilities = slices.DeleteFunc(slices.Clone(acitest.DefaultCapabilities), func(c string) bool { return c == "restored.admin_token" })
	g, err = guestconn.Dialer{}.DialGuest(ctx, sock, "new-admin")
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	if _, err := g.Restored(ctx, fleet.RestoredInfo{SandboxID: "sb-z", Token: "t", AdminToken: "a", Generation: 3, Entropy: []byte{1}}); !errors.Is(err, errdefs.ErrFailedPrecondition) {
		t.Fatalf("Restored on a guestd without token rotation: %v, want FailedPrecondition", err)
	}
	if err := g.Close(); err != nil {
		t.Fatalf("second close: %v", err)
	}
}

// A guestd is as hostile as its sandbox: controld reads back no marker file
// larger than a marker, and no message larger than its small replies need.
func TestHostileGuest(t *testing.T) {
	t.Cleanup(func() { goleak.VerifyNone(t) })
	dir, err := os.MkdirTemp("", "gc")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(dir)
	sock, err := guestsock.Self(filepath.Join(dir, "aci.sock"))
	if err != nil {
		t.Fatal(err)
	}
	srv, err := acitest.NewUnixServer(sock.Path)
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	srv.Token = "admin"
	srv.Handle = func(_ context.Context, m *aciv1.ClientMessage) *aciv1.ServerMessage {
		if r := m.GetMemoryChallenge(); r != nil { // a reply far larger than any controld asks for
			return &aciv1.ServerMessage{Id: m.GetId(), Reply: &aciv1.ServerMessage_MemoryChallenge{
				MemoryChallenge: &aciv1.MemoryChallengeResponse{Mac: make([]byte, 8<<20)}}}
		}
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	g, err := guestconn.Dialer{}.DialGuest(ctx, sock, "admin")
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	if err := g.PutFile(ctx, "/marker", make([]byte, 1<<20), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := g.GetFile(ctx, "/marker"); !errors.Is(err, errdefs.ErrResourceExhausted) {
		t.Fatalf("a 1 MiB marker: %v", err)
	}
	if _, err := g.MemoryChallenge(ctx, []byte("n")); err == nil {
		t.Fatal("an 8 MiB reply was read")
	}
}
