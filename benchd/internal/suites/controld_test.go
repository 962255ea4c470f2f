//go:build linux

package suites

import (
	"context"
	"flag"
	"strings"
	"testing"
	"time"

	"github.com/forkfleet/forkfleet/api/aci/acitest"
	"github.com/forkfleet/forkfleet/api/controldfake"
	controldv1 "github.com/forkfleet/forkfleet/api/gen/forkfleet/controld/v1"
	"github.com/forkfleet/forkfleet/benchd/internal/result"
	"github.com/forkfleet/forkfleet/benchd/internal/runner"
	"github.com/forkfleet/forkfleet/benchd/internal/suiteapi"
)

// TestControldSuitesAgainstFake runs every controld suite end to end against
// the in-memory controld whose sandboxes point at an in-memory ACI server:
// it checks the suites' logic and result shape, not performance.
func TestControldSuitesAgainstFake(t *testing.T) {
	srv := controldfake.Start(t)
	guest := acitest.NewServer()
	defer guest.Close()
	png := append([]byte("\x89PNG\r\n\x1a\n"), make([]byte, 100)...)
	guest.SetFrame(png)
	srv.SetEndpoint(func(*controldv1.Sandbox) *controldv1.Endpoint { return &controldv1.Endpoint{Url: guest.URL()} })

	cases := []struct {
		s     suiteapi.Suite
		flags []string
		want  []string // metrics that must have successful samples
	}{
		{&bootSuite{}, []string{"--boot-floor=false"}, []string{"boot.milestone"}},
		{&fanoutSuite{}, []string{"--fanout-ns=1,3"}, []string{"fanout.wall", "fanout.per_sandbox"}},
		{&checkpointSuite{}, []string{"--checkpoint-podman=false"}, []string{"checkpoint.client_total", "checkpoint.total"}},
		{&forkSuite{}, []string{"--fork-ns=1,4", "--fork-settle=0", "--fork-ksm-wait=0", "--fork-podman=false"}, []string{"fork.fanout.wall", "fork.replica_usable"}},
		{&poolSuite{}, []string{"--pool-size=2", "--pool-bursts=1,4", "--pool-ksm-wait=0"}, []string{"pool.hit_rate", "pool.claim_rpc", "pool.claim_usable"}},
		{&dedupSuite{}, []string{"--dedup-ns=3", "--dedup-rounds=3"}, []string{"dedup.bytes_per_round"}},
	}
	for _, c := range cases {
		t.Run(c.s.Name(), func(t *testing.T) {
			fs := flag.NewFlagSet(c.s.Name(), flag.ContinueOnError)
			c.s.Flags(fs)
			if err := fs.Parse(c.flags); err != nil {
				t.Fatal(err)
			}
			env := &suiteapi.Env{N: 2, Warmup: 0, ControldSocket: srv.SocketPath, WorkDir: t.TempDir()}
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			o, err := runner.Run(ctx, c.s, env, t.TempDir(), map[string]any{})
			if err != nil {
				t.Fatal(err)
			}
			if o.Status != result.StatusOK {
				t.Fatalf("status %s: %s", o.Status, o.Reason)
			}
			r, err := result.ReadFile(o.Path)
			if err != nil {
				t.Fatal(err)
			}
			for _, m := range c.want {
				found := false
				for _, row := range r.Rows {
					found = found || (row.Metric == m && row.N > 0)
				}
				if !found {
					t.Errorf("no successful %s row; rows: %v; notes: %v", m, metrics(r.Rows), r.Notes)
				}
			}
		})
	}
}

func TestControldSuitesSkipWithoutSocket(t *testing.T) {
	env := &suiteapi.Env{ControldSocket: "/nonexistent/controld.sock"}
	for _, s := range []suiteapi.Suite{&bootSuite{}, &fanoutSuite{}, &checkpointSuite{}, &forkSuite{}, &poolSuite{}, &dedupSuite{}, &browserSuite{}, &legibilitySuite{}} {
		reason, ok := suiteapi.IsSkip(s.Check(context.Background(), env))
		if !ok || !strings.Contains(reason, "absent") {
			t.Errorf("%s: %q %v", s.Name(), reason, ok)
		}
	}
}

func metrics(rows []result.Row) []string {
	var out []string
	for _, r := range rows {
		out = append(out, r.Key())
	}
	return out
}
