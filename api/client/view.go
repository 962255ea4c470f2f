package client

import (
	"context"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"

	controldv1 "github.com/forkfleet/forkfleet/api/gen/forkfleet/controld/v1"
)

// ViewTicket mints a single-use ticket for the sandbox's live view in a
// browser and returns its URL (open it once: it is spent for a cookie) and
// when it stops working. control lets the viewer send mouse and keyboard
// input; ttl 0 takes controld's default (60 s, at most 10 min).
func (sb *Sandbox) ViewTicket(ctx context.Context, control bool, ttl time.Duration) (url string, expires time.Time, err error) {
	req := &controldv1.CreateViewTicketRequest{SandboxId: sb.id, Control: control}
	if ttl != 0 {
		req.Ttl = durationpb.New(ttl)
	}
	r, err := sb.c.sandboxes.CreateViewTicket(ctx, req)
	if err != nil {
		return "", time.Time{}, convert(ctx, err)
	}
	return r.GetUrl(), r.GetExpiresAt().AsTime(), nil
}
