package app

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"time"

	"github.com/prometheus/client_golang/prometheus"
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

// controld is one Run: what its start-up steps made, which its shutdown
// steps stop.
type controld struct {
	cfg  *config.Config
	deps Deps
	log  *slog.Logger
	hc   *health.Checker

	// undo holds the releases of what the start-up steps acquired, run in
	// reverse when a later step fails; the named shutdown handles the
	// normal stop.
	undo []func()

	// prepare
	host      string
	token     string
	serverTLS *tls.Config
	// startTelemetry
	tr  *telemetry.Tracing
	reg *prometheus.Registry
	fm  *fleet.Metrics
	// openStore
	st *store.Store
	// listen
	gwLn, tcpLn, metricsLn, unixLn net.Listener
	gwHost                         string
	// serveEarly
	gsrv     *server.Server
	msrv     *http.Server
	serveErr chan error
	// openRecordings, startManager, startGateway
	recs     *recording.Manager
	mgr      *fleet.Manager
	gateway  *gateway.Gateway
	gwServer *gateway.Server
	// announce
	addrs Addrs
	// startWatchdog
	stopWatchdog context.CancelFunc
	wdDone       chan struct{}
}

func newControld(cfg *config.Config, deps Deps) *controld {
	d := &controld{cfg: cfg, deps: deps, log: deps.Logger, hc: deps.Health, serveErr: make(chan error, 4)}
	if d.log == nil {
		d.log = slog.Default()
	}
	if d.deps.Dialer == nil {
		d.deps.Dialer = guestconn.Dialer{}
	}
	if d.hc == nil {
		d.hc = health.New()
	}
	return d
}

// start runs the start-up steps in order. When one fails, what the
// earlier ones acquired is released in reverse and its error returned.
func (d *controld) start(ctx context.Context) (err error) {
	defer func() {
		if err != nil {
			for i := len(d.undo) - 1; i >= 0; i-- {
				d.undo[i]()
			}
		}
		d.undo = nil // from here on the ordered shutdown takes over
	}()
	for _, step := range []func(context.Context) error{
		d.prepare,        // host name, state and checkpoint dirs, API token, TLS
		d.startTelemetry, // traces, the metrics registry
		d.openStore,      // controld's records
		d.listen,         // gateway, gRPC TCP, metrics, gRPC unix socket
		d.serveEarly,     // gRPC and metrics, answering "starting"
		d.openRecordings, // recordings beside the records
		d.startManager,   // the fleet: records and runtime reconciled
		d.startGateway,   // the ACI gateway, serving
		d.announce,       // the controld services, SERVING, READY=1
		d.startWatchdog,  // systemd's watchdog, when it asks for one
	} {
		if err := step(ctx); err != nil {
			return err
		}
	}
	return nil
}

// prepare settles what the configuration leaves open and acquires
// nothing: the host's name, the state and checkpoint dirs, the TCP API
// token and the TLS configuration.
func (d *controld) prepare(context.Context) (err error) {
	cfg := d.cfg
	d.host = cfg.Host
	if d.host == "" {
		d.host, _ = os.Hostname()
	}
	for _, dir := range []string{cfg.StateDir, cfg.CheckpointDir} {
		if err := os.MkdirAll(dir, 0o700); err != nil {
			return fmt.Errorf("controld: %w", err)
		}
	}
	if d.token, err = loadToken(cfg); err != nil {
		return err
	}
	if d.serverTLS, err = cfg.TLS.ServerConfig(); err != nil {
		return fmt.Errorf("controld: %w", err)
	}
	return nil
}

// startTelemetry starts the trace exporter and makes the metrics registry.
func (d *controld) startTelemetry(ctx context.Context) error {
	t := d.cfg.Tracing
	tr, err := telemetry.NewTracing(ctx, telemetry.TraceConfig{
		Endpoint: t.OTLPEndpoint, Protocol: t.OTLPProtocol, Insecure: t.OTLPInsecure,
		ServiceName: t.ServiceName, Version: Version,
	})
	if err != nil {
		return err
	}
	d.tr = tr
	d.undo = append(d.undo, func() { tr.Shutdown(context.Background()) })
	d.reg = telemetry.NewRegistry(Version)
	d.fm = fleet.NewMetrics(d.reg)
	// The runtime's own instruments (containerdrt: lazy restore's hot sets).
	if c, ok := runtime.As[prometheus.Collector](d.deps.Runtime); ok {
		d.reg.MustRegister(c)
	}
	return nil
}

// openStore opens controld's records, and reports the store's health.
func (d *controld) openStore(context.Context) error {
	st, err := store.Open(filepath.Join(d.cfg.StateDir, "controld.db"))
	if err != nil {
		return err
	}
	d.st = st
	d.undo = append(d.undo, func() { st.Close() })
	d.hc.AddCheck("store", func(context.Context) error { return st.Ping() })
	return nil
}

// listen binds every listener before anything serves: the gateway's
// bound address goes into endpoints.
func (d *controld) listen(ctx context.Context) (err error) {
	cfg := d.cfg
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
		d.undo = append(d.undo, func() { ln.Close() })
		return ln, nil
	}
	if d.gwLn, err = listen(cfg.Gateway.Listen); err != nil {
		return err
	}
	if d.tcpLn, err = listen(cfg.GRPC.TCPAddress); err != nil {
		return err
	}
	if d.tcpLn != nil && d.serverTLS != nil {
		// TLS under gRPC's plaintext transport: one grpc.Server keeps
		// serving the unix socket in the clear. gRPC clients insist on
		// ALPN h2.
		grpcTLS := d.serverTLS.Clone()
		grpcTLS.NextProtos = []string{"h2"}
		d.tcpLn = tls.NewListener(d.tcpLn, grpcTLS)
	}
	if d.metricsLn, err = listen(cfg.Metrics.Listen); err != nil {
		return err
	}
	if p := cfg.GRPC.UnixSocket; p != "" {
		ln, err := listenUnix(p)
		if err != nil {
			return err
		}
		d.unixLn = ln
		d.undo = append(d.undo, func() { ln.Close() })
	}
	d.gwHost = cfg.Gateway.Advertise
	if d.gwHost == "" {
		d.gwHost = d.gwLn.Addr().String()
	}
	return nil
}

// serve runs a server's Serve until it stops; a failure other than the
// stop ends controld (wait).
func (d *controld) serve(name string, fn func() error) {
	go func() {
		if err := fn(); err != nil && !errors.Is(err, grpc.ErrServerStopped) && !errors.Is(err, http.ErrServerClosed) {
			d.serveErr <- fmt.Errorf("%s: %w", name, err)
		}
	}()
}

// serveEarly serves gRPC and the metrics port from here on, before
// reconciliation (which may wait minutes for a dump a crashed controld
// left): health answers NOT_SERVING and /readyz 503 until it is done, the
// controld services UNAVAILABLE (reason STARTING), instead of connections
// that hang in the listen backlog.
func (d *controld) serveEarly(context.Context) error {
	d.gsrv = server.New(server.Options{Token: d.token, TracerProvider: d.tr.Provider, Registerer: d.reg, Version: Version})
	d.undo = append(d.undo, d.gsrv.Stop)
	if d.metricsLn != nil {
		mux := http.NewServeMux()
		mux.Handle("GET /metrics", promhttp.HandlerFor(d.reg, promhttp.HandlerOpts{Registry: d.reg}))
		mux.Handle("GET /healthz", healthz(d.hc))
		mux.Handle("GET /readyz", readyz(d.hc))
		msrv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
		d.msrv = msrv
		d.undo = append(d.undo, func() { msrv.Close() })
	}
	if d.unixLn != nil {
		d.serve("grpc unix", func() error { return d.gsrv.Serve(d.unixLn) })
	}
	if d.tcpLn != nil {
		d.serve("grpc tcp", func() error { return d.gsrv.Serve(d.tcpLn) })
	}
	if d.msrv != nil {
		d.serve("metrics", func() error { return d.msrv.Serve(d.metricsLn) })
	}
	d.log.Info("controld starting: reconciling its records with the runtime", "version", Version)
	return nil
}

// openRecordings opens the recordings, which live beside controld's
// records; the sandbox check goes through the manager once it exists
// (nothing records before serving).
func (d *controld) openRecordings(context.Context) (err error) {
	d.recs, err = recording.New(recording.Options{Dir: filepath.Join(d.cfg.StateDir, "recordings"), Log: d.log, Registerer: d.reg,
		GatewayHost: d.gwHost, GatewayTLS: d.serverTLS != nil,
		Routable: func(id string) error { _, err := d.mgr.Route(id); return err }})
	return err
}

// startManager starts the fleet, which reconciles its records with the
// runtime first. The gateway routes through the manager and the manager
// drops the gateway's connections before a freeze: the knot is tied
// through d.gateway, set before anything is served.
func (d *controld) startManager(ctx context.Context) error {
	cfg := d.cfg
	ram, err := config.HostRAM()
	if err != nil {
		return fmt.Errorf("controld: host RAM for admission.max_memory: %w", err)
	}
	mgr, err := fleet.New(ctx, fleet.Options{
		Runtime:       fleet.InstrumentRuntime(d.deps.Runtime, d.fm),
		Dialer:        d.deps.Dialer,
		Store:         d.st,
		Metrics:       d.fm,
		Tracer:        d.tr.Provider.Tracer("github.com/forkfleet/forkfleet/controld"),
		Logger:        d.log,
		Host:          d.host,
		GatewayHost:   d.gwHost,
		GatewayTLS:    d.serverTLS != nil,
		DefaultImage:  cfg.DefaultImage,
		DefaultScreen: &controldv1.Screen{Width: cfg.DefaultScreen.Width, Height: cfg.DefaultScreen.Height, Depth: cfg.DefaultScreen.Depth},
		CheckpointDir: cfg.CheckpointDir,
		BootTimeout:   cfg.BootTimeout.D(),
		FrameSettle:   cfg.FrameSettle.D(),
		WarmSlots:     cfg.Boot.Precreate,
		LazyMinBytes:  int64(cfg.Fork.LazyMinBytes),
		Limits:        cfg.HostLimits(ram),
		Health:        d.hc,
		Recordings:    d.recs,
		DropConnections: func(id string) {
			if n := d.gateway.DropSandbox(id); n > 0 {
				d.log.Info("closed gateway connections for a checkpoint", "sandbox", id, "connections", n)
			}
		},
	})
	if err != nil {
		return err
	}
	d.mgr = mgr
	d.undo = append(d.undo, func() {
		cctx, cancel := context.WithTimeout(context.Background(), cfg.ShutdownTimeout.D())
		defer cancel()
		mgr.Close(cctx)
	})
	return nil
}

// startGateway makes the ACI gateway over the manager and serves it.
func (d *controld) startGateway(context.Context) error {
	cfg := d.cfg
	d.reg.MustRegister(d.mgr.Collector())
	d.gateway = gateway.New(d.mgr, gateway.Options{
		Log: d.log,
		Limits: connlimit.Limits{
			HeaderTimeout: cfg.Gateway.HeaderTimeout.D(),
			IdleTimeout:   cfg.Gateway.IdleTimeout.D(),
			MaxHandshakes: cfg.Gateway.MaxHandshakes,
		},
		MaxSessions:  cfg.Gateway.MaxSessions,
		TLS:          d.serverTLS,
		Registerer:   d.reg,
		ViewSessions: filepath.Join(cfg.StateDir, "view-sessions.json"),
		Downloads:    d.recs,
	})
	d.recs.SetSource(d.gateway)
	d.gwServer = gateway.NewServer(d.gateway)
	d.serve("gateway", func() error { return d.gwServer.Serve(d.gwLn) })
	return nil
}

// announce opens the controld services and says so: health SERVING,
// /readyz 200, systemd READY=1.
func (d *controld) announce(context.Context) error {
	d.addrs = Addrs{Gateway: d.gwLn.Addr().String(), Token: d.token}
	if d.unixLn != nil {
		d.addrs.GRPCUnix = d.unixLn.Addr().String()
	}
	if d.tcpLn != nil {
		d.addrs.GRPCTCP = d.tcpLn.Addr().String()
	}
	if d.metricsLn != nil {
		d.addrs.Metrics = d.metricsLn.Addr().String()
	}
	d.log.Info("controld serving", "version", Version, "grpc_unix", d.addrs.GRPCUnix, "grpc_tcp", d.addrs.GRPCTCP,
		"gateway", d.addrs.Gateway, "metrics", d.addrs.Metrics, "host", d.host)
	d.gsrv.SetManager(d.mgr)
	d.hc.SetState(health.Serving)
	if err := sdNotify("READY=1\nSTATUS=serving"); err != nil {
		d.log.Warn("sd_notify READY", "err", err)
	}
	return nil
}

// startWatchdog pings systemd's watchdog while controld is healthy, when
// the unit asks for one.
func (d *controld) startWatchdog(ctx context.Context) error {
	wdCtx, stop := context.WithCancel(ctx)
	d.stopWatchdog = stop
	d.wdDone = make(chan struct{})
	if iv, err := watchdogInterval(os.Getenv); err != nil {
		d.log.Warn("systemd watchdog", "err", err)
		close(d.wdDone)
	} else if iv > 0 {
		d.log.Info("systemd watchdog on", "interval", iv)
		go func() { defer close(d.wdDone); watchdog(wdCtx, iv, d.hc, d.log) }()
	} else {
		close(d.wdDone)
	}
	return nil
}
