package fleet

import (
	"context"
	"fmt"
	"net"
	"strconv"

	"google.golang.org/protobuf/proto"

	"github.com/forkfleet/forkfleet/api/errdefs"
	controldv1 "github.com/forkfleet/forkfleet/api/gen/forkfleet/controld/v1"
	"github.com/forkfleet/forkfleet/api/netpolicy"
	"github.com/forkfleet/forkfleet/api/rules"
	"github.com/forkfleet/forkfleet/controld/internal/network"
	"github.com/forkfleet/forkfleet/controld/internal/runtime"
	"github.com/forkfleet/forkfleet/controld/internal/store"
)

// netSpecOf is the runtime's view of a sandbox's network; a pooled sandbox
// is held (it reaches nothing) until its claim connects it.
func netSpecOf(n *controldv1.Network, pooled bool) runtime.NetworkSpec {
	spec := runtime.NetworkSpec{Hold: pooled && netpolicy.Mode(n) == controldv1.NetworkMode_NETWORK_MODE_EGRESS}
	if netpolicy.Mode(n) == controldv1.NetworkMode_NETWORK_MODE_EGRESS {
		spec.Mode = network.ModeEgress
		spec.Policy = policyOf(n.GetPolicy())
	}
	return spec
}

// policyOf converts a validated API policy.
func policyOf(p *controldv1.NetworkPolicy) network.Policy {
	conv := func(rules []*controldv1.NetworkRule) []network.Rule {
		var out []network.Rule
		for _, r := range rules {
			cidr, err := netpolicy.ParseCIDR(r.GetCidr())
			if err != nil {
				continue // validated at the API: never reached
			}
			nr := network.Rule{CIDR: cidr}
			switch r.GetProtocol() {
			case controldv1.NetworkProtocol_NETWORK_PROTOCOL_TCP:
				nr.Proto = network.ProtoTCP
			case controldv1.NetworkProtocol_NETWORK_PROTOCOL_UDP:
				nr.Proto = network.ProtoUDP
			}
			for _, pr := range r.GetPorts() {
				last := pr.GetLast()
				if last == 0 {
					last = pr.GetFirst()
				}
				nr.Ports = append(nr.Ports, network.PortRange{First: uint16(pr.GetFirst()), Last: uint16(last)})
			}
			out = append(out, nr)
		}
		return out
	}
	return network.Policy{Allow: conv(p.GetAllow()), Deny: conv(p.GetDeny())}
}

// checkEgress refuses mode egress up front when the runtime cannot set it
// up, with the runtime's reason.
func (m *sandboxer) checkEgress(n *controldv1.Network) error {
	if netpolicy.Mode(n) != controldv1.NetworkMode_NETWORK_MODE_EGRESS {
		return nil
	}
	nw, ok := runtime.As[runtime.Networker](m.rt)
	if !ok {
		return errdefs.WithReason(errdefs.ErrFailedPrecondition, "EGRESS_UNAVAILABLE", "this runtime has no sandbox networking")
	}
	return nw.EgressUnavailable()
}

func (m *sandboxer) networker() (runtime.Networker, error) {
	nw, ok := runtime.As[runtime.Networker](m.rt)
	if !ok {
		return nil, errdefs.WithReason(errdefs.ErrFailedPrecondition, "NO_NETWORKING", "this runtime has no sandbox networking")
	}
	return nw, nil
}

// UpdateSandboxNetwork replaces a running sandbox's network policy.
func (m *sandboxer) UpdateSandboxNetwork(ctx context.Context, req *controldv1.UpdateSandboxNetworkRequest) (*controldv1.Sandbox, error) {
	if err := rules.SandboxID("id", req.GetId()); err != nil {
		return nil, err
	}
	if err := netpolicy.ValidatePolicy("policy", req.GetPolicy()); err != nil {
		return nil, err
	}
	sb, err := m.lookup(req.GetId())
	if err != nil {
		return nil, err
	}
	sb.op.Lock()
	defer sb.op.Unlock()
	m.mu.Lock()
	rec := cloneRecord(sb.rec)
	deleting := sb.deleting
	m.mu.Unlock()
	switch {
	case deleting:
		return nil, sandboxNotFound(req.GetId())
	case rec.Pooled:
		return nil, errdefs.WithReason(errdefs.ErrFailedPrecondition, "SANDBOX_POOLED", "sandbox %s is held by its pool; claim it first", req.GetId())
	case netpolicy.Mode(rec.Sandbox.GetNetwork()) != controldv1.NetworkMode_NETWORK_MODE_EGRESS:
		return nil, errdefs.WithReason(errdefs.ErrFailedPrecondition, "NOT_EGRESS", "sandbox %s is in network mode %s; a policy needs NETWORK_MODE_EGRESS", req.GetId(), netpolicy.Mode(rec.Sandbox.GetNetwork()))
	}
	switch rec.Sandbox.GetState() {
	case controldv1.SandboxState_SANDBOX_STATE_READY, controldv1.SandboxState_SANDBOX_STATE_SUSPENDED, controldv1.SandboxState_SANDBOX_STATE_BOOTING:
	default:
		return nil, errdefs.WithReason(errdefs.ErrFailedPrecondition, "SANDBOX_NOT_RUNNING", "sandbox %s is %s", req.GetId(), rec.Sandbox.GetState())
	}
	nw, err := m.networker()
	if err != nil {
		return nil, err
	}
	if err := nw.SetNetworkPolicy(ctx, req.GetId(), policyOf(req.GetPolicy())); err != nil {
		return nil, fmt.Errorf("sandbox %s: %w", req.GetId(), err)
	}
	return m.update(sb, controldv1.SandboxEventType_SANDBOX_EVENT_TYPE_STATE, nil, func(r *store.SandboxRecord) {
		r.Sandbox.Network = &controldv1.Network{Mode: controldv1.NetworkMode_NETWORK_MODE_EGRESS}
		if req.GetPolicy() != nil {
			r.Sandbox.Network.Policy = proto.Clone(req.GetPolicy()).(*controldv1.NetworkPolicy)
		}
	})
}

// portURL is where the gateway serves an exposed port.
func (m *sandboxer) portURL(id string, port uint32) string {
	return fmt.Sprintf("http://%s/v1/sandboxes/%s/ports/%d/", m.opts.GatewayHost, id, port)
}

// ExposePort records an exposed port with a token of its own (the same
// token again for a port exposed already).
func (m *sandboxer) ExposePort(_ context.Context, req *controldv1.ExposePortRequest) (*controldv1.ExposePortResponse, error) {
	if err := rules.SandboxID("sandbox_id", req.GetSandboxId()); err != nil {
		return nil, err
	}
	if err := netpolicy.ValidatePort("port", req.GetPort()); err != nil {
		return nil, err
	}
	if _, err := m.networker(); err != nil {
		return nil, err
	}
	sb, err := m.lookup(req.GetSandboxId())
	if err != nil {
		return nil, err
	}
	sb.op.Lock()
	defer sb.op.Unlock()
	m.mu.Lock()
	pooled, tok, have, n := sb.rec.Pooled, sb.rec.Ports[req.GetPort()], false, len(sb.rec.Ports)
	_, have = sb.rec.Ports[req.GetPort()]
	m.mu.Unlock()
	switch {
	case pooled:
		return nil, errdefs.WithReason(errdefs.ErrFailedPrecondition, "SANDBOX_POOLED", "sandbox %s is held by its pool; claim it first", req.GetSandboxId())
	case have:
		return &controldv1.ExposePortResponse{Url: m.portURL(req.GetSandboxId(), req.GetPort()), Token: tok}, nil
	case n >= netpolicy.MaxExposedPorts:
		return nil, errdefs.WithReason(errdefs.ErrResourceExhausted, "TOO_MANY_PORTS", "sandbox %s exposes %d ports already (at most %d)", req.GetSandboxId(), n, netpolicy.MaxExposedPorts)
	}
	tok = newToken()
	if _, err := m.update(sb, controldv1.SandboxEventType_SANDBOX_EVENT_TYPE_UNSPECIFIED, nil, func(r *store.SandboxRecord) {
		if r.Ports == nil {
			r.Ports = map[uint32]string{}
		}
		r.Ports[req.GetPort()] = tok
	}); err != nil {
		return nil, err
	}
	return &controldv1.ExposePortResponse{Url: m.portURL(req.GetSandboxId(), req.GetPort()), Token: tok}, nil
}

// UnexposePort forgets an exposed port; connections through it go on
// until they close.
func (m *sandboxer) UnexposePort(_ context.Context, req *controldv1.UnexposePortRequest) error {
	if err := rules.SandboxID("sandbox_id", req.GetSandboxId()); err != nil {
		return err
	}
	if err := netpolicy.ValidatePort("port", req.GetPort()); err != nil {
		return err
	}
	sb, err := m.lookup(req.GetSandboxId())
	if err != nil {
		return err
	}
	sb.op.Lock()
	defer sb.op.Unlock()
	m.mu.Lock()
	_, have := sb.rec.Ports[req.GetPort()]
	m.mu.Unlock()
	if !have {
		return errdefs.WithReason(errdefs.ErrNotFound, "PORT_NOT_EXPOSED", "sandbox %s does not expose port %d", req.GetSandboxId(), req.GetPort())
	}
	_, err = m.update(sb, controldv1.SandboxEventType_SANDBOX_EVENT_TYPE_UNSPECIFIED, nil, func(r *store.SandboxRecord) {
		delete(r.Ports, req.GetPort())
	})
	return err
}

// PortRoute is what the gateway needs to forward to an exposed port.
type PortRoute struct {
	// Tokens that open it: the port's own and the sandbox's ACI token.
	PortToken, ACIToken string
	// Dial connects to the port inside the sandbox.
	Dial func(ctx context.Context) (net.Conn, error)
}

// PortRoute returns how to reach an exposed port of a running sandbox.
func (m *sandboxer) PortRoute(id string, port string) (PortRoute, error) {
	n, err := strconv.ParseUint(port, 10, 16)
	if err != nil || n == 0 {
		return PortRoute{}, errdefs.InvalidField("port", "%q is not a TCP port", port)
	}
	nw, err := m.networker()
	if err != nil {
		return PortRoute{}, err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	sb, ok := m.sandboxes[id]
	if !ok || sb.deleting || sb.rec.Pooled {
		return PortRoute{}, sandboxNotFound(id)
	}
	tok, ok := sb.rec.Ports[uint32(n)]
	if !ok {
		return PortRoute{}, errdefs.WithReason(errdefs.ErrNotFound, "PORT_NOT_EXPOSED", "sandbox %s does not expose port %d", id, n)
	}
	if sb.checkpointing {
		return PortRoute{}, errdefs.WithReason(errdefs.ErrUnavailable, "SANDBOX_CHECKPOINTING",
			"sandbox %s is being checkpointed; retry shortly", id)
	}
	switch sb.rec.Sandbox.GetState() {
	case controldv1.SandboxState_SANDBOX_STATE_BOOTING, controldv1.SandboxState_SANDBOX_STATE_READY:
	default:
		return PortRoute{}, errdefs.WithReason(errdefs.ErrFailedPrecondition, "SANDBOX_NOT_RUNNING", "sandbox %s is %s", id, sb.rec.Sandbox.GetState())
	}
	return PortRoute{PortToken: tok, ACIToken: sb.rec.ACIToken, Dial: func(ctx context.Context) (net.Conn, error) {
		return nw.DialPort(ctx, id, uint16(n))
	}}, nil
}
