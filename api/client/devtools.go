package client

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"regexp"
	"strings"
	"time"

	"github.com/forkfleet/forkfleet/api/errdefs"
)

// DevToolsPort is where the web desktop's browser (images/desktop-web)
// serves the Chrome DevTools protocol, on the sandbox's loopback only.
const DevToolsPort = 9222

// DevTools is a sandbox browser's DevTools endpoint through controld's
// gateway, for CDP clients: Playwright's
// connect_over_cdp(WebSocketURL, headers=Header) and Puppeteer's
// connect({browserWSEndpoint: WebSocketURL, headers: Header}).
type DevTools struct {
	// WebSocketURL is the browser target on the gateway (ws:// or wss://).
	WebSocketURL string
	// HTTPURL is the DevTools HTTP root on the gateway (json/version,
	// json/list).
	HTTPURL string
	// Header authorizes every request and the WebSocket upgrade.
	Header http.Header
	// Browser is the browser's product, e.g. "Chrome/156.0.8078.114".
	Browser string
}

// devToolsVersionLimit bounds the json/version answer read (the browser
// runs in the sandbox: its bytes are the sandbox's).
const devToolsVersionLimit = 64 << 10

// DevTools exposes the sandbox's DevTools port through the gateway
// (ExposePort) and asks the browser for its target. The browser names its
// WebSocket on the sandbox's loopback (ws://127.0.0.1:9222/devtools/browser/
// <id>): the endpoint returned is that path under the exposed port's URL.
// Every replica of a sandbox has its own. A sandbox whose browser does not
// answer fails with an error wrapping errdefs.ErrUnavailable.
func (sb *Sandbox) DevTools(ctx context.Context) (*DevTools, error) {
	base, token, err := sb.ExposePort(ctx, DevToolsPort)
	if err != nil {
		return nil, err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, strings.TrimSuffix(base, "/")+"/json/version", nil)
	if err != nil {
		return nil, fmt.Errorf("client: devtools: %w: %v", errdefs.ErrInvalidArgument, err)
	}
	header := http.Header{"Authorization": {"Bearer " + token}}
	req.Header = header.Clone()
	hc := &http.Client{Timeout: 30 * time.Second}
	if cfg := sb.gatewayTLS(); cfg != nil {
		hc.Transport = &http.Transport{TLSClientConfig: cfg}
	}
	resp, err := hc.Do(req)
	if err != nil {
		return nil, fmt.Errorf("client: devtools of %s: %w: %v", sb.id, errdefs.ErrUnavailable, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, devToolsVersionLimit+1))
	if err != nil {
		return nil, fmt.Errorf("client: devtools of %s: %w: %v", sb.id, errdefs.ErrUnavailable, err)
	}
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("client: devtools of %s: %w: json/version answered %s", sb.id, errdefs.ErrUnavailable, resp.Status)
	}
	d, err := devToolsEndpoint(base, body)
	if err != nil {
		return nil, fmt.Errorf("client: devtools of %s: %w", sb.id, err)
	}
	d.Header = header
	return d, nil
}

// browserTargetPath is the only WebSocket path taken from the browser's
// answer.
var browserTargetPath = regexp.MustCompile(`^/devtools/browser/[A-Za-z0-9-]{1,64}$`)

// devToolsEndpoint builds the endpoint from the exposed port's URL and the
// browser's json/version answer, keeping only the target's path from it.
func devToolsEndpoint(base string, body []byte) (*DevTools, error) {
	if len(body) > devToolsVersionLimit {
		return nil, fmt.Errorf("%w: json/version answer over %d bytes", errdefs.ErrUnavailable, devToolsVersionLimit)
	}
	var v struct {
		Browser string `json:"Browser"`
		WS      string `json:"webSocketDebuggerUrl"`
	}
	if err := json.Unmarshal(body, &v); err != nil {
		return nil, fmt.Errorf("%w: json/version: %v", errdefs.ErrUnavailable, err)
	}
	ws, err := url.Parse(v.WS)
	if err != nil || !browserTargetPath.MatchString(ws.Path) {
		return nil, fmt.Errorf("%w: json/version names no browser target (%.100q)", errdefs.ErrUnavailable, v.WS)
	}
	u, err := url.Parse(base)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") {
		return nil, fmt.Errorf("%w: exposed port URL %q", errdefs.ErrInvalidArgument, base)
	}
	httpURL := strings.TrimSuffix(u.String(), "/") + "/"
	u.Scheme = map[string]string{"http": "ws", "https": "wss"}[u.Scheme]
	u.Path = strings.TrimSuffix(u.Path, "/") + ws.Path
	u.RawPath = ""
	return &DevTools{WebSocketURL: u.String(), HTTPURL: httpURL, Browser: v.Browser}, nil
}
