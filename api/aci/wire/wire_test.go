package wire

import (
	"encoding/hex"
	"testing"
)

// The MAC is fixed by the wire: guestd and controld are built apart.
func TestProofMAC(t *testing.T) {
	// RFC 4231 test case 2.
	got := ProofMAC([]byte("Jefe"), []byte("what do ya want for nothing?"))
	if want := "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"; hex.EncodeToString(got) != want {
		t.Fatalf("ProofMAC = %x", got)
	}
	if !ProofOK([]byte("Jefe"), []byte("what do ya want for nothing?"), got) {
		t.Fatal("ProofOK refuses the right answer")
	}
	if ProofOK([]byte("Jeff"), []byte("what do ya want for nothing?"), got) {
		t.Fatal("ProofOK takes another value's answer")
	}
}
