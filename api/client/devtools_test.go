package client

import (
	"errors"
	"strings"
	"testing"

	"github.com/forkfleet/forkfleet/api/errdefs"
)

func TestDevToolsEndpoint(t *testing.T) {
	base := "https://gw.example:7480/v1/sandboxes/sb-1/ports/9222/"
	d, err := devToolsEndpoint(base, []byte(`{"Browser":"Chrome/156.0.8078.114","webSocketDebuggerUrl":"ws://127.0.0.1:9222/devtools/browser/4c81923f-59ae-4cd5"}`))
	if err != nil {
		t.Fatal(err)
	}
	if d.WebSocketURL != "wss://gw.example:7480/v1/sandboxes/sb-1/ports/9222/devtools/browser/4c81923f-59ae-4cd5" ||
		d.HTTPURL != base || d.Browser != "Chrome/156.0.8078.114" {
		t.Fatalf("endpoint %+v", d)
	}
	// What the sandbox's browser answers is hostile: only a browser
	// target's path is taken from it.
	for _, body := range []string{
		`{"webSocketDebuggerUrl":"ws://evil.example/devtools/browser/../../admin"}`,
		`{"webSocketDebuggerUrl":"ws://127.0.0.1:9222/devtools/page/1"}`,
		`{"webSocketDebuggerUrl":""}`,
		`not json`,
		`{"webSocketDebuggerUrl":"ws://127.0.0.1/devtools/browser/` + strings.Repeat("a", 65) + `"}`,
		strings.Repeat(" ", devToolsVersionLimit+1),
	} {
		if _, err := devToolsEndpoint(base, []byte(body)); !errors.Is(err, errdefs.ErrUnavailable) {
			t.Errorf("%.60q: got %v, want UNAVAILABLE", body, err)
		}
	}
	if d, err := devToolsEndpoint("http://127.0.0.1:7480/v1/sandboxes/sb-2/ports/9222", []byte(`{"webSocketDebuggerUrl":"ws://127.0.0.1:9222/devtools/browser/x"}`)); err != nil ||
		d.WebSocketURL != "ws://127.0.0.1:7480/v1/sandboxes/sb-2/ports/9222/devtools/browser/x" {
		t.Fatalf("plain gateway: %+v %v", d, err)
	}
}
