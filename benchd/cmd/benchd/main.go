// Command benchd is forkfleet's benchmark driver: every performance claim of
// the project is reproducible with one `benchd run`.
//
//	benchd list
//	benchd run --suite NAME|all [--out DIR] [--n N] [--warmup W] [suite flags]
//	benchd compare OLD NEW [--threshold 15]
//	benchd pool --out FILE [--set KEY=VALUE]... RUN.json...
//	benchd report [--results DIR] [--out docs/benchmarks.md] [--check]
//	benchd peers [packages]
//	benchd peer ...   (internal: a synthetic ACI server for clientscale)
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"text/tabwriter"

	"github.com/forkfleet/forkfleet/api/desktoptest"
	"github.com/forkfleet/forkfleet/benchd/internal/compare"
	"github.com/forkfleet/forkfleet/benchd/internal/peers"
	"github.com/forkfleet/forkfleet/benchd/internal/report"
	"github.com/forkfleet/forkfleet/benchd/internal/result"
	"github.com/forkfleet/forkfleet/benchd/internal/runner"
	"github.com/forkfleet/forkfleet/benchd/internal/suiteapi"
	"github.com/forkfleet/forkfleet/benchd/internal/suites"
)

// version is set at link time (make build: -X main.version=$(git describe)).
var version = "dev"

// Exit codes.
const (
	exitOK         = 0
	exitFailed     = 1 // a suite failed, or compare found a regression
	exitUsage      = 2
	exitInfraError = 3 // benchd itself could not do its job
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	os.Exit(run(ctx, os.Args[1:], os.Stdout, os.Stderr))
}

func usage(w io.Writer) {
	fmt.Fprint(w, `usage:
  benchd list
  benchd run --suite NAME|all [--out DIR] [--n N] [--warmup W] [--skip-missing-peers] [suite flags]
  benchd compare OLD NEW [--threshold 15]
  benchd pool --out FILE [--set KEY=VALUE]... RUN.json...   one result from runs of a suite (ab.sh)
  benchd report [--results DIR] [--out FILE]
  benchd peers [packages]     the peers the suites measure (make peers installs them)
  benchd version
`)
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		usage(stderr)
		return exitUsage
	}
	switch args[0] {
	case "list":
		return cmdList(stdout)
	case "run":
		return cmdRun(ctx, args[1:], stderr)
	case "compare":
		return cmdCompare(args[1:], stdout, stderr)
	case "report":
		return cmdReport(args[1:], stdout, stderr)
	case "pool":
		return cmdPool(args[1:], stdout, stderr)
	case "peers":
		return cmdPeers(args[1:], stdout, stderr)
	case "peer":
		if err := suites.RunPeer(ctx, args[1:]); err != nil {
			fmt.Fprintf(stderr, "benchd peer: %v\n", err)
			return exitInfraError
		}
		return exitOK
	case "version", "--version":
		fmt.Fprintln(stdout, "benchd", version)
		return exitOK
	case "-h", "--help", "help":
		usage(stdout)
		return exitOK
	}
	fmt.Fprintf(stderr, "benchd: unknown command %q\n", args[0])
	usage(stderr)
	return exitUsage
}

func cmdList(w io.Writer) int {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	for _, s := range suiteapi.All() {
		fmt.Fprintf(tw, "%s\t%s\n", s.Name(), s.Description())
	}
	tw.Flush()
	return exitOK
}

// defaultResultsRoot is <repo>/benchd/results when run inside the monorepo,
// else ./results.
func defaultResultsRoot() string {
	wd, _ := os.Getwd()
	if root := desktoptest.RepoRoot(wd); root != "" {
		return filepath.Join(root, "benchd", "results")
	}
	return "results"
}

func cmdRun(ctx context.Context, args []string, stderr io.Writer) int {
	fs := flag.NewFlagSet("run", flag.ContinueOnError)
	fs.SetOutput(stderr)
	name := fs.String("suite", "", "suite to run, or all")
	out := fs.String("out", defaultResultsRoot(), "results root; files go to <root>/<YYYY-MM-DD>/<suite>-<HHMMSS>.json")
	n := fs.Int("n", 0, "samples per cell (0: each suite's default)")
	warm := fs.Int("warmup", -1, "warm-up samples per cell, discarded (-1: each suite's default)")
	guestd := fs.String("guestd", "", "guestd binary for host-side suites (empty: build ../guestd/cmd/guestd)")
	sock := fs.String("controld-socket", "/run/forkfleet/controld.sock", "controld gRPC unix socket")
	skipPeers := fs.Bool("skip-missing-peers", false, "run suites whose peers are not installed, without the peer rows (default: such a suite fails; `make peers` installs them)")
	// Every suite's own flags, so `--suite all` takes them all. Names are
	// unique across suites; Register panics otherwise via the FlagSet.
	own := map[string]*flag.FlagSet{}
	for _, s := range suiteapi.All() {
		sfs := flag.NewFlagSet(s.Name(), flag.ContinueOnError)
		s.Flags(sfs)
		sfs.VisitAll(func(f *flag.Flag) { fs.Var(f.Value, f.Name, f.Usage) })
		own[s.Name()] = sfs
	}
	if err := fs.Parse(args); err != nil {
		return exitUsage
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "benchd run: unexpected arguments %v\n", fs.Args())
		return exitUsage
	}
	var todo []suiteapi.Suite
	switch *name {
	case "":
		fmt.Fprintln(stderr, "benchd run: --suite is required (see benchd list)")
		return exitUsage
	case "all":
		todo = suiteapi.All()
	default:
		s, ok := suiteapi.Lookup(*name)
		if !ok {
			fmt.Fprintf(stderr, "benchd run: unknown suite %q (see benchd list)\n", *name)
			return exitUsage
		}
		todo = []suiteapi.Suite{s}
	}
	self, err := os.Executable()
	if err != nil {
		fmt.Fprintf(stderr, "benchd: %v\n", err)
		return exitInfraError
	}
	wd, _ := os.Getwd()
	code := exitOK
	for _, s := range todo {
		if ctx.Err() != nil {
			break
		}
		work, err := os.MkdirTemp("", "benchd-"+s.Name()+"-")
		if err != nil {
			fmt.Fprintf(stderr, "benchd: %v\n", err)
			return exitInfraError
		}
		env := &suiteapi.Env{N: *n, Warmup: *warm, Self: self, RepoRoot: desktoptest.RepoRoot(wd), GuestdBin: *guestd,
			ControldSocket: *sock, WorkDir: work, SkipMissingPeers: *skipPeers, Log: stderr}
		config := map[string]any{"n": *n, "warmup": *warm, "controld-socket": *sock}
		if *guestd != "" {
			config["guestd"] = *guestd
		}
		own[s.Name()].VisitAll(func(f *flag.Flag) { config[f.Name] = f.Value.String() })
		o, err := runner.Run(ctx, s, env, *out, config)
		os.RemoveAll(work)
		if err != nil {
			fmt.Fprintf(stderr, "benchd: %s: %v\n", s.Name(), err)
			return exitInfraError
		}
		switch o.Status {
		case result.StatusOK:
			fmt.Fprintf(stderr, "%s: ok -> %s\n", o.Suite, o.Path)
			if len(o.PeersMissing) > 0 {
				fmt.Fprintf(stderr, "%s: WARNING: peers NOT measured (not installed): %s; `make peers` installs them\n",
					o.Suite, strings.Join(o.PeersMissing, ", "))
			}
		case result.StatusSkipped:
			fmt.Fprintf(stderr, "%s: SKIPPED (%s) -> %s\n", o.Suite, o.Reason, o.Path)
		default:
			fmt.Fprintf(stderr, "%s: FAILED (%s) -> %s\n", o.Suite, o.Reason, o.Path)
			code = exitFailed
		}
	}
	if ctx.Err() != nil {
		fmt.Fprintln(stderr, "benchd: interrupted")
		return exitFailed
	}
	return code
}

// cmdPeers lists the peers and where they are installed, or (packages)
// prints their Debian packages for deploy/host-setup.sh --packages.
func cmdPeers(args []string, stdout, stderr io.Writer) int {
	switch {
	case len(args) == 1 && args[0] == "packages":
		fmt.Fprintln(stdout, strings.Join(peers.Packages(), " "))
		return exitOK
	case len(args) > 0:
		fmt.Fprintf(stderr, "benchd peers: unexpected arguments %v (usage: benchd peers [packages])\n", args)
		return exitUsage
	}
	tw := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "PEER\tPACKAGE\tBINARY")
	missing := 0
	for _, p := range peers.All() {
		path, err := p.Path()
		if err != nil {
			path, missing = "NOT INSTALLED", missing+1
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\n", p.Name, p.Package, path)
	}
	tw.Flush()
	if missing > 0 {
		fmt.Fprintf(stderr, "%d peer(s) not installed: `make peers` installs them\n", missing)
		return exitFailed
	}
	return exitOK
}

// loadSide reads a result file, or the latest result per suite of a
// directory.
func loadSide(path string) ([]*result.Result, error) {
	st, err := os.Stat(path)
	if err != nil {
		return nil, err
	}
	if !st.IsDir() {
		r, err := result.ReadFile(path)
		if err != nil {
			return nil, err
		}
		return []*result.Result{r}, nil
	}
	ls, bad, err := report.Latest(path, nil)
	if err != nil {
		return nil, err
	}
	if len(bad) > 0 {
		return nil, errors.Join(bad...)
	}
	var out []*result.Result
	for _, l := range ls {
		out = append(out, l.Result)
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("%s: no result files", path)
	}
	return out, nil
}

func cmdCompare(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("compare", flag.ContinueOnError)
	fs.SetOutput(stderr)
	th := fs.Float64("threshold", 15, "regression threshold in percent of the old p50")
	// Accept flags before or after the two paths.
	var paths []string
	for len(args) > 0 {
		if err := fs.Parse(args); err != nil {
			return exitUsage
		}
		if fs.NArg() == 0 {
			break
		}
		paths = append(paths, fs.Arg(0))
		args = fs.Args()[1:]
	}
	if len(paths) != 2 {
		fmt.Fprintln(stderr, "usage: benchd compare OLD NEW [--threshold 15]")
		return exitUsage
	}
	if *th < 0 {
		fmt.Fprintln(stderr, "benchd compare: --threshold must be >= 0")
		return exitUsage
	}
	old, err := loadSide(paths[0])
	if err != nil {
		fmt.Fprintf(stderr, "benchd compare: %v\n", err)
		return exitInfraError
	}
	nw, err := loadSide(paths[1])
	if err != nil {
		fmt.Fprintf(stderr, "benchd compare: %v\n", err)
		return exitInfraError
	}
	rep := compare.Compare(old, nw, *th)
	rep.Print(stdout)
	if rep.Regressions() > 0 {
		return exitFailed
	}
	return exitOK
}

// cmdPool merges runs of one suite (the rounds of an interleaved A/B,
// benchd/ab.sh) into one result file: samples pooled, config.pooled_from
// naming the runs, --set adding config keys (the A/B's description).
func cmdPool(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("pool", flag.ContinueOnError)
	fs.SetOutput(stderr)
	out := fs.String("out", "", "result file to write (never overwritten: a suffix is added when it exists)")
	set := map[string]string{}
	fs.Func("set", "KEY=VALUE added to the pooled result's config (repeatable)", func(v string) error {
		k, val, ok := strings.Cut(v, "=")
		if !ok || k == "" {
			return fmt.Errorf("want KEY=VALUE, got %q", v)
		}
		set[k] = val
		return nil
	})
	if err := fs.Parse(args); err != nil {
		return exitUsage
	}
	if *out == "" || fs.NArg() == 0 || !strings.HasSuffix(*out, ".json") {
		fmt.Fprintln(stderr, "usage: benchd pool --out FILE.json [--set KEY=VALUE]... RUN.json...")
		return exitUsage
	}
	runs := make([]*result.Result, 0, fs.NArg())
	for _, p := range fs.Args() {
		r, err := result.ReadFile(p)
		if err != nil {
			fmt.Fprintf(stderr, "benchd pool: %v\n", err)
			return exitInfraError
		}
		runs = append(runs, r)
	}
	pooled, err := result.Pool(runs, fs.Args())
	if err != nil {
		fmt.Fprintf(stderr, "benchd pool: %v\n", err)
		return exitFailed
	}
	for k, v := range set {
		pooled.Config[k] = v
	}
	if err := os.MkdirAll(filepath.Dir(*out), 0o755); err != nil {
		fmt.Fprintf(stderr, "benchd pool: %v\n", err)
		return exitInfraError
	}
	loc := result.Location{Dir: filepath.Dir(*out), Base: strings.TrimSuffix(filepath.Base(*out), ".json")}
	path, err := result.WriteCompact(loc, pooled)
	if err != nil {
		fmt.Fprintf(stderr, "benchd pool: %v\n", err)
		return exitInfraError
	}
	fmt.Fprintln(stdout, path)
	return exitOK
}

func cmdReport(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("report", flag.ContinueOnError)
	fs.SetOutput(stderr)
	dir := fs.String("results", defaultResultsRoot(), "results directory to read")
	out := fs.String("out", defaultReportPath(), "Markdown file to write (charts go to <name>-charts/ next to it)")
	check := fs.Bool("check", false, "write nothing; fail when the report on disk differs from what the results render (make check)")
	if err := fs.Parse(args); err != nil {
		return exitUsage
	}
	var order []string
	for _, s := range suiteapi.All() {
		order = append(order, s.Name())
	}
	ls, bad, err := report.Latest(*dir, order)
	if err != nil {
		fmt.Fprintf(stderr, "benchd report: %v\n", err)
		return exitInfraError
	}
	for _, b := range bad {
		fmt.Fprintf(stderr, "benchd report: ignoring invalid result: %v\n", b)
	}
	if *check {
		if len(bad) > 0 {
			fmt.Fprintln(stderr, "benchd report --check: invalid result files (see above)")
			return exitFailed
		}
		if err := report.Check(ls, *out); err != nil {
			fmt.Fprintf(stderr, "benchd report --check: %v\n", err)
			return exitFailed
		}
		fmt.Fprintf(stdout, "%s matches the results in %s\n", *out, *dir)
		return exitOK
	}
	if err := os.MkdirAll(filepath.Dir(*out), 0o755); err != nil {
		fmt.Fprintf(stderr, "benchd report: %v\n", err)
		return exitInfraError
	}
	if err := report.Render(ls, *out); err != nil {
		fmt.Fprintf(stderr, "benchd report: %v\n", err)
		return exitInfraError
	}
	var names []string
	for _, l := range ls {
		names = append(names, l.Suite)
	}
	fmt.Fprintf(stdout, "wrote %s (%s)\n", *out, strings.Join(names, ", "))
	return exitOK
}

func defaultReportPath() string {
	wd, _ := os.Getwd()
	if root := desktoptest.RepoRoot(wd); root != "" {
		return filepath.Join(root, "benchd", "docs", "benchmarks.md")
	}
	return filepath.Join("docs", "benchmarks.md")
}
