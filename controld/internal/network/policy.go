package network

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"
)

// Mode is a sandbox's network mode.
type Mode int

const (
	// ModeNone: loopback only (lo up in a namespace of its own).
	ModeNone Mode = iota
	// ModeEgress: loopback, plus a route to the outside through the
	// sandbox's router namespace, NAT and a DNS stub, under a policy.
	ModeEgress
)

func (m Mode) String() string {
	if m == ModeEgress {
		return "egress"
	}
	return "none"
}

// Proto is the transport a rule matches.
type Proto string

const (
	ProtoAny Proto = ""
	ProtoTCP Proto = "tcp"
	ProtoUDP Proto = "udp"
)

// PortRange is an inclusive range of destination ports.
type PortRange struct{ First, Last uint16 }

// Rule matches traffic to a destination prefix, optionally limited to a
// transport and destination ports (ports need a transport or match both).
type Rule struct {
	CIDR  netip.Prefix
	Proto Proto
	Ports []PortRange
}

// Policy is what a sandbox in egress mode may reach, beyond what is always
// refused (the host itself, other sandboxes, link-local and multicast
// addresses): a destination matching a deny rule is refused; otherwise,
// with no allow rules everything is allowed, and with allow rules only what
// matches one. DNS through the sandbox's stub is always answered.
type Policy struct {
	Allow []Rule
	Deny  []Rule
}

// Closed is the policy of a sandbox that may reach nothing (a pooled
// replica before its claim): everything is denied.
var Closed = Policy{Deny: []Rule{{CIDR: netip.MustParsePrefix("0.0.0.0/0")}}}

// nftRules renders the policy as the rules of a sandbox's chain.
func (p Policy) nftRules() []string {
	var out []string
	for _, r := range p.Deny {
		out = append(out, r.nft("drop"))
	}
	for _, r := range p.Allow {
		out = append(out, r.nft("accept"))
	}
	if len(p.Allow) == 0 {
		out = append(out, "accept")
	} else {
		out = append(out, "drop")
	}
	return out
}

func (r Rule) nft(verdict string) string {
	var b strings.Builder
	if r.CIDR.Bits() > 0 {
		fmt.Fprintf(&b, "ip daddr %s ", r.CIDR.Masked())
	}
	ports := ""
	if len(r.Ports) > 0 {
		var ps []string
		for _, p := range r.Ports {
			if p.First == p.Last {
				ps = append(ps, fmt.Sprint(p.First))
			} else {
				ps = append(ps, fmt.Sprintf("%d-%d", p.First, p.Last))
			}
		}
		ports = "{ " + strings.Join(ps, ", ") + " }"
	}
	switch {
	case r.Proto != ProtoAny && ports != "":
		fmt.Fprintf(&b, "%s dport %s ", r.Proto, ports)
	case r.Proto != ProtoAny:
		fmt.Fprintf(&b, "meta l4proto %s ", r.Proto)
	case ports != "":
		fmt.Fprintf(&b, "meta l4proto { tcp, udp } th dport %s ", ports)
	}
	b.WriteString(verdict)
	return b.String()
}

// Equal reports whether two policies render the same rules.
func (p Policy) Equal(q Policy) bool { return slices.Equal(p.nftRules(), q.nftRules()) }
