//go:build linux

package network

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
)

// The host's table (family inet, named Config.Table) holds all of
// forkfleet's rules on the host:
//
//   - input: nothing from a sandbox reaches the host itself (controld's,
//     containerd's or any other port on any host address), except replies;
//   - forward: traffic from a sandbox goes through sandbox_out, traffic to a
//     sandbox only as a reply;
//   - sandbox_out: replies pass; IPv6, link-local (metadata), loopback,
//     multicast and broadcast, and every sandbox uplink (other sandboxes) are
//     dropped; then each sandbox's own chain (sb_<n>, through the egress
//     verdict map keyed by its host-side interface) applies its policy;
//   - postrouting: sandbox traffic leaving the host is masqueraded.
//
// Base chains are rebuilt at every start (flushed, rules added again);
// sandbox chains stay until their sandbox's network is released or pruned.

func (m *Manager) ensureTable() error {
	t, p, up := m.cfg.Table, m.cfg.IfPrefix+"*", m.cfg.UplinkCIDR.String()
	var b strings.Builder
	w := func(format string, args ...any) { fmt.Fprintf(&b, format+"\n", args...) }
	w("add table inet %s", t)
	w("add map inet %s egress { type ifname : verdict; }", t)
	w("add chain inet %s input { type filter hook input priority filter; policy accept; }", t)
	w("add chain inet %s forward { type filter hook forward priority filter; policy accept; }", t)
	w("add chain inet %s postrouting { type nat hook postrouting priority srcnat; policy accept; }", t)
	w("add chain inet %s sandbox_out", t)
	for _, c := range []string{"input", "forward", "postrouting", "sandbox_out"} {
		w("flush chain inet %s %s", t, c)
	}
	w(`add rule inet %s input iifname "%s" ct state established,related accept`, t, p)
	w(`add rule inet %s input iifname "%s" drop`, t, p)
	w(`add rule inet %s forward iifname "%s" jump sandbox_out`, t, p)
	w(`add rule inet %s forward oifname "%s" ct state established,related accept`, t, p)
	w(`add rule inet %s forward oifname "%s" drop`, t, p)
	w(`add rule inet %s postrouting ip saddr %s oifname != "%s" masquerade`, t, up, p)
	w(`add rule inet %s sandbox_out ct state established,related accept`, t)
	w(`add rule inet %s sandbox_out meta nfproto ipv6 drop`, t)
	w(`add rule inet %s sandbox_out ip daddr { 0.0.0.0/8, 127.0.0.0/8, 169.254.0.0/16, 224.0.0.0/3, %s } drop`, t, up)
	w(`add rule inet %s sandbox_out iifname vmap @egress`, t)
	w(`add rule inet %s sandbox_out drop`, t)
	return nft(b.String())
}

func chainName(index int) string { return "sb_" + strconv.Itoa(index) }

// setChain (re)writes sandbox chain index with policy p in one batch; with
// create it also makes the chain and its verdict map entry. The empty
// policy goes over netlink (openChain), the rest through nft.
func (m *Manager) setChain(index int, p Policy, create bool) error {
	if len(p.Allow) == 0 && len(p.Deny) == 0 {
		return m.openChain(index)
	}
	t, c := m.cfg.Table, chainName(index)
	var b strings.Builder
	w := func(format string, args ...any) { fmt.Fprintf(&b, format+"\n", args...) }
	if create {
		w("add chain inet %s %s", t, c)
	}
	w("flush chain inet %s %s", t, c)
	for _, r := range p.nftRules() {
		w("add rule inet %s %s %s", t, c, r)
	}
	if create {
		w(`add element inet %s egress { "%s" : jump %s }`, t, m.hostIf(index), c)
	}
	if err := nft(b.String()); err != nil {
		return fmt.Errorf("policy chain %s: %w", c, err)
	}
	return nil
}

// sandboxChains lists the sandbox chains in the table.
func (m *Manager) sandboxChains() ([]int, error) {
	out, err := exec.Command("nft", "-j", "list", "chains", "inet").Output()
	if err != nil {
		return nil, fmt.Errorf("nft list chains: %w", err)
	}
	var doc struct {
		Nftables []struct {
			Chain *struct {
				Table string `json:"table"`
				Name  string `json:"name"`
			} `json:"chain"`
		} `json:"nftables"`
	}
	if err := json.Unmarshal(out, &doc); err != nil {
		return nil, fmt.Errorf("nft list chains: %w", err)
	}
	var idx []int
	for _, e := range doc.Nftables {
		if e.Chain == nil || e.Chain.Table != m.cfg.Table {
			continue
		}
		if s, ok := strings.CutPrefix(e.Chain.Name, "sb_"); ok {
			if n, err := strconv.Atoi(s); err == nil {
				idx = append(idx, n)
			}
		}
	}
	return idx, nil
}

// RemoveTable deletes the host's table and its host lock file (tests;
// deploy/README.md documents the manual undo).
func (m *Manager) RemoveTable() error {
	os.Remove(filepath.Join(hostLockDir, "forkfleet-net-"+m.cfg.Table+".lock"))
	return nft("delete table inet " + m.cfg.Table)
}
