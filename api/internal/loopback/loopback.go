// Package loopback decides whether traffic to a host stays on this machine,
// where a bearer token may travel without TLS (the rule api/client and
// api/aci share).
package loopback

import "net"

// Host reports whether host (a name or an IP, without port or brackets)
// is "localhost" or a loopback address. Other names are not resolved: a
// name that happens to resolve to the loopback still counts as remote.
func Host(host string) bool {
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}
