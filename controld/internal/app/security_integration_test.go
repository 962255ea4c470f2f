package app_test

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/forkfleet/forkfleet/api/aci"
	"github.com/forkfleet/forkfleet/api/errdefs"
	aciv1 "github.com/forkfleet/forkfleet/api/gen/forkfleet/aci/v1"
	controldv1 "github.com/forkfleet/forkfleet/api/gen/forkfleet/controld/v1"
	"github.com/forkfleet/forkfleet/controld/internal/store"
)

// secretProbe runs, in a sandbox, everything a process there could try to
// learn guestd's tokens with: guestd's environment, memory and descriptors
// (listing their numbers tells nothing; opening one must fail),
// the memory of the init above it (tini, which is dumpable: every string
// in it that could be a token), and every process's environment and
// command line. It returns what it read (errors included).
const secretProbe = `
g=
for p in /proc/[0-9]*; do [ "$(cat $p/comm 2>/dev/null)" = guestd ] && g=${p#/proc/}; done
echo "guestd=$g init=$(cat /proc/1/comm)"
for f in environ mem maps; do
  (exec 3</proc/$g/$f) 2>/dev/null && echo "readable guestd $f" || echo "denied guestd $f"
done
for n in 0 1 2; do
  (exec 3</proc/$g/fd/$n) 2>/dev/null && echo "readable guestd fd $n" || echo "denied guestd fd $n"
done
while read -r range perms rest; do
  case $perms in r*) ;; *) continue ;; esac
  s=$((0x${range%-*})); e=$((0x${range#*-}))
  dd if=/proc/1/mem bs=4096 skip=$((s / 4096)) count=$(((e - s) / 4096)) 2>/dev/null
done </proc/1/maps | grep -aoE '[A-Za-z0-9_=+/-]{16,}' | sort -u
for p in /proc/[0-9]*; do
  cat "$p/environ" "$p/cmdline" 2>/dev/null | tr '\0' '\n'
done
env
`

// probeSecrets runs secretProbe in the sandbox behind sess and checks that
// guestd's memory and environment are closed to it, and that guestd runs
// under tini (a replica can be checkpointed again: TestRealStackCheckpointOfReplica).
func probeSecrets(t *testing.T, ctx context.Context, sess *aci.Session, what string) string {
	t.Helper()
	out := shell(t, ctx, sess, secretProbe)
	if !strings.Contains(out, " init=tini-static\n") || strings.Contains(out, "guestd= ") {
		t.Errorf("%s: want guestd under tini: %.200q", what, out)
	}
	if !strings.Contains(out, "TINI_KILL_PROCESS_GROUP") { // a string of tini's text
		t.Errorf("%s: the probe did not read tini's memory", what)
	}
	for _, f := range []string{"environ", "mem", "maps", "fd 0", "fd 1", "fd 2"} {
		if !strings.Contains(out, "denied guestd "+f) {
			t.Errorf("%s: a process of the sandbox can read guestd's %s", what, f)
		}
	}
	return out
}

// TestRealStackTokens: no process in a sandbox (root included) can read
// guestd's tokens, before or after a restore; every memory-tier replica and
// every pooled replica gets its own tokens of both roles, and the
// checkpoint's tokens (and a sibling's) no longer open it.
func TestRealStackTokens(t *testing.T) {
	s := newStackIn(t, "forkfleet-security-it")
	s.launch(0)
	ctx := s.ctx

	var sandboxes []string
	var poolID, ckID string
	defer func() {
		bg := context.Background()
		if poolID != "" {
			s.plc.DeletePool(bg, &controldv1.DeletePoolRequest{Id: poolID})
		}
		for _, id := range sandboxes {
			s.sbc.DeleteSandbox(bg, &controldv1.DeleteSandboxRequest{Id: id})
		}
		if ckID != "" {
			s.ckc.DeleteCheckpoint(bg, &controldv1.DeleteCheckpointRequest{Id: ckID, Cascade: true})
		}
	}()

	// The agent runs as root in this sandbox (and its forks): the probe is
	// root in the sandbox, the strongest attacker short of a kernel bug.
	src, err := s.sbc.CreateSandbox(ctx, &controldv1.CreateSandboxRequest{WaitReady: true, RunAsRoot: true})
	if err != nil {
		t.Fatalf("create: %v", err)
	}
	sandboxes = append(sandboxes, src.Sandbox.Id)
	sess, err := aci.Dial(ctx, src.Endpoint.Url, src.Endpoint.Token)
	if err != nil {
		t.Fatal(err)
	}
	if who := shell(t, ctx, sess, "id -u"); who != "0" {
		t.Fatalf("the probe runs as uid %s, want root", who)
	}
	seen := probeSecrets(t, ctx, sess, "source")
	sess.Close()

	ck, err := s.ckc.CreateCheckpoint(ctx, &controldv1.CreateCheckpointRequest{SandboxId: src.Sandbox.Id})
	if err != nil {
		t.Fatalf("checkpoint: %v", err)
	}
	ckID = ck.Checkpoint.Id
	fr, err := s.ckc.ForkCheckpoint(ctx, &controldv1.ForkCheckpointRequest{CheckpointId: ckID, Count: 2})
	if err != nil {
		t.Fatalf("fork: %v", err)
	}
	var replicas []*controldv1.ForkReplica
	for _, r := range fr.Replicas {
		if r.ErrorCode != 0 {
			t.Fatalf("replica failed (%d): %s", r.ErrorCode, r.ErrorMessage)
		}
		sandboxes = append(sandboxes, r.Sandbox.Id)
		replicas = append(replicas, r)
		rs, err := aci.Dial(ctx, r.Endpoint.Url, r.Endpoint.Token)
		if err != nil {
			t.Fatalf("replica ACI with its own token: %v", err)
		}
		seen += probeSecrets(t, ctx, rs, "replica "+r.Sandbox.Id)
		rs.Close()
		// Through the gateway, the source's token does not open a replica.
		if _, err := aci.Dial(ctx, r.Endpoint.Url, src.Endpoint.Token); !errors.Is(err, errdefs.ErrPermissionDenied) {
			t.Errorf("replica %s through the gateway with the source's token: %v, want refused", r.Sandbox.Id, err)
		}
	}

	pl, err := s.plc.CreatePool(ctx, &controldv1.CreatePoolRequest{Source: &controldv1.CreatePoolRequest_CheckpointId{CheckpointId: ckID}, Size: 2})
	if err != nil {
		t.Fatalf("pool: %v", err)
	}
	poolID = pl.Pool.Id
	waitPool(t, s, poolID, 2)
	cl, err := s.plc.ClaimPool(ctx, &controldv1.ClaimPoolRequest{PoolId: poolID})
	if err != nil || !cl.Hit {
		t.Fatalf("claim: %v (hit %v)", err, cl.GetHit())
	}
	sandboxes = append(sandboxes, cl.Sandbox.Id)
	cep, err := s.sbc.GetSandboxEndpoint(ctx, &controldv1.GetSandboxEndpointRequest{Id: cl.Sandbox.Id})
	if err != nil {
		t.Fatal(err)
	}
	cs, err := aci.Dial(ctx, cep.Endpoint.Url, cep.Endpoint.Token)
	if err != nil {
		t.Fatalf("claimed replica: %v", err)
	}
	seen += probeSecrets(t, ctx, cs, "claimed pool replica")
	cs.Close()

	// Every token controld holds, from its store (controld stopped: the
	// sandboxes run on).
	s.stop()
	st, err := store.Open(filepath.Join(s.cfg.StateDir, "controld.db"))
	if err != nil {
		t.Fatal(err)
	}
	recs, err := st.Sandboxes()
	st.Close()
	if err != nil {
		t.Fatal(err)
	}
	byID := map[string]*store.SandboxRecord{}
	tokens := map[string]string{} // token -> whose
	for _, r := range recs {
		byID[r.Sandbox.Id] = r
		for _, tok := range []string{r.ACIToken, r.AdminToken} {
			if who, dup := tokens[tok]; dup {
				t.Errorf("sandboxes %s and %s share a token", who, r.Sandbox.Id)
			}
			tokens[tok] = r.Sandbox.Id
		}
	}
	for tok, who := range tokens {
		if strings.Contains(seen, tok) {
			t.Errorf("a process in a sandbox read a token of %s", who)
		}
	}
	source := byID[src.Sandbox.Id]
	if source == nil {
		t.Fatal("no record of the source")
	}
	// The replicas that run (the forks and the claimed one), each dialed on
	// guestd's socket with every token but its own.
	running := []string{replicas[0].Sandbox.Id, replicas[1].Sandbox.Id, cl.Sandbox.Id}
	for _, id := range running {
		r := byID[id]
		if r == nil {
			t.Fatalf("no record of %s", id)
		}
		for tok, who := range tokens {
			dctx, cancel := context.WithTimeout(ctx, 10*time.Second)
			gs, err := aci.DialSandbox(dctx, r.ACISocket, tok)
			cancel()
			own := who == id
			switch {
			case own && err != nil:
				t.Errorf("%s refuses its own token: %v", id, err)
			case !own && err == nil:
				t.Errorf("%s accepts a token of %s", id, who)
			case !own && !errors.Is(err, errdefs.ErrPermissionDenied):
				t.Errorf("%s with a token of %s: %v, want refused", id, who, err)
			}
			if gs != nil {
				if own {
					if _, err := gs.Do(ctx, &aciv1.ClientMessage{Request: &aciv1.ClientMessage_Ping{Ping: &aciv1.PingRequest{}}}); err != nil {
						t.Errorf("%s: ping: %v", id, err)
					}
				}
				gs.Close()
			}
		}
	}
	s.launch(0) // the deferred cleanup goes through controld
}

func waitPool(t *testing.T, s *bootStack, id string, n uint32) {
	t.Helper()
	deadline := time.Now().Add(2 * time.Minute)
	for {
		g, err := s.plc.GetPool(s.ctx, &controldv1.GetPoolRequest{Id: id})
		if err != nil {
			t.Fatal(err)
		}
		if g.Pool.Available >= n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("pool %s: %d of %d warm after 2 min", id, g.Pool.Available, n)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestRealStackCheckpointOfReplica: a memory-tier replica is checkpointed
// and forked again, two levels deep (a search tree's branches), and each
// level's replica holds what its parent did before the checkpoint. guestd is
// non-dumpable and a restored process keeps the host's user namespace as its
// memory's owner: as the dump's root process it failed CRIU's user
// namespace check ("Can't open <pid>/ns/net on procfs"); under tini it is not
// the root.
func TestRealStackCheckpointOfReplica(t *testing.T) {
	s := newStackIn(t, "forkfleet-replica-ck-it")
	s.launch(0)
	ctx := s.ctx
	var sandboxes, cks []string
	defer func() {
		bg := context.Background()
		for _, id := range sandboxes {
			s.sbc.DeleteSandbox(bg, &controldv1.DeleteSandboxRequest{Id: id})
		}
		for i := len(cks) - 1; i >= 0; i-- {
			s.ckc.DeleteCheckpoint(bg, &controldv1.DeleteCheckpointRequest{Id: cks[i], Cascade: true})
		}
	}()
	src, err := s.sbc.CreateSandbox(ctx, &controldv1.CreateSandboxRequest{WaitReady: true})
	if err != nil {
		t.Fatalf("create: %v", err)
	}
	sandboxes = append(sandboxes, src.Sandbox.Id)
	id, ep := src.Sandbox.Id, src.Endpoint
	for level := 1; level <= 2; level++ {
		sess, err := aci.Dial(ctx, ep.Url, ep.Token)
		if err != nil {
			t.Fatalf("level %d: ACI: %v", level, err)
		}
		shell(t, ctx, sess, fmt.Sprintf("echo %d >/tmp/level", level))
		sess.Close()
		ck, err := s.ckc.CreateCheckpoint(ctx, &controldv1.CreateCheckpointRequest{SandboxId: id})
		if err != nil {
			t.Fatalf("level %d: checkpoint of %s: %v", level, id, err)
		}
		cks = append(cks, ck.Checkpoint.Id)
		fr, err := s.ckc.ForkCheckpoint(ctx, &controldv1.ForkCheckpointRequest{CheckpointId: ck.Checkpoint.Id, Count: 1})
		if err != nil {
			t.Fatalf("level %d: fork: %v", level, err)
		}
		r := fr.Replicas[0]
		if r.ErrorCode != 0 {
			t.Fatalf("level %d: replica failed (%d): %s", level, r.ErrorCode, r.ErrorMessage)
		}
		sandboxes = append(sandboxes, r.Sandbox.Id)
		id, ep = r.Sandbox.Id, r.Endpoint
		rs, err := aci.Dial(ctx, ep.Url, ep.Token)
		if err != nil {
			t.Fatalf("level %d: replica ACI: %v", level, err)
		}
		if got := shell(t, ctx, rs, "cat /tmp/level"); got != fmt.Sprint(level) {
			t.Errorf("level %d: the replica's /tmp/level is %q", level, got)
		}
		rs.Close()
	}
}
