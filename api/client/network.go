package client

import (
	"context"

	"google.golang.org/protobuf/proto"

	controldv1 "github.com/forkfleet/forkfleet/api/gen/forkfleet/controld/v1"
)

// NetworkOption (a sandbox's network mode and policy) works with
// CreateSandbox and CreatePool.
type NetworkOption interface {
	CreateOption
	PoolOption
}

type networkOpt struct{ n *controldv1.Network }

// WithNetwork sets the network mode and policy of a sandbox (or of a pool's
// members; a checkpoint pool's mode is its checkpoint's). Mode none
// (loopback only) when unset.
func WithNetwork(n *controldv1.Network) NetworkOption { return networkOpt{proto.CloneOf(n)} }

// WithEgress is WithNetwork in mode egress under policy (nil: everything
// but what is always refused: the host, other sandboxes, link-local).
func WithEgress(policy *controldv1.NetworkPolicy) NetworkOption {
	return networkOpt{&controldv1.Network{Mode: controldv1.NetworkMode_NETWORK_MODE_EGRESS, Policy: proto.CloneOf(policy)}}
}

func (o networkOpt) applyCreate(r *controldv1.CreateSandboxRequest) { r.Network = proto.CloneOf(o.n) }
func (o networkOpt) applyPool(r *controldv1.CreatePoolRequest)      { r.Network = proto.CloneOf(o.n) }

// PolicyOption (an egress sandbox's policy) works with Fork and ClaimPool.
type PolicyOption interface {
	ForkOption
	ClaimOption
}

type policyOpt struct{ p *controldv1.NetworkPolicy }

// WithNetworkPolicy sets each replica's (or the claimed sandbox's) network
// policy instead of the source's (the pool's).
func WithNetworkPolicy(p *controldv1.NetworkPolicy) PolicyOption { return policyOpt{proto.CloneOf(p)} }

func (o policyOpt) applyFork(r *controldv1.ForkCheckpointRequest) {
	r.NetworkPolicy = proto.CloneOf(o.p)
}
func (o policyOpt) applyClaim(r *controldv1.ClaimPoolRequest) { r.NetworkPolicy = proto.CloneOf(o.p) }

// UpdateNetwork replaces the sandbox's network policy (mode egress).
func (sb *Sandbox) UpdateNetwork(ctx context.Context, policy *controldv1.NetworkPolicy) error {
	r, err := sb.c.sandboxes.UpdateSandboxNetwork(ctx, &controldv1.UpdateSandboxNetworkRequest{Id: sb.id, Policy: policy})
	if err != nil {
		return convert(ctx, err)
	}
	sb.set(r.GetSandbox())
	return nil
}

// ExposePort makes TCP port inside the sandbox reachable through controld's
// gateway and returns its URL and token (send it as "Authorization: Bearer
// <token>" or in an X-Forkfleet-Token header).
func (sb *Sandbox) ExposePort(ctx context.Context, port int) (url, token string, err error) {
	r, err := sb.c.sandboxes.ExposePort(ctx, &controldv1.ExposePortRequest{SandboxId: sb.id, Port: uint32(max(port, 0))})
	if err != nil {
		return "", "", convert(ctx, err)
	}
	return r.GetUrl(), r.GetToken(), nil
}

// UnexposePort closes an exposed port.
func (sb *Sandbox) UnexposePort(ctx context.Context, port int) error {
	_, err := sb.c.sandboxes.UnexposePort(ctx, &controldv1.UnexposePortRequest{SandboxId: sb.id, Port: uint32(max(port, 0))})
	return convert(ctx, err)
}
