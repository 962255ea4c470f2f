package app_test

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/forkfleet/forkfleet/api/aci"
	aciv1 "github.com/forkfleet/forkfleet/api/gen/forkfleet/aci/v1"
	controldv1 "github.com/forkfleet/forkfleet/api/gen/forkfleet/controld/v1"
)

// The limits tests attack a real sandbox from inside, as a model driving it
// could, and check the host: controld on the real stack in its own
// namespace (forkfleet-limits-it, see testenv).

// create boots a sandbox with res and returns it with an ACI session.
func (s *bootStack) create(res *controldv1.Resources) (*controldv1.Sandbox, *aci.Session) {
	s.t.Helper()
	cr, err := s.sbc.CreateSandbox(s.ctx, &controldv1.CreateSandboxRequest{WaitReady: true, Resources: res})
	if err != nil {
		s.t.Fatalf("create: %v", err)
	}
	s.t.Cleanup(func() { s.sbc.DeleteSandbox(context.Background(), &controldv1.DeleteSandboxRequest{Id: cr.Sandbox.Id}) })
	sess, err := aci.Dial(s.ctx, cr.Endpoint.Url, cr.Endpoint.Token)
	if err != nil {
		s.t.Fatalf("ACI of %s: %v", cr.Sandbox.Id, err)
	}
	s.t.Cleanup(func() { sess.Close() })
	return cr.Sandbox, sess
}

// run executes a shell script in the sandbox and returns its result.
func run(t *testing.T, ctx context.Context, sess *aci.Session, script string, timeout time.Duration) *aciv1.ExecResponse {
	t.Helper()
	r, err := sess.Exec(ctx, &aciv1.ExecRequest{Argv: []string{"/bin/sh", "-c", script}, TimeoutMs: uint32(timeout.Milliseconds())})
	if err != nil {
		t.Fatalf("exec %q: %v", script, err)
	}
	return r
}

// A sandbox that prints without end, through its init's stdout and stderr
// (which a root process of the sandbox can open), never keeps more than its
// log budget on the host, and is not held up by its log.
func TestRealStackLogFlood(t *testing.T) {
	s := newStackIn(t, "forkfleet-limits-it")
	s.launch(0)
	const budget = 256 << 10
	sb, sess := s.create(&controldv1.Resources{LogBytes: budget})
	if got := sb.GetResources().GetLogBytes(); got != budget {
		t.Fatalf("log budget %d", got)
	}
	// 64 MiB to stdout and 64 MiB to stderr, then a last line.
	start := time.Now()
	r := run(t, s.ctx, sess, `head -c 67108864 /dev/zero | tr '\0' x >/proc/1/fd/1 &
head -c 67108864 /dev/zero | tr '\0' y >/proc/1/fd/2; wait; echo the-last-line >/proc/1/fd/1`, time.Minute)
	if r.ExitCode != 0 {
		t.Fatalf("flood: exit %d %s", r.ExitCode, r.Stderr)
	}
	t.Logf("128 MiB printed in %v", time.Since(start))
	logPath := filepath.Join(s.rt.Config().StateDir, "logs", sb.Id+".log")
	var total int64
	deadline := time.Now().Add(10 * time.Second)
	for {
		total = 0
		for _, p := range []string{logPath, logPath + ".1"} {
			if st, err := os.Stat(p); err == nil {
				total += st.Size()
			}
		}
		b, _ := os.ReadFile(logPath)
		if strings.Contains(string(b), "the-last-line") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the last line never reached the log (%d bytes kept)", total)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if total > budget {
		t.Fatalf("%d bytes of log on the host, budget %d", total, budget)
	}
	t.Logf("log on the host: %d bytes (budget %d)", total, budget)
	if _, err := sess.Ping(s.ctx, nil); err != nil {
		t.Fatalf("sandbox unresponsive after the flood: %v", err)
	}
}
