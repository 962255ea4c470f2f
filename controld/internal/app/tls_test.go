package app_test

import (
	"context"
	"errors"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/forkfleet/forkfleet/api/aci"
	"github.com/forkfleet/forkfleet/api/aci/acitest"
	"github.com/forkfleet/forkfleet/api/client"
	"github.com/forkfleet/forkfleet/api/errdefs"
	controldv1 "github.com/forkfleet/forkfleet/api/gen/forkfleet/controld/v1"
	"github.com/forkfleet/forkfleet/controld/internal/fleet/fleettest"
)

// TestControldTLS is issue #12 item 11 end to end: with a certificate, a
// key and a client CA in the config, the gRPC TCP listener and the gateway
// speak TLS and want the client certificate as well as the token; the
// endpoint says wss://, and api/client carries its TLS config to the ACI
// session it opens through the gateway.
func TestControldTLS(t *testing.T) {
	certs := acitest.NewCerts(t)
	dir := certs.WriteFiles(t, t.TempDir())
	cfg := testConfig(t)
	cfg.TLS.CertFile, cfg.TLS.KeyFile, cfg.TLS.ClientCAFile = dir+"/server.pem", dir+"/server-key.pem", dir+"/ca.pem"
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	sockDir, err := os.MkdirTemp("", "gd")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(sockDir) })
	rt := fleettest.NewRuntime()
	rt.SocketDir = sockDir
	t.Cleanup(rt.Close)
	d := start(t, cfg, rt)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	c, err := client.Dial(ctx, d.addrs.GRPCTCP, client.WithToken(d.addrs.Token), client.WithTLS(certs.ClientConfig(true)))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	sb, err := c.CreateSandbox(ctx, client.WithWaitReady())
	if err != nil {
		t.Fatal(err)
	}
	ep, err := sb.Endpoint(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(ep.GetUrl(), "wss://") {
		t.Fatalf("endpoint %s with a TLS gateway", ep.GetUrl())
	}
	s, err := sb.ACI(ctx, client.ViaGateway())
	if err != nil {
		t.Fatalf("ACI through the TLS gateway: %v", err)
	}
	if _, err := s.Ping(ctx, []byte("x")); err != nil {
		t.Fatal(err)
	}
	s.Close()

	// Without the client certificate neither listener lets a call through,
	// token or not; nor does plaintext.
	noCert, err := client.Dial(ctx, d.addrs.GRPCTCP, client.WithToken(d.addrs.Token), client.WithTLS(certs.ClientConfig(false)))
	if err != nil {
		t.Fatal(err)
	}
	defer noCert.Close()
	if _, err := noCert.GetSandbox(ctx, sb.ID()); err == nil {
		t.Fatal("gRPC call without a client certificate")
	}
	plain, err := client.Dial(ctx, d.addrs.GRPCTCP, client.WithToken(d.addrs.Token))
	if err != nil {
		t.Fatal(err)
	}
	defer plain.Close()
	if _, err := plain.GetSandbox(ctx, sb.ID()); !errors.Is(err, errdefs.ErrUnavailable) {
		t.Fatalf("plaintext gRPC to the TLS listener: %v", err)
	}
	if _, err := aci.Dial(ctx, ep.GetUrl(), ep.GetToken(), aci.WithTLSConfig(certs.ClientConfig(false))); err == nil {
		t.Fatal("gateway session without a client certificate")
	}
	if _, err := aci.Dial(ctx, strings.Replace(ep.GetUrl(), "wss://", "ws://", 1), ep.GetToken()); err == nil {
		t.Fatal("plaintext session to the TLS gateway")
	}
	// The unix socket is trusted by its permissions and stays plaintext.
	if _, err := d.sb.ListSandboxes(ctx, &controldv1.ListSandboxesRequest{}); err != nil {
		t.Fatalf("unix socket: %v", err)
	}
}
