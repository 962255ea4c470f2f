//go:build linux

package network

import (
	"errors"
	"fmt"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"
)

// The common nftables changes of the sandbox path go over netlink, in
// process: nft's start, parse and cache fill cost 4 to 6 ms per call here,
// twice per egress sandbox made and twice per one released. Policies with
// rules are rendered for nft (nft.go), which only a create or update that
// asks for one pays.

// ifname is an interface name as nftables compares it (16 bytes, padded).
func ifname(n string) []byte {
	b := make([]byte, unix.IFNAMSIZ)
	copy(b, n)
	return b
}

// routerNAT installs the router namespace's masquerade: everything leaving
// by its uplink takes the uplink's address (the sandbox's outside identity).
func routerNAT(rtPath string) error {
	fd, err := unix.Open(rtPath, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	c, err := nftables.New(nftables.WithNetNSFd(fd))
	if err != nil {
		return err
	}
	t := c.AddTable(&nftables.Table{Family: nftables.TableFamilyIPv4, Name: "forkfleet"})
	ch := c.AddChain(&nftables.Chain{Name: "postrouting", Table: t, Type: nftables.ChainTypeNAT,
		Hooknum: nftables.ChainHookPostrouting, Priority: nftables.ChainPriorityNATSource})
	c.AddRule(&nftables.Rule{Table: t, Chain: ch, Exprs: []expr.Any{
		&expr.Meta{Key: expr.MetaKeyOIFNAME, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: ifname(routerUp)},
		&expr.Masq{},
	}})
	if err := c.Flush(); err != nil {
		return fmt.Errorf("router masquerade: %w", err)
	}
	return nil
}

// hostTable is the manager's table in the host's namespace.
func (m *Manager) hostTable() *nftables.Table {
	return &nftables.Table{Family: nftables.TableFamilyINet, Name: m.cfg.Table}
}

// openChain makes sandbox chain index accept everything (the empty
// policy) and enters it in the egress map, in one batch.
func (m *Manager) openChain(index int) error {
	c, err := nftables.New()
	if err != nil {
		return err
	}
	t := m.hostTable()
	egress, err := c.GetSetByName(t, "egress")
	if err != nil {
		return fmt.Errorf("egress map: %w", err)
	}
	ch := c.AddChain(&nftables.Chain{Name: chainName(index), Table: t})
	c.FlushChain(ch)
	c.AddRule(&nftables.Rule{Table: t, Chain: ch, Exprs: []expr.Any{&expr.Verdict{Kind: expr.VerdictAccept}}})
	if err := c.SetAddElements(egress, []nftables.SetElement{{Key: ifname(m.hostIf(index)),
		VerdictData: &expr.Verdict{Kind: expr.VerdictJump, Chain: chainName(index)}}}); err != nil {
		return err
	}
	if err := c.Flush(); err != nil {
		return fmt.Errorf("policy chain %s: %w", chainName(index), err)
	}
	return nil
}

// dropChain removes sandbox chain index and its map entry; either may be
// gone already.
func (m *Manager) dropChain(index int) error {
	c, err := nftables.New()
	if err != nil {
		return err
	}
	t := m.hostTable()
	if egress, err := c.GetSetByName(t, "egress"); err == nil {
		if err := c.SetDeleteElements(egress, []nftables.SetElement{{Key: ifname(m.hostIf(index))}}); err != nil {
			return err
		}
		if err := c.Flush(); err != nil && !errors.Is(err, unix.ENOENT) {
			return fmt.Errorf("egress map entry of %s: %w", chainName(index), err)
		}
	}
	if _, err := c.ListChain(t, chainName(index)); err != nil {
		return nil // gone
	}
	c.DelChain(&nftables.Chain{Name: chainName(index), Table: t})
	if err := c.Flush(); err != nil && !errors.Is(err, unix.ENOENT) {
		return fmt.Errorf("delete chain %s: %w", chainName(index), err)
	}
	return nil
}
