package fleet_test

import (
	"context"
	"errors"
	"net/url"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/forkfleet/forkfleet/api/errdefs"
	controldv1 "github.com/forkfleet/forkfleet/api/gen/forkfleet/controld/v1"
	"github.com/forkfleet/forkfleet/controld/internal/fleet"
)

func TestViewTickets(t *testing.T) {
	e := newEnv(t, nil)
	ctx := context.Background()
	sb := e.ready(nil)
	mint := func(req *controldv1.CreateViewTicketRequest) *controldv1.CreateViewTicketResponse {
		t.Helper()
		r, err := e.m.CreateViewTicket(ctx, req)
		if err != nil {
			t.Fatal(err)
		}
		return r
	}

	_, err := e.m.CreateViewTicket(ctx, &controldv1.CreateViewTicketRequest{SandboxId: sb.Id, Ttl: durationpb.New(time.Hour)})
	wantCode(t, err, codes.InvalidArgument, "ttl")
	_, err = e.m.CreateViewTicket(ctx, &controldv1.CreateViewTicketRequest{SandboxId: "sb-zzzzzzzzzzzzzzzz"})
	wantCode(t, err, codes.NotFound, "")

	r := mint(&controldv1.CreateViewTicketRequest{SandboxId: sb.Id, Control: true})
	u, err := url.Parse(r.Url)
	if err != nil || u.Path != "/v1/sandboxes/"+sb.Id+"/view" || u.Query().Get("ticket") != r.Ticket {
		t.Fatalf("url %q: %v", r.Url, err)
	}
	if d := time.Until(r.ExpiresAt.AsTime()); d < 50*time.Second || d > time.Minute {
		t.Fatalf("default lifetime %v, want a minute", d)
	}
	// Another sandbox's ticket is refused and not spent.
	if _, err := e.m.RedeemViewTicket("sb-zzzzzzzzzzzzzzzz", r.Ticket); !errors.Is(err, errdefs.ErrPermissionDenied) {
		t.Fatalf("redeem on another sandbox: %v", err)
	}
	g, err := e.m.RedeemViewTicket(sb.Id, r.Ticket)
	if err != nil || !g.Control || g.Sandbox != sb.Id {
		t.Fatalf("redeem: %+v %v", g, err)
	}
	if _, err := e.m.RedeemViewTicket(sb.Id, r.Ticket); !errors.Is(err, errdefs.ErrPermissionDenied) {
		t.Fatalf("a spent ticket: %v", err)
	}
	short := mint(&controldv1.CreateViewTicketRequest{SandboxId: sb.Id, Ttl: durationpb.New(time.Millisecond)})
	time.Sleep(5 * time.Millisecond)
	if _, err := e.m.RedeemViewTicket(sb.Id, short.Ticket); !errors.Is(err, errdefs.ErrPermissionDenied) {
		t.Fatalf("an expired ticket: %v", err)
	}
	// Outstanding tickets are bounded per sandbox.
	for range fleet.MaxViewTickets {
		mint(&controldv1.CreateViewTicketRequest{SandboxId: sb.Id})
	}
	_, err = e.m.CreateViewTicket(ctx, &controldv1.CreateViewTicketRequest{SandboxId: sb.Id})
	wantCode(t, err, codes.ResourceExhausted, "")
}
