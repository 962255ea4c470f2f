package app_test

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os/exec"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/forkfleet/forkfleet/api/errdefs"
	"github.com/forkfleet/forkfleet/api/errdefs/errgrpc"
	controldv1 "github.com/forkfleet/forkfleet/api/gen/forkfleet/controld/v1"
	"github.com/forkfleet/forkfleet/controld/internal/app"
	"github.com/forkfleet/forkfleet/controld/internal/fleet/fleettest"
	"github.com/forkfleet/forkfleet/controld/internal/testenv"
)

// healthProbe runs grpc-health-probe against addr and returns its exit status and
// output. Its statuses: 0 SERVING, 2 connection failure, 3 RPC failure,
// 4 NOT_SERVING.
func healthProbe(t *testing.T, bin string, args ...string) (int, string) {
	t.Helper()
	out, err := exec.Command(bin, append([]string{"-connect-timeout", "2s", "-rpc-timeout", "2s"}, args...)...).CombinedOutput()
	var ee *exec.ExitError
	switch {
	case err == nil:
		return 0, string(out)
	case errors.As(err, &ee):
		return ee.ExitCode(), string(out)
	}
	t.Fatalf("grpc-health-probe: %v", err)
	return 0, ""
}

func httpStatus(t *testing.T, url string) (int, string) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, strings.TrimSpace(string(b))
}

// Health follows controld's life: NOT_SERVING (and /readyz 503, the
// controld services UNAVAILABLE) while startup reconciliation runs, SERVING
// after it, NOT_SERVING from the first moment of shutdown; /healthz is 200
// while alive. grpc-health-probe is the probe operators and Kubernetes use.
func TestHealthFollowsStartupAndShutdown(t *testing.T) {
	probeBin := testenv.Tool(t, "grpc-health-probe")
	cfg := testConfig(t)
	cfg.Metrics.Listen = freeAddr(t) // known before controld reports its addresses
	rt := fleettest.NewRuntime()
	rt.ListGate = make(chan struct{}) // reconciliation waits for the test
	rt.ReadyAfter = time.Hour         // a sandbox that stays BOOTING
	t.Cleanup(rt.Close)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	ready := make(chan app.Addrs, 1)
	go func() {
		done <- app.Run(ctx, cfg, app.Deps{Runtime: rt, Dialer: fleettest.Dialer{R: rt}, Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
			OnReady: func(a app.Addrs) { ready <- a }})
	}()
	unix := "unix://" + cfg.GRPC.UnixSocket

	// Starting: the listeners answer, nothing is ready.
	var code int
	var out string
	eventually(t, "the gRPC listener", func() bool { code, out = healthProbe(t, probeBin, "-addr", unix); return code != 2 })
	if code != 4 || !strings.Contains(out, "NOT_SERVING") {
		t.Fatalf("during reconciliation: exit %d %q, want 4 NOT_SERVING", code, out)
	}
	conn, err := grpc.NewClient(unix, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	cctx, ccancel := context.WithTimeout(ctx, 5*time.Second)
	defer ccancel()
	_, err = controldv1.NewSandboxServiceClient(conn).ListSandboxes(cctx, &controldv1.ListSandboxesRequest{})
	if err = errgrpc.FromGRPC(err); !errors.Is(err, errdefs.ErrUnavailable) || errdefs.Reason(err) != "STARTING" {
		t.Fatalf("a call during reconciliation: %v, want UNAVAILABLE STARTING", err)
	}
	metricsURL := "http://" + cfg.Metrics.Listen
	if c, body := httpStatus(t, metricsURL+"/readyz"); c != http.StatusServiceUnavailable || body != "starting" {
		t.Fatalf("/readyz while starting: %d %q", c, body)
	}
	if c, body := httpStatus(t, metricsURL+"/healthz"); c != http.StatusOK {
		t.Fatalf("/healthz while starting: %d %q", c, body)
	}

	// Reconciled: serving.
	close(rt.ListGate)
	var addrs app.Addrs
	select {
	case addrs = <-ready:
	case err := <-done:
		t.Fatalf("controld: %v", err)
	case <-time.After(10 * time.Second):
		t.Fatal("controld not ready")
	}
	for _, args := range [][]string{
		{"-addr", unix},
		{"-addr", unix, "-service", "forkfleet.controld.v1.SandboxService"},
		// TCP: probes carry no token, health needs none.
		{"-addr", addrs.GRPCTCP},
	} {
		if code, out := healthProbe(t, probeBin, args...); code != 0 || !strings.Contains(out, "SERVING") {
			t.Fatalf("probe %v after reconciliation: exit %d %q", args, code, out)
		}
	}
	if code, out := healthProbe(t, probeBin, "-addr", unix, "-service", "no.such.Service"); code != 3 {
		t.Fatalf("unknown service: exit %d %q, want 3 (NOT_FOUND)", code, out)
	}
	if c, body := httpStatus(t, metricsURL+"/readyz"); c != http.StatusOK || body != "serving" {
		t.Fatalf("/readyz serving: %d %q", c, body)
	}
	if c, body := httpStatus(t, metricsURL+"/healthz"); c != http.StatusOK || body != "ok" {
		t.Fatalf("/healthz serving: %d %q", c, body)
	}

	// Stopping: a watch sees NOT_SERVING and /readyz says so while an
	// in-flight call (a wait on a sandbox that never gets ready) holds the
	// drain.
	sbc := controldv1.NewSandboxServiceClient(conn)
	cr, err := sbc.CreateSandbox(cctx, &controldv1.CreateSandboxRequest{})
	if err != nil {
		t.Fatal(err)
	}
	waitErr := make(chan error, 1)
	go func() {
		_, err := sbc.WaitSandboxReady(context.Background(), &controldv1.WaitSandboxReadyRequest{Id: cr.Sandbox.Id, Timeout: durationpb.New(3 * time.Second)})
		waitErr <- err
	}()
	watch, err := healthpb.NewHealthClient(conn).Watch(context.Background(), &healthpb.HealthCheckRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if st, err := watch.Recv(); err != nil || st.Status != healthpb.HealthCheckResponse_SERVING {
		t.Fatalf("watch: %v %v", st, err)
	}
	time.Sleep(100 * time.Millisecond) // the wait is in flight
	cancel()
	if st, err := watch.Recv(); err != nil || st.Status != healthpb.HealthCheckResponse_NOT_SERVING {
		t.Fatalf("watch at shutdown: %v %v, want NOT_SERVING", st, err)
	}
	// ... and then ends, not holding the graceful stop.
	if st, err := watch.Recv(); err == nil {
		t.Fatalf("watch after NOT_SERVING: %v, want its end", st)
	}
	if c, body := httpStatus(t, metricsURL+"/readyz"); c != http.StatusServiceUnavailable || body != "stopping" {
		t.Fatalf("/readyz while stopping: %d %q", c, body)
	}
	if c, _ := httpStatus(t, metricsURL+"/healthz"); c != http.StatusServiceUnavailable {
		t.Fatalf("/healthz while stopping: %d", c)
	}
	<-waitErr
	if err := <-done; err != nil {
		t.Fatalf("Run: %v", err)
	}
}

// grpcurl finds every service through reflection and calls each of them,
// over the unix socket and over TCP with the bearer token.
func TestGrpcurlReflection(t *testing.T) {
	grpcurl := testenv.Tool(t, "grpcurl")
	d := fakeStack(t)
	unix := []string{"-plaintext", "-unix", d.addrs.GRPCUnix}
	tcp := []string{"-plaintext", "-H", "authorization: Bearer " + d.addrs.Token, d.addrs.GRPCTCP}
	run := func(args ...string) string {
		t.Helper()
		out, err := exec.Command(grpcurl, args...).CombinedOutput()
		if err != nil {
			t.Fatalf("grpcurl %s: %v\n%s", strings.Join(args, " "), err, out)
		}
		return string(out)
	}
	for _, target := range [][]string{unix, tcp} {
		list := run(append(target, "list")...)
		for _, svc := range []string{"forkfleet.controld.v1.SandboxService", "forkfleet.controld.v1.CheckpointService",
			"forkfleet.controld.v1.PoolService", "grpc.health.v1.Health", "grpc.reflection.v1.ServerReflection"} {
			if !strings.Contains(list, svc) {
				t.Errorf("grpcurl list: no %s in\n%s", svc, list)
			}
		}
	}
	desc := run(append(unix, "describe", "forkfleet.controld.v1.SandboxService.CreateSandbox")...)
	if !strings.Contains(desc, "CreateSandboxRequest") {
		t.Errorf("describe: %s", desc)
	}
	// One call per service, request and response through reflection.
	created := run(append(append([]string(nil), unix[:len(unix)-1]...), "-d", `{"waitReady": true, "labels": {"via": "grpcurl"}}`,
		d.addrs.GRPCUnix, "forkfleet.controld.v1.SandboxService/CreateSandbox")...)
	if !strings.Contains(created, `"SANDBOX_STATE_READY"`) {
		t.Errorf("CreateSandbox through grpcurl: %s", created)
	}
	for _, call := range []struct{ method, data, want string }{
		{"forkfleet.controld.v1.SandboxService/ListSandboxes", `{"labels": {"via": "grpcurl"}}`, `"via": "grpcurl"`},
		{"forkfleet.controld.v1.CheckpointService/ListCheckpoints", `{}`, `{`},
		{"forkfleet.controld.v1.PoolService/ListPools", `{}`, `{`},
		{"grpc.health.v1.Health/Check", `{}`, `"SERVING"`},
	} {
		for _, target := range [][]string{unix, tcp} {
			args := append(append(append([]string(nil), target[:len(target)-1]...), "-d", call.data), target[len(target)-1], call.method)
			if out := run(args...); !strings.Contains(out, call.want) {
				t.Errorf("%s: %s", call.method, out)
			}
		}
	}
	// Without the token, TCP refuses the API (health excepted).
	out, err := exec.Command(grpcurl, "-plaintext", d.addrs.GRPCTCP, "forkfleet.controld.v1.PoolService/ListPools").CombinedOutput()
	if err == nil || !strings.Contains(string(out), "Unauthenticated") {
		t.Errorf("TCP without a token: %v %s", err, out)
	}
}

// freeAddr returns a loopback address with a port free a moment ago.
func freeAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}
