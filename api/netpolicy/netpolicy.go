// Package netpolicy holds the rules of a sandbox's network fields
// (controldv1.Network, NetworkPolicy, exposed ports) that controld and its
// in-memory fake share: which requests are valid, and how a checkpoint's or
// a pool's network carries over to the sandboxes made from it.
package netpolicy

import (
	"fmt"
	"net/netip"

	"google.golang.org/protobuf/proto"

	"github.com/forkfleet/forkfleet/api/errdefs"
	controldv1 "github.com/forkfleet/forkfleet/api/gen/forkfleet/controld/v1"
)

// Bounds of a policy: each rule is a few nftables rules on the host.
const (
	MaxRules        = 64 // allow and deny, each
	MaxPortRanges   = 16 // per rule
	MaxExposedPorts = 16 // per sandbox
)

// Mode returns n's mode with UNSPECIFIED read as NONE.
func Mode(n *controldv1.Network) controldv1.NetworkMode {
	if m := n.GetMode(); m != controldv1.NetworkMode_NETWORK_MODE_UNSPECIFIED {
		return m
	}
	return controldv1.NetworkMode_NETWORK_MODE_NONE
}

// Normalize returns the network a sandbox created with n gets: the mode
// spelled out, and in mode none no policy.
func Normalize(n *controldv1.Network) *controldv1.Network {
	out := &controldv1.Network{Mode: Mode(n)}
	if out.Mode == controldv1.NetworkMode_NETWORK_MODE_EGRESS && n.GetPolicy() != nil {
		out.Policy = proto.Clone(n.GetPolicy()).(*controldv1.NetworkPolicy)
	}
	return out
}

// ValidateNetwork checks the network of a create or pool request.
func ValidateNetwork(field string, n *controldv1.Network) error {
	if n == nil {
		return nil
	}
	switch n.GetMode() {
	case controldv1.NetworkMode_NETWORK_MODE_UNSPECIFIED, controldv1.NetworkMode_NETWORK_MODE_NONE:
		if n.GetPolicy() != nil {
			return errdefs.InvalidField(field+".policy", "a policy needs mode NETWORK_MODE_EGRESS")
		}
		return nil
	case controldv1.NetworkMode_NETWORK_MODE_EGRESS:
		return ValidatePolicy(field+".policy", n.GetPolicy())
	}
	return errdefs.InvalidField(field+".mode", "unknown network mode %d", n.GetMode())
}

// ValidatePolicy checks a policy.
func ValidatePolicy(field string, p *controldv1.NetworkPolicy) error {
	if p == nil {
		return nil
	}
	for name, rules := range map[string][]*controldv1.NetworkRule{"allow": p.GetAllow(), "deny": p.GetDeny()} {
		if len(rules) > MaxRules {
			return errdefs.InvalidField(field+"."+name, "%d rules, at most %d", len(rules), MaxRules)
		}
		for i, r := range rules {
			if err := validateRule(fmt.Sprintf("%s.%s[%d]", field, name, i), r); err != nil {
				return err
			}
		}
	}
	return nil
}

func validateRule(field string, r *controldv1.NetworkRule) error {
	if _, err := ParseCIDR(r.GetCidr()); err != nil {
		return errdefs.InvalidField(field+".cidr", "%v", err)
	}
	switch r.GetProtocol() {
	case controldv1.NetworkProtocol_NETWORK_PROTOCOL_UNSPECIFIED, controldv1.NetworkProtocol_NETWORK_PROTOCOL_TCP,
		controldv1.NetworkProtocol_NETWORK_PROTOCOL_UDP:
	default:
		return errdefs.InvalidField(field+".protocol", "unknown protocol %d", r.GetProtocol())
	}
	if len(r.GetPorts()) > MaxPortRanges {
		return errdefs.InvalidField(field+".ports", "%d ranges, at most %d", len(r.GetPorts()), MaxPortRanges)
	}
	for i, pr := range r.GetPorts() {
		first, last := pr.GetFirst(), pr.GetLast()
		if last == 0 {
			last = first
		}
		if first < 1 || first > 65535 || last < first || last > 65535 {
			return errdefs.InvalidField(fmt.Sprintf("%s.ports[%d]", field, i), "%d..%d is not a range within 1..65535", first, pr.GetLast())
		}
	}
	return nil
}

// ParseCIDR parses a rule's destination: an IPv4 prefix or address.
func ParseCIDR(s string) (netip.Prefix, error) {
	if p, err := netip.ParsePrefix(s); err == nil {
		if !p.Addr().Is4() {
			return netip.Prefix{}, fmt.Errorf("%q: only IPv4 destinations (sandboxes have no IPv6 route)", s)
		}
		return p.Masked(), nil
	}
	a, err := netip.ParseAddr(s)
	if err != nil {
		return netip.Prefix{}, fmt.Errorf("%q is neither an IPv4 prefix nor an address", s)
	}
	if !a.Is4() {
		return netip.Prefix{}, fmt.Errorf("%q: only IPv4 destinations (sandboxes have no IPv6 route)", s)
	}
	return netip.PrefixFrom(a, 32), nil
}

// ValidatePort checks a port to expose.
func ValidatePort(field string, port uint32) error {
	if port < 1 || port > 65535 {
		return errdefs.InvalidField(field, "%d is not a TCP port (1..65535)", port)
	}
	return nil
}

// PolicyFor returns the policy a sandbox made from a checkpoint or a pool
// gets: the request's when given, else inherited. A policy for a sandbox in
// mode none is refused.
func PolicyFor(field string, mode controldv1.NetworkMode, requested, inherited *controldv1.NetworkPolicy) (*controldv1.NetworkPolicy, error) {
	if requested == nil {
		if mode != controldv1.NetworkMode_NETWORK_MODE_EGRESS {
			return nil, nil
		}
		return inherited, nil
	}
	if mode != controldv1.NetworkMode_NETWORK_MODE_EGRESS {
		return nil, errdefs.InvalidField(field, "a policy needs mode NETWORK_MODE_EGRESS (this one's is %s)", mode)
	}
	if err := ValidatePolicy(field, requested); err != nil {
		return nil, err
	}
	return requested, nil
}

// PoolNetwork returns the network of a pool's members. An image pool's is
// the request's. A checkpoint pool's mode is the checkpoint's (ck; the
// request may spell it out, not change it) and its policy the request's or
// else the checkpoint source's.
func PoolNetwork(field string, req *controldv1.Network, fromCheckpoint bool, ck *controldv1.Network) (*controldv1.Network, error) {
	if !fromCheckpoint {
		if err := ValidateNetwork(field, req); err != nil {
			return nil, err
		}
		return Normalize(req), nil
	}
	mode := Mode(ck)
	if req.GetMode() != controldv1.NetworkMode_NETWORK_MODE_UNSPECIFIED && req.GetMode() != mode {
		return nil, errdefs.InvalidField(field+".mode", "the checkpoint's source ran in %s; its replicas run in the same mode", mode)
	}
	policy, err := PolicyFor(field+".policy", mode, req.GetPolicy(), ck.GetPolicy())
	if err != nil {
		return nil, err
	}
	out := &controldv1.Network{Mode: mode}
	if policy != nil {
		out.Policy = proto.Clone(policy).(*controldv1.NetworkPolicy)
	}
	return out, nil
}
