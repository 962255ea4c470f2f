package fleet

import (
	"crypto/rand"
	"encoding/hex"
)

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
