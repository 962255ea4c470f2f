// Package config holds controld's configuration: built-in defaults (an
// embedded TOML file), overridden by an optional file, then by flags.
package config

import (
	_ "embed"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	toml "github.com/pelletier/go-toml/v2"

	"github.com/forkfleet/forkfleet/api/screen"
)

//go:embed default.toml
var defaultTOML []byte

// Config is controld's effective configuration.
type Config struct {
	Host            string    `toml:"host"`
	StateDir        string    `toml:"state_dir"`
	CheckpointDir   string    `toml:"checkpoint_dir"`
	LayersDir       string    `toml:"layers_dir"`
	DefaultImage    string    `toml:"default_image"`
	BootTimeout     Duration  `toml:"boot_timeout"`
	ShutdownTimeout Duration  `toml:"shutdown_timeout"`
	FrameSettle     Duration  `toml:"frame_settle"`
	DefaultScreen   Screen    `toml:"default_screen"`
	Boot            Boot      `toml:"boot"`
	Fork            Fork      `toml:"fork"`
	Limits          Limits    `toml:"limits"`
	Admission       Admission `toml:"admission"`

	GRPC       GRPC       `toml:"grpc"`
	Gateway    Gateway    `toml:"gateway"`
	TLS        TLS        `toml:"tls"`
	Metrics    Metrics    `toml:"metrics"`
	Containerd Containerd `toml:"containerd"`
	Tracing    Tracing    `toml:"tracing"`
	Network    Network    `toml:"network"`
	UserNS     UserNS     `toml:"userns"`
	Registry   Registry   `toml:"registry"`
	Log        Log        `toml:"log"`
}

// UserNS configures the sandboxes' user namespaces (docs/security.md,
// "User namespaces").
type UserNS struct {
	// Enabled runs every sandbox in a user namespace of its own, mapped to
	// a range of host ids no other sandbox holds (from the subordinate ids
	// of "forkfleet" in /etc/subuid and /etc/subgid); false: sandboxes run
	// in the host's user namespace, root in a sandbox is root on the host.
	Enabled bool `toml:"enabled"`
}

// Log configures controld's own log (stderr; the journal under systemd).
type Log struct {
	// Level: debug, info, warn or error. At debug, CRIU's dump logs are
	// verbose too (level 4; 2 otherwise).
	Level string `toml:"level"`
	// Format: text (logfmt) or json, one record per line.
	Format string `toml:"format"`
}

// SlogLevel parses Level.
func (l Log) SlogLevel() (slog.Level, error) {
	var v slog.Level
	if err := v.UnmarshalText([]byte(l.Level)); err != nil {
		return 0, fmt.Errorf("log.level %q: debug, info, warn or error", l.Level)
	}
	return v, nil
}

// Network configures sandbox networks (see controld/docs/networking.md).
type Network struct {
	// RunDir holds the sandboxes' namespace bind mounts and state (tmpfs).
	RunDir string `toml:"run_dir"`
	// Table is the host's nftables table (family inet) controld owns;
	// IfPrefix starts its host-side interface names; UplinkCIDR is split
	// into one /30 uplink per egress sandbox.
	Table      string `toml:"table"`
	IfPrefix   string `toml:"if_prefix"`
	UplinkCIDR string `toml:"uplink_cidr"`
	// MTU of the sandbox links; 0: the host's default route's.
	MTU int `toml:"mtu"`
	// DNSUpstream are the resolvers ("ip" or "ip:port") the sandboxes' DNS
	// stub forwards to; empty: /etc/resolv.conf's.
	DNSUpstream []string `toml:"dns_upstream"`
}

// Screen is a default display geometry.
type Screen struct {
	Width  uint32 `toml:"width"`
	Height uint32 `toml:"height"`
	Depth  uint32 `toml:"depth"`
}

// Boot configures how sandboxes boot.
type Boot struct {
	// Precreate is how many sandboxes of the default image, screen and
	// resources are kept created but not started (warm slots), so a
	// matching create only starts one; 0 disables.
	Precreate int `toml:"precreate"`
}

// Fork configures forks of checkpoints.
type Fork struct {
	// LazyMinBytes: a fork in restore mode AUTO restores lazily when its
	// checkpoint leaves at least this much memory to the page server (and
	// the host can: docs/controld.md "Lazy restore"); 0: AUTO is eager.
	LazyMinBytes Size `toml:"lazy_min_bytes"`
}

// MaxPrecreate bounds boot.precreate: each slot holds a shim, a runc init
// and a snapshot.
const MaxPrecreate = 16

// GRPC configures the API listeners.
type GRPC struct {
	UnixSocket string `toml:"unix_socket"`
	TCPAddress string `toml:"tcp_address"`
	TokenFile  string `toml:"token_file"`
}

// Gateway configures the ACI WebSocket gateway.
type Gateway struct {
	Listen    string `toml:"listen"`
	Advertise string `toml:"advertise"`
	// HeaderTimeout bounds an upgrade request's headers (and its TLS
	// handshake); IdleTimeout a keep-alive connection between requests.
	HeaderTimeout Duration `toml:"header_timeout"`
	IdleTimeout   Duration `toml:"idle_timeout"`
	// MaxHandshakes caps connections not upgraded yet (the oldest is
	// closed past it); MaxSessions caps spliced ACI sessions.
	MaxHandshakes int `toml:"max_handshakes"`
	MaxSessions   int `toml:"max_sessions"`
}

// TLS configures the TCP listeners that carry bearer tokens: the gRPC TCP
// listener and the ACI gateway.
type TLS struct {
	// CertFile and KeyFile (PEM) turn TLS on for both; set both or neither.
	// They are read again when they change, so a renewed certificate needs
	// no restart.
	CertFile string `toml:"cert_file"`
	KeyFile  string `toml:"key_file"`
	// ClientCAFile (PEM), when set, makes both require a client
	// certificate signed by one of its CAs (mutual TLS) in addition to the
	// bearer token.
	ClientCAFile string `toml:"client_ca_file"`
	// AllowPlaintextRemote permits a plaintext gRPC TCP or gateway listener
	// on a non-loopback address, where bearer tokens cross the network in
	// the clear. Off, such a configuration is refused.
	AllowPlaintextRemote bool `toml:"allow_plaintext_remote"`
}

// Enabled reports whether the TCP listeners serve TLS.
func (t TLS) Enabled() bool { return t.CertFile != "" }

// Metrics configures the Prometheus endpoint.
type Metrics struct {
	Listen string `toml:"listen"`
}

// minPartSize bounds registry.part_size from below: smaller parts buy a
// cut push little and cost a request each.
const minPartSize = 64 << 10

// Registry says how checkpoints reach OCI registries (default.toml).
type Registry struct {
	DockerConfig string   `toml:"docker_config"`
	PlainHTTP    []string `toml:"plain_http"`
	PartSize     Size     `toml:"part_size"`
}

// Containerd says where the runtime's containerd is.
type Containerd struct {
	Address   string `toml:"address"`
	Namespace string `toml:"namespace"`
	// CgroupParent holds every sandbox's cgroup (<parent>/<id>, cgroup v1
	// cgroupfs): a second controld on the host (a benchmark's, benchd/ab.sh)
	// keeps its sandboxes' cgroups apart with its own.
	CgroupParent string `toml:"cgroup_parent"`
}

// Tracing configures OpenTelemetry export (see default.toml; the standard
// OTEL_* variables apply, ApplyEnv).
type Tracing struct {
	// OTLPEndpoint: "https://host:port", "http://host:port" or "host:port".
	OTLPEndpoint string `toml:"otlp_endpoint"`
	// OTLPProtocol: "grpc" or "http/protobuf"; empty: grpc.
	OTLPProtocol string `toml:"otlp_protocol"`
	// OTLPInsecure: plaintext to an endpoint without a scheme.
	OTLPInsecure bool   `toml:"otlp_insecure"`
	ServiceName  string `toml:"service_name"`
}

// Duration is a time.Duration written as "1.5s" in TOML.
type Duration time.Duration

// D returns the duration as a time.Duration.
func (d Duration) D() time.Duration { return time.Duration(d) }

// MarshalText implements encoding.TextMarshaler.
func (d Duration) MarshalText() ([]byte, error) { return []byte(time.Duration(d).String()), nil }

// UnmarshalText implements encoding.TextUnmarshaler.
func (d *Duration) UnmarshalText(b []byte) error {
	v, err := time.ParseDuration(string(b))
	if err != nil {
		return err
	}
	*d = Duration(v)
	return nil
}

// Default returns the built-in configuration.
func Default() *Config {
	var c Config
	if err := decode(defaultTOML, &c); err != nil {
		// The embedded file is part of the binary; a broken one is a build bug.
		panic(fmt.Sprintf("config: embedded default.toml: %v", err))
	}
	return &c
}

func decode(b []byte, c *Config) error {
	d := toml.NewDecoder(strings.NewReader(string(b)))
	d.DisallowUnknownFields()
	return d.Decode(c)
}

// LoadFile overlays the TOML file at path onto c: keys absent from the file
// keep their current values.
func (c *Config) LoadFile(path string) error {
	b, err := os.ReadFile(path)
	if err != nil {
		return fmt.Errorf("config: %w", err)
	}
	if err := decode(b, c); err != nil {
		return fmt.Errorf("config %s: %w", path, err)
	}
	return nil
}

// ApplyEnv applies the environment variables controld honours: OpenTelemetry's
// standard ones for traces (the signal-specific variable before the general
// one; OTEL_SDK_DISABLED=true or OTEL_TRACES_EXPORTER=none turn traces off)
// and forkfleet's for containerd.
func (c *Config) ApplyEnv(getenv func(string) string) error {
	otel := func(name string) string {
		if v := getenv("OTEL_EXPORTER_OTLP_TRACES_" + name); v != "" {
			return v
		}
		return getenv("OTEL_EXPORTER_OTLP_" + name)
	}
	if v := otel("ENDPOINT"); v != "" {
		c.Tracing.OTLPEndpoint = v
	}
	if v := otel("PROTOCOL"); v != "" {
		c.Tracing.OTLPProtocol = v
	}
	if v := otel("INSECURE"); v != "" {
		b, err := strconv.ParseBool(v)
		if err != nil {
			return fmt.Errorf("OTEL_EXPORTER_OTLP_INSECURE=%q: %w", v, err)
		}
		c.Tracing.OTLPInsecure = b
	}
	if v := getenv("OTEL_SERVICE_NAME"); v != "" {
		c.Tracing.ServiceName = v
	}
	switch v := getenv("OTEL_TRACES_EXPORTER"); v {
	case "", "otlp":
	case "none":
		c.Tracing.OTLPEndpoint = ""
	default:
		return fmt.Errorf("OTEL_TRACES_EXPORTER=%q: controld exports traces with otlp (or none)", v)
	}
	if v := getenv("OTEL_SDK_DISABLED"); strings.EqualFold(v, "true") {
		c.Tracing.OTLPEndpoint = ""
	}
	if v := getenv("FORKFLEET_CONTAINERD_NAMESPACE"); v != "" {
		c.Containerd.Namespace = v
	}
	if v := getenv("FORKFLEET_CONTAINERD_ADDRESS"); v != "" {
		c.Containerd.Address = v
	}
	return nil
}

// Marshal renders c as TOML.
func (c *Config) Marshal() ([]byte, error) { return toml.Marshal(c) }

// Validate checks the configuration for values controld cannot run with.
func (c *Config) Validate() error {
	var errs []error
	if !filepath.IsAbs(c.StateDir) {
		errs = append(errs, fmt.Errorf("state_dir %q: must be an absolute path", c.StateDir))
	}
	if !filepath.IsAbs(c.CheckpointDir) {
		errs = append(errs, fmt.Errorf("checkpoint_dir %q: must be an absolute path", c.CheckpointDir))
	}
	if !filepath.IsAbs(c.LayersDir) {
		errs = append(errs, fmt.Errorf("layers_dir %q: must be an absolute path (every sandbox has a disk quota)", c.LayersDir))
	}
	if c.DefaultImage == "" {
		errs = append(errs, errors.New("default_image: must be set"))
	}
	if c.Registry.PartSize < minPartSize {
		errs = append(errs, fmt.Errorf("registry.part_size %d: must be at least %d (64KiB)", c.Registry.PartSize, minPartSize))
	}
	if c.Registry.DockerConfig != "" && !filepath.IsAbs(c.Registry.DockerConfig) {
		errs = append(errs, fmt.Errorf("registry.docker_config %q: must be an absolute path", c.Registry.DockerConfig))
	}
	if c.BootTimeout.D() <= 0 {
		errs = append(errs, errors.New("boot_timeout: must be positive"))
	}
	if c.ShutdownTimeout.D() <= 0 {
		errs = append(errs, errors.New("shutdown_timeout: must be positive"))
	}
	if c.FrameSettle.D() <= 0 || c.FrameSettle.D() > 3*time.Second {
		errs = append(errs, errors.New("frame_settle: must be positive and at most 3s"))
	}
	if c.Fork.LazyMinBytes < 0 {
		errs = append(errs, errors.New("fork.lazy_min_bytes: must not be negative"))
	}
	if c.Boot.Precreate < 0 || c.Boot.Precreate > MaxPrecreate {
		errs = append(errs, fmt.Errorf("boot.precreate %d: must be in 0..%d", c.Boot.Precreate, MaxPrecreate))
	}
	if err := c.HostLimits(1 << 40).Validate(); err != nil {
		errs = append(errs, fmt.Errorf("limits, admission: %w", err))
	}
	if !filepath.IsAbs(c.Network.RunDir) {
		errs = append(errs, fmt.Errorf("network.run_dir %q: must be an absolute path", c.Network.RunDir))
	}
	if _, err := netip.ParsePrefix(c.Network.UplinkCIDR); err != nil {
		errs = append(errs, fmt.Errorf("network.uplink_cidr: %v", err))
	}
	if _, err := c.Network.Upstreams(); err != nil {
		errs = append(errs, err)
	}
	if c.Network.MTU != 0 && (c.Network.MTU < 576 || c.Network.MTU > 65535) {
		errs = append(errs, fmt.Errorf("network.mtu %d: 0 (the host's) or 576..65535", c.Network.MTU))
	}
	if d := c.DefaultScreen; !screen.EdgeOK(int(d.Width)) || !screen.EdgeOK(int(d.Height)) || !screen.DepthOK(int(d.Depth)) {
		errs = append(errs, fmt.Errorf("default_screen %dx%dx%d: width and height %d..%d, depth %d (or 0)",
			d.Width, d.Height, d.Depth, screen.MinEdge, screen.MaxEdge, screen.Depth))
	}
	if c.GRPC.UnixSocket == "" && c.GRPC.TCPAddress == "" {
		errs = append(errs, errors.New("grpc: at least one of unix_socket and tcp_address must be set"))
	}
	for name, addr := range map[string]string{
		"grpc.tcp_address": c.GRPC.TCPAddress, "gateway.listen": c.Gateway.Listen,
		"metrics.listen": c.Metrics.Listen, "gateway.advertise": c.Gateway.Advertise,
	} {
		if addr == "" {
			continue
		}
		if _, _, err := net.SplitHostPort(addr); err != nil {
			errs = append(errs, fmt.Errorf("%s %q: %v", name, addr, err))
		}
	}
	if c.Gateway.Listen == "" {
		errs = append(errs, errors.New("gateway.listen: must be set (endpoints point at it)"))
	}
	if c.Gateway.HeaderTimeout.D() <= 0 || c.Gateway.IdleTimeout.D() <= 0 {
		errs = append(errs, errors.New("gateway.header_timeout, gateway.idle_timeout: must be positive"))
	}
	if c.Gateway.MaxHandshakes <= 0 || c.Gateway.MaxSessions <= 0 {
		errs = append(errs, errors.New("gateway.max_handshakes, gateway.max_sessions: must be positive"))
	}
	if (c.TLS.CertFile == "") != (c.TLS.KeyFile == "") {
		errs = append(errs, errors.New("tls.cert_file, tls.key_file: set both or neither"))
	}
	if c.TLS.ClientCAFile != "" && !c.TLS.Enabled() {
		errs = append(errs, errors.New("tls.client_ca_file: needs tls.cert_file and tls.key_file"))
	}
	if !c.TLS.Enabled() && !c.TLS.AllowPlaintextRemote {
		for _, l := range []struct{ name, addr string }{{"grpc.tcp_address", c.GRPC.TCPAddress}, {"gateway.listen", c.Gateway.Listen}} {
			if l.addr != "" && !loopbackBind(l.addr) {
				errs = append(errs, fmt.Errorf("%s %q: a plaintext listener off the loopback sends bearer tokens in the clear: "+
					"set tls.cert_file and tls.key_file, or tls.allow_plaintext_remote = true on a trusted network", l.name, l.addr))
			}
		}
	}
	if c.Containerd.Namespace == "" {
		errs = append(errs, errors.New("containerd.namespace: must be set"))
	}
	if !filepath.IsAbs(c.Containerd.CgroupParent) || filepath.Clean(c.Containerd.CgroupParent) == "/" {
		errs = append(errs, fmt.Errorf("containerd.cgroup_parent %q: an absolute path below /", c.Containerd.CgroupParent))
	}
	if _, err := c.Log.SlogLevel(); err != nil {
		errs = append(errs, err)
	}
	if c.Log.Format != "text" && c.Log.Format != "json" {
		errs = append(errs, fmt.Errorf("log.format %q: text or json", c.Log.Format))
	}
	switch c.Tracing.OTLPProtocol {
	case "", "grpc", "http/protobuf":
	default:
		errs = append(errs, fmt.Errorf("tracing.otlp_protocol %q: grpc or http/protobuf", c.Tracing.OTLPProtocol))
	}
	if e := c.Tracing.OTLPEndpoint; strings.Contains(e, "://") && !strings.HasPrefix(e, "http://") && !strings.HasPrefix(e, "https://") {
		errs = append(errs, fmt.Errorf("tracing.otlp_endpoint %q: https://host:port, http://host:port or host:port", e))
	}
	return errors.Join(errs...)
}

// loopbackBind reports whether a listen address binds the loopback only:
// "localhost" or a loopback IP. An empty host (every interface) or any other
// name is not.
func loopbackBind(addr string) bool {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return false
	}
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// GatewayHost returns the host:port that endpoint URLs name.
func (c *Config) GatewayHost() string {
	if c.Gateway.Advertise != "" {
		return c.Gateway.Advertise
	}
	return c.Gateway.Listen
}

// TokenPath returns where the generated API token lives.
func (c *Config) TokenPath() string { return filepath.Join(c.StateDir, "api.token") }

// DefaultFile is the configuration file controld reads when --config is
// not given; when it does not exist the built-in defaults apply.
var DefaultFile = "/etc/forkfleet/controld.toml"

// Flags binds command-line overrides for c to fs. Parse fs after loading the
// file; use LoadArgs for the whole sequence.
type Flags struct {
	// ConfigFile is the file read: --config, or DefaultFile when it exists
	// (empty: none, built-in defaults).
	ConfigFile  string
	PrintConfig bool
	// Flags of the process rather than of the daemon's configuration.
	Version bool
}

// LoadArgs builds the effective configuration from defaults, the file named
// by --config (DefaultFile when it exists and --config is not given), the
// environment and flags, in that order.
func LoadArgs(args []string, getenv func(string) string) (*Config, *Flags, error) {
	c := Default()
	var f Flags
	fs := flag.NewFlagSet("controld", flag.ContinueOnError)
	fs.StringVar(&f.ConfigFile, "config", "", "TOML config file overriding the built-in defaults (default "+DefaultFile+" when it exists)")
	fs.BoolVar(&f.Version, "version", false, "print the version and exit")
	fs.BoolVar(&f.PrintConfig, "print-config", false, "print the effective configuration and exit")
	// Overrides are collected first and applied after the file, so a flag
	// beats the file whatever the argument order.
	overrides := map[string]*string{}
	for _, name := range []string{
		"host", "state-dir", "checkpoint-dir", "layers-dir", "default-image", "boot-timeout", "shutdown-timeout",
		"grpc-unix", "grpc-tcp", "token-file", "gateway-listen", "gateway-advertise", "metrics-listen",
		"containerd-address", "containerd-namespace", "otlp-endpoint", "boot-precreate",
		"tls-cert", "tls-key", "tls-client-ca", "allow-plaintext-remote", "log-level", "log-format",
	} {
		overrides[name] = new(string)
		fs.Func(name, flagUsage[name], func(v string) error { *overrides[name] = v; return nil })
	}
	// fs.Func closes over name per iteration (Go >= 1.22 loop semantics).
	if err := fs.Parse(args); err != nil {
		return nil, nil, err
	}
	if fs.NArg() > 0 {
		return nil, nil, fmt.Errorf("unexpected arguments: %q", fs.Args())
	}
	if f.ConfigFile == "" && DefaultFile != "" {
		// Only a missing default file means "defaults": one that exists but
		// cannot be read is an error, as is a missing --config file.
		if _, err := os.Stat(DefaultFile); err == nil || !errors.Is(err, os.ErrNotExist) {
			f.ConfigFile = DefaultFile
		}
	}
	if f.ConfigFile != "" {
		if err := c.LoadFile(f.ConfigFile); err != nil {
			return nil, nil, err
		}
	}
	if err := c.ApplyEnv(getenv); err != nil {
		return nil, nil, err
	}
	set := map[string]bool{}
	fs.Visit(func(fl *flag.Flag) { set[fl.Name] = true })
	str := func(name string, dst *string) {
		if set[name] {
			*dst = *overrides[name]
		}
	}
	dur := func(name string, dst *Duration) error {
		if !set[name] {
			return nil
		}
		return dst.UnmarshalText([]byte(*overrides[name]))
	}
	str("host", &c.Host)
	str("state-dir", &c.StateDir)
	str("checkpoint-dir", &c.CheckpointDir)
	str("layers-dir", &c.LayersDir)
	str("default-image", &c.DefaultImage)
	str("grpc-unix", &c.GRPC.UnixSocket)
	str("grpc-tcp", &c.GRPC.TCPAddress)
	str("token-file", &c.GRPC.TokenFile)
	str("gateway-listen", &c.Gateway.Listen)
	str("gateway-advertise", &c.Gateway.Advertise)
	str("metrics-listen", &c.Metrics.Listen)
	str("containerd-address", &c.Containerd.Address)
	str("containerd-namespace", &c.Containerd.Namespace)
	str("otlp-endpoint", &c.Tracing.OTLPEndpoint)
	str("tls-cert", &c.TLS.CertFile)
	str("tls-key", &c.TLS.KeyFile)
	str("tls-client-ca", &c.TLS.ClientCAFile)
	str("log-level", &c.Log.Level)
	str("log-format", &c.Log.Format)
	if set["allow-plaintext-remote"] {
		v, err := strconv.ParseBool(*overrides["allow-plaintext-remote"])
		if err != nil {
			return nil, nil, fmt.Errorf("-allow-plaintext-remote: %w", err)
		}
		c.TLS.AllowPlaintextRemote = v
	}
	if set["boot-precreate"] {
		n, err := strconv.Atoi(*overrides["boot-precreate"])
		if err != nil {
			return nil, nil, fmt.Errorf("-boot-precreate: %w", err)
		}
		c.Boot.Precreate = n
	}
	if err := dur("boot-timeout", &c.BootTimeout); err != nil {
		return nil, nil, fmt.Errorf("-boot-timeout: %w", err)
	}
	if err := dur("shutdown-timeout", &c.ShutdownTimeout); err != nil {
		return nil, nil, fmt.Errorf("-shutdown-timeout: %w", err)
	}
	if err := c.Validate(); err != nil {
		return nil, nil, err
	}
	return c, &f, nil
}

var flagUsage = map[string]string{
	"host":                   "host name reported in Sandbox.host (default: kernel hostname)",
	"state-dir":              "directory of controld's state (store, generated token)",
	"checkpoint-dir":         "directory of checkpoint images",
	"layers-dir":             "btrfs with quotas holding the sandboxes' writable layers",
	"default-image":          "image of sandboxes created without one",
	"boot-timeout":           "request-to-usable limit of a boot, e.g. 60s",
	"shutdown-timeout":       "how long shutdown waits for in-flight calls",
	"grpc-unix":              "gRPC unix socket path (empty: none)",
	"grpc-tcp":               "gRPC TCP address, bearer-token protected (empty: none)",
	"token-file":             "API token file read when present",
	"gateway-listen":         "ACI gateway listen address",
	"gateway-advertise":      "host:port of the gateway in endpoint URLs",
	"metrics-listen":         "Prometheus /metrics listen address (empty: none)",
	"containerd-address":     "containerd socket",
	"containerd-namespace":   "containerd namespace",
	"otlp-endpoint":          "OTLP/gRPC traces endpoint (empty: traces off)",
	"boot-precreate":         "sandboxes of the default spec kept precreated (warm slots; 0: off)",
	"tls-cert":               "PEM certificate chain of the gRPC TCP listener and the gateway (TLS on)",
	"tls-key":                "PEM private key of tls-cert",
	"tls-client-ca":          "PEM CA bundle: TCP clients must present a certificate it signed (mutual TLS)",
	"allow-plaintext-remote": "true: allow plaintext gRPC TCP / gateway listeners on non-loopback addresses",
	"log-level":              "debug, info, warn or error (debug: CRIU's dump logs at level 4 too)",
	"log-format":             "text or json",
}

// Upstreams parses DNSUpstream (port 53 when none is given).
func (n Network) Upstreams() ([]netip.AddrPort, error) {
	var out []netip.AddrPort
	for _, s := range n.DNSUpstream {
		if ap, err := netip.ParseAddrPort(s); err == nil {
			out = append(out, ap)
			continue
		}
		a, err := netip.ParseAddr(s)
		if err != nil {
			return nil, fmt.Errorf("network.dns_upstream %q: not an address or address:port", s)
		}
		out = append(out, netip.AddrPortFrom(a, 53))
	}
	return out, nil
}
