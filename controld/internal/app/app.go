// Package app wires controld together: store, runtime, manager, gRPC API,
// ACI gateway, metrics and traces, with an ordered shutdown.
package app

import (
	"context"
	"crypto/rand"
	"crypto/tls"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus/promhttp"
	"google.golang.org/grpc"

	"github.com/forkfleet/forkfleet/api/connlimit"
	controldv1 "github.com/forkfleet/forkfleet/api/gen/forkfleet/controld/v1"
	"github.com/forkfleet/forkfleet/controld/internal/config"
	"github.com/forkfleet/forkfleet/controld/internal/fleet"
	"github.com/forkfleet/forkfleet/controld/internal/gateway"
	"github.com/forkfleet/forkfleet/controld/internal/guestconn"
	"github.com/forkfleet/forkfleet/controld/internal/health"
	"github.com/forkfleet/forkfleet/controld/internal/recording"
	"github.com/forkfleet/forkfleet/controld/internal/runtime"
	"github.com/forkfleet/forkfleet/controld/internal/server"
	"github.com/forkfleet/forkfleet/controld/internal/store"
	"github.com/forkfleet/forkfleet/controld/internal/telemetry"
)

// Version is controld's version, set at link time.
var Version = "dev"

// Deps are what Run does not build from the configuration: the runtime
// (containerdrt in production, a fake or containerdrt in tests) and,
// optionally, the guest dialer.
type Deps struct {
	Runtime runtime.Runtime   // required
	Dialer  fleet.GuestDialer // nil: guestconn over the ACI client
	Logger  *slog.Logger      // nil: slog.Default()
	// OnReady, when set, is called once every listener serves.
	OnReady func(Addrs)
	// Health, when set, is the checker controld reports into (tests add
	// loops and checks of their own); nil: a fresh one.
	Health *health.Checker
}

// Addrs are the bound addresses (useful with port 0 in tests).
type Addrs struct {
	GRPCUnix string
	GRPCTCP  string
	Gateway  string
	Metrics  string
	Token    string // the TCP API token
}

// Run serves until ctx ends, then shuts down in order. Sandboxes keep
// running; the next Run adopts them. gRPC (health and reflection) and the
// metrics port answer from before startup reconciliation; the controld
// services, the gateway, grpc.health.v1 SERVING, /readyz and READY=1 follow
// it.
func Run(ctx context.Context, cfg *config.Config, deps Deps) (err error) {
	if deps.Runtime == nil {
		return errors.New("controld: no runtime")
	}
	log := deps.Logger
	if log == nil {
		log = slog.Default()
	}
	if deps.Dialer == nil {
		deps.Dialer = guestconn.Dialer{}
	}
	hc := deps.Health
	if hc == nil {
		hc = health.New()
	}
	host := cfg.Host
	if host == "" {
		host, _ = os.Hostname()
	}
	for _, d := range []string{cfg.StateDir, cfg.CheckpointDir} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			return fmt.Errorf("controld: %w", err)
		}
	}
	token, err := loadToken(cfg)
	if err != nil {
		return err
	}
	serverTLS, err := cfg.TLS.ServerConfig()
	if err != nil {
		return fmt.Errorf("controld: %w", err)
	}

	// Every step that acquired something registers its release here; they
	// run in reverse on a failed start, and the named shutdown sequence
	// below handles the normal stop.
	var undo []func()
	defer func() {
		if err != nil {
			for i := len(undo) - 1; i >= 0; i-- {
				undo[i]()
			}
		}
	}()

	tr, err := telemetry.NewTracing(ctx, telemetry.TraceConfig{
		Endpoint: cfg.Tracing.OTLPEndpoint, Protocol: cfg.Tracing.OTLPProtocol, Insecure: cfg.Tracing.OTLPInsecure,
		ServiceName: cfg.Tracing.ServiceName, Version: Version,
	})
	if err != nil {
		return err
	}
	undo = append(undo, func() { tr.Shutdown(context.Background()) })
	reg := telemetry.NewRegistry(Version)
	fm := fleet.NewMetrics(reg)

	st, err := store.Open(filepath.Join(cfg.StateDir, "controld.db"))
	if err != nil {
		return err
	}
	undo = append(undo, func() { st.Close() })
	hc.AddCheck("store", func(context.Context) error { return st.Ping() })

	// Listeners first: the gateway's bound address goes into endpoints.
	lc := net.ListenConfig{}
	lc.SetMultipathTCP(false)
	listen := func(addr string) (net.Listener, error) {
		if addr == "" {
			return nil, nil
		}
		ln, err := lc.Listen(ctx, "tcp", addr)
		if err != nil {
			return nil, fmt.Errorf("controld: listen %s: %w", addr, err)
		}
		undo = append(undo, func() { ln.Close() })
		return ln, nil
	}
	gwLn, err := listen(cfg.Gateway.Listen)
	if err != nil {
		return err
	}
	tcpLn, err := listen(cfg.GRPC.TCPAddress)
	if err != nil {
		return err
	}
	if tcpLn != nil && serverTLS != nil {
		// TLS under gRPC's plaintext transport: one grpc.Server keeps
		// serving the unix socket in the clear. gRPC clients insist on
		// ALPN h2.
		grpcTLS := serverTLS.Clone()
		grpcTLS.NextProtos = []string{"h2"}
		tcpLn = tls.NewListener(tcpLn, grpcTLS)
	}
	metricsLn, err := listen(cfg.Metrics.Listen)
	if err != nil {
		return err
	}
	var unixLn net.Listener
	if p := cfg.GRPC.UnixSocket; p != "" {
		if unixLn, err = listenUnix(p); err != nil {
			return err
		}
		undo = append(undo, func() { unixLn.Close() })
	}
	gwHost := cfg.Gateway.Advertise
	if gwHost == "" {
		gwHost = gwLn.Addr().String()
	}

	// gRPC and the metrics port serve from here on, before reconciliation
	// (which may wait minutes for a dump a crashed controld left): health
	// answers NOT_SERVING and /readyz 503 until it is done, the controld
	// services UNAVAILABLE (reason STARTING), instead of connections that
	// hang in the listen backlog.
	gsrv := server.New(server.Options{Token: token, TracerProvider: tr.Provider, Registerer: reg, Version: Version})
	undo = append(undo, gsrv.Stop)
	var msrv *http.Server
	if metricsLn != nil {
		mux := http.NewServeMux()
		mux.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{Registry: reg}))
		mux.Handle("GET /healthz", healthz(hc))
		mux.Handle("GET /readyz", readyz(hc))
		msrv = &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
		undo = append(undo, func() { msrv.Close() })
	}
	serveErr := make(chan error, 4)
	serve := func(name string, fn func() error) {
		go func() {
			if err := fn(); err != nil && !errors.Is(err, grpc.ErrServerStopped) && !errors.Is(err, http.ErrServerClosed) {
				serveErr <- fmt.Errorf("%s: %w", name, err)
			}
		}()
	}
	if unixLn != nil {
		serve("grpc unix", func() error { return gsrv.Serve(unixLn) })
	}
	if tcpLn != nil {
		serve("grpc tcp", func() error { return gsrv.Serve(tcpLn) })
	}
	if msrv != nil {
		serve("metrics", func() error { return msrv.Serve(metricsLn) })
	}
	log.Info("controld starting: reconciling its records with the runtime", "version", Version)

	// The gateway routes through the manager and the manager drops the
	// gateway's connections before a freeze: tie the knot through gwRef,
	// set before anything is served.
	var gwRef *gateway.Gateway
	var mgrRef *fleet.Manager
	// Recordings live beside controld's records; the sandbox check goes
	// through the manager once it exists (nothing records before serving).
	recs, err := recording.New(recording.Options{Dir: filepath.Join(cfg.StateDir, "recordings"), Log: log, Registerer: reg,
		GatewayHost: gwHost, GatewayTLS: serverTLS != nil,
		Routable: func(id string) error { _, err := mgrRef.Route(id); return err }})
	if err != nil {
		return err
	}
	ram, err := config.HostRAM()
	if err != nil {
		return fmt.Errorf("controld: host RAM for admission.max_memory: %w", err)
	}
	mgr, err := fleet.New(ctx, fleet.Options{
		Runtime:       fleet.InstrumentRuntime(deps.Runtime, fm),
		Dialer:        deps.Dialer,
		Store:         st,
		Metrics:       fm,
		Tracer:        tr.Provider.Tracer("github.com/forkfleet/forkfleet/controld"),
		Logger:        log,
		Host:          host,
		GatewayHost:   gwHost,
		GatewayTLS:    serverTLS != nil,
		DefaultImage:  cfg.DefaultImage,
		DefaultScreen: &controldv1.Screen{Width: cfg.DefaultScreen.Width, Height: cfg.DefaultScreen.Height, Depth: cfg.DefaultScreen.Depth},
		CheckpointDir: cfg.CheckpointDir,
		BootTimeout:   cfg.BootTimeout.D(),
		FrameSettle:   cfg.FrameSettle.D(),
		WarmSlots:     cfg.Boot.Precreate,
		Limits:        cfg.HostLimits(ram),
		Health:        hc,
		Recordings:    recs,
		DropConnections: func(id string) {
			if n := gwRef.DropSandbox(id); n > 0 {
				log.Info("closed gateway connections for a checkpoint", "sandbox", id, "connections", n)
			}
		},
	})
	if err != nil {
		return err
	}
	undo = append(undo, func() {
		cctx, cancel := context.WithTimeout(context.Background(), cfg.ShutdownTimeout.D())
		defer cancel()
		mgr.Close(cctx)
	})
	mgrRef = mgr

	reg.MustRegister(mgr.Collector())
	gwRef = gateway.New(mgr, gateway.Options{
		Log: log,
		Limits: connlimit.Limits{
			HeaderTimeout: cfg.Gateway.HeaderTimeout.D(),
			IdleTimeout:   cfg.Gateway.IdleTimeout.D(),
			MaxHandshakes: cfg.Gateway.MaxHandshakes,
		},
		MaxSessions:  cfg.Gateway.MaxSessions,
		TLS:          serverTLS,
		Registerer:   reg,
		ViewSessions: filepath.Join(cfg.StateDir, "view-sessions.json"),
		Downloads:    recs,
	})
	recs.SetSource(gwRef)
	gw := gateway.NewServer(gwRef)
	serve("gateway", func() error { return gw.Serve(gwLn) })
	addrs := Addrs{Gateway: gwLn.Addr().String(), Token: token}
	if unixLn != nil {
		addrs.GRPCUnix = unixLn.Addr().String()
	}
	if tcpLn != nil {
		addrs.GRPCTCP = tcpLn.Addr().String()
	}
	if metricsLn != nil {
		addrs.Metrics = metricsLn.Addr().String()
	}
	log.Info("controld serving", "version", Version, "grpc_unix", addrs.GRPCUnix, "grpc_tcp", addrs.GRPCTCP,
		"gateway", addrs.Gateway, "metrics", addrs.Metrics, "host", host)
	gsrv.SetManager(mgr)
	hc.SetState(health.Serving)
	if err := sdNotify("READY=1\nSTATUS=serving"); err != nil {
		log.Warn("sd_notify READY", "err", err)
	}
	wdCtx, stopWatchdog := context.WithCancel(ctx)
	defer stopWatchdog()
	wdDone := make(chan struct{})
	if iv, err := watchdogInterval(os.Getenv); err != nil {
		log.Warn("systemd watchdog", "err", err)
		close(wdDone)
	} else if iv > 0 {
		log.Info("systemd watchdog on", "interval", iv)
		go func() { defer close(wdDone); watchdog(wdCtx, iv, hc, log) }()
	} else {
		close(wdDone)
	}
	if deps.OnReady != nil {
		deps.OnReady(addrs)
	}

	var runErr error
	select {
	case <-ctx.Done():
		log.Info("controld shutting down", "cause", context.Cause(ctx))
	case runErr = <-serveErr:
		log.Error("controld: a listener failed; shutting down", "err", runErr)
	}
	undo = nil // the ordered shutdown below takes over
	hc.SetState(health.Stopping)
	gsrv.Stopping() // health NOT_SERVING, to checks and watches alike
	// systemd stops watching once the unit is stopping; so does controld.
	stopWatchdog()
	<-wdDone
	if err := sdNotify("STOPPING=1\nSTATUS=stopping"); err != nil {
		log.Warn("sd_notify STOPPING", "err", err)
	}
	deadline := time.Now().Add(cfg.ShutdownTimeout.D())
	var errs []error
	step := func(name string, fn func(ctx context.Context) error) {
		sctx, cancel := context.WithDeadline(context.Background(), deadline)
		defer cancel()
		start := time.Now()
		err := fn(sctx)
		if err != nil {
			errs = append(errs, fmt.Errorf("shutdown %s: %w", name, err))
		}
		log.Info("shutdown step", "step", name, "took", time.Since(start), "err", err)
	}
	step("stop accepting gRPC", func(context.Context) error {
		for _, ln := range []net.Listener{unixLn, tcpLn} {
			if ln != nil {
				ln.Close()
			}
		}
		// Streams (watches) would hold GracefulStop until the deadline: end
		// them now; clients re-watch on the restarted controld.
		mgr.CloseWatches()
		return nil
	})
	step("drain in-flight gRPC calls", func(ctx context.Context) error {
		done := make(chan struct{})
		go func() { gsrv.GracefulStop(); close(done) }()
		select {
		case <-done:
			return nil
		case <-ctx.Done():
			gsrv.Stop()
			<-done
			return errors.New("deadline reached: remaining calls cut off")
		}
	})
	// Recordings end first: their files are closed and marked stopped
	// while the gateway still feeds them.
	step("stop recordings", func(context.Context) error { recs.Close(); return nil })
	step("stop gateway", gw.Shutdown)
	step("stop pool replenishers and reapers", mgr.Close)
	if msrv != nil {
		step("stop metrics", msrv.Shutdown)
	}
	step("flush traces", tr.Shutdown)
	step("close store", func(context.Context) error { return st.Close() })
	if p := cfg.GRPC.UnixSocket; p != "" {
		os.Remove(p)
	}
	return errors.Join(append([]error{runErr}, errs...)...)
}

// listenUnix listens on a unix socket, replacing a stale socket file.
// Access is by file permissions: root and the socket's group.
func listenUnix(path string) (net.Listener, error) {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return nil, fmt.Errorf("controld: %w", err)
	}
	if fi, err := os.Lstat(path); err == nil {
		if fi.Mode()&os.ModeSocket == 0 {
			return nil, fmt.Errorf("controld: %s exists and is not a socket", path)
		}
		// A live controld would hold the store lock, so this one is stale.
		os.Remove(path)
	}
	ln, err := net.Listen("unix", path)
	if err != nil {
		return nil, fmt.Errorf("controld: listen %s: %w", path, err)
	}
	if err := os.Chmod(path, 0o660); err != nil {
		ln.Close()
		return nil, fmt.Errorf("controld: chmod %s: %w", path, err)
	}
	return ln, nil
}

// loadToken returns the TCP API token: the configured token file when
// present, else the generated one under the state dir (created on first
// start, mode 0600).
func loadToken(cfg *config.Config) (string, error) {
	if f := cfg.GRPC.TokenFile; f != "" {
		b, err := os.ReadFile(f)
		switch {
		case err == nil:
			t := strings.TrimSpace(string(b))
			if t == "" {
				return "", fmt.Errorf("controld: token file %s is empty", f)
			}
			return t, nil
		case !errors.Is(err, os.ErrNotExist):
			return "", fmt.Errorf("controld: token file: %w", err)
		}
	}
	p := cfg.TokenPath()
	if b, err := os.ReadFile(p); err == nil {
		if t := strings.TrimSpace(string(b)); t != "" {
			return t, nil
		}
	} else if !errors.Is(err, os.ErrNotExist) {
		return "", fmt.Errorf("controld: token: %w", err)
	}
	var raw [32]byte
	if _, err := rand.Read(raw[:]); err != nil {
		return "", err
	}
	t := hex.EncodeToString(raw[:])
	tmp := p + ".tmp"
	if err := os.WriteFile(tmp, []byte(t+"\n"), 0o600); err != nil {
		return "", fmt.Errorf("controld: write token: %w", err)
	}
	if err := os.Rename(tmp, p); err != nil {
		return "", fmt.Errorf("controld: write token: %w", err)
	}
	return t, nil
}
