package runner

import (
	"context"
	"errors"
	"flag"
	"os"
	"strings"
	"testing"

	"github.com/forkfleet/forkfleet/benchd/internal/peers"
	"github.com/forkfleet/forkfleet/benchd/internal/result"
	"github.com/forkfleet/forkfleet/benchd/internal/suiteapi"
)

type fake struct {
	check func() error
	run   func() ([]result.Row, error)
}

func (fake) Name() string                                               { return "fake" }
func (fake) Description() string                                        { return "test suite" }
func (fake) Flags(*flag.FlagSet)                                        {}
func (f fake) Check(context.Context, *suiteapi.Env) error               { return f.check() }
func (f fake) Run(context.Context, *suiteapi.Env) ([]result.Row, error) { return f.run() }

func TestOutcomes(t *testing.T) {
	ok := func() error { return nil }
	rows := func() ([]result.Row, error) { return []result.Row{result.Single("m", "ms", nil, 1)}, nil }
	cases := []struct {
		name   string
		s      fake
		status string
	}{
		{"ok", fake{ok, rows}, result.StatusOK},
		{"skip in check", fake{func() error { return suiteapi.Skipf("no controld") }, rows}, result.StatusSkipped},
		{"skip in run", fake{ok, func() ([]result.Row, error) { return nil, suiteapi.Skipf("no capability") }}, result.StatusSkipped},
		{"failed", fake{ok, func() ([]result.Row, error) { return nil, errors.New("boom") }}, result.StatusFailed},
		{"no rows", fake{ok, func() ([]result.Row, error) { return nil, nil }}, result.StatusFailed},
		{"panic", fake{ok, func() ([]result.Row, error) { panic("oops") }}, result.StatusFailed},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			root := t.TempDir()
			env := &suiteapi.Env{Warmup: -1, WorkDir: t.TempDir()}
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

// peered is a suite that promises peers.
type peered struct {
	fake
	names []string
	saw   map[string]bool
}

func (p *peered) Peers() []string { return p.names }
func (p *peered) Run(_ context.Context, env *suiteapi.Env) ([]result.Row, error) {
	p.saw = map[string]bool{}
	for _, n := range p.names {
		_, ok := env.Peer(n)
		p.saw[n] = ok
	}
	return []result.Row{result.Single("m", "ms", nil, 1)}, nil
}

// TestMissingPeers: a promised peer that is not installed fails the suite
// and names the package, unless benchd was told to skip missing peers; then
// the suite runs without it and the result says so.
func TestMissingPeers(t *testing.T) {
	defer func(f func([]string) (map[string]string, []peers.Peer)) { resolvePeers = f }(resolvePeers)
	resolvePeers = func(names []string) (map[string]string, []peers.Peer) {
		return map[string]string{"xdotool": "/usr/bin/xdotool"}, []peers.Peer{{Name: "podman", Package: "podman"}}
	}
	for _, skip := range []bool{false, true} {
		s := &peered{fake: fake{check: func() error { return nil }}, names: []string{"xdotool", "podman"}}
		env := &suiteapi.Env{Warmup: -1, WorkDir: t.TempDir(), SkipMissingPeers: skip}
		o, err := Run(context.Background(), s, env, t.TempDir(), nil)
		if err != nil {
			t.Fatal(err)
		}
		r, err := result.ReadFile(o.Path)
		if err != nil {
			t.Fatal(err)
		}
		if !skip {
			if o.Status != result.StatusFailed || !strings.Contains(o.Reason, "podman (package podman)") ||
				!strings.Contains(o.Reason, "make peers") || s.saw != nil {
				t.Fatalf("missing peer without skip: %+v, ran: %v", o, s.saw)
			}
			continue
		}
		if o.Status != result.StatusOK || len(o.PeersMissing) != 1 || o.PeersMissing[0] != "podman" {
			t.Fatalf("missing peer with skip: %+v", o)
		}
		if !s.saw["xdotool"] || s.saw["podman"] {
			t.Fatalf("suite saw peers %v", s.saw)
		}
		if len(r.Notes) != 1 || !strings.Contains(r.Notes[0], "PEERS NOT MEASURED") {
			t.Fatalf("notes %q", r.Notes)
		}
	}
}
