package aci_test

import (
	"context"
	"errors"
	"net"
	"runtime"
	"strings"
	"testing"

	"github.com/forkfleet/forkfleet/api/aci"
	"github.com/forkfleet/forkfleet/api/aci/acitest"
	"github.com/forkfleet/forkfleet/api/errdefs"
	aciv1 "github.com/forkfleet/forkfleet/api/gen/forkfleet/aci/v1"
)

// allocated returns the bytes fn allocated (process-wide).
func allocated(fn func()) uint64 {
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	fn()
	runtime.ReadMemStats(&after)
	return after.TotalAlloc - before.TotalAlloc
}

// TestHostileReplies is issue #12 item 10 for api/aci (and so for
// controld, which talks to every guestd through it): sizes a guestd sends
// are not trusted. A window list of 263,000 empty entries (0.5 MB on the
// wire, some 50 MB decoded) is a protocol violation; a file_get reply
// announcing a 1 TiB file reserves nothing near it; a reply carrying more
// than was asked for is refused. (The JSON subprotocol: TestDecodeBounds.)
func TestHostileReplies(t *testing.T) {
	var getReplies int
	// Built ahead: the measurements below count this process's allocations,
	// the fake guestd's included.
	ws := make([]*aciv1.Window, aci.MaxMessageElements+1000)
	for i := range ws {
		ws[i] = &aciv1.Window{}
	}
	windows := &aciv1.ServerMessage{Reply: &aciv1.ServerMessage_ListWindows{ListWindows: &aciv1.ListWindowsResponse{Windows: ws}}}
	srv := startServer(t, func(s *acitest.Server) {
		s.Handle = func(_ context.Context, m *aciv1.ClientMessage) *aciv1.ServerMessage {
			switch r := m.GetRequest().(type) {
			case *aciv1.ClientMessage_ListWindows:
				windows.Id = m.GetId()
				return windows
			case *aciv1.ClientMessage_FileGet:
				switch r.FileGet.GetPath() {
				case "/huge":
					getReplies++
					return &aciv1.ServerMessage{Id: m.GetId(), Reply: &aciv1.ServerMessage_FileGet{FileGet: &aciv1.FileGetResponse{
						Data: []byte("0123456789"), Size: 1 << 40, Eof: getReplies > 1}}}
				case "/overlong":
					return &aciv1.ServerMessage{Id: m.GetId(), Reply: &aciv1.ServerMessage_FileGet{FileGet: &aciv1.FileGetResponse{
						Data: make([]byte, r.FileGet.GetLength()+1), Size: 1 << 30}}}
				}
			}
			return nil
		}
	})
	ctx := ctxT(t)

	s := dial(t, srv)
	var data []byte
	var err error
	n := allocated(func() { data, err = s.GetFile(ctx, "/huge") })
	if err != nil || string(data) != "01234567890123456789" {
		t.Fatalf("get: %q %v", data, err)
	}
	if n > 64<<20 {
		t.Fatalf("a reply announcing 1 TiB made GetFile allocate %d bytes", n)
	}
	if _, err := s.GetFile(ctx, "/overlong"); !errors.Is(err, aci.ErrProtocol) {
		t.Fatalf("reply longer than asked: %v", err)
	}
	// A caller that knows what to expect reads no more.
	getReplies = 0
	if _, err := s.GetFile(ctx, "/huge", aci.UpTo(64)); !errors.Is(err, aci.ErrResourceExhausted) {
		t.Fatalf("UpTo on a file announced at 1 TiB: %v", err)
	}
	if err := s.PutFile(ctx, "/small", []byte("0123456789")); err != nil {
		t.Fatal(err)
	}
	if b, err := s.GetFile(ctx, "/small", aci.UpTo(10)); err != nil || string(b) != "0123456789" {
		t.Fatalf("UpTo(10) on 10 bytes: %q %v", b, err)
	}
	if _, err := s.GetFile(ctx, "/small", aci.UpTo(9)); !errors.Is(err, aci.ErrResourceExhausted) {
		t.Fatalf("UpTo(9) on 10 bytes: %v", err)
	}
	n = allocated(func() { _, err = s.ListWindows(ctx) })
	if !errors.Is(err, aci.ErrProtocol) || !strings.Contains(err.Error(), "elements") {
		t.Fatalf("an endless window list: %v", err)
	}
	if n > 64<<20 {
		t.Fatalf("the refused window list allocated %d bytes", n)
	}
	s.Close()
}

// TestPlaintextTokenToRemote is issue #12 item 11 for api/aci: a bearer
// token never goes over ws:// to a host that is not the loopback, as
// api/client refuses for gRPC, unless WithInsecure says the network is
// trusted. No connection is attempted: the test talks to its own server
// only, through a dialer, whatever the URL names.
func TestPlaintextTokenToRemote(t *testing.T) {
	srv := startServer(t, func(s *acitest.Server) { s.Token = "tok" })
	ctx := ctxT(t)
	dialed := 0
	local := aci.WithDialer(func(ctx context.Context, _, _ string) (net.Conn, error) {
		dialed++
		var d net.Dialer
		return d.DialContext(ctx, "tcp", strings.TrimSuffix(strings.TrimPrefix(srv.URL(), "ws://"), "/aci"))
	})
	for _, u := range []string{"ws://sandboxes.example.com:7480/aci", "ws://10.1.2.3:7480/aci", "http://[2001:db8::1]:7480/aci"} {
		_, err := aci.Dial(ctx, u, "tok", local)
		if !errors.Is(err, errdefs.ErrInvalidArgument) || !strings.Contains(err.Error(), "plaintext") {
			t.Errorf("%s: %v", u, err)
		}
		// A token source is a token too.
		_, err = aci.Dial(ctx, u, "", local, aci.WithTokenSource(func(context.Context) (string, error) { return "tok", nil }))
		if !errors.Is(err, errdefs.ErrInvalidArgument) {
			t.Errorf("%s with a token source: %v", u, err)
		}
	}
	if dialed != 0 {
		t.Fatalf("%d connections attempted with a token in plaintext", dialed)
	}
	// Allowed: WithInsecure, no token at all, and loopback hosts.
	for name, opts := range map[string][]aci.DialOption{
		"insecure": {local, aci.WithInsecure()},
	} {
		s, err := aci.Dial(ctx, "ws://sandboxes.example.com:7480/aci", "tok", opts...)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		s.Close()
	}
	if _, err := aci.Dial(ctx, "ws://sandboxes.example.com:7480/aci", "", local); !errors.Is(err, errdefs.ErrPermissionDenied) {
		t.Fatalf("no token (the server wants one): %v", err)
	}
	for _, host := range []string{"localhost", "127.0.0.1", "[::1]"} {
		u := "ws://" + host + ":7480/aci"
		s, err := aci.Dial(ctx, u, "tok", local)
		if err != nil {
			t.Fatalf("%s: %v", u, err)
		}
		s.Close()
	}
}
