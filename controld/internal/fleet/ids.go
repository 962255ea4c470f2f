package fleet

import (
	"crypto/rand"
	"encoding/base32"
	"encoding/hex"
	"strings"
)

// Ids are a kind prefix plus 80 random bits in lower-case base32: unique
// without coordination, so an id names the same object on any host.
var idEncoding = base32.NewEncoding("abcdefghijklmnopqrstuvwxyz234567").WithPadding(base32.NoPadding)

const (
	prefixSandbox    = "sb-"
	prefixCheckpoint = "ck-"
	prefixPool       = "pl-"
)

func newID(prefix string) string {
	var b [10]byte
	rand.Read(b[:])
	return prefix + idEncoding.EncodeToString(b[:])
}

// validID reports whether s looks like an id of this kind (cheap syntax
// check, so garbage is InvalidArgument rather than NotFound).
func validID(prefix, s string) bool {
	if !strings.HasPrefix(s, prefix) || len(s) != len(prefix)+16 {
		return false
	}
	_, err := idEncoding.DecodeString(s[len(prefix):])
	return err == nil
}

// newToken returns 256 random bits, hex encoded.
func newToken() string {
	var b [32]byte
	rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

func randomBytes(n int) []byte {
	b := make([]byte, n)
	rand.Read(b)
	return b
}
