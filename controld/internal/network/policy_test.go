package network

import (
	"net/netip"
	"slices"
	"testing"
)

func TestPolicyRules(t *testing.T) {
	p := Policy{
		Deny: []Rule{{CIDR: netip.MustParsePrefix("10.0.0.0/8")}},
		Allow: []Rule{
			{CIDR: netip.MustParsePrefix("0.0.0.0/0"), Proto: ProtoTCP, Ports: []PortRange{{443, 443}, {8000, 8099}}},
			{CIDR: netip.MustParsePrefix("192.0.2.7/24"), Ports: []PortRange{{53, 53}}},
			{CIDR: netip.MustParsePrefix("198.51.100.0/24"), Proto: ProtoUDP},
		},
	}
	want := []string{
		"ip daddr 10.0.0.0/8 drop",
		"tcp dport { 443, 8000-8099 } accept",
		"ip daddr 192.0.2.0/24 meta l4proto { tcp, udp } th dport { 53 } accept",
		"ip daddr 198.51.100.0/24 meta l4proto udp accept",
		"drop",
	}
	if got := p.nftRules(); !slices.Equal(got, want) {
		t.Errorf("rules\n got %q\nwant %q", got, want)
	}
	if got := (Policy{}).nftRules(); !slices.Equal(got, []string{"accept"}) {
		t.Errorf("empty policy: %q", got)
	}
	if got := Closed.nftRules(); !slices.Equal(got, []string{"drop", "accept"}) {
		t.Errorf("closed policy: %q", got)
	}
	if !p.Equal(p) || p.Equal(Policy{}) {
		t.Error("Equal")
	}
}
