package runner

import (
	"context"
	"errors"
	"flag"
	"os"
	"testing"

	"github.com/forkfleet/forkfleet/benchd/internal/result"
	"github.com/forkfleet/forkfleet/benchd/internal/suite"
)

type fake struct {
	check func() error
	run   func() ([]result.Row, error)
}

func (fake) Name() string                                            { return "fake" }
func (fake) Description() string                                     { return "test suite" }
func (fake) Flags(*flag.FlagSet)                                     {}
func (f fake) Check(context.Context, *suite.Env) error               { return f.check() }
func (f fake) Run(context.Context, *suite.Env) ([]result.Row, error) { return f.run() }

func TestOutcomes(t *testing.T) {
	ok := func() error { return nil }
	rows := func() ([]result.Row, error) { return []result.Row{result.Single("m", "ms", nil, 1)}, nil }
	cases := []struct {
		name   string
		s      fake
		status string
	}{
		{"ok", fake{ok, rows}, result.StatusOK},
		{"skip in check", fake{func() error { return suite.Skipf("no controld") }, rows}, result.StatusSkipped},
		{"skip in run", fake{ok, func() ([]result.Row, error) { return nil, suite.Skipf("no capability") }}, result.StatusSkipped},
		{"failed", fake{ok, func() ([]result.Row, error) { return nil, errors.New("boom") }}, result.StatusFailed},
		{"no rows", fake{ok, func() ([]result.Row, error) { return nil, nil }}, result.StatusFailed},
		{"panic", fake{ok, func() ([]result.Row, error) { panic("oops") }}, result.StatusFailed},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			root := t.TempDir()
			env := &suite.Env{Warmup: -1, WorkDir: t.TempDir()}
			o, err := Run(context.Background(), c.s, env, root, map[string]any{"x": 1})
			if err != nil {
				t.Fatal(err)
			}
			if o.Status != c.status {
				t.Fatalf("status %s (%s), want %s", o.Status, o.Reason, c.status)
			}
			r, err := result.ReadFile(o.Path)
			if err != nil {
				t.Fatal(err)
			}
			if r.Status != c.status || (c.status != result.StatusOK && r.Reason == "") {
				t.Fatalf("file: %+v", r)
			}
			if r.Host.Cores < 1 || r.Build.GoVersion == "" {
				t.Fatalf("fingerprint missing: %+v %+v", r.Host, r.Build)
			}
			if c.name == "skip in check" {
				if _, err := os.Stat(o.Path[:len(o.Path)-len(".json")] + ".trace.jsonl"); err == nil {
					t.Error("empty trace file left behind for a skipped suite")
				}
			}
		})
	}
}
