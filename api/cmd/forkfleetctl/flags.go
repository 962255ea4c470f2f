package main

import (
	"fmt"
	"net/netip"
	"slices"
	"strconv"
	"strings"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/forkfleet/forkfleet/api/client"
	controldv1 "github.com/forkfleet/forkfleet/api/gen/forkfleet/controld/v1"
	"github.com/forkfleet/forkfleet/api/limits"
)

// Flag values shared by several commands. Each parses into the request
// field it names; a malformed value is a usage error.

// keyValues is a repeatable KEY=VALUE flag (labels, env).
type keyValues struct {
	name string
	list []string
}

func addKeyValues(fs *pflag.FlagSet, name, usage string) *keyValues {
	kv := &keyValues{name: name}
	fs.StringArrayVar(&kv.list, name, nil, usage+" (KEY=VALUE, repeatable)")
	return kv
}

func (kv *keyValues) Map() (map[string]string, error) {
	if len(kv.list) == 0 {
		return nil, nil
	}
	m := make(map[string]string, len(kv.list))
	for _, s := range kv.list {
		k, v, ok := strings.Cut(s, "=")
		if !ok || k == "" {
			return nil, usagef("--%s %q: want KEY=VALUE", kv.name, s)
		}
		m[k] = v
	}
	return m, nil
}

// resourceFlags are a sandbox's limits (controldv1.Resources); unset flags
// leave the field 0 (the host's default, or the checkpoint's).
type resourceFlags struct {
	memory, disk, log string
	cpuMillis, pids   int64
	cpuWeight         uint32
}

func addResourceFlags(fs *pflag.FlagSet) *resourceFlags {
	r := &resourceFlags{}
	fs.StringVar(&r.memory, "memory", "", "memory limit, e.g. 2GiB (no swap)")
	fs.StringVar(&r.disk, "disk", "", "disk quota of the writable layer, e.g. 8GiB")
	fs.StringVar(&r.log, "log", "", "stdout and stderr kept on the host, e.g. 16MiB")
	fs.Int64Var(&r.cpuMillis, "cpu-millis", 0, "hard CPU quota in thousandths of a core")
	fs.Uint32Var(&r.cpuWeight, "cpu-weight", 0, "CPU weight when cores are contended (1..10000)")
	fs.Int64Var(&r.pids, "pids", 0, "most processes and threads")
	return r
}

func (r *resourceFlags) Resources() (*controldv1.Resources, error) {
	out := &controldv1.Resources{CpuMillis: r.cpuMillis, CpuWeight: r.cpuWeight, PidsMax: r.pids}
	for _, f := range []struct {
		name, v string
		dst     *int64
	}{{"memory", r.memory, &out.MemoryBytes}, {"disk", r.disk, &out.DiskBytes}, {"log", r.log, &out.LogBytes}} {
		if f.v == "" {
			continue
		}
		n, err := limits.ParseBytes(f.v)
		if err != nil {
			return nil, usagef("--%s: %v", f.name, err)
		}
		*f.dst = n
	}
	if proto0(out) {
		return nil, nil
	}
	return out, nil
}

func proto0(r *controldv1.Resources) bool {
	return r.CpuMillis == 0 && r.MemoryBytes == 0 && r.CpuWeight == 0 && r.PidsMax == 0 && r.DiskBytes == 0 && r.LogBytes == 0
}

// policyFlags are an egress network policy: --allow and --deny rules
// written CIDR[:tcp|udp[:PORTS]], PORTS like 80,443,8000-8100.
type policyFlags struct {
	allow, deny []string
}

func addPolicyFlags(fs *pflag.FlagSet) *policyFlags {
	p := &policyFlags{}
	fs.StringArrayVar(&p.allow, "allow", nil, "egress rule to allow: CIDR[:tcp|udp[:PORTS]] (repeatable; with any, only what matches one)")
	fs.StringArrayVar(&p.deny, "deny", nil, "egress rule to deny: CIDR[:tcp|udp[:PORTS]] (repeatable)")
	return p
}

// Policy returns nil when no rule was given.
func (p *policyFlags) Policy() (*controldv1.NetworkPolicy, error) {
	if len(p.allow) == 0 && len(p.deny) == 0 {
		return nil, nil
	}
	out := &controldv1.NetworkPolicy{}
	for _, s := range p.allow {
		r, err := parseRule(s)
		if err != nil {
			return nil, usagef("--allow %q: %v", s, err)
		}
		out.Allow = append(out.Allow, r)
	}
	for _, s := range p.deny {
		r, err := parseRule(s)
		if err != nil {
			return nil, usagef("--deny %q: %v", s, err)
		}
		out.Deny = append(out.Deny, r)
	}
	return out, nil
}

func parseRule(s string) (*controldv1.NetworkRule, error) {
	parts := strings.Split(s, ":")
	if len(parts) > 3 {
		return nil, fmt.Errorf("want CIDR[:tcp|udp[:PORTS]]")
	}
	cidr := parts[0]
	if !strings.Contains(cidr, "/") {
		if _, err := netip.ParseAddr(cidr); err != nil {
			return nil, fmt.Errorf("%q is not an IPv4 address or prefix", cidr)
		}
	} else if _, err := netip.ParsePrefix(cidr); err != nil {
		return nil, fmt.Errorf("%q is not an IPv4 prefix", cidr)
	}
	r := &controldv1.NetworkRule{Cidr: cidr}
	if len(parts) >= 2 {
		switch parts[1] {
		case "tcp":
			r.Protocol = controldv1.NetworkProtocol_NETWORK_PROTOCOL_TCP
		case "udp":
			r.Protocol = controldv1.NetworkProtocol_NETWORK_PROTOCOL_UDP
		default:
			return nil, fmt.Errorf("protocol %q: want tcp or udp", parts[1])
		}
	}
	if len(parts) == 3 {
		for _, pr := range strings.Split(parts[2], ",") {
			first, last, isRange := strings.Cut(pr, "-")
			f, err := strconv.ParseUint(first, 10, 16)
			if err != nil {
				return nil, fmt.Errorf("port %q", first)
			}
			rng := &controldv1.PortRange{First: uint32(f)}
			if isRange {
				l, err := strconv.ParseUint(last, 10, 16)
				if err != nil {
					return nil, fmt.Errorf("port %q", last)
				}
				rng.Last = uint32(l)
			}
			r.Ports = append(r.Ports, rng)
		}
	}
	return r, nil
}

func ruleText(r *controldv1.NetworkRule) string {
	s := r.GetCidr()
	switch r.GetProtocol() {
	case controldv1.NetworkProtocol_NETWORK_PROTOCOL_TCP:
		s += ":tcp"
	case controldv1.NetworkProtocol_NETWORK_PROTOCOL_UDP:
		s += ":udp"
	default:
		if len(r.GetPorts()) > 0 {
			s += ":any"
		}
	}
	var ports []string
	for _, p := range r.GetPorts() {
		if p.GetLast() != 0 {
			ports = append(ports, fmt.Sprintf("%d-%d", p.GetFirst(), p.GetLast()))
		} else {
			ports = append(ports, fmt.Sprint(p.GetFirst()))
		}
	}
	if len(ports) > 0 {
		s += ":" + strings.Join(ports, ",")
	}
	return s
}

// parseScreen reads WxH or WxHxD.
func parseScreen(s string) (*controldv1.Screen, error) {
	var w, h, d uint32
	parts := strings.Split(s, "x")
	if len(parts) < 2 || len(parts) > 3 {
		return nil, usagef("--screen %q: want WxH or WxHxDEPTH", s)
	}
	for i, dst := range []*uint32{&w, &h, &d}[:len(parts)] {
		n, err := strconv.ParseUint(parts[i], 10, 32)
		if err != nil {
			return nil, usagef("--screen %q: want WxH or WxHxDEPTH", s)
		}
		*dst = uint32(n)
	}
	return &controldv1.Screen{Width: w, Height: h, Depth: d}, nil
}

// enumNames maps lower-case short names ("ready", "memory") onto an enum's
// values, dropping its prefix and UNSPECIFIED.
func enumNames[E ~int32](names map[int32]string, prefix string) map[string]E {
	out := map[string]E{}
	for v, n := range names {
		if v == 0 {
			continue
		}
		out[strings.ToLower(strings.TrimPrefix(n, prefix))] = E(v)
	}
	return out
}

var (
	stateByName = enumNames[controldv1.SandboxState](controldv1.SandboxState_name, "SANDBOX_STATE_")
	levelByName = enumNames[controldv1.VerifyLevel](controldv1.VerifyLevel_name, "VERIFY_LEVEL_")
	tierByName  = enumNames[controldv1.CheckpointTier](controldv1.CheckpointTier_name, "CHECKPOINT_TIER_")
	// restoreModeByName are fork --restore's values (auto, eager, lazy).
	restoreModeByName = enumNames[controldv1.RestoreMode](controldv1.RestoreMode_name, "RESTORE_MODE_")
)

// parseEnums reads a repeatable enum flag.
func parseEnums[E ~int32](flag string, vals []string, byName map[string]E) ([]E, error) {
	var out []E
	for _, v := range vals {
		e, ok := byName[strings.ToLower(v)]
		if !ok {
			return nil, usagef("--%s %q: want one of %s", flag, v, strings.Join(sortedNames(byName), ", "))
		}
		out = append(out, e)
	}
	return out, nil
}

func sortedNames[E ~int32](byName map[string]E) []string {
	out := make([]string, 0, len(byName))
	for n := range byName {
		out = append(out, n)
	}
	slices.Sort(out)
	return out
}

// pageFlags are a List call's paging: without --page-size every page is
// fetched; with it, one page, whose next token the output carries.
type pageFlags struct {
	size  int
	token string
}

func addPageFlags(fs *pflag.FlagSet) *pageFlags {
	p := &pageFlags{}
	fs.IntVar(&p.size, "page-size", 0, "one page of at most this many (1..1000; its next token is printed); default: every page")
	fs.StringVar(&p.token, "page-token", "", "the page after the one that printed this token (with the same filters)")
	return p
}

func (p *pageFlags) option() client.PageOption { return client.WithPageSize(p.size) }

// pages runs a List call: one page (from --page-token) with --page-size,
// else every page.
func pages[T any](p *pageFlags, page func(token string) ([]T, string, error)) ([]T, string, error) {
	if p.size < 0 || p.size > 1000 {
		return nil, "", usagef("--page-size %d: want 1..1000", p.size)
	}
	if p.size > 0 || p.token != "" {
		return page(p.token)
	}
	var out []T
	token := ""
	for {
		items, next, err := page(token)
		if err != nil {
			return nil, "", err
		}
		out = append(out, items...)
		if next == "" {
			return out, "", nil
		}
		token = next
	}
}

// complete completes a command's first argument with one "id\tdescription"
// row per item that list returns. It offers nothing when controld cannot be
// reached: completion never fails loudly.
func complete[T any](g *globals, args []string, list func(*client.Client) ([]T, error), row func(T) string) ([]string, cobra.ShellCompDirective) {
	if len(args) > 0 {
		return nil, cobra.ShellCompDirectiveNoFileComp
	}
	c, err := g.client()
	if err != nil {
		return nil, cobra.ShellCompDirectiveNoFileComp
	}
	items, err := list(c)
	if err != nil {
		return nil, cobra.ShellCompDirectiveNoFileComp
	}
	out := make([]string, 0, len(items))
	for _, it := range items {
		out = append(out, row(it))
	}
	return out, cobra.ShellCompDirectiveNoFileComp
}
