// Package wire holds what both ends of the ACI compute the same way besides
// the protobuf messages: the answer to a proof challenge and the record
// opcodes of zlib screencast frames. It imports only the standard library,
// so guestd uses it too.
package wire

import (
	"crypto/hmac"
	"crypto/sha256"
)

// ProofMAC answers a challenge about a secret value a sandbox holds (the
// memory mark, the network probe's value): HMAC-SHA256 of nonce keyed by
// the value. Fork verification sends a fresh nonce, so only a process that
// holds the value can answer.
func ProofMAC(value, nonce []byte) []byte {
	m := hmac.New(sha256.New, value)
	m.Write(nonce)
	return m.Sum(nil)
}

// ProofOK reports, in constant time, whether got answers nonce for value.
func ProofOK(value, nonce, got []byte) bool {
	return hmac.Equal(got, ProofMAC(value, nonce))
}

// Records of a zlib screencast frame, inflated (the encoder's comment in
// guestd/internal/screencast/zlib.go gives their layout).
const (
	ZlibOpRaw   = 0 // rect, then B, G, R per pixel
	ZlibOpCopy  = 1 // rect, src x, src y
	ZlibOpSolid = 2 // rect, B, G, R
	ZlibOpEnd   = 3 // the frame's last record
)

// A11yStates names the bits of A11yNode.states: AT-SPI's AtspiStateType, by
// bit number.
var A11yStates = [...]string{
	"invalid", "active", "armed", "busy", "checked", "collapsed", "defunct", "editable", "enabled",
	"expandable", "expanded", "focusable", "focused", "has tooltip", "horizontal", "iconified", "modal",
	"multi line", "multiselectable", "opaque", "pressed", "resizable", "selectable", "selected",
	"sensitive", "showing", "single line", "stale", "transient", "vertical", "visible",
	"manages descendants", "indeterminate", "required", "truncated", "animated", "invalid entry",
	"supports autocompletion", "selectable text", "is default", "visited", "checkable", "has popup",
	"read only",
}
