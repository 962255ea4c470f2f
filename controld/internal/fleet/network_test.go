package fleet_test

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc/codes"

	controldv1 "github.com/forkfleet/forkfleet/api/gen/forkfleet/controld/v1"
	"github.com/forkfleet/forkfleet/controld/internal/fleet/fleettest"
	"github.com/forkfleet/forkfleet/controld/internal/network"
	"github.com/forkfleet/forkfleet/controld/internal/runtime"
)

var egress = controldv1.NetworkMode_NETWORK_MODE_EGRESS

func denyPolicy(cidr string) *controldv1.NetworkPolicy {
	return &controldv1.NetworkPolicy{Deny: []*controldv1.NetworkRule{{Cidr: cidr}}}
}

// A sandbox's network mode and policy reach the runtime, are kept in its
// record, carry over to its checkpoint's forks (the mode always, the policy
// unless the fork asks for another) and can change while it runs.
func TestSandboxNetwork(t *testing.T) {
	e := newEnv(t, nil)
	ctx := context.Background()
	_, _, err := e.m.CreateSandbox(ctx, &controldv1.CreateSandboxRequest{Network: &controldv1.Network{Policy: denyPolicy("10.0.0.0/8")}})
	wantCode(t, err, codes.InvalidArgument, "network.policy")
	_, _, err = e.m.CreateSandbox(ctx, &controldv1.CreateSandboxRequest{Network: &controldv1.Network{Mode: egress, Policy: denyPolicy("::/0")}})
	wantCode(t, err, codes.InvalidArgument, "network.policy.deny[0].cidr")

	sb, _, err := e.m.CreateSandbox(ctx, &controldv1.CreateSandboxRequest{WaitReady: true,
		Network: &controldv1.Network{Mode: egress, Policy: denyPolicy("10.0.0.0/8")}})
	if err != nil {
		t.Fatal(err)
	}
	ns, _ := e.rt.Net(sb.Id)
	if ns.Spec.Mode != network.ModeEgress || len(ns.Policy.Deny) != 1 || !ns.Connected || sb.GetNetwork().GetMode() != egress {
		t.Fatalf("runtime network %+v, record %v", ns, sb.GetNetwork())
	}
	none := e.ready(nil)
	if none.GetNetwork().GetMode() != controldv1.NetworkMode_NETWORK_MODE_NONE {
		t.Errorf("default network %v", none.GetNetwork())
	}
	_, err = e.m.UpdateSandboxNetwork(ctx, &controldv1.UpdateSandboxNetworkRequest{Id: none.Id, Policy: denyPolicy("0.0.0.0/0")})
	wantCode(t, err, codes.FailedPrecondition, "")
	up, err := e.m.UpdateSandboxNetwork(ctx, &controldv1.UpdateSandboxNetworkRequest{Id: sb.Id, Policy: denyPolicy("192.0.2.0/24")})
	if err != nil || up.GetNetwork().GetPolicy().GetDeny()[0].GetCidr() != "192.0.2.0/24" {
		t.Fatalf("update: %v %v", up, err)
	}
	if ns, _ := e.rt.Net(sb.Id); ns.Policy.Deny[0].CIDR.String() != "192.0.2.0/24" {
		t.Errorf("runtime policy after the update: %+v", ns.Policy)
	}

	ck, err := e.m.CreateCheckpoint(ctx, &controldv1.CreateCheckpointRequest{SandboxId: sb.Id})
	if err != nil {
		t.Fatal(err)
	}
	if ck.GetNetwork().GetMode() != egress {
		t.Errorf("checkpoint network %v", ck.GetNetwork())
	}
	reps, err := replicasOf(e.m.ForkCheckpoint(ctx, &controldv1.ForkCheckpointRequest{CheckpointId: ck.Id, Count: 2}))
	if err != nil || reps[0].ErrorCode != 0 || reps[1].ErrorCode != 0 {
		t.Fatalf("fork: %v %v", reps, err)
	}
	ns, _ = e.rt.Net(reps[0].Sandbox.Id)
	if ns.Spec.Mode != network.ModeEgress || ns.Policy.Deny[0].CIDR.String() != "192.0.2.0/24" {
		t.Errorf("replica network %+v: want the source's mode and policy", ns)
	}
	reps, err = replicasOf(e.m.ForkCheckpoint(ctx, &controldv1.ForkCheckpointRequest{CheckpointId: ck.Id, Count: 1, NetworkPolicy: denyPolicy("198.51.100.0/24")}))
	if err != nil || reps[0].ErrorCode != 0 {
		t.Fatalf("fork with a policy: %v %v", reps, err)
	}
	if ns, _ := e.rt.Net(reps[0].Sandbox.Id); ns.Policy.Deny[0].CIDR.String() != "198.51.100.0/24" {
		t.Errorf("replica policy %+v", ns.Policy)
	}

	// No egress on the host: refused up front with the runtime's reason.
	e.rt.NoEgress = true
	_, _, err = e.m.CreateSandbox(ctx, &controldv1.CreateSandboxRequest{Network: &controldv1.Network{Mode: egress}})
	wantCode(t, err, codes.FailedPrecondition, "")
}

// The network verifier: a replica whose loopback does not carry the
// restored listener fails it (and is removed); the others pass.
func TestForkNetworkVerifier(t *testing.T) {
	e := newEnv(t, nil)
	ctx := context.Background()
	src := e.ready(nil)
	ck, err := e.m.CreateCheckpoint(ctx, &controldv1.CreateCheckpointRequest{SandboxId: src.Id})
	if err != nil {
		t.Fatal(err)
	}
	var n atomic.Int32 // replicas restore concurrently
	e.rt.OnRestore = func(_ runtime.BootSpec, g *fleettest.Guestd) {
		if n.Add(1) == 2 {
			g.LoopbackDown = true
		}
	}
	reps, err := replicasOf(e.m.ForkCheckpoint(ctx, &controldv1.ForkCheckpointRequest{CheckpointId: ck.Id, Count: 3}))
	if err != nil {
		t.Fatal(err)
	}
	failed := 0
	for _, r := range reps {
		if r.ErrorCode == 0 {
			continue
		}
		failed++
		if !strings.Contains(r.ErrorMessage, "VERIFY_LEVEL_NETWORK") || !strings.Contains(r.ErrorMessage, "unreachable") {
			t.Errorf("replica failed with %q, want the network proof", r.ErrorMessage)
		}
	}
	if failed != 1 {
		t.Fatalf("%d replicas failed, want 1", failed)
	}
}

// Pooled egress replicas reach nothing until claimed; a claim connects one
// under the claim's policy (or the pool's).
func TestPoolClaimConnectsNetwork(t *testing.T) {
	e := newEnv(t, nil)
	ctx := context.Background()
	src, _, err := e.m.CreateSandbox(ctx, &controldv1.CreateSandboxRequest{WaitReady: true, Network: &controldv1.Network{Mode: egress}})
	if err != nil {
		t.Fatal(err)
	}
	ck, err := e.m.CreateCheckpoint(ctx, &controldv1.CreateCheckpointRequest{SandboxId: src.Id})
	if err != nil {
		t.Fatal(err)
	}
	_, err = e.m.CreatePool(ctx, &controldv1.CreatePoolRequest{Source: &controldv1.CreatePoolRequest_CheckpointId{CheckpointId: ck.Id}, Size: 1,
		Network: &controldv1.Network{Mode: controldv1.NetworkMode_NETWORK_MODE_NONE}})
	wantCode(t, err, codes.InvalidArgument, "network.mode")
	p, err := e.m.CreatePool(ctx, &controldv1.CreatePoolRequest{Source: &controldv1.CreatePoolRequest_CheckpointId{CheckpointId: ck.Id}, Size: 1,
		Network: &controldv1.Network{Policy: denyPolicy("10.0.0.0/8")}})
	if err != nil {
		t.Fatal(err)
	}
	var member string
	deadline := time.Now().Add(10 * time.Second)
	for member == "" && time.Now().Before(deadline) {
		ss, _, _ := e.m.ListSandboxes(ctx, &controldv1.ListSandboxesRequest{States: []controldv1.SandboxState{controldv1.SandboxState_SANDBOX_STATE_SUSPENDED}})
		for _, s := range ss {
			if s.PoolId == p.Id {
				member = s.Id
			}
		}
		time.Sleep(5 * time.Millisecond)
	}
	if ns, ok := e.rt.Net(member); !ok || ns.Connected || !ns.Spec.Hold {
		t.Fatalf("pooled replica %s network %+v: want held", member, ns)
	}
	s, _, hit, _, err := e.m.ClaimPool(ctx, &controldv1.ClaimPoolRequest{PoolId: p.Id, NetworkPolicy: denyPolicy("203.0.113.0/24")})
	if err != nil || !hit || s.Id != member {
		t.Fatalf("claim: %v hit %v err %v", s.GetId(), hit, err)
	}
	ns, _ := e.rt.Net(member)
	if !ns.Connected || ns.Policy.Deny[0].CIDR.String() != "203.0.113.0/24" || s.GetNetwork().GetPolicy().GetDeny()[0].GetCidr() != "203.0.113.0/24" {
		t.Errorf("claimed replica network %+v, record %v", ns, s.GetNetwork())
	}
}

// An exposed port answers through the manager's route with its own token
// or the sandbox's; exposing twice returns the same token; unexposed ports
// and pooled sandboxes are refused.
func TestExposePort(t *testing.T) {
	e := newEnv(t, nil)
	ctx := context.Background()
	sb := e.ready(nil)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go http.Serve(ln, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { fmt.Fprint(w, "hello ", r.URL.Path) }))
	e.rt.ServePort(sb.Id, 8080, ln.Addr().String())

	_, err = e.m.ExposePort(ctx, &controldv1.ExposePortRequest{SandboxId: sb.Id, Port: 0})
	wantCode(t, err, codes.InvalidArgument, "port")
	ep, err := e.m.ExposePort(ctx, &controldv1.ExposePortRequest{SandboxId: sb.Id, Port: 8080})
	if err != nil || ep.Token == "" || !strings.HasSuffix(ep.Url, "/v1/sandboxes/"+sb.Id+"/ports/8080/") {
		t.Fatalf("expose: %v %v", ep, err)
	}
	again, _ := e.m.ExposePort(ctx, &controldv1.ExposePortRequest{SandboxId: sb.Id, Port: 8080})
	if again.GetToken() != ep.Token {
		t.Error("exposing an exposed port made a new token")
	}
	route, err := e.m.PortRoute(sb.Id, "8080")
	if err != nil || route.PortToken != ep.Token || route.ACIToken == "" {
		t.Fatalf("route %+v %v", route, err)
	}
	c, err := route.Dial(ctx)
	if err != nil {
		t.Fatal(err)
	}
	fmt.Fprint(c, "GET /x HTTP/1.0\r\n\r\n")
	b, _ := io.ReadAll(c)
	c.Close()
	if !strings.HasSuffix(string(b), "hello /x") {
		t.Errorf("through the route: %q", b)
	}
	if _, err := e.m.PortRoute(sb.Id, "9090"); err == nil {
		t.Error("an unexposed port routed")
	}
	if err := e.m.UnexposePort(ctx, &controldv1.UnexposePortRequest{SandboxId: sb.Id, Port: 8080}); err != nil {
		t.Fatal(err)
	}
	if _, err := e.m.PortRoute(sb.Id, "8080"); err == nil {
		t.Error("an unexposed port still routes")
	}
}
