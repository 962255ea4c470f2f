package gateway

import (
	"context"
	"crypto/subtle"
	"errors"
	"net"
	"net/http"
	"net/http/httputil"
	"strings"
	"sync"

	"github.com/forkfleet/forkfleet/api/errdefs"
	"github.com/forkfleet/forkfleet/controld/internal/fleet"
)

// Exposed ports: /v1/sandboxes/{id}/ports/{port}/... reaches TCP port
// {port} inside sandbox {id} (ExposePort), with the prefix removed. It is a
// reverse proxy, not a splice: every request is authorized and rewritten
// (HTTP/1.1 keep-alive carries several), and WebSocket (or any) upgrades
// pass through once accepted. The upstream connection is made inside the
// sandbox's network namespace, to its loopback, so servers that listen only
// there (dev servers, Chromium's DevTools) are reachable, in every replica
// independently, in any network mode.

// TokenHeader carries a port's token for clients that cannot set
// Authorization (it is removed before the request is forwarded).
const TokenHeader = "X-Forkfleet-Token"

// PortRouter resolves an exposed port (fleet.Manager implements it).
type PortRouter interface {
	PortRoute(id, port string) (fleet.PortRoute, error)
}

// portConns tracks the upstream connections of exposed ports per sandbox,
// so a checkpoint can close them before the freeze.
type portConns struct {
	mu    sync.Mutex
	conns map[*trackedConn]string
}

type trackedConn struct {
	net.Conn
	pc   *portConns
	once sync.Once
}

func (c *trackedConn) Close() error {
	c.once.Do(func() {
		c.pc.mu.Lock()
		delete(c.pc.conns, c)
		c.pc.mu.Unlock()
	})
	return c.Conn.Close()
}

// count returns the connections open now.
func (pc *portConns) count() int {
	pc.mu.Lock()
	defer pc.mu.Unlock()
	return len(pc.conns)
}

func (pc *portConns) add(id string, c net.Conn) net.Conn {
	t := &trackedConn{Conn: c, pc: pc}
	pc.mu.Lock()
	if pc.conns == nil {
		pc.conns = map[*trackedConn]string{}
	}
	pc.conns[t] = id
	pc.mu.Unlock()
	return t
}

// drop closes the port connections of sandbox id (all with id "").
func (pc *portConns) drop(id string) {
	pc.mu.Lock()
	var victims []*trackedConn
	for c, cid := range pc.conns {
		if id == "" || cid == id {
			victims = append(victims, c)
		}
	}
	pc.mu.Unlock()
	for _, c := range victims {
		c.Close()
	}
}

// portToken returns the token a request presents for a port, and strips it
// from the request so the sandbox's server never sees it.
func portToken(r *http.Request) string {
	if t := strings.TrimSpace(r.Header.Get(TokenHeader)); t != "" {
		r.Header.Del(TokenHeader)
		return t
	}
	if t := bearer(r); t != "" {
		r.Header.Del("Authorization")
		return t
	}
	return ""
}

func tokenMatches(got string, want ...string) bool {
	ok := 0
	for _, w := range want {
		if w != "" {
			ok |= subtle.ConstantTimeCompare([]byte(got), []byte(w))
		}
	}
	return got != "" && ok == 1
}

func (g *Gateway) servePort(pr PortRouter) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		id, port := r.PathValue("id"), r.PathValue("port")
		route, err := pr.PortRoute(id, port)
		if err != nil {
			switch {
			case errors.Is(err, errdefs.ErrNotFound):
				http.Error(w, err.Error(), http.StatusNotFound)
			case errors.Is(err, errdefs.ErrInvalidArgument):
				http.Error(w, err.Error(), http.StatusBadRequest)
			case errors.Is(err, errdefs.ErrUnavailable):
				http.Error(w, err.Error(), http.StatusServiceUnavailable)
			default:
				http.Error(w, err.Error(), http.StatusConflict)
			}
			return
		}
		if !tokenMatches(portToken(r), route.PortToken, route.ACIToken) {
			w.Header().Set("WWW-Authenticate", `Bearer realm="forkfleet-port"`)
			http.Error(w, "missing or invalid token", http.StatusUnauthorized)
			return
		}
		prefix := "/v1/sandboxes/" + id + "/ports/" + port
		g.portProxy(pr, id, port, prefix, route).ServeHTTP(w, r)
	}
}

// portProxy forwards one request (and its upgrade, if any) to the port.
// The upstream connection is made for this request and closed after it:
// a request of another client on a pooled connection would otherwise skip
// its own authorization.
func (g *Gateway) portProxy(pr PortRouter, id, port, prefix string, route fleet.PortRoute) *httputil.ReverseProxy {
	return &httputil.ReverseProxy{
		Rewrite: func(p *httputil.ProxyRequest) {
			p.Out.URL.Scheme = "http"
			p.Out.URL.Host = "127.0.0.1:" + port
			p.Out.URL.Path = "/" + strings.TrimPrefix(strings.TrimPrefix(p.In.URL.Path, prefix), "/")
			p.Out.URL.RawPath = ""
			// As a client inside the sandbox would: servers such as
			// Chromium's DevTools accept only a loopback Host.
			p.Out.Host = p.Out.URL.Host
			p.SetXForwarded()
			p.Out.Header.Set("X-Forwarded-Host", p.In.Host)
			p.Out.Header.Set("X-Forwarded-Prefix", prefix)
		},
		Transport: &http.Transport{
			DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
				ctx, cancel := context.WithTimeout(ctx, g.dialTimeout)
				defer cancel()
				c, err := route.Dial(ctx)
				if err != nil {
					return nil, err
				}
				tc := g.ports.add(id, c)
				// A checkpoint that began after the route was resolved
				// dropped the ports before this connection was tracked.
				if _, err := pr.PortRoute(id, port); err != nil {
					tc.Close()
					return nil, err
				}
				return tc, nil
			},
			DisableKeepAlives:      true,
			MaxResponseHeaderBytes: 1 << 20,
		},
		ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) {
			code := http.StatusBadGateway
			if errors.Is(err, errdefs.ErrUnavailable) {
				code = http.StatusServiceUnavailable
			}
			http.Error(w, "sandbox port unreachable: "+err.Error(), code)
		},
	}
}
