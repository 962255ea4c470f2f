package fleet

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"errors"
	"fmt"
	"net/url"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/forkfleet/forkfleet/api/errdefs"
	controldv1 "github.com/forkfleet/forkfleet/api/gen/forkfleet/controld/v1"
	"github.com/forkfleet/forkfleet/api/rules"
)

// View tickets open a sandbox's live view in a browser (the gateway's
// /v1/sandboxes/{id}/view). A ticket is a bearer credential of its own:
// short-lived (CreateViewTicketRequest.ttl), redeemed at most once, for one
// sandbox and one scope (watch, or control). Only its SHA-256 is kept, in
// memory: a controld restart forgets every ticket, which costs a viewer a
// new one and nothing else.

// MaxViewTickets bounds the tickets outstanding per sandbox; minting more
// is RESOURCE_EXHAUSTED until some are redeemed or expire.
const MaxViewTickets = 64

type viewTicket struct {
	sandbox string
	control bool
	expires time.Time
}

// ViewGrant is what a redeemed ticket grants.
type ViewGrant struct {
	Sandbox string
	Control bool
}

// CreateViewTicket mints a view ticket for a routable sandbox.
func (m *sandboxer) CreateViewTicket(_ context.Context, req *controldv1.CreateViewTicketRequest) (*controldv1.CreateViewTicketResponse, error) {
	if err := rules.SandboxID("sandbox_id", req.GetSandboxId()); err != nil {
		return nil, err
	}
	ttl, err := rules.ViewTicketTTL("ttl", req.GetTtl())
	if err != nil {
		return nil, err
	}
	id := req.GetSandboxId()
	// The same states the gateway routes: a ticket for a sandbox that is
	// being checkpointed is fine (the view waits for it).
	if _, err := m.Route(id); err != nil && !errors.Is(err, errdefs.ErrUnavailable) {
		return nil, err
	}
	ticket := rand.Text()
	now := time.Now()
	m.viewMu.Lock()
	defer m.viewMu.Unlock()
	if m.viewTickets == nil {
		m.viewTickets = map[[sha256.Size]byte]viewTicket{}
	}
	n := 0
	for k, t := range m.viewTickets {
		switch {
		case !now.Before(t.expires):
			delete(m.viewTickets, k)
		case t.sandbox == id:
			n++
		}
	}
	if n >= MaxViewTickets {
		return nil, errdefs.WithReason(errdefs.ErrResourceExhausted, "TOO_MANY_VIEW_TICKETS",
			"sandbox %s has %d view tickets outstanding (at most %d)", id, n, MaxViewTickets)
	}
	t := viewTicket{sandbox: id, control: req.GetControl(), expires: now.Add(ttl)}
	m.viewTickets[sha256.Sum256([]byte(ticket))] = t
	scheme := "http"
	if m.opts.GatewayTLS {
		scheme = "https"
	}
	return &controldv1.CreateViewTicketResponse{
		Url:       fmt.Sprintf("%s://%s/v1/sandboxes/%s/view?ticket=%s", scheme, m.opts.GatewayHost, id, url.QueryEscape(ticket)),
		Ticket:    ticket,
		ExpiresAt: timestamppb.New(t.expires),
	}, nil
}

// RedeemViewTicket spends a ticket of sandbox id: it works once, before it
// expires, for the sandbox it was minted for. Every refusal is the same
// PERMISSION_DENIED, whether the ticket never existed, expired, was spent,
// or names another sandbox.
func (m *sandboxer) RedeemViewTicket(id, ticket string) (ViewGrant, error) {
	key := sha256.Sum256([]byte(ticket))
	m.viewMu.Lock()
	t, ok := m.viewTickets[key]
	if ok && t.sandbox == id {
		delete(m.viewTickets, key)
	}
	m.viewMu.Unlock()
	if !ok || t.sandbox != id || !time.Now().Before(t.expires) {
		return ViewGrant{}, errdefs.WithReason(errdefs.ErrPermissionDenied, "VIEW_TICKET_INVALID", "invalid, expired or spent view ticket")
	}
	return ViewGrant{Sandbox: id, Control: t.control}, nil
}
