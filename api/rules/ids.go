package rules

import (
	"crypto/rand"
	"encoding/base32"
	"strings"
)

// Ids are a kind prefix plus 80 random bits in lower-case base32: unique
// without coordination, so an id names the same object on any host.
var idEncoding = base32.NewEncoding("abcdefghijklmnopqrstuvwxyz234567").WithPadding(base32.NoPadding)

// Id prefixes.
const (
	PrefixSandbox    = "sb-"
	PrefixCheckpoint = "ck-"
	PrefixPool       = "pl-"
	PrefixRecording  = "rc-"
)

// NewID returns a fresh id of the kind prefix names.
func NewID(prefix string) string {
	var b [10]byte
	rand.Read(b[:])
	return prefix + idEncoding.EncodeToString(b[:])
}

// ValidID reports whether s looks like an id of this kind (cheap syntax
// check, so garbage is InvalidArgument rather than NotFound).
func ValidID(prefix, s string) bool {
	if !strings.HasPrefix(s, prefix) || len(s) != len(prefix)+16 {
		return false
	}
	_, err := idEncoding.DecodeString(s[len(prefix):])
	return err == nil
}
