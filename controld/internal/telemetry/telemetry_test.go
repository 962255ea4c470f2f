package telemetry

import (
	"context"
	"crypto/tls"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	coltracepb "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	commonpb "go.opentelemetry.io/proto/otlp/common/v1"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/protobuf/proto"

	"github.com/forkfleet/forkfleet/api/aci/acitest"
)

// receiver collects the OTLP trace requests a test collector got.
type receiver struct {
	coltracepb.UnimplementedTraceServiceServer
	mu   sync.Mutex
	reqs []*coltracepb.ExportTraceServiceRequest
	got  chan struct{}
}

func newReceiver() *receiver { return &receiver{got: make(chan struct{}, 16)} }

func (r *receiver) Export(_ context.Context, req *coltracepb.ExportTraceServiceRequest) (*coltracepb.ExportTraceServiceResponse, error) {
	r.mu.Lock()
	r.reqs = append(r.reqs, req)
	r.mu.Unlock()
	r.got <- struct{}{}
	return &coltracepb.ExportTraceServiceResponse{}, nil
}

// wait returns the first request, or fails after a few seconds.
func (r *receiver) wait(t *testing.T) *coltracepb.ExportTraceServiceRequest {
	t.Helper()
	select {
	case <-r.got:
	case <-time.After(10 * time.Second):
		t.Fatal("the collector received no spans")
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.reqs[0]
}

// tlsGRPCCollector serves OTLP/gRPC over TLS on loopback with a throwaway
// CA, written to caFile. badHandshakes counts TLS handshakes that failed (a
// plaintext client).
func tlsGRPCCollector(t *testing.T) (addr, caFile string, r *receiver, badHandshakes func() int) {
	t.Helper()
	certs := acitest.NewCerts(t)
	caFile = filepath.Join(t.TempDir(), "ca.pem")
	if err := os.WriteFile(caFile, certs.CAPEM, 0o600); err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	bad := 0
	cfg := &tls.Config{Certificates: []tls.Certificate{certs.Server}, MinVersion: tls.VersionTLS12}
	srv := grpc.NewServer(grpc.Creds(countingCreds{TransportCredentials: credentials.NewTLS(cfg), onFail: func() { mu.Lock(); bad++; mu.Unlock() }}))
	r = newReceiver()
	coltracepb.RegisterTraceServiceServer(srv, r)
	go srv.Serve(ln)
	t.Cleanup(srv.Stop)
	return ln.Addr().String(), caFile, r, func() int { mu.Lock(); defer mu.Unlock(); return bad }
}

type countingCreds struct {
	credentials.TransportCredentials
	onFail func()
}

func (c countingCreds) ServerHandshake(conn net.Conn) (net.Conn, credentials.AuthInfo, error) {
	out, info, err := c.TransportCredentials.ServerHandshake(conn)
	if err != nil {
		c.onFail()
	}
	return out, info, err
}

// emit exports one span through a provider made from cfg and flushes it.
func emit(t *testing.T, cfg TraceConfig) {
	t.Helper()
	ctx := context.Background()
	tr, err := NewTracing(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	_, span := tr.Provider.Tracer("test").Start(ctx, "test.span")
	span.End()
	sctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := tr.Shutdown(sctx); err != nil {
		t.Logf("shutdown: %v", err) // the collector's side decides the test
	}
}

func attr(attrs []*commonpb.KeyValue, key string) string {
	for _, a := range attrs {
		if a.GetKey() == key {
			return a.GetValue().GetStringValue()
		}
	}
	return ""
}

// An https:// collector gets TLS even with insecure set: it used to get a
// plaintext connection (otlp_insecure defaulted to true and won over the
// scheme). The collector's CA is trusted as a system root (SSL_CERT_FILE),
// as a public collector's would be: OTEL_EXPORTER_OTLP_CERTIFICATE would
// force TLS by itself and hide the bug. Go loads system roots once per
// process, so the exporter runs in a child process of this test binary.
func TestOTLPHTTPSEndpointGetsTLS(t *testing.T) {
	if os.Getenv("TELEMETRY_TEST_CHILD") == "1" {
		emit(t, TraceConfig{Endpoint: os.Getenv("TELEMETRY_TEST_ENDPOINT"), Insecure: true, ServiceName: "controld", Version: "v9"})
		return
	}
	addr, ca, r, bad := tlsGRPCCollector(t)
	cmd := exec.Command(os.Args[0], "-test.run=^TestOTLPHTTPSEndpointGetsTLS$", "-test.count=1")
	cmd.Env = append(os.Environ(), "TELEMETRY_TEST_CHILD=1", "TELEMETRY_TEST_ENDPOINT=https://"+addr, "SSL_CERT_FILE="+ca,
		"OTEL_RESOURCE_ATTRIBUTES=deployment.environment=test,forkfleet.host=h1", "OTEL_SERVICE_NAME=controld-test")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("child: %v\n%s", err, out)
	}
	req := r.wait(t)
	if n := bad(); n != 0 {
		t.Errorf("%d failed TLS handshakes", n)
	}
	res := req.GetResourceSpans()[0]
	ra := res.GetResource().GetAttributes()
	if attr(ra, "service.name") != "controld-test" || attr(ra, "service.version") != "v9" ||
		attr(ra, "deployment.environment") != "test" || attr(ra, "forkfleet.host") != "h1" {
		t.Errorf("resource %v", ra)
	}
	if name := res.GetScopeSpans()[0].GetSpans()[0].GetName(); name != "test.span" {
		t.Errorf("span %q", name)
	}
}

// A host:port endpoint (no scheme) is TLS unless insecure: the default
// reaches a TLS collector (trusted through OTEL_EXPORTER_OTLP_CERTIFICATE).
func TestOTLPGRPCBareEndpointDefaultsToTLS(t *testing.T) {
	addr, ca, r, bad := tlsGRPCCollector(t)
	t.Setenv("OTEL_EXPORTER_OTLP_CERTIFICATE", ca)
	emit(t, TraceConfig{Endpoint: addr, ServiceName: "controld"})
	r.wait(t)
	if n := bad(); n != 0 {
		t.Errorf("%d failed TLS handshakes", n)
	}
}

// OTLP over HTTP (protobuf), https:// with the test CA: a base URL gets
// /v1/traces.
func TestOTLPHTTPOverTLS(t *testing.T) {
	certs := acitest.NewCerts(t)
	ca := filepath.Join(t.TempDir(), "ca.pem")
	os.WriteFile(ca, certs.CAPEM, 0o600)
	t.Setenv("OTEL_EXPORTER_OTLP_CERTIFICATE", ca)
	got := make(chan *coltracepb.ExportTraceServiceRequest, 4)
	srv := &http.Server{
		Handler: http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
			if req.URL.Path != "/v1/traces" || req.Header.Get("Content-Type") != "application/x-protobuf" {
				http.Error(w, "unexpected "+req.URL.Path, http.StatusNotFound)
				return
			}
			b, _ := io.ReadAll(req.Body)
			m := &coltracepb.ExportTraceServiceRequest{}
			if err := proto.Unmarshal(b, m); err != nil {
				http.Error(w, err.Error(), http.StatusBadRequest)
				return
			}
			got <- m
			w.Header().Set("Content-Type", "application/x-protobuf")
			out, _ := proto.Marshal(&coltracepb.ExportTraceServiceResponse{})
			w.Write(out)
		}),
		TLSConfig: &tls.Config{Certificates: []tls.Certificate{certs.Server}},
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go srv.ServeTLS(ln, "", "")
	t.Cleanup(func() { srv.Close() })
	emit(t, TraceConfig{Endpoint: "https://" + ln.Addr().String(), Protocol: ProtocolHTTP, ServiceName: "controld"})
	select {
	case m := <-got:
		if attr(m.GetResourceSpans()[0].GetResource().GetAttributes(), "service.name") != "controld" {
			t.Errorf("resource %v", m.GetResourceSpans()[0].GetResource())
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the HTTP collector received no spans")
	}
}

func TestTracingConfigErrors(t *testing.T) {
	for _, cfg := range []TraceConfig{
		{Endpoint: "ftp://collector:4317"},
		{Endpoint: "https://"},
		{Endpoint: "collector:4317", Protocol: "thrift"},
	} {
		if _, err := NewTracing(context.Background(), cfg); err == nil || !strings.Contains(err.Error(), "otlp") {
			t.Errorf("%+v: %v", cfg, err)
		}
	}
	tr, err := NewTracing(context.Background(), TraceConfig{})
	if err != nil || tr.Shutdown(context.Background()) != nil {
		t.Fatalf("no endpoint: %v", err)
	}
}

func TestRegistryBuildInfo(t *testing.T) {
	reg := NewRegistry("v1.2.3-4-gabc")
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != "forkfleet_controld_build_info" {
			continue
		}
		m := mf.GetMetric()[0]
		labels := map[string]string{}
		for _, l := range m.GetLabel() {
			labels[l.GetName()] = l.GetValue()
		}
		if labels["version"] != "v1.2.3-4-gabc" || labels["goversion"] == "" || m.GetGauge().GetValue() != 1 {
			t.Fatalf("build_info %v = %v", labels, m.GetGauge().GetValue())
		}
		return
	}
	t.Fatal("no forkfleet_controld_build_info")
}
