package netpolicy

import (
	"errors"
	"testing"

	"github.com/forkfleet/forkfleet/api/errdefs"
	controldv1 "github.com/forkfleet/forkfleet/api/gen/forkfleet/controld/v1"
)

func TestValidateNetwork(t *testing.T) {
	egress := controldv1.NetworkMode_NETWORK_MODE_EGRESS
	rule := func(cidr string, ports ...*controldv1.PortRange) *controldv1.NetworkRule {
		return &controldv1.NetworkRule{Cidr: cidr, Ports: ports}
	}
	ok := []*controldv1.Network{
		nil, {}, {Mode: controldv1.NetworkMode_NETWORK_MODE_NONE}, {Mode: egress},
		{Mode: egress, Policy: &controldv1.NetworkPolicy{
			Allow: []*controldv1.NetworkRule{rule("0.0.0.0/0", &controldv1.PortRange{First: 443}), rule("192.0.2.7")},
			Deny:  []*controldv1.NetworkRule{rule("10.0.0.0/8", &controldv1.PortRange{First: 1, Last: 65535})},
		}},
	}
	for i, n := range ok {
		if err := ValidateNetwork("network", n); err != nil {
			t.Errorf("%d: %v", i, err)
		}
	}
	bad := map[string]*controldv1.Network{
		"policy in mode none": {Policy: &controldv1.NetworkPolicy{}},
		"unknown mode":        {Mode: 7},
		"ipv6":                {Mode: egress, Policy: &controldv1.NetworkPolicy{Deny: []*controldv1.NetworkRule{rule("::/0")}}},
		"garbage cidr":        {Mode: egress, Policy: &controldv1.NetworkPolicy{Deny: []*controldv1.NetworkRule{rule("example.com")}}},
		"port 0":              {Mode: egress, Policy: &controldv1.NetworkPolicy{Allow: []*controldv1.NetworkRule{rule("0.0.0.0/0", &controldv1.PortRange{})}}},
		"reversed range":      {Mode: egress, Policy: &controldv1.NetworkPolicy{Allow: []*controldv1.NetworkRule{rule("0.0.0.0/0", &controldv1.PortRange{First: 90, Last: 80})}}},
		"port too big":        {Mode: egress, Policy: &controldv1.NetworkPolicy{Allow: []*controldv1.NetworkRule{rule("0.0.0.0/0", &controldv1.PortRange{First: 70000})}}},
		"bad protocol":        {Mode: egress, Policy: &controldv1.NetworkPolicy{Allow: []*controldv1.NetworkRule{{Cidr: "0.0.0.0/0", Protocol: 9}}}},
	}
	for name, n := range bad {
		if err := ValidateNetwork("network", n); !errors.Is(err, errdefs.ErrInvalidArgument) {
			t.Errorf("%s: %v, want InvalidArgument", name, err)
		}
	}
	if err := ValidatePort("port", 0); err == nil {
		t.Error("port 0 accepted")
	}
	if p, err := PolicyFor("p", controldv1.NetworkMode_NETWORK_MODE_NONE, &controldv1.NetworkPolicy{}, nil); err == nil || p != nil {
		t.Error("a policy for mode none accepted")
	}
	inh := &controldv1.NetworkPolicy{Deny: []*controldv1.NetworkRule{rule("10.0.0.0/8")}}
	if p, err := PolicyFor("p", egress, nil, inh); err != nil || p != inh {
		t.Errorf("inherited policy: %v %v", p, err)
	}
}
