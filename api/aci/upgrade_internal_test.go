package aci

import (
	"bytes"
	"encoding/binary"
	"testing"

	"github.com/coder/websocket"
)

// clientFrame's three length encodings, masked (RFC 6455 5.2).
func TestClientFrame(t *testing.T) {
	for _, n := range []int{0, 125, 126, 300, 0xffff, 0x10000} {
		payload := bytes.Repeat([]byte{0xa5}, n)
		for _, typ := range []websocket.MessageType{websocket.MessageBinary, websocket.MessageText} {
			f, err := clientFrame(typ, payload)
			if err != nil {
				t.Fatal(err)
			}
			wantOp := byte(0x2)
			if typ == websocket.MessageText {
				wantOp = 0x1
			}
			if f[0] != 0x80|wantOp || f[1]&0x80 == 0 {
				t.Fatalf("n=%d: header %x: want FIN, opcode %d, mask bit", n, f[:2], wantOp)
			}
			var got, hdr int
			switch l := f[1] & 0x7f; l {
			case 126:
				got, hdr = int(binary.BigEndian.Uint16(f[2:])), 4
			case 127:
				got, hdr = int(binary.BigEndian.Uint64(f[2:])), 10
			default:
				got, hdr = int(l), 2
			}
			if got != n || (n < 126) != (hdr == 2) || (n > 0xffff) != (hdr == 10) {
				t.Fatalf("n=%d: length %d in a %d-byte header", n, got, hdr)
			}
			key, body := f[hdr:hdr+4], f[hdr+4:]
			if len(body) != n {
				t.Fatalf("n=%d: body of %d bytes", n, len(body))
			}
			for i := range body {
				if body[i]^key[i&3] != payload[i] {
					t.Fatalf("n=%d: byte %d does not unmask to the payload", n, i)
				}
			}
		}
	}
}
