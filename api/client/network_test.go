package client_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/forkfleet/forkfleet/api/client"
	"github.com/forkfleet/forkfleet/api/errdefs"
	controldv1 "github.com/forkfleet/forkfleet/api/gen/forkfleet/controld/v1"
)

func TestNetworkAndPorts(t *testing.T) {
	c, _, ctx := setup(t)
	deny := &controldv1.NetworkPolicy{Deny: []*controldv1.NetworkRule{{Cidr: "10.0.0.0/8"}}}
	if _, err := c.CreateSandbox(ctx, client.WithNetwork(&controldv1.Network{Policy: deny})); !errors.Is(err, errdefs.ErrInvalidArgument) || errdefs.Field(err) != "network.policy" {
		t.Fatalf("a policy in mode none: %v", err)
	}
	sb, err := c.CreateSandbox(ctx, client.WithEgress(deny), client.WithWaitReady())
	if err != nil {
		t.Fatal(err)
	}
	if sb.Info().GetNetwork().GetMode() != controldv1.NetworkMode_NETWORK_MODE_EGRESS {
		t.Errorf("network %v", sb.Info().GetNetwork())
	}
	open := &controldv1.NetworkPolicy{}
	if err := sb.UpdateNetwork(ctx, open); err != nil || len(sb.Info().GetNetwork().GetPolicy().GetDeny()) != 0 {
		t.Errorf("update: %v %v", sb.Info().GetNetwork(), err)
	}
	url, tok, err := sb.ExposePort(ctx, 8080)
	if err != nil || tok == "" || !strings.HasSuffix(url, "/ports/8080/") {
		t.Errorf("expose: %q %q %v", url, tok, err)
	}
	if _, _, err := sb.ExposePort(ctx, 70000); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Errorf("expose 70000: %v", err)
	}
	if err := sb.UnexposePort(ctx, 8080); err != nil {
		t.Error(err)
	}
	if err := sb.UnexposePort(ctx, 8080); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("unexpose twice: %v", err)
	}
	ck, err := sb.Checkpoint(ctx)
	if err != nil {
		t.Fatal(err)
	}
	replicas, err := ck.Fork(ctx, 2, client.WithNetworkPolicy(deny))
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range replicas {
		if got := r.Sandbox.Info().GetNetwork(); got.GetMode() != controldv1.NetworkMode_NETWORK_MODE_EGRESS || len(got.GetPolicy().GetDeny()) != 1 {
			t.Errorf("replica network %v", got)
		}
	}
}
