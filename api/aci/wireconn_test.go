package aci_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/forkfleet/forkfleet/api/aci"
	"github.com/forkfleet/forkfleet/api/aci/acitest"
	aciv1 "github.com/forkfleet/forkfleet/api/gen/forkfleet/aci/v1"
)

func TestWireConn(t *testing.T) {
	srv := acitest.NewServer()
	defer srv.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()

	w, _, err := aci.DialWire(ctx, srv.URL(), "")
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	h, err := w.Hello(ctx, "events.ready")
	if err != nil || h.GetProtocolVersion() != aci.ProtocolVersion {
		t.Fatalf("hello: %v %v", h, err)
	}
	r, err := w.Call(ctx, &aciv1.ClientMessage{Request: &aciv1.ClientMessage_Ping{Ping: &aciv1.PingRequest{}}})
	if err != nil || r.GetPing() == nil || r.GetId() != 2 {
		t.Fatalf("ping: %v %v", r, err)
	}

	// The plaintext rule of Dial holds here too.
	if _, _, err := aci.DialWire(ctx, "ws://192.0.2.1:1/", "secret"); !errors.Is(err, aci.ErrInvalidArgument) {
		t.Fatalf("token in plaintext to a remote host: %v", err)
	}
	// A context that ends unblocks a read.
	short, stop := context.WithTimeout(ctx, 50*time.Millisecond)
	defer stop()
	if _, err := w.Recv(short); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("recv past the deadline: %v", err)
	}
}
