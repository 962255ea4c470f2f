package client

import (
	"crypto/tls"
	"testing"
)

// A host reached through a dns:/// name has its gateway verified against
// that name (its endpoint URLs name the pod's address); a host given by
// address, or a caller's own ServerName, is left alone.
func TestGatewayTLSName(t *testing.T) {
	base := &tls.Config{MinVersion: tls.VersionTLS12}
	r := &router{o: &dialOptions{tls: base}, endpoints: map[string]*endpoint{
		"10.0.0.1:7443": {target: "10.0.0.1:7443", serverName: "controld.forkfleet.svc", host: "node-1"},
		"host-b:7443":   {target: "host-b:7443", host: "node-2"},
	}, order: []string{"10.0.0.1:7443", "host-b:7443"}, owners: map[string]string{
		"sb-aaaaaaaaaaaaaaaa": "node-1", "sb-bbbbbbbbbbbbbbbb": "node-2",
	}}
	cfg := r.gatewayTLS("sb-aaaaaaaaaaaaaaaa")
	if cfg == nil || cfg.ServerName != "controld.forkfleet.svc" || cfg.MinVersion != tls.VersionTLS12 || base.ServerName != "" {
		t.Fatalf("resolved host: %+v", cfg)
	}
	if cfg := r.gatewayTLS("sb-bbbbbbbbbbbbbbbb"); cfg != nil {
		t.Fatalf("host by address: %+v", cfg)
	}
	if cfg := r.gatewayTLS("sb-cccccccccccccccc"); cfg != nil {
		t.Fatalf("unknown sandbox: %+v", cfg)
	}
	base.ServerName = "pinned"
	if cfg := r.gatewayTLS("sb-aaaaaaaaaaaaaaaa"); cfg != nil {
		t.Fatalf("the caller's ServerName: %+v", cfg)
	}
}
