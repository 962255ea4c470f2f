//go:build linux

// Package guestd wires guestd together: config, the reaper, the supervised
// X session, the ACI server and its listeners, and an ordered shutdown.
package guestd

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/forkfleet/forkfleet/api/errdefs"
	"github.com/forkfleet/forkfleet/guestd/internal/a11y"
	"github.com/forkfleet/forkfleet/guestd/internal/aci"
	"github.com/forkfleet/forkfleet/guestd/internal/config"
	"github.com/forkfleet/forkfleet/guestd/internal/gcpace"
	"github.com/forkfleet/forkfleet/guestd/internal/ready"
	"github.com/forkfleet/forkfleet/guestd/internal/reaper"
	"github.com/forkfleet/forkfleet/guestd/internal/supervise"
	"github.com/forkfleet/forkfleet/guestd/internal/sysops"
	"github.com/forkfleet/forkfleet/guestd/internal/x11"
)

// Version is guestd's version: main's, set at link time (-X main.version).
var Version = "dev"

type options struct {
	configPath     string
	display        string
	noSupervise    bool
	listenTCP      string
	listenUnix     string
	addrFile       string
	insecureNoAuth bool
	grace          time.Duration
	logLevel       string
	showVersion    bool
	underInit      bool
	tokensFD       int
}

func parseFlags(args []string, stderr io.Writer) (*options, *flag.FlagSet, error) {
	o := &options{}
	fs := flag.NewFlagSet("guestd", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&o.configPath, "config", config.DefaultPath, "config file (the embedded default is used when the default path is absent)")
	fs.StringVar(&o.display, "display", "", "X display, overriding the config (\":5\")")
	fs.BoolVar(&o.noSupervise, "no-supervise", false, "do not start Xvfb, the window manager or apps: serve an existing display (benchmarks, tests)")
	fs.StringVar(&o.listenTCP, "listen-tcp", "", "TCP address to serve on; with --listen-unix, replaces the config's listeners (127.0.0.1:0 picks a port)")
	fs.StringVar(&o.listenUnix, "listen-unix", "", "unix socket path to serve on; replaces the config's listeners like --listen-tcp")
	fs.StringVar(&o.addrFile, "addr-file", "", "write the bound TCP address here once listening")
	fs.BoolVar(&o.insecureNoAuth, "insecure-no-auth", false, "serve without tokens (every session is admin): local development and benchmarks only")
	fs.DurationVar(&o.grace, "shutdown-grace", 5*time.Second, "time children get between SIGTERM and SIGKILL")
	fs.StringVar(&o.logLevel, "log-level", "info", "debug, info, warn or error")
	fs.BoolVar(&o.showVersion, "version", false, "print the version and exit")
	fs.BoolVar(&o.underInit, sysops.FlagUnderInit, false, "run as the child of the sandbox's init (set by guestd itself when it starts as PID 1)")
	fs.IntVar(&o.tokensFD, sysops.FlagTokensFD, -1, "read the tokens from this pipe, not the environment (with --"+sysops.FlagUnderInit+")")
	if err := fs.Parse(args); err != nil {
		return nil, nil, err
	}
	if fs.NArg() > 0 {
		return nil, nil, fmt.Errorf("unexpected arguments: %v", fs.Args())
	}
	return o, fs, nil
}

// Run is guestd's whole life: it returns when ctx ends or SIGTERM/SIGINT
// arrives, after the ordered shutdown.
func Run(ctx context.Context, args []string, stdout, stderr io.Writer, getenv func(string) string) error {
	o, fs, err := parseFlags(args, stderr)
	if err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return nil
		}
		return err
	}
	if o.showVersion {
		fmt.Fprintln(stdout, "guestd", Version)
		return nil
	}
	var level slog.Level
	if err := level.UnmarshalText([]byte(o.logLevel)); err != nil {
		return fmt.Errorf("--log-level: %w", err)
	}
	log := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: level}))

	// Before any secret is read: from here on no process of the sandbox can
	// read guestd's environment or memory (its tokens), not even root in it.
	if err := sysops.Undumpable(); err != nil {
		return fmt.Errorf("prctl(PR_SET_DUMPABLE, 0): %w", err)
	}
	if os.Getpid() == 1 && !o.underInit {
		// KSM's opt-in outlives the exec: tini's pages merge too.
		_ = sysops.MergeMemory()
		err := sysops.ExecInit(args, config.EnvACIToken, config.EnvAdminToken)
		log.Warn("guestd stays the sandbox's init: CRIU will not checkpoint this sandbox's replicas", "err", err)
	}
	if o.underInit {
		if err := sysops.SetUnderInit(); err != nil {
			return err
		}
		if o.tokensFD >= 0 {
			tokens, err := sysops.ReadTokens(o.tokensFD, config.EnvACIToken, config.EnvAdminToken)
			if err != nil {
				return err
			}
			base := getenv
			getenv = func(k string) string {
				if v, ok := tokens[k]; ok {
					return v
				}
				return base(k)
			}
		}
	}
	explicitConfig := false
	fs.Visit(func(f *flag.Flag) { explicitConfig = explicitConfig || f.Name == "config" })
	cfg, err := config.Load(o.configPath, !explicitConfig, getenv)
	if err != nil {
		return err
	}
	// The tokens live in the server from now on, nowhere else.
	childEnv := sysops.SanitizedEnv(os.Environ(), config.EnvACIToken, config.EnvAdminToken)
	sysops.ScrubEnv(config.EnvACIToken, config.EnvAdminToken)
	if o.display != "" {
		cfg.Display = o.display
	}
	if o.listenTCP != "" || o.listenUnix != "" {
		cfg.Listen = config.Listen{TCP: o.listenTCP, Unix: o.listenUnix}
	}
	if err := cfg.Validate(); err != nil {
		return err
	}
	if cfg.ACIToken == "" && !o.insecureNoAuth {
		return fmt.Errorf("%s is not set: refusing to serve without auth (use --insecure-no-auth for local development)", config.EnvACIToken)
	}
	if cfg.AdminToken == "" && !o.insecureNoAuth {
		log.Warn(config.EnvAdminToken + " is not set: admin requests (memory_mark, restored) are unavailable")
	}

	// KSM: forked replicas of one checkpoint share most pages; opting the
	// whole process (and the session it starts) in lets the kernel merge them.
	if err := sysops.MergeMemory(); err != nil {
		log.Warn("PR_SET_MEMORY_MERGE failed", "err", err)
	}

	if sysops.SandboxInit() {
		if err := sysops.EnsureDevShm("/dev/shm"); err != nil {
			log.Warn("no /dev/shm: POSIX shared memory will fail in the sandbox", "err", err)
		}
	}

	supervising := !o.noSupervise
	mode := reaper.Own
	switch {
	case o.underInit:
		mode = reaper.Children
	case supervising || sysops.SandboxInit():
		mode = reaper.All
	}
	rp, err := reaper.New(mode)
	if err != nil {
		return err
	}

	ctx, stop := signal.NotifyContext(ctx, unix.SIGTERM, unix.SIGINT)
	defer stop()

	childEnv = append(sysops.SanitizedEnv(childEnv, "DISPLAY"), "DISPLAY="+cfg.Display)
	childEnv = sysops.WithLocale(childEnv)
	if a := cfg.A11y; a != nil {
		// Every program of the session finds the accessibility bus and is
		// told to expose itself on it (the toolkits' switches).
		childEnv = append(sysops.SanitizedEnv(childEnv, "AT_SPI_BUS_ADDRESS"), "AT_SPI_BUS_ADDRESS="+a.Address)
		childEnv = append(childEnv, a.Env...)
	}
	// The agent's processes run as the image's unprivileged user (root only
	// for a sandbox created so); guestd stays root.
	var agent *sysops.Identity
	if name := cfg.AgentUser(); name != "" {
		if agent, err = sysops.LookupIdentity(name); err != nil {
			rp.Close()
			return fmt.Errorf("config user: %w", err)
		}
		if os.Geteuid() != 0 {
			rp.Close()
			return fmt.Errorf("config user %q: guestd must run as root to run the agent as another user", name)
		}
	}
	runner := &sysops.Runner{Reaper: rp, Env: childEnv, User: agent, Log: log}
	files := sysops.NewFiles(sysops.FileLimits{
		MaxFileBytes: cfg.Limits.MaxFileBytes,
		// Leave room for the envelope under the message limit.
		MaxReadBytes: cfg.Limits.MaxMessageBytes - 4096,
		MaxUploads:   cfg.Limits.MaxUploads,
		UploadIdle:   time.Duration(cfg.Limits.UploadIdleSeconds) * time.Second,
	})
	if o.noSupervise {
		// The windows the image names come from the apps guestd starts;
		// serving someone else's display, it starts none.
		cfg.Ready = config.Ready{}
	}
	conds, err := ready.New(cfg.Ready)
	if err != nil {
		rp.Close()
		return err
	}
	opts := aci.Options{
		ACIToken: cfg.ACIToken, AdminToken: cfg.AdminToken, InsecureNoAuth: o.insecureNoAuth,
		SandboxID: cfg.SandboxID, ServerVersion: Version, MaxMessageBytes: cfg.Limits.MaxMessageBytes,
		MaxSessions: cfg.Limits.MaxSessions, MaxSessionBytes: cfg.Limits.MaxSessionBytes,
		Runner: runner, Files: files, AgentFiles: agent.FSCred(), Ready: conds, Log: log,
	}
	if sysops.SandboxInit() {
		// As the sandbox's init, /proc shows the sandbox only.
		opts.SandboxCPU = sysops.OthersCPUTime
	}
	// sup is set below, before any session can be served. A pool's member
	// keeps its X server running while its apps are held: its proofs
	// capture the screen.
	var sup *supervise.Supervisor
	if supervising && sysops.SandboxInit() {
		opts.StopApps = func() func() int {
			return supervise.StopOthers(func() int { return sup.Pid(xvfbName(cfg)) })
		}
	}
	a11yAddr := ""
	if cfg.A11y != nil {
		a11yAddr = cfg.A11y.Address
	}
	access := a11y.New(a11yAddr)
	opts.A11y = access
	srv, err := aci.New(opts)
	if err != nil {
		rp.Close()
		return err
	}

	var steps []shutdownStep
	defer func() { runShutdown(log, steps) }()
	steps = append(steps, shutdownStep{"reaper", func(context.Context) error { rp.Close(); return nil }})
	steps = append(steps, shutdownStep{"uploads", func(context.Context) error { files.Close(); return nil }})
	steps = append(steps, shutdownStep{"a11y-client", func(context.Context) error { access.Close(); return nil }})

	// Listeners first: a client can connect (and wait for the ReadyEvent)
	// while X is still coming up.
	var listeners []net.Listener
	if p := cfg.Listen.Unix; p != "" {
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			return err
		}
		_ = os.Remove(p) // stale socket from a previous run
		l, err := aci.Listen(ctx, "unix", p)
		if err != nil {
			return err
		}
		if err := os.Chmod(p, 0o660); err != nil {
			l.Close()
			return err
		}
		listeners = append(listeners, l)
		steps = append(steps, shutdownStep{"unix-socket", func(context.Context) error { return os.Remove(p) }})
	}
	if a := cfg.Listen.TCP; a != "" {
		l, err := aci.Listen(ctx, "tcp", a)
		if err != nil {
			for _, l := range listeners {
				l.Close()
			}
			return err
		}
		listeners = append(listeners, l)
		if o.addrFile != "" {
			if err := os.WriteFile(o.addrFile, []byte(l.Addr().String()+"\n"), 0o644); err != nil {
				return err
			}
		}
	}
	var serveWG sync.WaitGroup
	for _, l := range listeners {
		serveWG.Add(1)
		go func() {
			defer serveWG.Done()
			if err := srv.Serve(l); err != nil && !errors.Is(err, http.ErrServerClosed) {
				log.Error("serve", "addr", l.Addr(), "err", err)
			}
		}()
		log.Info("listening", "network", l.Addr().Network(), "addr", l.Addr().String())
	}
	// Steps run in reverse registration order; the server goes first.
	steps = append(steps, shutdownStep{"listeners", func(context.Context) error {
		serveWG.Wait()
		return nil
	}})

	sup = supervise.New(rp, log, childEnv, o.grace)
	dm := &desktopManager{cfg: cfg, srv: srv, log: log, sup: sup, agent: agent, access: access, supervising: supervising, trigger: make(chan struct{}, 1)}
	dmCtx, dmCancel := context.WithCancel(context.Background())
	dmDone := make(chan struct{})
	go func() { defer close(dmDone); dm.run(dmCtx) }()
	steps = append(steps, shutdownStep{"desktop", func(context.Context) error {
		dmCancel()
		<-dmDone
		return nil
	}})

	if supervising {
		steps = append(steps, shutdownStep{"orphans", func(context.Context) error {
			supervise.TerminateAll(o.grace)
			return nil
		}})
		steps = append(steps, shutdownStep{"session", func(context.Context) error {
			// Apps first, then the window manager, then X.
			order := make([]string, 0, len(cfg.Apps)+2)
			for _, a := range cfg.Apps {
				order = append(order, a.Name)
			}
			order = append(order, cfg.WindowManager.Name)
			if a := cfg.A11y; a != nil {
				order = append(order, a11yName(a.Registry, "a11y-registry"), a11yName(a.Bus, "a11y-bus"))
			}
			order = append(order, xvfbName(cfg))
			sup.Stop(order...)
			return nil
		}})
		if err := supervise.CleanStaleXLock(cfg.Display); err != nil {
			return err
		}
		sup.Start(supervise.XvfbSpec(cfg, dm.kick))
	} else {
		dm.kick()
	}
	steps = append(steps, shutdownStep{"launched-apps", func(context.Context) error {
		runner.StopLaunched(o.grace)
		return nil
	}})
	steps = append(steps, shutdownStep{"aci-server", func(ctx context.Context) error {
		return srv.Shutdown(ctx)
	}})

	log.Info("guestd running", "version", Version, "pid", os.Getpid(), "display", cfg.Display,
		"supervise", supervising, "auth", !o.insecureNoAuth, "reaper", map[reaper.Mode]string{reaper.All: "all", reaper.Own: "own", reaper.Children: "children"}[mode])
	janitor := time.NewTicker(time.Minute)
	defer janitor.Stop()
	for {
		select {
		case <-ctx.Done():
			log.Info("shutting down", "cause", context.Cause(ctx))
			return nil
		case <-janitor.C:
			if n := files.SweepStale(); n > 0 {
				log.Info("removed stale uploads", "count", n)
			}
		}
	}
}

func xvfbName(cfg *config.Config) string {
	if cfg.Xvfb.Name != "" {
		return cfg.Xvfb.Name
	}
	return "xvfb"
}

type shutdownStep struct {
	name string
	fn   func(context.Context) error
}

// runShutdown runs steps newest first, each bounded, logging what it did.
func runShutdown(log *slog.Logger, steps []shutdownStep) {
	for i := len(steps) - 1; i >= 0; i-- {
		s := steps[i]
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		t := time.Now()
		err := s.fn(ctx)
		cancel()
		if err != nil && !errors.Is(err, os.ErrNotExist) {
			log.Warn("shutdown step failed", "step", s.name, "err", err, "took", time.Since(t))
			continue
		}
		log.Info("shutdown step done", "step", s.name, "took", time.Since(t))
	}
}

// desktopManager opens the X display when it comes up (Xvfb's -displayfd
// notification, or at once for an existing display), hands it to the ACI
// server, paints the root, starts the window manager and apps once, and
// reopens after an X restart.
type desktopManager struct {
	cfg         *config.Config
	srv         *aci.Server
	log         *slog.Logger
	sup         *supervise.Supervisor
	agent       *sysops.Identity // who the window manager and apps run as
	access      *a11y.Client
	supervising bool
	trigger     chan struct{}
	started     bool
}

func (m *desktopManager) kick() {
	select {
	case m.trigger <- struct{}{}:
	default:
	}
}

func (m *desktopManager) run(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-m.trigger:
		}
		d := m.open(ctx)
		if d == nil {
			return
		}
		if m.supervising && m.cfg.RootColor != "" {
			color, _ := config.ParseColor(m.cfg.RootColor)
			if err := supervise.PaintRoot(m.cfg.Display, color); err != nil {
				m.log.Warn("paint root", "err", err)
			}
		}
		if m.cfg.A11y != nil {
			d.SetKeySync(m.access.SyncRegistry)
		}
		m.srv.SetDesktop(d)
		if m.supervising && !m.started {
			m.started = true
			m.startSession(ctx, d)
		}
		select {
		case <-d.Done():
			m.log.Warn("X connection lost; waiting for the display to come back")
			m.srv.SetDesktop(nil)
			d.Close()
			if !m.supervising {
				m.kick()
			}
		case <-ctx.Done():
			m.srv.SetDesktop(nil)
			d.Close()
			return
		}
	}
}

// open connects with backoff until it succeeds or ctx ends.
func (m *desktopManager) open(ctx context.Context) *x11.Desktop {
	delay := 5 * time.Millisecond
	for {
		octx, cancel := context.WithTimeout(ctx, 5*time.Second)
		d, err := x11.Open(octx, m.cfg.Display)
		cancel()
		if err == nil {
			m.log.Info("display open", "display", m.cfg.Display)
			return d
		}
		m.log.Debug("display not available yet", "display", m.cfg.Display, "err", err)
		t := time.NewTimer(delay)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil
		case <-t.C:
		}
		delay = min(delay*2, time.Second)
	}
}

// startSession starts the window manager, waits until it manages the
// screen, then starts the apps: an app that maps its window before the
// window manager took over the root is never adopted and stays invisible.
func (m *desktopManager) startSession(ctx context.Context, d *x11.Desktop) {
	a := m.cfg.A11y
	if a != nil {
		m.startBus(a)
	}
	wm := m.cfg.WindowManager
	if wm.Path != "" {
		name := wm.Name
		if name == "" {
			name = filepath.Base(wm.Path)
		}
		m.sup.Start(m.asAgent(supervise.Spec{Name: name, Path: wm.Path, Args: wm.Args, Env: wm.Env, Restart: config.RestartAlways}))
	}
	if a != nil {
		// The registry needs the bus (it connects at once) and X (its
		// device event controller); it comes up while the window manager
		// does.
		wctx, cancel := context.WithTimeout(ctx, a11yStartTimeout)
		if err := m.access.WaitBus(wctx); err != nil {
			m.log.Warn("accessibility bus did not come up", "err", err)
		}
		cancel()
		m.sup.Start(m.asAgent(supervise.Spec{Name: a11yName(a.Registry, "a11y-registry"), Path: a.Registry.Path,
			Args: a.Registry.Args, Env: a.Registry.Env, Restart: config.RestartAlways}))
	}
	if wm.Path != "" {
		if err := waitWM(ctx, d, wmStartTimeout); err != nil {
			m.log.Warn("window manager did not come up; starting apps anyway", "wm", wm.Name, "err", err)
		}
	}
	if a != nil {
		// An app that starts before the registry holds its name registers
		// with nobody and never shows in the tree.
		t := time.Now()
		wctx, cancel := context.WithTimeout(ctx, a11yStartTimeout)
		if err := m.access.WaitRegistry(wctx); err != nil {
			m.log.Warn("accessibility registry did not come up; starting apps anyway", "err", err)
		} else {
			m.log.Info("accessibility bus and registry up", "waited", time.Since(t))
		}
		cancel()
	}
	for _, a := range m.cfg.Apps {
		restart := a.Restart
		if restart == "" {
			restart = config.RestartOnFailure
		}
		m.sup.Start(m.asAgent(supervise.Spec{Name: a.Name, Path: a.Path, Args: a.Args, Env: a.Env, Restart: restart}))
	}
}

// startBus starts the accessibility bus (dbus-daemon) as the agent user on
// the configured socket, whose directory guestd makes the agent's.
func (m *desktopManager) startBus(a *config.A11y) {
	sock := a.SocketPath()
	dir := filepath.Dir(sock)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		m.log.Warn("a11y bus directory", "dir", dir, "err", err)
	}
	if cred := m.agent.Credential(); cred != nil {
		if err := os.Lchown(dir, int(cred.Uid), int(cred.Gid)); err != nil {
			m.log.Warn("a11y bus directory", "dir", dir, "err", err)
		}
	}
	_ = os.Remove(sock) // a stale socket from a previous run
	args := append(slices.Clone(a.Bus.Args), "--address="+a.Address)
	m.sup.Start(m.asAgent(supervise.Spec{Name: a11yName(a.Bus, "a11y-bus"), Path: a.Bus.Path, Args: args, Env: a.Bus.Env,
		Restart: config.RestartAlways}))
}

func a11yName(p config.Program, def string) string {
	if p.Name != "" {
		return p.Name
	}
	return def
}

// a11yStartTimeout bounds the wait for the accessibility registry before
// the apps start (it takes about 20 ms).
const a11yStartTimeout = 3 * time.Second

// asAgent makes a session program run as the agent user, with its login
// variables (the program's own env entries still win) and in its home.
func (m *desktopManager) asAgent(s supervise.Spec) supervise.Spec {
	s.Env = append(m.agent.Env(nil), s.Env...)
	s.Credential = m.agent.Credential()
	s.Dir = m.agent.Dir()
	return s
}

const wmStartTimeout = 5 * time.Second

// waitWM waits until the window manager manages the screen: its EWMH check
// window first, probing the way the ready query does (1 ms a probe; the
// window manager needs about 10 ms), then an answer from its event loop
// (x11.Desktop.WaitWMAnswers: openbox announces itself before it answers
// clients, and an xterm started in between waited 5 s for an answer in one
// boot of ten). A window manager that cannot be asked is taken as up once
// announced.
func waitWM(ctx context.Context, d *x11.Desktop, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	t := time.NewTicker(time.Millisecond)
	defer t.Stop()
	for {
		st, err := d.Ready(ctx)
		if err == nil && st.WMUp {
			break
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
		}
	}
	if err := d.WaitWMAnswers(ctx); err != nil && !errors.Is(err, errdefs.ErrInvalidArgument) {
		return err
	}
	return nil
}

// Main is the process entry point used by cmd/guestd.
func Main() int {
	// The collector follows the heap, not the clock: a guestd thawed or
	// restored long after its last collection would otherwise collect
	// first, in its claim's or fork's window (gcpace).
	gcpace.Start(os.Getenv)
	if err := Run(context.Background(), os.Args[1:], os.Stdout, os.Stderr, os.Getenv); err != nil {
		fmt.Fprintln(os.Stderr, "guestd:", strings.TrimSpace(err.Error()))
		return 1
	}
	return 0
}
