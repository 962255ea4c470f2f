package gateway_test

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"

	"github.com/coder/websocket"

	"github.com/forkfleet/forkfleet/api/errdefs"
	"github.com/forkfleet/forkfleet/controld/internal/fleet"
	"github.com/forkfleet/forkfleet/controld/internal/gateway"
)

// portRouter routes sandbox "sb-1" port 8080 to a test server.
type portRouter struct {
	router
	addr string
}

func (p portRouter) PortRoute(id, port string) (fleet.PortRoute, error) {
	if id != "sb-1" || port != "8080" {
		return fleet.PortRoute{}, errdefs.WithReason(errdefs.ErrNotFound, "PORT_NOT_EXPOSED", "not exposed")
	}
	return fleet.PortRoute{PortToken: "port-token", ACIToken: "aci-token", Dial: func(ctx context.Context) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "tcp", p.addr)
	}}, nil
}

// HTTP and WebSocket pass through an exposed port, with the prefix and the
// token removed; a missing or wrong token, or an unexposed port, is refused.
func TestExposedPort(t *testing.T) {
	app := http.NewServeMux()
	app.HandleFunc("/echo", func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, "path=%s host=%s auth=%q tok=%q prefix=%s", r.URL.Path, r.Host, r.Header.Get("Authorization"),
			r.Header.Get(gateway.TokenHeader), r.Header.Get("X-Forwarded-Prefix"))
	})
	app.HandleFunc("/ws", func(w http.ResponseWriter, r *http.Request) {
		c, err := websocket.Accept(w, r, nil)
		if err != nil {
			return
		}
		defer c.CloseNow()
		typ, b, err := c.Read(r.Context())
		if err == nil {
			c.Write(r.Context(), typ, append([]byte("echo "), b...))
		}
		c.Close(websocket.StatusNormalClosure, "")
	})
	appLn, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	appSrv := &http.Server{Handler: app}
	go appSrv.Serve(appLn)
	defer appSrv.Close()

	gw := gateway.New(portRouter{router: router{}, addr: appLn.Addr().String()}, gateway.Options{})
	srv := gateway.NewServer(gw)
	gwLn, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go srv.Serve(gwLn)
	defer srv.Shutdown(context.Background())
	base := "http://" + gwLn.Addr().String() + "/v1/sandboxes/sb-1/ports/8080"

	get := func(url string, hdr map[string]string) (int, string) {
		t.Helper()
		req, _ := http.NewRequest("GET", url, nil)
		for k, v := range hdr {
			req.Header.Set(k, v)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	for _, hdr := range []map[string]string{nil, {"Authorization": "Bearer wrong"}, {gateway.TokenHeader: "aci-token-x"}} {
		if code, _ := get(base+"/echo", hdr); code != http.StatusUnauthorized {
			t.Errorf("token %v: %d, want 401", hdr, code)
		}
	}
	code, body := get(base+"/echo", map[string]string{"Authorization": "Bearer port-token"})
	if code != 200 || !strings.Contains(body, "path=/echo") || !strings.Contains(body, `auth=""`) || !strings.Contains(body, "host=127.0.0.1:8080") ||
		!strings.Contains(body, "prefix=/v1/sandboxes/sb-1/ports/8080") {
		t.Errorf("through the port: %d %q", code, body)
	}
	if code, body := get(base+"/echo", map[string]string{gateway.TokenHeader: "aci-token"}); code != 200 || !strings.Contains(body, `tok=""`) {
		t.Errorf("with the sandbox's token: %d %q", code, body)
	}
	if code, _ := get("http://"+gwLn.Addr().String()+"/v1/sandboxes/sb-1/ports/9090/echo", map[string]string{gateway.TokenHeader: "port-token"}); code != http.StatusNotFound {
		t.Errorf("unexposed port: %d", code)
	}

	ctx := context.Background()
	c, _, err := websocket.Dial(ctx, strings.Replace(base, "http", "ws", 1)+"/ws",
		&websocket.DialOptions{HTTPHeader: http.Header{gateway.TokenHeader: {"port-token"}}})
	if err != nil {
		t.Fatal(err)
	}
	defer c.CloseNow()
	if err := c.Write(ctx, websocket.MessageText, []byte("hi")); err != nil {
		t.Fatal(err)
	}
	if _, b, err := c.Read(ctx); err != nil || string(b) != "echo hi" {
		t.Errorf("websocket through the port: %q %v", b, err)
	}
	// A checkpoint closes the port's connections.
	gw.DropSandbox("sb-1")
	if _, _, err := c.Read(ctx); err == nil {
		t.Error("the WebSocket survived DropSandbox")
	}
}
