// Package peers names the tools benchd measures forkfleet against, where
// their binaries are, and the Debian packages that install them. `make
// peers` installs every one (`benchd peers packages` lists them for
// deploy/host-setup.sh); a suite that promises a peer fails when it is
// missing, unless benchd runs with --skip-missing-peers.
package peers

import (
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"
)

// Peer is one tool a suite compares against.
type Peer struct {
	Name    string // as suites and result rows name it
	Package string // the Debian package that installs it
	// Paths are the binary's absolute paths, the first existing one wins.
	// Never PATH: /usr/local may hold wrappers that are not the tool a user
	// of the peer runs.
	Paths []string
}

// table is every peer of every suite.
var table = []Peer{
	{Name: "xdotool", Package: "xdotool", Paths: []string{"/usr/bin/xdotool"}},
	{Name: "import", Package: "imagemagick", Paths: []string{"/usr/bin/import-im6.q16", "/usr/bin/import"}},
	{Name: "convert", Package: "imagemagick", Paths: []string{"/usr/bin/convert-im6.q16", "/usr/bin/convert"}},
	{Name: "xwd", Package: "x11-apps", Paths: []string{"/usr/bin/xwd"}},
	{Name: "x11vnc", Package: "x11vnc", Paths: []string{"/usr/bin/x11vnc"}},
	{Name: "podman", Package: "podman", Paths: []string{"/usr/bin/podman"}},
}

// ErrMissing is returned for a peer whose binary is not installed.
var ErrMissing = errors.New("peer not installed")

// All returns every peer.
func All() []Peer { return slices.Clone(table) }

// Lookup returns the peer named name.
func Lookup(name string) (Peer, bool) {
	i := slices.IndexFunc(table, func(p Peer) bool { return p.Name == name })
	if i < 0 {
		return Peer{}, false
	}
	return table[i], true
}

// Path returns the peer's installed binary.
func (p Peer) Path() (string, error) {
	for _, path := range p.Paths {
		if st, err := os.Stat(path); err == nil && !st.IsDir() && st.Mode()&0o111 != 0 {
			return path, nil
		}
	}
	return "", fmt.Errorf("%s (Debian package %s, %s): %w", p.Name, p.Package, strings.Join(p.Paths, " or "), ErrMissing)
}

// Packages returns the Debian packages of every peer, sorted, once each.
func Packages() []string {
	var out []string
	for _, p := range table {
		out = append(out, p.Package)
	}
	slices.Sort(out)
	return slices.Compact(out)
}

// Resolve returns the binary of every named peer and the ones missing.
// Unknown names are a programming error: they panic.
func Resolve(names []string) (paths map[string]string, missing []Peer) {
	paths = map[string]string{}
	for _, n := range names {
		p, ok := Lookup(n)
		if !ok {
			panic("peers: unknown peer " + n)
		}
		if path, err := p.Path(); err == nil {
			paths[n] = path
		} else {
			missing = append(missing, p)
		}
	}
	return paths, missing
}

// Describe names missing peers and their packages for a message.
func Describe(missing []Peer) string {
	var parts []string
	for _, p := range missing {
		parts = append(parts, fmt.Sprintf("%s (package %s)", p.Name, p.Package))
	}
	return strings.Join(parts, ", ")
}
