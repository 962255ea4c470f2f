// Package pagetest holds the web pages forkfleet's browser tests and
// benchmarks open in a sandbox's Chromium (the desktop-web image), and the
// one way they open them: as a file the ACI puts into the sandbox, typed
// into the address bar as a person would. No network is involved.
package pagetest

import (
	"context"
	_ "embed"
	"time"

	"github.com/forkfleet/forkfleet/api/aci"
	aciv1 "github.com/forkfleet/forkfleet/api/gen/forkfleet/aci/v1"
)

// Counter keeps a counter in JavaScript (every 50 ms, drawn each tick: the
// page animates) and shows it, the text of its focused input and nothing
// else in the page title, which the browser window's title carries: state
// an agent sees without the network. The title starts with "counter ".
//
//go:embed counter.html
var Counter []byte

// CounterPath is where Open puts the counter page.
const CounterPath = "/tmp/counter.html"

// Open puts content at path in the sandbox and types its file:// URL into
// the focused browser's address bar. Call it once the desktop is ready (the
// image's readiness: the browser's window focused on its start page); wait
// for the page's title after it.
func Open(ctx context.Context, s *aci.Session, path string, content []byte) error {
	if err := s.PutFile(ctx, path, content); err != nil {
		return err
	}
	// Chromium moves the focus into its address bar asynchronously after
	// ctrl+l: a key typed at once can land before it (the first letter of
	// the URL went missing now and then), so wait as a person would.
	_, err := s.Step(ctx, []*aciv1.Action{aci.Key("ctrl", "l"), aci.Wait(300 * time.Millisecond),
		aci.Type("file://" + path), aci.Key("Return")}, nil)
	return err
}
