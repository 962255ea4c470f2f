package app_test

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/forkfleet/forkfleet/api/aci"
	aciv1 "github.com/forkfleet/forkfleet/api/gen/forkfleet/aci/v1"
	controldv1 "github.com/forkfleet/forkfleet/api/gen/forkfleet/controld/v1"
)

// TestRealStackUsableAgent: on the real stack with the desktop image,
// "usable" means an agent's first input lands, and the agent is not root.
//
//   - The boot waterfall shows the image's readiness conditions (its xterm
//     mapped and focused) before usable, and text typed the moment
//     CreateSandbox(wait_ready) returns reaches the shell in the xterm, as
//     UTF-8 (the session runs with C.UTF-8).
//   - exec, the xterm and its shell run as the unprivileged agent user:
//     the agent cannot read guestd's environment (its tokens) or write
//     /etc, and the files it makes (typed, exec'd or put) are its own.
//   - A memory checkpoint and a verified fork keep all of it (CRIU restores
//     the credentials); a sandbox created with run_as_root runs its agent
//     as root.
func TestRealStackUsableAgent(t *testing.T) {
	s := newStackIn(t, "forkfleet-agent-it")
	ctx := s.ctx
	s.launch(1)
	s.waitSlots(1)
	var created []string
	var ckID string
	t.Cleanup(func() {
		for _, id := range created {
			s.sbc.DeleteSandbox(ctx, &controldv1.DeleteSandboxRequest{Id: id})
		}
		if ckID != "" {
			s.ckc.DeleteCheckpoint(ctx, &controldv1.DeleteCheckpointRequest{Id: ckID, Cascade: true})
		}
	})
	create := func(req *controldv1.CreateSandboxRequest) *controldv1.CreateSandboxResponse {
		t.Helper()
		req.WaitReady = true
		cr, err := s.sbc.CreateSandbox(ctx, req)
		if err != nil {
			t.Fatalf("create: %v", err)
		}
		created = append(created, cr.Sandbox.Id)
		return cr
	}
	dial := func(ep *controldv1.Endpoint) *aci.Session {
		t.Helper()
		sess, err := aci.Dial(ctx, ep.Url, ep.Token)
		if err != nil {
			t.Fatalf("ACI: %v", err)
		}
		t.Cleanup(func() { sess.Close() })
		return sess
	}
	// typeLine types a shell command into the xterm at once and waits for
	// the file it writes.
	typeLine := func(sess *aci.Session, text, file string) {
		t.Helper()
		if _, err := sess.Step(ctx, []*aciv1.Action{aci.Type(fmt.Sprintf("printf '%%s\\n' '%s' > %s\n", text, file))}, nil); err != nil {
			t.Fatal(err)
		}
		deadline := time.Now().Add(30 * time.Second)
		for {
			if got := shell(t, ctx, sess, "cat "+file+" 2>/dev/null || true"); got != "" {
				if got != text {
					t.Fatalf("the shell in the xterm wrote %q, want %q", got, text)
				}
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("the keys typed at usable never reached the shell (%s)", file)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	// owners lists the uid of every process of the sandbox with one of
	// these names.
	owners := func(sess *aci.Session, names ...string) map[string]string {
		t.Helper()
		out := shell(t, ctx, sess, `for p in /proc/[0-9]*; do c=$(cat $p/comm 2>/dev/null) && u=$(stat -c %u $p) && echo "$c $u"; done`)
		got := map[string]string{}
		for _, line := range strings.Split(out, "\n") {
			f := strings.Fields(line)
			if len(f) == 2 && slices.Contains(names, f[0]) {
				if prev, ok := got[f[0]]; ok && prev != f[1] {
					f[1] = prev + "," + f[1]
				}
				got[f[0]] = f[1]
			}
		}
		return got
	}

	cr := create(&controldv1.CreateSandboxRequest{})
	var names []string
	for _, p := range cr.Sandbox.Boot {
		names = append(names, p.Name)
		t.Logf("  %-16s %v", p.Name, p.At.AsDuration())
	}
	if !slices.Contains(names, "windows_mapped") || !slices.Contains(names, "focused") || names[len(names)-1] != "usable" {
		t.Fatalf("boot phases %v: want the xterm mapped and focused before usable", names)
	}
	if cr.Sandbox.GetRunAsRoot() {
		t.Fatal("a default sandbox runs its agent as root")
	}
	sess := dial(cr.Endpoint)
	const typed = "été ✓ 丘丙 über"
	typeLine(sess, typed, "/tmp/typed")

	if got := shell(t, ctx, sess, `id -un; id -u; echo "$HOME $USER $LANG"; pwd; stat -c %U /tmp/typed`); got != "agent\n1000\n/home/agent agent C.UTF-8\n/home/agent\nagent" {
		t.Fatalf("the agent's identity: %q", got)
	}
	r, err := sess.Exec(ctx, &aciv1.ExecRequest{Argv: []string{"/bin/sh", "-c", "cat /proc/1/environ; touch /etc/forkfleet-agent"}})
	if err != nil {
		t.Fatal(err)
	}
	if r.ExitCode == 0 || strings.Contains(string(r.Stdout), "FORKFLEET_") || !strings.Contains(string(r.Stderr), "ermission denied") {
		t.Fatalf("the agent read guestd's environment or wrote /etc: exit %d, %q %q", r.ExitCode, r.Stdout, r.Stderr)
	}
	if got := owners(sess, "xterm", "bash", "openbox", "Xvfb", "guestd"); got["xterm"] != "1000" || got["bash"] != "1000" ||
		got["openbox"] != "1000" || got["Xvfb"] != "0" || got["guestd"] != "0" {
		t.Fatalf("process owners %v: want the session apps as agent (1000), X and guestd as root", got)
	}
	if err := sess.PutFile(ctx, "/home/agent/put", []byte("x")); err != nil {
		t.Fatal(err)
	}
	if info, err := sess.Stat(ctx, "/home/agent/put"); err != nil || info.GetUid() != 1000 || info.GetGid() != 1000 {
		t.Fatalf("file put by the agent: %v %v", info, err)
	}
	if err := sess.PutFile(ctx, "/etc/forkfleet-agent", []byte("x")); !errors.Is(err, aci.ErrPermissionDenied) {
		t.Fatalf("file put into /etc by the agent: %v, want permission denied", err)
	}

	ck, err := s.ckc.CreateCheckpoint(ctx, &controldv1.CreateCheckpointRequest{SandboxId: cr.Sandbox.Id})
	if err != nil {
		t.Fatalf("checkpoint: %v", err)
	}
	ckID = ck.Checkpoint.Id
	fr, err := s.ckc.ForkCheckpoint(ctx, &controldv1.ForkCheckpointRequest{CheckpointId: ckID, Count: 1})
	if err != nil || fr.Replicas[0].GetErrorMessage() != "" {
		t.Fatalf("fork: %v %v", fr, err)
	}
	created = append(created, fr.Replicas[0].Sandbox.Id)
	rep := dial(fr.Replicas[0].Endpoint)
	if got := owners(rep, "xterm", "bash", "guestd"); got["xterm"] != "1000" || got["bash"] != "1000" || got["guestd"] != "0" {
		t.Fatalf("replica's process owners %v", got)
	}
	typeLine(rep, typed+" (replica)", "/tmp/typed-replica")
	if got := shell(t, ctx, rep, "id -un; stat -c %U /tmp/typed-replica"); got != "agent\nagent" {
		t.Fatalf("replica: %q", got)
	}

	root := create(&controldv1.CreateSandboxRequest{RunAsRoot: true})
	if !root.Sandbox.GetRunAsRoot() {
		t.Fatal("run_as_root is not on the record")
	}
	rs := dial(root.Endpoint)
	if got := shell(t, ctx, rs, "id -u"); got != "0" {
		t.Fatalf("run_as_root: exec runs as uid %s", got)
	}
	if got := owners(rs, "xterm"); got["xterm"] != "0" {
		t.Fatalf("run_as_root: xterm runs as uid %s", got["xterm"])
	}
}
