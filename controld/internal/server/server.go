// Package server exposes the fleet Manager as controld's four gRPC
// services, with grpc.health.v1 and server reflection beside them. Errors
// are converted to gRPC status (with BadRequest/ErrorInfo details) exactly
// once, in an interceptor; handlers return domain errors.
package server

import (
	"context"
	"crypto/subtle"
	"strings"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/contrib/instrumentation/google.golang.org/grpc/otelgrpc"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/reflection"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/forkfleet/forkfleet/api/client"
	"github.com/forkfleet/forkfleet/api/errdefs"
	"github.com/forkfleet/forkfleet/api/errdefs/errgrpc"
	controldv1 "github.com/forkfleet/forkfleet/api/gen/forkfleet/controld/v1"
	"github.com/forkfleet/forkfleet/controld/internal/fleet"
)

// Options configure the gRPC server.
type Options struct {
	// Token is required as "authorization: Bearer <token>" from TCP peers.
	// Unix-socket peers are trusted (the socket's permissions guard it).
	// grpc.health.v1 answers without it (probes carry no token; health says
	// nothing about sandboxes).
	Token          string
	TracerProvider trace.TracerProvider // nil: global
	Registerer     prometheus.Registerer
	// Version is reported by GetHostStatus.
	Version string
}

// Server is controld's gRPC server: the four controld services,
// grpc.health.v1 and server reflection. It serves from the start, before
// the manager exists: health answers NOT_SERVING and the controld services
// UNAVAILABLE (reason STARTING) until SetManager, after startup
// reconciliation.
type Server struct {
	*grpc.Server
	h      *handlers
	health *healthService
}

// healthService is grpc's health server whose Watch streams end once they
// have told their client NOT_SERVING at shutdown: a load balancer's open
// watch would otherwise hold the graceful stop until its deadline.
type healthService struct {
	*health.Server
	stopping atomic.Bool
}

func (h *healthService) Watch(req *healthpb.HealthCheckRequest, stream healthpb.Health_WatchServer) error {
	ctx, cancel := context.WithCancel(stream.Context())
	defer cancel()
	return h.Server.Watch(req, &endingWatch{Health_WatchServer: stream, ctx: ctx, cancel: cancel, h: h})
}

// Stopping reports NOT_SERVING from now on and ends every watch after it
// delivered that.
func (h *healthService) Stopping() {
	h.stopping.Store(true)
	h.Server.Shutdown()
}

type endingWatch struct {
	healthpb.Health_WatchServer
	ctx    context.Context
	cancel context.CancelFunc
	h      *healthService
}

func (w *endingWatch) Context() context.Context { return w.ctx }

func (w *endingWatch) Send(r *healthpb.HealthCheckResponse) error {
	err := w.Health_WatchServer.Send(r)
	if r.GetStatus() == healthpb.HealthCheckResponse_NOT_SERVING && w.h.stopping.Load() {
		w.cancel() // the watch returns: its last word was NOT_SERVING
	}
	return err
}

// The services whose health grpc.health.v1 reports ("" is the server's).
var services = []string{
	"", controldv1.SandboxService_ServiceDesc.ServiceName, controldv1.CheckpointService_ServiceDesc.ServiceName,
	controldv1.PoolService_ServiceDesc.ServiceName, controldv1.HostService_ServiceDesc.ServiceName,
}

// New returns a gRPC server with every service registered, not serving
// the controld services yet (SetManager).
func New(opts Options) *Server {
	met := newMetrics(opts.Registerer)
	var otelOpts []otelgrpc.Option
	if opts.TracerProvider != nil {
		otelOpts = append(otelOpts, otelgrpc.WithTracerProvider(opts.TracerProvider))
	}
	a := auth{token: opts.Token}
	h := &handlers{}
	s := grpc.NewServer(append(client.ServerKeepalive(),
		grpc.StatsHandler(otelgrpc.NewServerHandler(otelOpts...)),
		// Outermost first: metrics see the final code, errors are converted
		// once, auth runs before any handler, and no controld handler runs
		// before the manager is there.
		grpc.ChainUnaryInterceptor(met.unary, errorsUnary, a.unary, h.readyUnary),
		grpc.ChainStreamInterceptor(met.stream, errorsStream, a.stream, h.readyStream),
	)...)
	controldv1.RegisterSandboxServiceServer(s, h)
	controldv1.RegisterCheckpointServiceServer(s, checkpoints{h: h})
	controldv1.RegisterPoolServiceServer(s, pools{h: h})
	controldv1.RegisterHostServiceServer(s, hosts{h: h, version: opts.Version})
	hs := &healthService{Server: health.NewServer()}
	for _, name := range services {
		hs.SetServingStatus(name, healthpb.HealthCheckResponse_NOT_SERVING)
	}
	healthpb.RegisterHealthServer(s, hs)
	reflection.Register(s)
	return &Server{Server: s, h: h, health: hs}
}

// SetManager starts serving the controld services through m and reports
// SERVING: call it once, after startup reconciliation.
func (s *Server) SetManager(m *fleet.Manager) {
	s.h.m.Store(m)
	for _, name := range services {
		s.health.SetServingStatus(name, healthpb.HealthCheckResponse_SERVING)
	}
}

// Stopping reports NOT_SERVING to every health check and watch from now on
// (shutdown began) and ends the watches once they have seen it.
func (s *Server) Stopping() { s.health.Stopping() }

// --- errors ---

func errorsUnary(ctx context.Context, req any, _ *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	resp, err := handler(ctx, req)
	return resp, errgrpc.ToGRPC(err)
}

func errorsStream(srv any, ss grpc.ServerStream, _ *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
	return errgrpc.ToGRPC(handler(srv, ss))
}

// --- auth ---

type auth struct{ token string }

func (a auth) check(ctx context.Context) error {
	if p, ok := peer.FromContext(ctx); ok && p.Addr != nil && p.Addr.Network() == "unix" {
		return nil
	}
	if a.token == "" {
		return errdefs.WithReason(errdefs.ErrUnauthenticated, "NO_TOKEN_CONFIGURED", "TCP access needs a configured API token")
	}
	md, _ := metadata.FromIncomingContext(ctx)
	for _, v := range md.Get("authorization") {
		scheme, tok, found := strings.Cut(v, " ")
		if found && strings.EqualFold(scheme, "bearer") && subtle.ConstantTimeCompare([]byte(tok), []byte(a.token)) == 1 {
			return nil
		}
	}
	return errdefs.WithReason(errdefs.ErrUnauthenticated, "BAD_TOKEN", "missing or invalid bearer token")
}

// healthPrefix is grpc.health.v1's method prefix: probes (Kubernetes,
// grpc_health_probe, load balancers) carry no token.
const healthPrefix = "/grpc.health.v1.Health/"

func (a auth) unary(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	if strings.HasPrefix(info.FullMethod, healthPrefix) {
		return handler(ctx, req)
	}
	if err := a.check(ctx); err != nil {
		return nil, err
	}
	return handler(ctx, req)
}

func (a auth) stream(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
	if strings.HasPrefix(info.FullMethod, healthPrefix) {
		return handler(srv, ss)
	}
	if err := a.check(ss.Context()); err != nil {
		return err
	}
	return handler(srv, ss)
}

// --- metrics ---

// metrics: one histogram of every call by method and code. Errors are its
// series with code != "OK" (sum by (code) (rate(..._count{code!="OK"}))); a
// separate error counter would only repeat its count.
type metrics struct {
	latency *prometheus.HistogramVec
}

func newMetrics(reg prometheus.Registerer) *metrics {
	m := &metrics{
		latency: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: "forkfleet", Subsystem: "controld", Name: "api_request_seconds",
			Help:    "gRPC API calls by method and code (errors: code != OK), and their latency.",
			Buckets: prometheus.ExponentialBuckets(0.0001, 2, 20),
		}, []string{"method", "code"}),
	}
	if reg != nil {
		reg.MustRegister(m.latency)
	}
	return m
}

func (m *metrics) observe(method string, start time.Time, err error) {
	m.latency.WithLabelValues(method, errgrpc.Code(err).String()).Observe(time.Since(start).Seconds())
}

func (m *metrics) unary(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	start := time.Now()
	resp, err := handler(ctx, req)
	m.observe(info.FullMethod, start, err)
	return resp, err
}

func (m *metrics) stream(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
	start := time.Now()
	err := handler(srv, ss)
	m.observe(info.FullMethod, start, err)
	return err
}

// --- handlers ---

// handlers implements SandboxService; checkpoints and pools wrap it for
// the other two services (their method sets differ).
type handlers struct {
	controldv1.UnimplementedSandboxServiceServer
	m atomic.Pointer[fleet.Manager] // nil until SetManager
}

// mgr is the manager; the ready interceptors guarantee it is set.
func (h *handlers) mgr() *fleet.Manager { return h.m.Load() }

// controldService reports whether method belongs to one of controld's own
// services (health and reflection answer from the start).
func controldService(method string) bool { return strings.HasPrefix(method, "/forkfleet.controld.") }

func errStarting() error {
	return errdefs.WithReason(errdefs.ErrUnavailable, "STARTING", "controld is starting (reconciling its records with the runtime); retry shortly")
}

func (h *handlers) readyUnary(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	if controldService(info.FullMethod) && h.m.Load() == nil {
		return nil, errStarting()
	}
	return handler(ctx, req)
}

func (h *handlers) readyStream(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
	if controldService(info.FullMethod) && h.m.Load() == nil {
		return errStarting()
	}
	return handler(srv, ss)
}

func (h *handlers) CreateSandbox(ctx context.Context, req *controldv1.CreateSandboxRequest) (*controldv1.CreateSandboxResponse, error) {
	s, ep, err := h.mgr().CreateSandbox(ctx, req)
	if err != nil {
		return nil, err
	}
	return &controldv1.CreateSandboxResponse{Sandbox: s, Endpoint: ep}, nil
}

func (h *handlers) GetSandbox(ctx context.Context, req *controldv1.GetSandboxRequest) (*controldv1.GetSandboxResponse, error) {
	s, err := h.mgr().GetSandbox(ctx, req.GetId())
	if err != nil {
		return nil, err
	}
	return &controldv1.GetSandboxResponse{Sandbox: s}, nil
}

func (h *handlers) ListSandboxes(ctx context.Context, req *controldv1.ListSandboxesRequest) (*controldv1.ListSandboxesResponse, error) {
	ss, next, err := h.mgr().ListSandboxes(ctx, req)
	if err != nil {
		return nil, err
	}
	return &controldv1.ListSandboxesResponse{Sandboxes: ss, NextPageToken: next}, nil
}

func (h *handlers) DeleteSandbox(ctx context.Context, req *controldv1.DeleteSandboxRequest) (*controldv1.DeleteSandboxResponse, error) {
	if err := h.mgr().DeleteSandbox(ctx, req.GetId()); err != nil {
		return nil, err
	}
	return &controldv1.DeleteSandboxResponse{}, nil
}

func (h *handlers) WaitSandboxReady(ctx context.Context, req *controldv1.WaitSandboxReadyRequest) (*controldv1.WaitSandboxReadyResponse, error) {
	s, err := h.mgr().WaitSandboxReady(ctx, req.GetId(), req.GetTimeout())
	if err != nil {
		return nil, err
	}
	return &controldv1.WaitSandboxReadyResponse{Sandbox: s}, nil
}

func (h *handlers) WatchSandboxes(req *controldv1.WatchSandboxesRequest, stream grpc.ServerStreamingServer[controldv1.WatchSandboxesResponse]) error {
	w, err := h.mgr().WatchSandboxes(stream.Context(), req)
	if err != nil {
		return err
	}
	defer w.Close()
	// Headers mark the watch as established: a client that waits for them
	// (stream.Header()) misses no event of what it does next.
	if err := stream.SendHeader(metadata.MD{}); err != nil {
		return err
	}
	for ev := range w.C {
		if err := stream.Send(ev); err != nil {
			return err
		}
	}
	if err := stream.Context().Err(); err != nil {
		return err
	}
	return w.Err()
}

func (h *handlers) GetSandboxEndpoint(ctx context.Context, req *controldv1.GetSandboxEndpointRequest) (*controldv1.GetSandboxEndpointResponse, error) {
	ep, err := h.mgr().SandboxEndpoint(ctx, req.GetId())
	if err != nil {
		return nil, err
	}
	return &controldv1.GetSandboxEndpointResponse{Endpoint: ep}, nil
}

func (h *handlers) SuspendSandbox(ctx context.Context, req *controldv1.SuspendSandboxRequest) (*controldv1.SuspendSandboxResponse, error) {
	s, err := h.mgr().SuspendSandbox(ctx, req.GetId())
	if err != nil {
		return nil, err
	}
	return &controldv1.SuspendSandboxResponse{Sandbox: s}, nil
}

func (h *handlers) ResumeSandbox(ctx context.Context, req *controldv1.ResumeSandboxRequest) (*controldv1.ResumeSandboxResponse, error) {
	s, err := h.mgr().ResumeSandbox(ctx, req.GetId())
	if err != nil {
		return nil, err
	}
	return &controldv1.ResumeSandboxResponse{Sandbox: s}, nil
}

func (h *handlers) VerifySandbox(ctx context.Context, req *controldv1.VerifySandboxRequest) (*controldv1.VerifySandboxResponse, error) {
	res, err := h.mgr().VerifySandbox(ctx, req)
	if err != nil {
		return nil, err
	}
	return &controldv1.VerifySandboxResponse{Results: res}, nil
}

func (h *handlers) UpdateSandboxNetwork(ctx context.Context, req *controldv1.UpdateSandboxNetworkRequest) (*controldv1.UpdateSandboxNetworkResponse, error) {
	sb, err := h.mgr().UpdateSandboxNetwork(ctx, req)
	if err != nil {
		return nil, err
	}
	return &controldv1.UpdateSandboxNetworkResponse{Sandbox: sb}, nil
}

func (h *handlers) CreateViewTicket(ctx context.Context, req *controldv1.CreateViewTicketRequest) (*controldv1.CreateViewTicketResponse, error) {
	return h.mgr().CreateViewTicket(ctx, req)
}

func (h *handlers) StartRecording(ctx context.Context, req *controldv1.StartRecordingRequest) (*controldv1.StartRecordingResponse, error) {
	return h.mgr().StartRecording(ctx, req)
}

func (h *handlers) StopRecording(ctx context.Context, req *controldv1.StopRecordingRequest) (*controldv1.StopRecordingResponse, error) {
	return h.mgr().StopRecording(ctx, req)
}

func (h *handlers) GetRecording(ctx context.Context, req *controldv1.GetRecordingRequest) (*controldv1.GetRecordingResponse, error) {
	return h.mgr().GetRecording(ctx, req)
}

func (h *handlers) ListRecordings(ctx context.Context, req *controldv1.ListRecordingsRequest) (*controldv1.ListRecordingsResponse, error) {
	return h.mgr().ListRecordings(ctx, req)
}

func (h *handlers) ExportRecording(ctx context.Context, req *controldv1.ExportRecordingRequest) (*controldv1.ExportRecordingResponse, error) {
	return h.mgr().ExportRecording(ctx, req)
}

func (h *handlers) CreateRecordingTicket(ctx context.Context, req *controldv1.CreateRecordingTicketRequest) (*controldv1.CreateRecordingTicketResponse, error) {
	return h.mgr().CreateRecordingTicket(ctx, req)
}

func (h *handlers) DeleteRecording(ctx context.Context, req *controldv1.DeleteRecordingRequest) (*controldv1.DeleteRecordingResponse, error) {
	return h.mgr().DeleteRecording(ctx, req)
}

func (h *handlers) ExposePort(ctx context.Context, req *controldv1.ExposePortRequest) (*controldv1.ExposePortResponse, error) {
	return h.mgr().ExposePort(ctx, req)
}

func (h *handlers) UnexposePort(ctx context.Context, req *controldv1.UnexposePortRequest) (*controldv1.UnexposePortResponse, error) {
	if err := h.mgr().UnexposePort(ctx, req); err != nil {
		return nil, err
	}
	return &controldv1.UnexposePortResponse{}, nil
}

func (h *handlers) ExtendSandbox(ctx context.Context, req *controldv1.ExtendSandboxRequest) (*controldv1.ExtendSandboxResponse, error) {
	sb, err := h.mgr().ExtendSandbox(ctx, req)
	if err != nil {
		return nil, err
	}
	return &controldv1.ExtendSandboxResponse{Sandbox: sb}, nil
}

type checkpoints struct {
	controldv1.UnimplementedCheckpointServiceServer
	h *handlers
}

var _ controldv1.CheckpointServiceServer = checkpoints{}

func (c checkpoints) CreateCheckpoint(ctx context.Context, req *controldv1.CreateCheckpointRequest) (*controldv1.CreateCheckpointResponse, error) {
	ck, err := c.h.mgr().CreateCheckpoint(ctx, req)
	if err != nil {
		return nil, err
	}
	return &controldv1.CreateCheckpointResponse{Checkpoint: ck}, nil
}

func (c checkpoints) GetCheckpoint(ctx context.Context, req *controldv1.GetCheckpointRequest) (*controldv1.GetCheckpointResponse, error) {
	ck, err := c.h.mgr().GetCheckpoint(ctx, req.GetId())
	if err != nil {
		return nil, err
	}
	return &controldv1.GetCheckpointResponse{Checkpoint: ck}, nil
}

func (c checkpoints) ListCheckpoints(ctx context.Context, req *controldv1.ListCheckpointsRequest) (*controldv1.ListCheckpointsResponse, error) {
	cks, next, err := c.h.mgr().ListCheckpoints(ctx, req)
	if err != nil {
		return nil, err
	}
	return &controldv1.ListCheckpointsResponse{Checkpoints: cks, NextPageToken: next}, nil
}

func (c checkpoints) DeleteCheckpoint(ctx context.Context, req *controldv1.DeleteCheckpointRequest) (*controldv1.DeleteCheckpointResponse, error) {
	ids, err := c.h.mgr().DeleteCheckpoint(ctx, req.GetId(), req.GetCascade())
	if err != nil {
		return nil, err
	}
	return &controldv1.DeleteCheckpointResponse{DeletedIds: ids}, nil
}

func (c checkpoints) ForkCheckpoint(ctx context.Context, req *controldv1.ForkCheckpointRequest) (*controldv1.ForkCheckpointResponse, error) {
	return c.h.mgr().ForkCheckpoint(ctx, req)
}

func (c checkpoints) ExportCheckpoint(ctx context.Context, req *controldv1.ExportCheckpointRequest) (*controldv1.ExportCheckpointResponse, error) {
	return c.h.mgr().ExportCheckpoint(ctx, req)
}

func (c checkpoints) ImportCheckpoint(ctx context.Context, req *controldv1.ImportCheckpointRequest) (*controldv1.ImportCheckpointResponse, error) {
	return c.h.mgr().ImportCheckpoint(ctx, req)
}

type pools struct {
	controldv1.UnimplementedPoolServiceServer
	h *handlers
}

var _ controldv1.PoolServiceServer = pools{}

func (p pools) CreatePool(ctx context.Context, req *controldv1.CreatePoolRequest) (*controldv1.CreatePoolResponse, error) {
	pl, err := p.h.mgr().CreatePool(ctx, req)
	if err != nil {
		return nil, err
	}
	return &controldv1.CreatePoolResponse{Pool: pl}, nil
}

func (p pools) GetPool(ctx context.Context, req *controldv1.GetPoolRequest) (*controldv1.GetPoolResponse, error) {
	pl, err := p.h.mgr().GetPool(ctx, req.GetId())
	if err != nil {
		return nil, err
	}
	return &controldv1.GetPoolResponse{Pool: pl}, nil
}

func (p pools) ListPools(ctx context.Context, req *controldv1.ListPoolsRequest) (*controldv1.ListPoolsResponse, error) {
	pls, next, err := p.h.mgr().ListPools(ctx, req)
	if err != nil {
		return nil, err
	}
	return &controldv1.ListPoolsResponse{Pools: pls, NextPageToken: next}, nil
}

func (p pools) UpdatePool(ctx context.Context, req *controldv1.UpdatePoolRequest) (*controldv1.UpdatePoolResponse, error) {
	pl, err := p.h.mgr().UpdatePool(ctx, req)
	if err != nil {
		return nil, err
	}
	return &controldv1.UpdatePoolResponse{Pool: pl}, nil
}

func (p pools) DeletePool(ctx context.Context, req *controldv1.DeletePoolRequest) (*controldv1.DeletePoolResponse, error) {
	if err := p.h.mgr().DeletePool(ctx, req.GetId()); err != nil {
		return nil, err
	}
	return &controldv1.DeletePoolResponse{}, nil
}

func (p pools) ClaimPool(ctx context.Context, req *controldv1.ClaimPoolRequest) (*controldv1.ClaimPoolResponse, error) {
	s, ep, hit, took, err := p.h.mgr().ClaimPool(ctx, req)
	if err != nil {
		return nil, err
	}
	return &controldv1.ClaimPoolResponse{Sandbox: s, Endpoint: ep, Hit: hit, Took: durationpb.New(took)}, nil
}

type hosts struct {
	controldv1.UnimplementedHostServiceServer
	h       *handlers
	version string
}

var _ controldv1.HostServiceServer = hosts{}

func (h hosts) GetHostStatus(ctx context.Context, req *controldv1.GetHostStatusRequest) (*controldv1.GetHostStatusResponse, error) {
	st, err := h.h.mgr().HostStatus()
	if err != nil {
		return nil, err
	}
	st.Version = h.version
	return st, nil
}
