package recording

import (
	"bytes"
	"encoding/binary"
)

// wsReader follows one direction of a WebSocket connection as its bytes
// pass through the gateway, which forwards them unchanged whatever this
// reader makes of them, and hands each complete data message to
// onMessage. It never fails the connection: on bytes it does not
// understand (compression, a protocol error) it stops reading that
// direction for good. Messages are kept up to keep bytes; a longer one is
// delivered cut (truncated, with its full size), so a hostile peer cannot
// make it buffer more.
//
// RFC 6455 framing: FIN/RSV/opcode, MASK/length (7, 16 or 64 bits), the
// mask key on client frames, then the payload; control frames may come
// between the fragments of a message.
type wsReader struct {
	// httpHead: the direction starts with an HTTP response head (guestd's
	// 101) to skip first.
	httpHead bool
	head     []byte
	keep     int

	hdr    [14]byte
	hn     int
	left   uint64 // payload bytes left in the current frame
	mask   [4]byte
	masked bool
	mpos   int
	ctrl   bool // the current frame is a control frame (skipped)
	fin    bool

	inMsg     bool
	text      bool
	msg       []byte
	size      uint64
	truncated bool

	broken bool

	onMessage func(text bool, data []byte, size uint64, truncated bool)
}

const maxHTTPHead = 16 << 10

func (r *wsReader) Write(b []byte) (int, error) {
	n := len(b)
	for len(b) > 0 && !r.broken {
		if r.httpHead {
			b = r.readHead(b)
			continue
		}
		if r.left == 0 && !r.inFrame() {
			b = r.readHeader(b)
			continue
		}
		b = r.readPayload(b)
	}
	return n, nil
}

// inFrame reports whether a frame header was read and its payload (maybe
// empty) is not finished.
func (r *wsReader) inFrame() bool { return r.hn < 0 }

func (r *wsReader) readHead(b []byte) []byte {
	room := maxHTTPHead - len(r.head)
	take := min(len(b), room)
	r.head = append(r.head, b[:take]...)
	i := bytes.Index(r.head, []byte("\r\n\r\n"))
	if i < 0 {
		if len(r.head) >= maxHTTPHead {
			r.broken = true
		}
		return b[take:]
	}
	if !bytes.HasPrefix(r.head, []byte("HTTP/1.1 101 ")) {
		r.broken = true // the upgrade was refused: no WebSocket follows
		return nil
	}
	used := i + 4 - (len(r.head) - take) // bytes of b that belong to the head
	r.httpHead, r.head = false, nil
	return b[used:]
}

// readHeader collects a frame header; once complete the frame's payload
// follows.
func (r *wsReader) readHeader(b []byte) []byte {
	need := 2
	if r.hn >= 2 {
		need = 2 + r.extLen() + 4*int(r.hdr[1]>>7)
	}
	for r.hn < need && len(b) > 0 {
		r.hdr[r.hn] = b[0]
		r.hn++
		b = b[1:]
		if r.hn == 2 {
			need = 2 + r.extLen() + 4*int(r.hdr[1]>>7)
		}
	}
	if r.hn < need {
		return b
	}
	h := r.hdr[:r.hn]
	if h[0]&0x70 != 0 { // RSV bits: an extension (compression) we do not follow
		r.broken = true
		return nil
	}
	op := h[0] & 0x0f
	r.fin = h[0]&0x80 != 0
	var n uint64
	switch ext := r.extLen(); ext {
	case 0:
		n = uint64(h[1] & 0x7f)
	case 2:
		n = uint64(binary.BigEndian.Uint16(h[2:]))
	case 8:
		n = binary.BigEndian.Uint64(h[2:])
	}
	r.masked = h[1]&0x80 != 0
	if r.masked {
		copy(r.mask[:], h[2+r.extLen():])
	}
	r.mpos = 0
	r.left = n
	r.ctrl = op >= 8
	switch {
	case op == 8: // close: nothing we follow comes after it
		r.broken = true
		r.flush()
		return nil
	case r.ctrl:
		if n > 125 || !r.fin {
			r.broken = true
			return nil
		}
	case op == 0:
		if !r.inMsg {
			r.broken = true
			return nil
		}
	case op == 1 || op == 2:
		if r.inMsg {
			r.broken = true
			return nil
		}
		r.inMsg, r.text, r.msg, r.size, r.truncated = true, op == 1, r.msg[:0], 0, false
	default:
		r.broken = true
		return nil
	}
	r.hn = -1 // in the frame's payload
	if n == 0 {
		r.endFrame()
	}
	return b
}

func (r *wsReader) extLen() int {
	switch r.hdr[1] & 0x7f {
	case 126:
		return 2
	case 127:
		return 8
	}
	return 0
}

func (r *wsReader) readPayload(b []byte) []byte {
	take := len(b)
	if uint64(take) > r.left {
		take = int(r.left)
	}
	p := b[:take]
	r.left -= uint64(take)
	if !r.ctrl {
		r.size += uint64(take)
		if room := r.keep - len(r.msg); room > 0 {
			keep := p[:min(room, len(p))]
			start := len(r.msg)
			r.msg = append(r.msg, keep...)
			if r.masked {
				for i := start; i < len(r.msg); i++ {
					r.msg[i] ^= r.mask[r.mpos&3]
					r.mpos++
				}
			}
		}
		if len(p) > 0 && len(r.msg) >= r.keep && r.size > uint64(r.keep) {
			r.truncated = true
		}
	}
	if r.left == 0 {
		r.endFrame()
	}
	return b[take:]
}

func (r *wsReader) endFrame() {
	r.hn = 0
	if r.ctrl || !r.fin {
		return
	}
	r.flush()
}

// flush delivers the message in progress, if any.
func (r *wsReader) flush() {
	if !r.inMsg {
		return
	}
	r.inMsg = false
	if r.onMessage != nil {
		r.onMessage(r.text, r.msg, r.size, r.truncated)
	}
	if cap(r.msg) > 1<<20 {
		r.msg = nil // do not hold a large buffer between messages
	}
}
