//go:build linux

package containerdrt

import (
	"bufio"
	"context"
	crand "crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/forkfleet/forkfleet/api/errdefs"
	"github.com/forkfleet/forkfleet/api/netnsfile"
	"github.com/forkfleet/forkfleet/controld/internal/network"
	"github.com/forkfleet/forkfleet/controld/internal/network/nettest"
	"github.com/forkfleet/forkfleet/controld/internal/runtime"
	"github.com/forkfleet/forkfleet/controld/internal/testenv"
)

// The bug of issue 13: a fork's network namespace must have lo up, and a
// listening socket restored in it must accept connections from inside it;
// a TCP connection within the sandbox survives the fork. Delete leaves no
// namespace behind.
func TestIntegrationForkLoopback(t *testing.T) {
	integration(t)
	r := newTestRuntime(t, testNamespace)
	importTestImage(t, r)
	ctx := context.Background()

	src := bootT(t, r, testSpec(uniqueID("netsrc")))
	if got := mustCall(t, src, "lo"); got != "0x9" {
		t.Errorf("source lo flags %s, want 0x9 (up)", got)
	}
	val := "v-" + randomHex(4)
	mustCall(t, src, "set "+val)
	if got := mustCall(t, src, "listen 127.0.0.1:7000"); !strings.HasPrefix(got, "ok") {
		t.Fatal(got)
	}
	if got := mustCall(t, src, "hold 127.0.0.1:7000"); got != "value "+val {
		t.Fatalf("hold: %s", got)
	}
	res := checkpointT(t, r, src.ID, runtime.TierMemory, false)
	if got := mustCall(t, src, "held ping"); got != "echo ping "+val {
		t.Errorf("source's in-sandbox connection after the checkpoint: %s", got)
	}

	forks := make([]runtime.Instance, 3)
	var wg sync.WaitGroup
	var mu sync.Mutex
	for i := range forks {
		wg.Add(1)
		go func() {
			defer wg.Done()
			spec := testSpec(uniqueID(fmt.Sprintf("netfork%d", i)))
			t.Cleanup(func() { deleteQuiet(r, spec.ID) })
			f, err := r.Restore(ctx, spec, res.Ref)
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				t.Errorf("fork %d: %v", i, err)
				return
			}
			forks[i] = f
		}()
	}
	wg.Wait()
	if t.Failed() {
		t.FailNow()
	}
	for i, f := range forks {
		waitSocket(t, f, 10*time.Second)
		mustCall(t, f, fmt.Sprintf("set fork%d", i))
		if got := mustCall(t, f, "lo"); got != "0x9" {
			t.Errorf("%s: lo flags %s, want 0x9 (up)", f.ID, got)
		}
		if got := mustCall(t, f, "dial 127.0.0.1:7000"); got != fmt.Sprintf("value fork%d", i) {
			t.Errorf("%s: restored listener: %s", f.ID, got)
		}
		got := mustCall(t, f, "held ping")
		t.Logf("%s: in-sandbox connection after the fork: %s", f.ID, got)
		if got != fmt.Sprintf("echo ping fork%d", i) {
			t.Errorf("%s: in-sandbox connection after the fork: %s", f.ID, got)
		}
	}
	for _, f := range forks {
		if err := r.Delete(ctx, f.ID); err != nil {
			t.Fatal(err)
		}
		if _, err := os.Stat(r.net.NetNS(f.ID)); !os.IsNotExist(err) {
			t.Errorf("%s: network namespace left after delete (%v)", f.ID, err)
		}
		assertGone(t, r, f.ID)
	}
}

// newEgressRuntime is a test runtime with egress networking of its own
// (table, interface prefix, uplink range), its DNS forwarded to out.
func newEgressRuntime(t *testing.T, out *nettest.Outside) *Runtime {
	t.Helper()
	var b [2]byte
	crand.Read(b[:])
	tag := hex.EncodeToString(b[:])
	cfg := network.Config{
		RunDir: t.TempDir(), Table: "forkfleet_it_" + tag, IfPrefix: "i" + tag,
		UplinkCIDR:  netip.PrefixFrom(netip.AddrFrom4([4]byte{10, 204, b[0], b[1] & 0xc0}), 26),
		DNSUpstream: []netip.AddrPort{out.DNS},
	}
	nm, err := network.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := nm.EgressError(); err != nil {
		t.Fatalf("egress unavailable (deploy/host-setup.sh sets the host up): %v", err)
	}
	state := t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	r, err := New(ctx, Config{
		Address: testenv.Address(), Namespace: testenv.Namespace(testNamespace), StateDir: state,
		CheckpointRoot: filepath.Join(state, "checkpoints"), CgroupParent: testenv.CgroupParent(testCgroupParent), Network: nm,
		NetHook: testenv.NetHook(t), UserNamespaces: testenv.UserNamespaces(t),
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		r.Close()
		nm.Close()
		nm.Prune(context.Background(), func(string) bool { return false })
		nm.RemoveTable()
	})
	return r
}

// An egress sandbox reaches the outside host; its forks keep their
// in-sandbox address and listener, get their own outside address, and find
// the source's connection to the outside closed.
func TestIntegrationForkEgress(t *testing.T) {
	integration(t)
	out := nettest.NewOutside(t, netip.MustParseAddr("198.18.255.254"))
	r := newEgressRuntime(t, out)
	importTestImage(t, r)
	ctx := context.Background()

	spec := testSpec(uniqueID("egsrc"))
	spec.Network.Mode = network.ModeEgress
	src := bootT(t, r, spec)
	outside := out.Addr.String() + ":80"
	if got := mustCall(t, src, "fetch "+outside+" /"); !strings.HasPrefix(got, "HTTP/1.0 200") {
		t.Fatalf("source egress: %s", got)
	}
	if got := mustCall(t, src, "read /etc/resolv.conf"); !strings.Contains(got, "nameserver "+network.GatewayAddr.Addr().String()) {
		t.Errorf("source resolv.conf: %q", got)
	}
	mustCall(t, src, "listen 0.0.0.0:7000")
	if got := mustCall(t, src, "hold "+network.SandboxAddr.Addr().String()+":7000"); !strings.HasPrefix(got, "value ") {
		t.Fatalf("hold: %s", got)
	}
	res := checkpointT(t, r, src.ID, runtime.TierMemory, false)
	if got := mustCall(t, src, "fetch "+outside+" /"); !strings.HasPrefix(got, "HTTP/1.0 200") {
		t.Errorf("source egress after the checkpoint: %s", got)
	}

	fspec := testSpec(uniqueID("egfork"))
	fspec.Network.Mode = network.ModeEgress
	t.Cleanup(func() { deleteQuiet(r, fspec.ID) })
	f, err := r.Restore(ctx, fspec, res.Ref)
	if err != nil {
		t.Fatal(err)
	}
	waitSocket(t, f, 10*time.Second)
	if got := mustCall(t, f, "held ping"); !strings.HasPrefix(got, "echo ping") {
		t.Errorf("fork: in-sandbox connection on the sandbox address: %s", got)
	}
	if got := mustCall(t, f, "fetch "+outside+" /"); !strings.HasPrefix(got, "HTTP/1.0 200") {
		t.Errorf("fork egress: %s", got)
	}
	a, _ := r.net.Outside(src.ID)
	b, _ := r.net.Outside(f.ID)
	if a == b || !b.IsValid() {
		t.Errorf("source and fork outside addresses %s, %s", a, b)
	}
	// A fork of a none-mode checkpoint in mode egress is refused.
	bad := testSpec(uniqueID("egbad"))
	if _, err := r.Restore(ctx, bad, res.Ref); !errors.Is(err, errdefs.ErrFailedPrecondition) {
		t.Errorf("restore in another network mode: %v", err)
	}
}

// A connection from the sandbox to the outside, open at the checkpoint, is
// aborted in the fork (its peer knows only the source) and stays in the
// source.
func TestIntegrationForkClosesOutsideConnections(t *testing.T) {
	integration(t)
	out := nettest.NewOutside(t, netip.MustParseAddr("198.18.255.254"))
	// A line server on the outside host: one line per connection, then echo.
	var ln net.Listener
	if err := netnsfile.Run(out.NSPath(), func() (err error) { ln, err = net.Listen("tcp4", out.Addr.String()+":81"); return err }); err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				fmt.Fprintln(c, "value outside")
				s := bufio.NewScanner(c)
				for s.Scan() {
					fmt.Fprintf(c, "echo %s outside\n", s.Text())
				}
			}()
		}
	}()
	r := newEgressRuntime(t, out)
	importTestImage(t, r)
	spec := testSpec(uniqueID("egconn"))
	spec.Network.Mode = network.ModeEgress
	src := bootT(t, r, spec)
	if got := mustCall(t, src, "hold "+out.Addr.String()+":81"); got != "value outside" {
		t.Fatalf("hold outside: %s", got)
	}
	res := checkpointT(t, r, src.ID, runtime.TierMemory, false)
	fspec := testSpec(uniqueID("egconnf"))
	fspec.Network.Mode = network.ModeEgress
	t.Cleanup(func() { deleteQuiet(r, fspec.ID) })
	f, err := r.Restore(context.Background(), fspec, res.Ref)
	if err != nil {
		t.Fatal(err)
	}
	waitSocket(t, f, 10*time.Second)
	if got := mustCall(t, f, "held ping"); !strings.Contains(got, "connection abort") {
		t.Errorf("fork's connection to the outside: %q, want aborted", got)
	}
	if got := mustCall(t, src, "held ping"); got != "echo ping outside" {
		t.Errorf("source's connection to the outside after the fork: %q", got)
	}
}
