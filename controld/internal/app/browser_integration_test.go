package app_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/forkfleet/forkfleet/api/aci"
	"github.com/forkfleet/forkfleet/api/aci/pagetest"
	"github.com/forkfleet/forkfleet/api/client"
	aciv1 "github.com/forkfleet/forkfleet/api/gen/forkfleet/aci/v1"
	controldv1 "github.com/forkfleet/forkfleet/api/gen/forkfleet/controld/v1"
)

// counterTitle parses the counter page's window title: its count and its
// input's text ("" for "counter 14 - Chromium": the text group is lazy, so
// the browser's suffix is never taken for text).
var counterTitle = regexp.MustCompile(`^counter (\d+)(?: (.*?))??(?: - Chromium)?$`)

// TestRealStackBrowser runs the web desktop (desktop-web) on the real stack:
// Chromium boots as the session app on its start page, ready means a URL
// typed at once lands in its address bar, CDP answers on the sandbox's
// loopback; a page whose JavaScript keeps a counter is
// checkpointed live and forked 4 ways; every replica passes the pixel proof
// although the page animates, its counter continues from the checkpoint's
// value and advances on its own, typed text (non-ASCII too) reaches the
// page, and no crash or restore dialog shows. Own namespace
// forkfleet-browser-it (testenv).
func TestRealStackBrowser(t *testing.T) {
	s := newWebStackIn(t, "forkfleet-browser-it")
	web := s.image
	ctx := s.ctx

	cr, err := s.sbc.CreateSandbox(ctx, &controldv1.CreateSandboxRequest{Image: web, WaitReady: true})
	if err != nil {
		t.Fatal(err)
	}
	src := cr.Sandbox.Id
	s.deleteSandboxAtEnd(src)
	sess, err := aci.Dial(ctx, cr.Endpoint.Url, cr.Endpoint.Token)
	if err != nil {
		t.Fatal(err)
	}
	defer sess.Close()
	// Ready (the image's readiness: the browser's window mapped, focused and
	// showing the start page) means the first input lands: the address bar
	// takes a URL typed right away.
	if _, err := sess.WaitReady(ctx); err != nil {
		t.Fatal(err)
	}
	if err := pagetest.Open(ctx, sess, pagetest.CounterPath, pagetest.Counter); err != nil {
		t.Fatal(err)
	}
	waitTitle(t, ctx, sess, "counter page typed into the address bar at ready", func(title string) bool { return counterTitle.MatchString(title) })

	// CDP answers on the sandbox's loopback (never on a host port).
	checkCDP(t, ctx, sess, "source")
	cdpThroughGateway(t, ctx, client.NewFromConn(s.conn).Sandbox(src), "source")

	// Typed text reaches the page's focused input, non-ASCII included.
	const typed = "été ünï 丘丙"
	if _, err := sess.Step(ctx, []*aciv1.Action{aci.Type(typed)}, nil); err != nil {
		t.Fatal(err)
	}
	waitTitle(t, ctx, sess, "typed text", func(title string) bool {
		m := counterTitle.FindStringSubmatch(title)
		return m != nil && m[2] == typed
	})
	sess.Close()

	before := counterOf(t, ctx, s, cr.Endpoint)
	ckr, err := s.ckc.CreateCheckpoint(ctx, &controldv1.CreateCheckpointRequest{SandboxId: src})
	if err != nil {
		t.Fatalf("checkpoint of the browser: %v", err)
	}
	ck := ckr.Checkpoint
	s.deleteCheckpointAtEnd(ck.Id)
	t.Logf("checkpoint: frozen %v, total %v, memory %d MiB, layer %d KiB",
		ck.Timing.GetFrozen().AsDuration(), ck.Timing.GetTotal().AsDuration(), ck.MemoryBytes>>20, ck.LayerBytes>>10)
	after := counterOf(t, ctx, s, cr.Endpoint)

	fork, err := s.ckc.ForkCheckpoint(ctx, &controldv1.ForkCheckpointRequest{CheckpointId: ck.Id, Count: 4})
	if err != nil {
		t.Fatal(err)
	}
	type replica struct {
		id    string
		ep    *controldv1.Endpoint
		first int
	}
	var reps []replica
	for i, r := range fork.Replicas {
		if r.ErrorCode != 0 {
			t.Fatalf("replica %d: %s", i, r.ErrorMessage)
		}
		s.deleteSandboxAtEnd(r.Sandbox.Id)
		for _, v := range r.Verification {
			if !v.Ok {
				t.Fatalf("replica %d: %s: %s", i, v.Level, v.Detail)
			}
		}
		reps = append(reps, replica{id: r.Sandbox.Id, ep: r.Endpoint})
	}
	// Every replica's page runs on from the checkpoint's state: its counter
	// starts within what the source showed around the checkpoint (plus what
	// it counted since), the typed text is there, and it advances.
	for i := range reps {
		n, text := titleState(t, ctx, s, reps[i].ep)
		if n < before || text != typed {
			t.Fatalf("replica %d starts at counter %d with %q; the source showed %d before the checkpoint, with %q", i, n, text, before, typed)
		}
		reps[i].first = n
	}
	t.Logf("counter: %d before the checkpoint, %d after; replicas at %v", before, after, reps)
	for i, r := range reps {
		checkReplicaRuns(t, ctx, s, i, r.id, r.ep, r.first, typed)
	}

	// A frozen pool's member waits with every process but guestd and the X
	// server stopped since its restored (and passed its proofs so; frozen,
	// /proc shows them all in the freezer's D): claimed, none is left
	// stopped and its page runs on from the checkpoint's state like a
	// fork's replica.
	pr, err := s.plc.CreatePool(ctx, &controldv1.CreatePoolRequest{Source: &controldv1.CreatePoolRequest_CheckpointId{CheckpointId: ck.Id}, Size: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer s.plc.DeletePool(context.Background(), &controldv1.DeletePoolRequest{Id: pr.Pool.Id})
	var member string
	deadline := time.Now().Add(2 * time.Minute)
	for member == "" {
		if time.Now().After(deadline) {
			t.Fatal("browser pool did not fill in 2 minutes")
		}
		l, err := s.sbc.ListSandboxes(ctx, &controldv1.ListSandboxesRequest{States: []controldv1.SandboxState{controldv1.SandboxState_SANDBOX_STATE_SUSPENDED}})
		if err != nil {
			t.Fatal(err)
		}
		for _, sb := range l.Sandboxes {
			if sb.PoolId == pr.Pool.Id {
				member = sb.Id
			}
		}
		time.Sleep(100 * time.Millisecond)
	}
	cl, err := s.plc.ClaimPool(ctx, &controldv1.ClaimPoolRequest{PoolId: pr.Pool.Id})
	if err != nil || !cl.Hit || cl.Sandbox.Id != member {
		t.Fatalf("claim: %v (hit %v), want member %s", err, cl.GetHit(), member)
	}
	s.deleteSandboxAtEnd(member)
	if stopped, all := stoppedProcesses(t, member); stopped != 0 || all == 0 {
		t.Fatalf("claimed %s with %d of its %d processes stopped", member, stopped, all)
	}
	n, text := titleState(t, ctx, s, cl.Endpoint)
	if n < before || text != typed {
		t.Fatalf("claimed member starts at counter %d with %q; the source showed %d before the checkpoint, with %q", n, text, before, typed)
	}
	checkReplicaRuns(t, ctx, s, len(reps), member, cl.Endpoint, n, typed)
}

// checkReplicaRuns checks a replica's page: it takes its own text ("r<i>"
// after typed) and its counter advances past first, its DevTools server
// answers, and it shows nothing but the browser's window (no crash or
// restore dialog).
func checkReplicaRuns(t *testing.T, ctx context.Context, s *bootStack, i int, id string, ep *controldv1.Endpoint, first int, typed string) {
	t.Helper()
	rs, err := aci.Dial(ctx, ep.Url, ep.Token)
	if err != nil {
		t.Fatal(err)
	}
	// Each replica gets its own text: they diverge.
	if _, err := rs.Step(ctx, []*aciv1.Action{aci.Type(fmt.Sprintf(" r%d", i))}, nil); err != nil {
		t.Fatal(err)
	}
	// The title collapses spaces: no text before gives "r<i>".
	want := strings.TrimSpace(fmt.Sprintf("%s r%d", typed, i))
	waitTitle(t, ctx, rs, fmt.Sprintf("replica %d advances with its own text", i), func(title string) bool {
		m := counterTitle.FindStringSubmatch(title)
		if m == nil {
			return false
		}
		n, _ := strconv.Atoi(m[1])
		return n > first && m[2] == want
	})
	// The restored DevTools server answers on the replica's loopback.
	checkCDP(t, ctx, rs, fmt.Sprintf("replica %d", i))
	if i == 0 {
		cdpThroughGateway(t, ctx, client.NewFromConn(s.conn).Sandbox(id), "replica 0")
	}
	// Nothing but the browser's window: no crash or restore dialog.
	ws, err := rs.ListWindows(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(ws) != 1 {
		var titles []string
		for _, w := range ws {
			titles = append(titles, w.GetTitle())
		}
		t.Fatalf("replica %d shows %d windows %q, want the browser's only", i, len(ws), titles)
	}
	rs.Close()
}

// stoppedProcesses counts the processes of sandbox id (its freezer or
// unified cgroup) and those stopped (state T). 0, 0 when its cgroup is not
// found.
func stoppedProcesses(t *testing.T, id string) (stopped, all int) {
	t.Helper()
	var procs []string
	for _, pat := range []string{"/sys/fs/cgroup/freezer/*/" + id + "/cgroup.procs", "/sys/fs/cgroup/*/" + id + "/cgroup.procs"} {
		if m, _ := filepath.Glob(pat); len(m) == 1 {
			b, err := os.ReadFile(m[0])
			if err != nil {
				t.Fatal(err)
			}
			procs = strings.Fields(string(b))
			break
		}
	}
	for _, pid := range procs {
		b, err := os.ReadFile("/proc/" + pid + "/stat")
		if err != nil {
			continue
		}
		all++
		if i := strings.LastIndexByte(string(b), ')'); i > 0 && i+2 < len(b) && b[i+2] == 'T' {
			stopped++
		}
	}
	return stopped, all
}

// checkCDP asks Chromium's DevTools server on the sandbox's loopback for
// /json/version (from inside: the port is never on the host).
func checkCDP(t *testing.T, ctx context.Context, sess *aci.Session, who string) {
	t.Helper()
	r, err := sess.Exec(ctx, &aciv1.ExecRequest{TimeoutMs: 10_000, Argv: []string{"/bin/bash", "-c",
		`exec 3<>/dev/tcp/127.0.0.1/9222 && printf 'GET /json/version HTTP/1.1\r\nHost: 127.0.0.1:9222\r\n\r\n' >&3 && timeout 2 cat <&3; true`}})
	if err != nil || r.ExitCode != 0 || !strings.Contains(string(r.Stdout), `"webSocketDebuggerUrl"`) || !strings.Contains(string(r.Stdout), "Chrome/") {
		t.Fatalf("%s: CDP /json/version on the sandbox's loopback: %v exit %d %q %q", who, err, r.GetExitCode(), r.GetStdout(), r.GetStderr())
	}
}

// cdpThroughGateway reaches the sandbox's browser as a CDP client on the
// host does: its DevTools port exposed through controld's gateway with the
// port's token (client.Sandbox.DevTools), a WebSocket to the browser target,
// one command.
func cdpThroughGateway(t *testing.T, ctx context.Context, sb *client.Sandbox, who string) {
	t.Helper()
	dt, err := sb.DevTools(ctx)
	if err != nil {
		t.Fatalf("%s: devtools through the gateway: %v", who, err)
	}
	c, _, err := websocket.Dial(ctx, dt.WebSocketURL, &websocket.DialOptions{HTTPHeader: dt.Header})
	if err != nil {
		t.Fatalf("%s: CDP WebSocket %s: %v", who, dt.WebSocketURL, err)
	}
	defer c.CloseNow()
	if err := c.Write(ctx, websocket.MessageText, []byte(`{"id":1,"method":"Browser.getVersion"}`)); err != nil {
		t.Fatal(err)
	}
	_, msg, err := c.Read(ctx)
	if err != nil || !strings.Contains(string(msg), `"product":"Chrome/`) {
		t.Fatalf("%s: Browser.getVersion over CDP: %v %.200s", who, err, msg)
	}
	t.Logf("%s: CDP through the gateway: %s answers at %s", who, dt.Browser, dt.WebSocketURL)
}

// waitTitle polls the window list until a window's title satisfies ok.
func waitTitle(t *testing.T, ctx context.Context, sess *aci.Session, what string, ok func(string) bool) string {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	var last []string
	for time.Now().Before(deadline) {
		ws, err := sess.ListWindows(ctx)
		if err != nil {
			t.Fatalf("%s: list windows: %v", what, err)
		}
		last = last[:0]
		for _, w := range ws {
			if ok(w.GetTitle()) {
				return w.GetTitle()
			}
			last = append(last, w.GetTitle())
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatalf("%s: no window title matched in 30 s; titles %q", what, last)
	return ""
}

// titleState reads the counter page's state from the window title of the
// sandbox at ep.
func titleState(t *testing.T, ctx context.Context, s *bootStack, ep *controldv1.Endpoint) (int, string) {
	t.Helper()
	sess, err := aci.Dial(ctx, ep.Url, ep.Token)
	if err != nil {
		t.Fatal(err)
	}
	defer sess.Close()
	title := waitTitle(t, ctx, sess, "counter", func(title string) bool { return counterTitle.MatchString(title) })
	m := counterTitle.FindStringSubmatch(title)
	n, _ := strconv.Atoi(m[1])
	return n, m[2]
}

func counterOf(t *testing.T, ctx context.Context, s *bootStack, ep *controldv1.Endpoint) int {
	t.Helper()
	n, _ := titleState(t, ctx, s, ep)
	return n
}
