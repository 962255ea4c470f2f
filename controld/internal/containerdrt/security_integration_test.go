//go:build linux

package containerdrt

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/forkfleet/forkfleet/api/errdefs"
	"github.com/forkfleet/forkfleet/api/guestsock"
	"github.com/forkfleet/forkfleet/controld/internal/fleet"
	"github.com/forkfleet/forkfleet/controld/internal/gateway"
	"github.com/forkfleet/forkfleet/controld/internal/guestconn"
)

// Root tests of issue #12's paths from a sandbox to the host. They run in
// their own namespace (testenv) on the testinit image, whose init does what
// root in a hostile sandbox may do on command.

const securityNamespace = "forkfleet-test-security"

func securityRuntime(t *testing.T) *Runtime {
	t.Helper()
	integration(t)
	r := newTestRuntime(t, securityNamespace)
	importTestImage(t, r)
	return r
}

// hostListener serves a unix socket on the host and counts what connects.
type hostListener struct {
	path  string
	conns atomic.Int32
}

func listenHost(t *testing.T, path string) *hostListener {
	t.Helper()
	ln, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	h := &hostListener{path: path}
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			h.conns.Add(1)
			c.Close()
		}
	}()
	return h
}

type oneRoute map[string]fleet.Route

func (r oneRoute) Route(id string) (fleet.Route, error) {
	if rt, ok := r[id]; ok {
		return rt, nil
	}
	return fleet.Route{}, fmt.Errorf("sandbox %s: %w", id, errdefs.ErrNotFound)
}

// gatewayUpgrade sends an authenticated ACI upgrade through a real gateway
// routing id to inst's socket and returns the HTTP status.
func gatewayUpgrade(t *testing.T, inst fleet.Instance, token string) int {
	t.Helper()
	g := gateway.New(oneRoute{inst.ID: {Token: token, ACISocket: inst.ACISocket}}, gateway.Options{})
	srv := gateway.NewServer(g)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go srv.Serve(ln)
	defer func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		srv.Shutdown(ctx)
	}()
	c, err := net.DialTimeout("tcp", ln.Addr().String(), 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(10 * time.Second))
	fmt.Fprintf(c, "GET /v1/sandboxes/%s/aci HTTP/1.1\r\nHost: x\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n"+
		"Sec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nAuthorization: Bearer %s\r\n\r\n", inst.ID, token)
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatalf("gateway response: %v", err)
	}
	resp.Body.Close()
	return resp.StatusCode
}

// TestIntegrationPlantedSocketSymlink: root in the sandbox replaces guestd's
// socket, or the directory holding it, with an absolute symlink to a host
// socket. A plain dial of /proc/<pid>/root/... lands on the host socket (the
// attack); controld's dialer, its admin sessions and the ACI gateway refuse
// the path and reach nothing on the host.
func TestIntegrationPlantedSocketSymlink(t *testing.T) {
	r := securityRuntime(t)
	ctx := context.Background()
	hostDir := t.TempDir()
	host := listenHost(t, filepath.Join(hostDir, "aci.sock"))

	for _, tc := range []struct{ name, target, link string }{
		{"socket", host.path, ACISocketInSandbox},
		{"directory", hostDir, filepath.Dir(ACISocketInSandbox)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			spec := testSpec(uniqueID("plant"))
			inst := bootT(t, r, spec)
			if got := mustCall(t, inst, "symlink "+tc.target+" "+tc.link); got != "ok" {
				t.Fatalf("plant: %s", got)
			}
			before := host.conns.Load()

			// The attack as it was: a plain path follows the link on the host.
			c, err := net.Dial("unix", inst.ACISocket.String())
			if err != nil {
				t.Fatalf("a plain dial did not follow the planted link (the test reproduces nothing): %v", err)
			}
			c.Close()
			waitFor(t, "the host socket sees the plain dial", func() bool { return host.conns.Load() == before+1 })
			before++

			if _, err := dialSandbox(inst.ACISocket, 5*time.Second); !errors.Is(err, guestsock.ErrUnsafePath) {
				t.Errorf("guestsock.Dial through a planted link: %v, want ErrUnsafePath", err)
			}
			dctx, cancel := context.WithTimeout(ctx, 5*time.Second)
			_, err = guestconn.Dialer{}.DialGuest(dctx, inst.ACISocket, spec.AdminToken)
			cancel()
			if !errors.Is(err, errdefs.ErrFailedPrecondition) {
				t.Errorf("admin session through a planted link: %v, want FailedPrecondition (not retried)", err)
			}
			if code := gatewayUpgrade(t, inst, spec.ACIToken); code != http.StatusBadGateway {
				t.Errorf("gateway upgrade through a planted link: HTTP %d, want 502", code)
			}
			time.Sleep(50 * time.Millisecond)
			if n := host.conns.Load() - before; n != 0 {
				t.Errorf("the host socket received %d connection(s) from controld's dialers", n)
			}
		})
	}
}

// TestIntegrationSocketPidGone: an address outlives its sandbox only as an
// error; the dialer never follows a pid to whatever holds it next.
func TestIntegrationSocketPidGone(t *testing.T) {
	r := securityRuntime(t)
	inst := bootT(t, r, testSpec(uniqueID("gone")))
	if inst.ACISocket.Start == 0 {
		t.Fatalf("instance socket without the init's start time: %+v", inst.ACISocket)
	}
	deleteQuiet(r, inst.ID)
	if _, err := dialSandbox(inst.ACISocket, 5*time.Second); !errors.Is(err, guestsock.ErrProcessGone) {
		t.Fatalf("dial after delete: %v, want ErrProcessGone", err)
	}
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out: %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// TestIntegrationLayerCopyRace: root in a running sandbox swaps a
// directory of its writable layer for a symlink to a host directory
// (renameat2 RENAME_EXCHANGE, in a loop) while checkpoints copy the layer.
// 1,000 layer copies (first pass racing, second pass frozen, as Checkpoint
// runs them) and real checkpoints of both tiers carry no host byte, and
// the host directory is untouched.
func TestIntegrationLayerCopyRace(t *testing.T) {
	r := securityRuntime(t)
	ctx := r.ctx(context.Background())
	hostDir, secret := hostSecret(t)
	inst := bootT(t, r, testSpec(uniqueID("swap")))
	for i := range 8 {
		if got := mustCall(t, inst, fmt.Sprintf("write /data/d/f%d sandbox", i)); got != "ok" {
			t.Fatal(got)
		}
	}
	if got := mustCall(t, inst, "symlink "+hostDir+" /data/l"); got != "ok" {
		t.Fatal(got)
	}
	if got := mustCall(t, inst, "swap /data/d /data/l"); got != "ok" {
		t.Fatal(got)
	}
	info, err := r.client.ContainerService().Get(ctx, inst.ID)
	if err != nil {
		t.Fatal(err)
	}
	ms, err := r.sn.Mounts(ctx, info.SnapshotKey)
	if err != nil {
		t.Fatal(err)
	}
	upper, err := upperDir(ms)
	if err != nil {
		t.Fatal(err)
	}

	const copies = 1000
	work := t.TempDir()
	for i := range copies {
		dst, err := os.MkdirTemp(work, "copy-")
		if err != nil {
			t.Fatal(err)
		}
		lc := newLayerCopier(upper, dst)
		if err := lc.First(ctx); err != nil {
			t.Fatalf("copy %d: first pass: %v", i, err)
		}
		if err := r.setFreezer(ctx, inst.ID, freezerFrozen); err != nil {
			t.Fatal(err)
		}
		err = lc.Sync(ctx)
		if terr := r.setFreezer(ctx, inst.ID, freezerThawed); terr != nil {
			t.Fatal(terr)
		}
		if err != nil {
			t.Fatalf("copy %d: second pass: %v", i, err)
		}
		assertNoHostBytes(t, dst, hostDir, secret)
		if t.Failed() {
			t.Fatalf("copy %d of %d carried or touched host bytes", i, copies)
		}
		os.RemoveAll(dst)
	}
	swaps := mustCall(t, inst, "swaps")
	t.Logf("%d raced layer copies; the sandbox made %s exchanges meanwhile", copies, swaps)
	if swaps == "0" {
		t.Fatal("the sandbox never swapped: the test raced nothing")
	}

	// Whole checkpoints, their committed layers read back.
	for i, tier := range []fleet.CheckpointTier{fleet.TierDisk, fleet.TierMemory, fleet.TierDisk, fleet.TierMemory, fleet.TierDisk} {
		res := checkpointT(t, r, inst.ID, tier, false)
		key := "forkfleet-test-view-" + randomHex(4)
		vms, err := r.sn.View(ctx, key, res.Ref.Snapshot)
		if err != nil {
			t.Fatal(err)
		}
		dir, err := topLowerDir(vms)
		if err != nil {
			t.Fatal(err)
		}
		assertNoHostBytes(t, dir, hostDir, secret)
		r.sn.Remove(ctx, key)
		if err := r.DeleteCheckpoint(ctx, res.Ref); err != nil {
			t.Fatal(err)
		}
		if t.Failed() {
			t.Fatalf("checkpoint %d (%v) carried or touched host bytes", i, tier)
		}
	}
}
