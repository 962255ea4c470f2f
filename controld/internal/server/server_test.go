package server_test

import (
	"context"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/goleak"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	controldv1 "github.com/forkfleet/forkfleet/api/gen/forkfleet/controld/v1"
	"github.com/forkfleet/forkfleet/api/limits"
	"github.com/forkfleet/forkfleet/controld/internal/fleet"
	"github.com/forkfleet/forkfleet/controld/internal/fleet/fleettest"
	"github.com/forkfleet/forkfleet/controld/internal/server"
	"github.com/forkfleet/forkfleet/controld/internal/store"
)

func TestServerErrorsAuthMetrics(t *testing.T) {
	t.Cleanup(func() { goleak.VerifyNone(t) })
	dir, err := os.MkdirTemp("", "srv")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	st, err := store.Open(filepath.Join(dir, "s.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	rt := fleettest.NewRuntime()
	m, err := fleet.New(context.Background(), fleet.Options{
		Runtime: rt, Dialer: fleettest.Dialer{R: rt}, Store: st, GatewayHost: "127.0.0.1:7480",
		DefaultImage: "img", CheckpointDir: filepath.Join(dir, "ck"),
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
	})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close(context.Background())
	reg := prometheus.NewRegistry()
	srv := server.New(server.Options{Token: "tok", Registerer: reg})
	srv.SetManager(m)
	uln, err := net.Listen("unix", filepath.Join(dir, "c.sock"))
	if err != nil {
		t.Fatal(err)
	}
	tln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go srv.Serve(uln)
	go srv.Serve(tln)
	defer srv.GracefulStop()

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	uc, err := grpc.NewClient("unix://"+uln.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer uc.Close()
	sb := controldv1.NewSandboxServiceClient(uc)

	_, err = sb.CreateSandbox(ctx, &controldv1.CreateSandboxRequest{Resources: &controldv1.Resources{MemoryBytes: 5}})
	st1 := status.Convert(err)
	if st1.Code() != codes.InvalidArgument {
		t.Fatalf("code %v", st1.Code())
	}
	var br *errdetails.BadRequest
	for _, d := range st1.Details() {
		if x, ok := d.(*errdetails.BadRequest); ok {
			br = x
		}
	}
	if br == nil || br.FieldViolations[0].Field != "resources.memory_bytes" {
		t.Fatalf("BadRequest detail: %v", st1.Details())
	}
	_, err = sb.GetSandbox(ctx, &controldv1.GetSandboxRequest{Id: "sb-aaaaaaaaaaaaaaaa"})
	st2 := status.Convert(err)
	var info *errdetails.ErrorInfo
	for _, d := range st2.Details() {
		if x, ok := d.(*errdetails.ErrorInfo); ok {
			info = x
		}
	}
	if st2.Code() != codes.NotFound || info == nil || info.Reason != "SANDBOX_NOT_FOUND" || info.Domain != "forkfleet.dev" {
		t.Fatalf("not found: %v %v", st2, st2.Details())
	}

	tc, err := grpc.NewClient(tln.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer tc.Close()
	tsb := controldv1.NewSandboxServiceClient(tc)
	if _, err := tsb.ListSandboxes(ctx, &controldv1.ListSandboxesRequest{}); status.Code(err) != codes.Unauthenticated {
		t.Fatalf("TCP without token: %v", err)
	}
	bad := metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer nope")
	if _, err := tsb.ListSandboxes(bad, &controldv1.ListSandboxesRequest{}); status.Code(err) != codes.Unauthenticated {
		t.Fatalf("TCP with a bad token: %v", err)
	}
	good := metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer tok")
	if _, err := tsb.ListSandboxes(good, &controldv1.ListSandboxesRequest{}); err != nil {
		t.Fatalf("TCP with the token: %v", err)
	}
	// A watch stream through the stream interceptors.
	ws, err := sb.WatchSandboxes(ctx, &controldv1.WatchSandboxesRequest{Ids: []string{"bad"}})
	if err == nil {
		_, err = ws.Recv()
	}
	if status.Code(err) != codes.InvalidArgument {
		t.Fatalf("watch with a bad id: %v", err)
	}

	// Errors are the latency histogram's series with a code other than OK.
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	errSeries := 0
	for _, mf := range mfs {
		if mf.GetName() == "forkfleet_controld_api_errors_total" {
			t.Error("api_errors_total is back: it repeats api_request_seconds_count{code!=\"OK\"}")
		}
		if mf.GetName() != "forkfleet_controld_api_request_seconds" {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "code" && l.GetValue() != "OK" {
					errSeries++
				}
			}
		}
	}
	if errSeries < 3 {
		t.Fatalf("api error series %d", errSeries)
	}
}

func TestHostStatus(t *testing.T) {
	t.Cleanup(func() { goleak.VerifyNone(t) })
	dir := t.TempDir()
	st, err := store.Open(filepath.Join(dir, "s.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	rt := fleettest.NewRuntime()
	lim := limits.Default()
	lim.MaxSandboxes, lim.MaxMemoryBytes = 7, 6<<30
	m, err := fleet.New(context.Background(), fleet.Options{
		Runtime: rt, Dialer: fleettest.Dialer{R: rt}, Store: st, GatewayHost: "127.0.0.1:7480",
		DefaultImage: "img", CheckpointDir: filepath.Join(dir, "ck"), Host: "node-a", Limits: lim,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
	})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close(context.Background())
	srv := server.New(server.Options{Registerer: prometheus.NewRegistry(), Version: "v9"})
	srv.SetManager(m)
	ln, err := net.Listen("unix", filepath.Join(dir, "c.sock"))
	if err != nil {
		t.Fatal(err)
	}
	go srv.Serve(ln)
	defer srv.GracefulStop()
	conn, err := grpc.NewClient("unix://"+ln.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()

	sb, err := controldv1.NewSandboxServiceClient(conn).CreateSandbox(ctx, &controldv1.CreateSandboxRequest{
		Resources: &controldv1.Resources{MemoryBytes: 2 << 30}, WaitReady: true})
	if err != nil {
		t.Fatal(err)
	}
	if h := sb.GetSandbox().GetHost(); h != "node-a" {
		t.Fatalf("sandbox host %q", h)
	}
	pl, err := controldv1.NewPoolServiceClient(conn).CreatePool(ctx, &controldv1.CreatePoolRequest{Name: "p", Source: &controldv1.CreatePoolRequest_Image{Image: "img"}, Size: 1})
	if err != nil {
		t.Fatal(err)
	}
	if h := pl.GetPool().GetHost(); h != "node-a" {
		t.Fatalf("pool host %q", h)
	}
	ck, err := controldv1.NewCheckpointServiceClient(conn).CreateCheckpoint(ctx, &controldv1.CreateCheckpointRequest{SandboxId: sb.GetSandbox().GetId()})
	if err != nil {
		t.Fatal(err)
	}
	if h := ck.GetCheckpoint().GetHost(); h != "node-a" {
		t.Fatalf("checkpoint host %q", h)
	}

	hs, err := controldv1.NewHostServiceClient(conn).GetHostStatus(ctx, &controldv1.GetHostStatusRequest{})
	if err != nil {
		t.Fatal(err)
	}
	// The image pool makes a checkpoint of its own once its member is warm
	// (fleet/pool_checkpoint.go), in the background: it may be counted yet.
	if hs.Host != "node-a" || hs.Version != "v9" || hs.MaxSandboxes != 7 || hs.MaxMemoryBytes != 6<<30 ||
		hs.DefaultMemoryBytes != lim.Default.MemoryBytes || hs.Checkpoints < 1 || hs.Checkpoints > 2 {
		t.Fatalf("status %v", hs)
	}
	if hs.MemoryTotalBytes <= 0 || hs.MemoryAvailableBytes <= 0 || hs.MemoryAvailableBytes > hs.MemoryTotalBytes {
		t.Fatalf("memory %d of %d", hs.MemoryAvailableBytes, hs.MemoryTotalBytes)
	}
	// The sandbox and the pool's member (warming or warm) are admitted.
	if hs.Sandboxes < 1 || hs.AdmittedMemoryBytes < 2<<30 {
		t.Fatalf("admitted %d sandboxes, %d bytes", hs.Sandboxes, hs.AdmittedMemoryBytes)
	}
	if len(hs.Pools) != 1 || hs.Pools[0].Id != pl.GetPool().GetId() || hs.Pools[0].Name != "p" || hs.Pools[0].Size != 1 {
		t.Fatalf("pools %v", hs.Pools)
	}
}
