// Package runner runs suites and publishes their result files.
package runner

import (
	"context"
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/forkfleet/forkfleet/benchd/internal/hostinfo"
	"github.com/forkfleet/forkfleet/benchd/internal/result"
	"github.com/forkfleet/forkfleet/benchd/internal/suite"
	"github.com/forkfleet/forkfleet/benchd/internal/trace"
)

// Outcome of one suite run.
type Outcome struct {
	Suite  string
	Status string
	Reason string
	Path   string
}

// Run checks and runs s, then writes its result under root. The returned
// error is about benchd itself (cannot write the result); a failing suite is
// reported through Outcome.Status.
func Run(ctx context.Context, s suite.Suite, env *suite.Env, root string, config map[string]any) (Outcome, error) {
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
	runErr := s.Check(ctx, env)
	if runErr == nil {
		sctx, span := env.Tracer.Start(ctx, "suite."+s.Name())
		rows, runErr = runProtected(sctx, s, env)
		span.End()
	}
	if r, ok := suite.IsSkip(runErr); ok {
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

// runProtected turns a suite panic into a failure of that suite, so
// `--suite all` still runs the rest and still writes a result.
func runProtected(ctx context.Context, s suite.Suite, env *suite.Env) (rows []result.Row, err error) {
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

func buildDir(env *suite.Env) string {
	if env.RepoRoot != "" {
		return env.RepoRoot
	}
	wd, _ := os.Getwd()
	return wd
}
