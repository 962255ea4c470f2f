package a11y

import (
	"encoding/binary"
	"testing"
)

// A hostile bus (or application) cannot crash the decoder: every prefix
// and a set of broken signatures decode to an error, never a panic.
func FuzzDecodeValue(f *testing.F) {
	f.Add("a(so)", []byte{16, 0, 0, 0, 0, 0, 0, 0, 2, 0, 0, 0, ':', '1', 0, 0, 1, 0, 0, 0, '/', 0})
	f.Add("a{sv}", []byte{0, 0, 0, 0})
	f.Add("(iiii)", make([]byte, 16))
	f.Add("", []byte{})
	f.Add("(", []byte{1})
	f.Add("v", []byte{1, 'a', 0, 0, 255, 255, 255, 255})
	f.Fuzz(func(t *testing.T, sig string, b []byte) {
		if len(sig) > 255 {
			return
		}
		d := &decoder{b: b, order: binary.LittleEndian}
		for s := sig; s != "" && d.err == nil; {
			n := sigLen(s)
			if n == 0 {
				break
			}
			d.value(s[:n])
			s = s[n:]
		}
	})
}

func TestEncodeCallRoundTrip(t *testing.T) {
	msg, err := encodeCall(7, ref{":1.5", "/org/a11y/atspi/accessible/3"}, "org.a11y.atspi.Text", "GetText", []any{int32(0), int32(-1), "x", uint32(9), 1.5})
	if err != nil {
		t.Fatal(err)
	}
	if len(msg)%1 != 0 || msg[0] != 'l' || msg[1] != 1 {
		t.Fatalf("header %v", msg[:4])
	}
	fields := int(binary.LittleEndian.Uint32(msg[12:]))
	d := &decoder{b: msg[:16+fields], order: binary.LittleEndian, pos: 16}
	got := map[byte]any{}
	for d.pos < 16+fields {
		d.align(8)
		code := d.byte()
		v, err := d.value(d.signature())
		if err != nil {
			t.Fatal(err)
		}
		got[code] = v
	}
	if got[1] != "/org/a11y/atspi/accessible/3" || got[3] != "GetText" || got[6] != ":1.5" || got[8] != "iisuv" {
		t.Fatalf("fields %v", got)
	}
	body := &decoder{b: msg[(16+fields+7)&^7:], order: binary.LittleEndian}
	var vals []any
	for _, s := range []string{"i", "i", "s", "u", "v"} {
		v, err := body.value(s)
		if err != nil {
			t.Fatal(err)
		}
		vals = append(vals, v)
	}
	if vals[1] != int32(-1) || vals[2] != "x" || vals[3] != uint32(9) || vals[4].(variant).v != 1.5 {
		t.Fatalf("body %v", vals)
	}
}
