// Package client is the Go client of controld's gRPC API: sandboxes,
// checkpoints and forks, warm pools, and the way from a sandbox to its ACI
// session. Every error it returns is converted with errdefs.FromGRPC, so
// callers test errors.Is(err, errdefs.ErrNotFound) and read
// errdefs.Field(err) for invalid requests.
//
//	c, err := client.Dial(ctx, "") // unix:///run/forkfleet/controld.sock
//	sb, err := c.CreateSandbox(ctx, client.WithWaitReady())
//	s, err := sb.ACI(ctx)
//	ck, err := sb.Checkpoint(ctx)
//	replicas, err := ck.Fork(ctx, 4)
package client

import (
	"context"
	"crypto/rand"
	"crypto/tls"
	_ "embed"
	"errors"
	"fmt"
	"net"
	"os"
	"strings"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"

	"github.com/forkfleet/forkfleet/api/aci"
	"github.com/forkfleet/forkfleet/api/errdefs"
	"github.com/forkfleet/forkfleet/api/errdefs/errgrpc"
	controldv1 "github.com/forkfleet/forkfleet/api/gen/forkfleet/controld/v1"
	"github.com/forkfleet/forkfleet/api/internal/loopback"
)

// Defaults of a controld host.
const (
	DefaultAddress   = "unix:///run/forkfleet/controld.sock"
	DefaultTokenFile = "/var/lib/forkfleet/controld/api.token"
)

// Keepalive: with no frame from controld for KeepaliveTime the client
// pings, and drops a connection whose ping goes unanswered for
// KeepaliveTimeout (a controld host gone without a FIN, a NAT that forgot
// the flow), so calls fail over to a new connection instead of hanging.
// controld accepts pings this often (its keepalive enforcement allows half
// of KeepaliveTime).
const (
	KeepaliveTime    = 30 * time.Second
	KeepaliveTimeout = 10 * time.Second
)

// ServerKeepalive is the keepalive of a server of this API (controld, and
// the fake that stands in for it): it accepts the pings of KeepaliveTime,
// idle connections included (gRPC's default enforcement, one ping per 5
// minutes, answers them with GOAWAY "too_many_pings"), and pings idle
// clients itself to find dead peers of long watches.
func ServerKeepalive() []grpc.ServerOption {
	return []grpc.ServerOption{
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: KeepaliveTime / 2, PermitWithoutStream: true}),
		grpc.KeepaliveParams(keepalive.ServerParameters{Time: time.Minute, Timeout: 20 * time.Second}),
	}
}

// ServiceConfig (serviceconfig.json; the Python client carries the same) is
// the gRPC service config Dial applies: calls that are safe to repeat
// (reads, deletes, changes that end the same whatever the count, and the
// four creating calls, which carry a request id so that a repeat returns the
// first attempt's result: the client gives each call one) are retried on
// UNAVAILABLE (controld starting, restarting, or a dropped
// connection) up to 5 attempts with gRPC's jittered exponential backoff from
// 100 ms to 2 s; a retry throttle stops retrying when most calls fail.
// Callers with their own retry loop can pass grpc.WithDisableRetry through
// WithGRPCDialOptions.
//
//go:embed serviceconfig.json
var ServiceConfig string

// Client talks to one controld. It is safe for concurrent use.
type Client struct {
	conn        *grpc.ClientConn // nil for a client of many hosts
	router      *router          // a client of many hosts (DialHosts)
	sandboxes   controldv1.SandboxServiceClient
	checkpoints controldv1.CheckpointServiceClient
	pools       controldv1.PoolServiceClient
	hosts       controldv1.HostServiceClient
	aciOpts     []aci.DialOption
	// gatewayTLS is the TLS configuration for HTTPS requests to controld's
	// gateway (exposed ports): Dial's WithTLS; nil means system roots.
	gatewayTLS *tls.Config
}

// Option configures Dial.
type Option func(*dialOptions)

type dialOptions struct {
	token     string
	tokenSet  bool
	tokenFile string
	tls       *tls.Config
	insecure  bool
	grpcOpts  []grpc.DialOption
	aciOpts   []aci.DialOption
	// lookupHost resolves DialHosts' dns:/// targets.
	lookupHost func(ctx context.Context, host string) ([]string, error)
	// registry is the repository a client of many hosts pushes checkpoints
	// to for forks on other hosts.
	registry string
}

// WithCheckpointRegistry lets a client of many hosts (DialHosts) fork a
// checkpoint on every host with room: Checkpoint.Fork spreads the
// replicas as placement does, forks the checkpoint's own host's share
// locally, and gives the other hosts the checkpoint through repository, an
// OCI repository every controld can reach ("registry.example:5000/forkfleet/checkpoints"):
// pushed once per checkpoint (tag: its id), forked by digest, pulled once
// per host. Without it, a fork stays on the checkpoint's host.
func WithCheckpointRegistry(repository string) Option {
	return func(o *dialOptions) { o.registry = repository }
}

// WithLookupHost resolves the names of DialHosts' dns:/// targets with fn
// instead of the system resolver (net.Resolver.LookupHost's contract:
// addresses without ports).
func WithLookupHost(fn func(ctx context.Context, host string) ([]string, error)) Option {
	return func(o *dialOptions) { o.lookupHost = fn }
}

// WithToken sends token as a bearer credential on every RPC.
func WithToken(token string) Option {
	return func(o *dialOptions) { o.token, o.tokenSet = token, true }
}

// WithTokenFile reads the bearer token from path at Dial (trailing
// whitespace trimmed). Without WithToken or WithTokenFile, Dial uses
// DefaultTokenFile when it is readable.
func WithTokenFile(path string) Option {
	return func(o *dialOptions) { o.tokenFile = path }
}

// WithTLS uses TLS with cfg for TCP targets, and for the ACI sessions
// Sandbox.ACI opens through a gateway that serves TLS (wss://).
func WithTLS(cfg *tls.Config) Option {
	return func(o *dialOptions) { o.tls = cfg }
}

// WithInsecure allows a bearer token over plaintext TCP to a non-loopback
// address (loopback and unix sockets never need it), to controld and to its
// ACI gateway.
func WithInsecure() Option {
	return func(o *dialOptions) { o.insecure = true }
}

// WithGRPCDialOptions appends raw gRPC dial options (interceptors, a custom
// dialer, ...).
func WithGRPCDialOptions(opts ...grpc.DialOption) Option {
	return func(o *dialOptions) { o.grpcOpts = append(o.grpcOpts, opts...) }
}

// WithACIDialOptions sets ACI dial options applied to every Sandbox.ACI
// session of this client (e.g. aci.WithFrameCache with one cache for the
// whole fleet).
func WithACIDialOptions(opts ...aci.DialOption) Option {
	return func(o *dialOptions) { o.aciOpts = append(o.aciOpts, opts...) }
}

// Dial connects to controld at target: "unix:///path" (DefaultAddress when
// empty) or "host:port". The connection is established lazily; the first
// RPC reports an unreachable controld (errdefs.ErrUnavailable).
func Dial(ctx context.Context, target string, opts ...Option) (*Client, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if target == "" {
		target = DefaultAddress
	}
	o, err := newDialOptions(opts)
	if err != nil {
		return nil, err
	}
	conn, err := o.connect(target, "")
	if err != nil {
		return nil, err
	}
	c := NewFromConn(conn, o.sessionOptions()...)
	c.gatewayTLS = o.tls
	return c, nil
}

// newDialOptions applies opts and reads the token they name.
func newDialOptions(opts []Option) (*dialOptions, error) {
	var o dialOptions
	for _, fn := range opts {
		fn(&o)
	}
	switch {
	case o.tokenSet:
	case o.tokenFile != "":
		b, err := os.ReadFile(o.tokenFile)
		if err != nil {
			return nil, fmt.Errorf("client: token file: %w", err)
		}
		o.token = strings.TrimSpace(string(b))
	default:
		if b, err := os.ReadFile(DefaultTokenFile); err == nil {
			o.token = strings.TrimSpace(string(b))
		}
	}
	return &o, nil
}

// connect makes the (lazy) gRPC connection to one controld at target.
// serverName, when set, is the name TLS verifies instead of target's host
// (an address resolved from a DNS name: the certificate names the name).
func (o *dialOptions) connect(target, serverName string) (*grpc.ClientConn, error) {
	local, err := isLocalTarget(target)
	if err != nil {
		return nil, err
	}
	if o.token != "" && !local && o.tls == nil && !o.insecure {
		return nil, fmt.Errorf("client: %w: refusing to send a bearer token in plaintext to %s (use WithTLS, or WithInsecure on a trusted network)",
			errdefs.ErrInvalidArgument, target)
	}
	gopts := []grpc.DialOption{}
	if o.tls != nil && !strings.HasPrefix(target, "unix:") {
		cfg := o.tls
		if serverName != "" && cfg.ServerName == "" {
			cfg = cfg.Clone()
			cfg.ServerName = serverName
		}
		gopts = append(gopts, grpc.WithTransportCredentials(credentials.NewTLS(cfg)))
	} else {
		gopts = append(gopts, grpc.WithTransportCredentials(insecure.NewCredentials()))
	}
	if o.token != "" {
		gopts = append(gopts, grpc.WithPerRPCCredentials(bearer{
			token:      o.token,
			requireTLS: !local && !o.insecure && o.tls != nil,
		}))
	}
	gopts = append(gopts,
		grpc.WithChainUnaryInterceptor(setRequestID),
		grpc.WithDefaultServiceConfig(ServiceConfig),
		grpc.WithKeepaliveParams(keepalive.ClientParameters{Time: KeepaliveTime, Timeout: KeepaliveTimeout, PermitWithoutStream: true}),
	)
	gopts = append(gopts, o.grpcOpts...)
	conn, err := grpc.NewClient(target, gopts...)
	if err != nil {
		return nil, fmt.Errorf("client: %w: %v", errdefs.ErrInvalidArgument, err)
	}
	return conn, nil
}

// sessionOptions are the ACI dial options of the client's sessions. The
// gateway is controld's too: the same trust decisions apply to it (the
// caller's own ACI options come after and win).
func (o *dialOptions) sessionOptions() []aci.DialOption {
	var aciOpts []aci.DialOption
	if o.tls != nil {
		aciOpts = append(aciOpts, aci.WithTLSConfig(o.tls))
	}
	if o.insecure {
		aciOpts = append(aciOpts, aci.WithInsecure())
	}
	return append(aciOpts, o.aciOpts...)
}

// NewFromConn wraps an existing gRPC connection (the caller keeps owning
// it: Close closes it).
func NewFromConn(conn *grpc.ClientConn, aciOpts ...aci.DialOption) *Client {
	c := newFromConn(conn, aciOpts...)
	c.conn = conn
	return c
}

func newFromConn(conn grpc.ClientConnInterface, aciOpts ...aci.DialOption) *Client {
	return &Client{
		sandboxes:   controldv1.NewSandboxServiceClient(conn),
		checkpoints: controldv1.NewCheckpointServiceClient(conn),
		pools:       controldv1.NewPoolServiceClient(conn),
		hosts:       controldv1.NewHostServiceClient(conn),
		aciOpts:     aciOpts,
	}
}

// isLocalTarget reports whether traffic to target stays on this host (a unix
// socket or a loopback address), where plaintext is acceptable.
func isLocalTarget(target string) (bool, error) {
	if strings.HasPrefix(target, "unix:") || strings.HasPrefix(target, "unix-abstract:") {
		return true, nil
	}
	addr := target
	if i := strings.Index(addr, ":///"); i >= 0 {
		addr = addr[i+4:]
	}
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return false, fmt.Errorf("client: target %q: %w: want unix:///path or host:port", target, errdefs.ErrInvalidArgument)
	}
	return loopback.Host(host), nil
}

// setRequestID gives a creating call without a request id a fresh one
// before it is sent (and retried): a retry of CreateSandbox,
// CreateCheckpoint, ForkCheckpoint or ClaimPool then returns the first
// attempt's result, whether it came through this client's methods or its
// raw service clients.
func setRequestID(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
	if m, ok := req.(proto.Message); ok {
		if fd := m.ProtoReflect().Descriptor().Fields().ByName("request_id"); fd != nil && m.ProtoReflect().Get(fd).String() == "" {
			// A copy: a caller that sends one request message twice means
			// two calls.
			c := proto.Clone(m)
			c.ProtoReflect().Set(fd, protoreflect.ValueOfString(NewRequestID()))
			req = c
		}
	}
	return invoker(ctx, method, req, reply, cc, opts...)
}

// NewRequestID returns a fresh request id (a random UUID).
func NewRequestID() string {
	var b [16]byte
	rand.Read(b[:])
	b[6] = b[6]&0x0f | 0x40 // version 4
	b[8] = b[8]&0x3f | 0x80 // RFC 4122 variant
	return fmt.Sprintf("%x-%x-%x-%x-%x", b[0:4], b[4:6], b[6:8], b[8:10], b[10:16])
}

// bearer is a per-RPC "authorization: Bearer <token>" credential.
type bearer struct {
	token      string
	requireTLS bool
}

func (b bearer) GetRequestMetadata(context.Context, ...string) (map[string]string, error) {
	return map[string]string{"authorization": "Bearer " + b.token}, nil
}

func (b bearer) RequireTransportSecurity() bool { return b.requireTLS }

// Close closes the connections to controld. ACI sessions opened through
// the client are independent and stay open.
func (c *Client) Close() error {
	if c.router != nil {
		return c.router.Close()
	}
	return c.conn.Close()
}

// Conn returns the underlying gRPC connection; nil for a client of many
// hosts (DialHosts).
func (c *Client) Conn() *grpc.ClientConn { return c.conn }

// SandboxService, CheckpointService and PoolService expose the raw
// generated clients (errors from them are NOT converted). A client of many
// hosts routes their calls as its own methods'.
func (c *Client) SandboxService() controldv1.SandboxServiceClient       { return c.sandboxes }
func (c *Client) CheckpointService() controldv1.CheckpointServiceClient { return c.checkpoints }
func (c *Client) PoolService() controldv1.PoolServiceClient             { return c.pools }

// HostStatus reports controld's host: its name (what records' host fields
// say), memory, admitted sandboxes against its admission limits, and pools.
// A client of many hosts reports its first host's; Hosts reports all.
func (c *Client) HostStatus(ctx context.Context) (*controldv1.GetHostStatusResponse, error) {
	r, err := c.hosts.GetHostStatus(ctx, &controldv1.GetHostStatusRequest{})
	if err != nil {
		return nil, convert(ctx, err)
	}
	return r, nil
}

// convert maps an RPC error onto the errdefs classes. A context error of
// the caller stays a context error.
func convert(ctx context.Context, err error) error {
	if err == nil {
		return nil
	}
	ctxErr := ctx.Err()
	if ctxErr == nil {
		// gRPC enforces the deadline with its own timer, which can fire a
		// hair before the context's.
		if dl, ok := ctx.Deadline(); ok && !time.Now().Before(dl) && status.Code(err) == codes.DeadlineExceeded {
			ctxErr = context.DeadlineExceeded
		}
	}
	if ctxErr != nil && !errors.Is(err, ctxErr) {
		return fmt.Errorf("%w: %w", ctxErr, errgrpc.FromGRPC(err))
	}
	return errgrpc.FromGRPC(err)
}
