package recording

import (
	"bytes"
	"encoding/binary"
	"testing"
)

// frameBytes builds one WebSocket frame (masked with key when it is set).
func frameBytes(fin bool, op byte, payload []byte, key []byte) []byte {
	b0 := op
	if fin {
		b0 |= 0x80
	}
	out := []byte{b0}
	mask := byte(0)
	if key != nil {
		mask = 0x80
	}
	switch n := len(payload); {
	case n < 126:
		out = append(out, mask|byte(n))
	case n < 1<<16:
		out = append(out, mask|126)
		out = binary.BigEndian.AppendUint16(out, uint16(n))
	default:
		out = append(out, mask|127)
		out = binary.BigEndian.AppendUint64(out, uint64(n))
	}
	p := append([]byte(nil), payload...)
	if key != nil {
		out = append(out, key...)
		for i := range p {
			p[i] ^= key[i%4]
		}
	}
	return append(out, p...)
}

type got struct {
	text      bool
	data      []byte
	size      uint64
	truncated bool
}

func collect(r *wsReader) *[]got {
	var out []got
	r.onMessage = func(text bool, data []byte, size uint64, truncated bool) {
		out = append(out, got{text, append([]byte(nil), data...), size, truncated})
	}
	return &out
}

// TestWSReader: messages come out whole from any split of the bytes:
// masked, fragmented with a ping between the fragments, 16- and 64-bit
// lengths, cut at the keep bound; guestd's 101 head is skipped; a close or
// an extension bit ends the reading, never the connection.
func TestWSReader(t *testing.T) {
	key := []byte{1, 2, 3, 4}
	big := bytes.Repeat([]byte("x"), 70000)
	var stream []byte
	stream = append(stream, "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\n\r\n"...)
	stream = append(stream, frameBytes(true, 2, []byte("one"), key)...)
	stream = append(stream, frameBytes(false, 1, []byte("tw"), key)...)
	stream = append(stream, frameBytes(true, 9, []byte("ping"), key)...)
	stream = append(stream, frameBytes(true, 0, []byte("o"), key)...)
	stream = append(stream, frameBytes(true, 2, big, nil)...)
	stream = append(stream, frameBytes(true, 2, bytes.Repeat([]byte("y"), 300), nil)...)
	stream = append(stream, frameBytes(true, 2, nil, nil)...)
	stream = append(stream, frameBytes(true, 8, nil, nil)...)
	stream = append(stream, frameBytes(true, 2, []byte("after close"), nil)...)
	for _, split := range []int{1, 3, 7, 1000, len(stream)} {
		r := &wsReader{keep: 1000, httpHead: true}
		out := collect(r)
		for b := stream; len(b) > 0; {
			n := min(split, len(b))
			r.Write(b[:n])
			b = b[n:]
		}
		msgs := *out
		if len(msgs) != 5 {
			t.Fatalf("split %d: %d messages: %+v", split, len(msgs), msgs)
		}
		if string(msgs[0].data) != "one" || msgs[0].text || string(msgs[1].data) != "two" || !msgs[1].text {
			t.Fatalf("split %d: %q %q", split, msgs[0].data, msgs[1].data)
		}
		if !msgs[2].truncated || msgs[2].size != 70000 || len(msgs[2].data) != 1000 {
			t.Fatalf("split %d: big message %v %d %d", split, msgs[2].truncated, msgs[2].size, len(msgs[2].data))
		}
		if msgs[3].truncated || len(msgs[3].data) != 300 || msgs[4].size != 0 {
			t.Fatalf("split %d: %+v", split, msgs[3:])
		}
	}
	// A refused upgrade: nothing is read as frames.
	r := &wsReader{keep: 100, httpHead: true}
	out := collect(r)
	r.Write([]byte("HTTP/1.1 401 Unauthorized\r\n\r\n"))
	r.Write(frameBytes(true, 2, []byte("x"), nil))
	// Compression (RSV1): reading stops.
	r2 := &wsReader{keep: 100}
	out2 := collect(r2)
	r2.Write([]byte{0xc2, 0x01, 'x'})
	r2.Write(frameBytes(true, 2, []byte("x"), nil))
	if len(*out) != 0 || len(*out2) != 0 || !r.broken || !r2.broken {
		t.Fatalf("refused upgrade %v, compressed %v", *out, *out2)
	}
}
