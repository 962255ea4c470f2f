// Package runner runs suites and publishes their result files.
package runner

import (
	"context"
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/forkfleet/forkfleet/benchd/internal/hostinfo"
	"github.com/forkfleet/forkfleet/benchd/internal/peers"
	"github.com/forkfleet/forkfleet/benchd/internal/result"
	"github.com/forkfleet/forkfleet/benchd/internal/suiteapi"
	"github.com/forkfleet/forkfleet/benchd/internal/trace"
)

// Outcome of one suite run.
type Outcome struct {
	Suite  string
	Status string
	Reason string
	Path   string
	// PeersMissing are promised peers the suite ran without
	// (--skip-missing-peers).
	PeersMissing []string
}

// Run checks and runs s, then writes its result under root. The returned
// error is about benchd itself (cannot write the result); a failing suite is
// reported through Outcome.Status.
func Run(ctx context.Context, s suiteapi.Suite, env *suiteapi.Env, root string, config map[string]any) (Outcome, error) {
	started := time.Now().UTC()
	out := Outcome{Suite: s.Name()}
	host := hostinfo.Collect(ctx)
	build := hostinfo.Build(ctx, buildDir(env))
	loc, err := result.Reserve(root, s.Name(), started)
	if err != nil {
		return out, err
	}
	tr, err := trace.Start(ctx, s.Name(), loc.TracePath())
	if err != nil {
		return out, err
	}
	env.Tracer = trace.Tracer()
	env.Progressf("%s: starting (spans: %s)", s.Name(), tr.Where)

	var rows []result.Row
	status, reason := result.StatusOK, ""
	var runErr error
	out.PeersMissing, runErr = ResolvePeers(s, env)
	if runErr == nil {
		runErr = s.Check(ctx, env)
	}
	if runErr == nil {
		sctx, span := env.Tracer.Start(ctx, "suite."+s.Name())
		rows, runErr = runProtected(sctx, s, env)
		span.End()
	}
	if r, ok := suiteapi.IsSkip(runErr); ok {
		status, reason = result.StatusSkipped, r
	} else if runErr != nil {
		status, reason = result.StatusFailed, runErr.Error()
	}
	if err := tr.Shutdown(context.WithoutCancel(ctx)); err != nil {
		env.Progressf("%s: flushing spans: %v", s.Name(), err)
	}
	if st, err := os.Stat(loc.TracePath()); err == nil && st.Size() == 0 {
		// Nothing traced (skipped, or spans went to OTLP): drop the empty
		// file this run reserved.
		os.Remove(loc.TracePath())
	}
	host.LoadAfter = hostinfo.LoadAvg()
	if config == nil {
		config = map[string]any{}
	}
	if rows == nil {
		rows = []result.Row{}
	}
	res := &result.Result{
		Schema: result.SchemaID, Suite: s.Name(), Status: status, Reason: reason,
		StartedAt: started, FinishedAt: time.Now().UTC(),
		Host: host, Build: build, Config: config, Rows: rows, Notes: env.Notes(),
	}
	path, err := result.Write(loc, res)
	if err != nil {
		return out, err
	}
	out.Status, out.Reason, out.Path = status, reason, path
	return out, nil
}

// resolvePeers is peers.Resolve; tests stand in for the machine.
var resolvePeers = peers.Resolve

// ResolvePeers finds the binaries of the peers s promises (Run calls it
// before Check; tests that run a suite directly call it too). A missing peer
// is an error, unless env.SkipMissingPeers: then it is noted in the result,
// returned, and the suite runs without it.
func ResolvePeers(s suiteapi.Suite, env *suiteapi.Env) (skipped []string, err error) {
	p, ok := s.(suiteapi.Peered)
	if !ok {
		return nil, nil
	}
	paths, missing := resolvePeers(p.Peers())
	env.SetPeers(paths)
	if len(missing) == 0 {
		return nil, nil
	}
	what := peers.Describe(missing)
	if !env.SkipMissingPeers {
		return nil, fmt.Errorf("peers not installed: %s; install every peer with `make peers`, or run with --skip-missing-peers to measure without them", what)
	}
	for _, m := range missing {
		skipped = append(skipped, m.Name)
	}
	env.Notef("PEERS NOT MEASURED (--skip-missing-peers): %s; install them with `make peers`", what)
	return skipped, nil
}

// runProtected turns a suite panic into a failure of that suite, so
// `--suite all` still runs the rest and still writes a result.
func runProtected(ctx context.Context, s suiteapi.Suite, env *suiteapi.Env) (rows []result.Row, err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("suite %s panicked: %v", s.Name(), r)
		}
	}()
	rows, err = s.Run(ctx, env)
	if err == nil && len(rows) == 0 {
		err = errors.New("suite produced no rows")
	}
	return rows, err
}

func buildDir(env *suiteapi.Env) string {
	if env.RepoRoot != "" {
		return env.RepoRoot
	}
	wd, _ := os.Getwd()
	return wd
}
