// Package rfb is a minimal RFB 3.8 (VNC) client for measuring a VNC server
// as a peer: it negotiates no authentication, asks for 32-bit true colour,
// requests framebuffer updates and accounts the bytes of every update
// without decoding pixels (ZRLE, Tight, Raw, CopyRect and LastRect are
// framed; anything else is a protocol error).
package rfb

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"time"
)

// Encodings.
const (
	EncRaw      int32 = 0
	EncCopyRect int32 = 1
	EncTight    int32 = 7
	EncZRLE     int32 = 16
	EncLastRect int32 = -224
)

// Conn is one RFB client connection.
type Conn struct {
	c      net.Conn
	r      *bufio.Reader
	Width  int
	Height int
	Name   string
	read   int64     // bytes read from the server so far
	lastRx time.Time // when the latest read from the socket returned data
}

// countingReader sits under the bufio.Reader: it counts bytes and stamps
// the time each socket read returned data, so a message's first byte can be
// dated even when the buffer already held it.
type countingReader struct{ rc *Conn }

func (c countingReader) Read(p []byte) (int, error) {
	n, err := c.rc.c.Read(p)
	if n > 0 {
		c.rc.read += int64(n)
		c.rc.lastRx = time.Now()
	}
	return n, err
}

// Dial connects, performs the 3.8 handshake with security type None, and
// sets a 32bpp depth-24 little-endian true-colour pixel format and the
// given encodings (in preference order).
func Dial(addr string, timeout time.Duration, encodings ...int32) (*Conn, error) {
	c, err := net.DialTimeout("tcp", addr, timeout)
	if err != nil {
		return nil, err
	}
	if tc, ok := c.(*net.TCPConn); ok {
		tc.SetNoDelay(true)
	}
	rc := &Conn{c: c}
	rc.r = bufio.NewReaderSize(countingReader{rc}, 1<<16)
	c.SetDeadline(time.Now().Add(timeout))
	if err := rc.handshake(encodings); err != nil {
		c.Close()
		return nil, fmt.Errorf("rfb handshake: %w", err)
	}
	c.SetDeadline(time.Time{})
	return rc, nil
}

func (rc *Conn) handshake(encodings []int32) error {
	ver := make([]byte, 12)
	if _, err := io.ReadFull(rc.r, ver); err != nil {
		return err
	}
	if string(ver[:4]) != "RFB " {
		return fmt.Errorf("not an RFB server: %q", ver)
	}
	if _, err := rc.c.Write([]byte("RFB 003.008\n")); err != nil {
		return err
	}
	var n uint8
	if err := binary.Read(rc.r, binary.BigEndian, &n); err != nil {
		return err
	}
	if n == 0 {
		return errors.New("server refused: " + rc.readReason())
	}
	types := make([]byte, n)
	if _, err := io.ReadFull(rc.r, types); err != nil {
		return err
	}
	found := false
	for _, t := range types {
		found = found || t == 1
	}
	if !found {
		return fmt.Errorf("server offers no security type None (offers %v)", types)
	}
	if _, err := rc.c.Write([]byte{1}); err != nil {
		return err
	}
	var status uint32
	if err := binary.Read(rc.r, binary.BigEndian, &status); err != nil {
		return err
	}
	if status != 0 {
		return errors.New("security failed: " + rc.readReason())
	}
	if _, err := rc.c.Write([]byte{1}); err != nil { // ClientInit: shared
		return err
	}
	var si struct {
		W, H uint16
		PF   [16]byte
		NL   uint32
	}
	if err := binary.Read(rc.r, binary.BigEndian, &si); err != nil {
		return err
	}
	name := make([]byte, si.NL)
	if _, err := io.ReadFull(rc.r, name); err != nil {
		return err
	}
	rc.Width, rc.Height, rc.Name = int(si.W), int(si.H), string(name)
	// SetPixelFormat: 32 bpp, depth 24, little endian, true colour, 8/8/8.
	pf := []byte{0, 0, 0, 0, 32, 24, 0, 1, 0, 255, 0, 255, 0, 255, 16, 8, 0, 0, 0, 0}
	if _, err := rc.c.Write(pf); err != nil {
		return err
	}
	msg := make([]byte, 4+4*len(encodings))
	msg[0] = 2
	binary.BigEndian.PutUint16(msg[2:], uint16(len(encodings)))
	for i, e := range encodings {
		binary.BigEndian.PutUint32(msg[4+4*i:], uint32(e))
	}
	_, err := rc.c.Write(msg)
	return err
}

func (rc *Conn) readReason() string {
	var l uint32
	if binary.Read(rc.r, binary.BigEndian, &l) != nil || l > 1<<16 {
		return "(no reason)"
	}
	b := make([]byte, l)
	io.ReadFull(rc.r, b)
	return string(b)
}

// Close closes the connection.
func (rc *Conn) Close() error { return rc.c.Close() }

// Request sends a FramebufferUpdateRequest for the whole screen.
func (rc *Conn) Request(incremental bool) error {
	msg := make([]byte, 10)
	msg[0] = 3
	if incremental {
		msg[1] = 1
	}
	binary.BigEndian.PutUint16(msg[6:], uint16(rc.Width))
	binary.BigEndian.PutUint16(msg[8:], uint16(rc.Height))
	_, err := rc.c.Write(msg)
	return err
}

// Update is one FramebufferUpdate as accounted.
type Update struct {
	Bytes int64 // wire bytes of the whole message
	// Payload is the encoded pixel data: Bytes less the message header
	// (4 bytes), the rectangle headers (12 bytes each) and ZRLE's 4-byte
	// length prefixes. A Tight rectangle counts whole (its control byte
	// and compact lengths are part of the encoding).
	Payload int64
	Rects   int
	Pixels  int64 // area covered by rectangles
	// FirstByte is when the socket read that delivered the message's first
	// byte returned; Received is when the whole message had been read.
	FirstByte time.Time
	Received  time.Time
}

// ReadUpdate reads server messages until a FramebufferUpdate has been read
// whole, skipping bells, colour maps and cut text. deadline bounds the wait.
func (rc *Conn) ReadUpdate(deadline time.Time) (Update, error) {
	rc.c.SetReadDeadline(deadline)
	for {
		start := rc.read - int64(rc.r.Buffered())
		t, err := rc.r.ReadByte()
		if err != nil {
			return Update{}, err
		}
		// The type byte came with the latest socket read: either the one
		// ReadByte just made or the earlier one that left it buffered.
		first := rc.lastRx
		switch t {
		case 0:
			u, err := rc.readUpdateBody()
			if err != nil {
				return Update{}, err
			}
			u.Bytes = rc.read - int64(rc.r.Buffered()) - start
			u.FirstByte, u.Received = first, time.Now()
			return u, nil
		case 1: // SetColourMapEntries
			var h struct {
				Pad   uint8
				First uint16
				N     uint16
			}
			if err := binary.Read(rc.r, binary.BigEndian, &h); err != nil {
				return Update{}, err
			}
			if _, err := rc.r.Discard(int(h.N) * 6); err != nil {
				return Update{}, err
			}
		case 2: // Bell
		case 3: // ServerCutText
			var h struct {
				Pad [3]byte
				L   uint32
			}
			if err := binary.Read(rc.r, binary.BigEndian, &h); err != nil {
				return Update{}, err
			}
			if _, err := rc.r.Discard(int(h.L)); err != nil {
				return Update{}, err
			}
		default:
			return Update{}, fmt.Errorf("unknown server message type %d", t)
		}
	}
}

func (rc *Conn) readUpdateBody() (Update, error) {
	var h struct {
		Pad uint8
		N   uint16
	}
	if err := binary.Read(rc.r, binary.BigEndian, &h); err != nil {
		return Update{}, err
	}
	var u Update
	for i := 0; i < int(h.N); i++ {
		var rh struct {
			X, Y, W, H uint16
			Enc        int32
		}
		if err := binary.Read(rc.r, binary.BigEndian, &rh); err != nil {
			return u, err
		}
		if rh.Enc == EncLastRect {
			break
		}
		u.Rects++
		u.Pixels += int64(rh.W) * int64(rh.H)
		start := rc.read - int64(rc.r.Buffered())
		if err := rc.skipRect(int(rh.W), int(rh.H), rh.Enc); err != nil {
			return u, fmt.Errorf("rect %d (encoding %d): %w", i, rh.Enc, err)
		}
		body := rc.read - int64(rc.r.Buffered()) - start
		if rh.Enc == EncZRLE {
			body -= 4
		}
		u.Payload += body
	}
	return u, nil
}

func (rc *Conn) skipRect(w, h int, enc int32) error {
	switch enc {
	case EncRaw:
		_, err := rc.r.Discard(w * h * 4)
		return err
	case EncCopyRect:
		_, err := rc.r.Discard(4)
		return err
	case EncZRLE:
		var l uint32
		if err := binary.Read(rc.r, binary.BigEndian, &l); err != nil {
			return err
		}
		_, err := rc.r.Discard(int(l))
		return err
	case EncTight:
		return rc.skipTight(w, h)
	}
	return fmt.Errorf("unsupported encoding %d", enc)
}

// skipTight frames one Tight rectangle (RFC 6143 extension as implemented
// by libvncserver) with 32bpp depth-24 pixels, i.e. 3-byte TPIXELs.
func (rc *Conn) skipTight(w, h int) error {
	ctl, err := rc.r.ReadByte()
	if err != nil {
		return err
	}
	kind := ctl >> 4
	switch {
	case kind == 0x08: // fill
		_, err := rc.r.Discard(3)
		return err
	case kind == 0x09: // JPEG
		l, err := rc.compactLen()
		if err != nil {
			return err
		}
		_, err = rc.r.Discard(l)
		return err
	case kind > 0x09:
		return fmt.Errorf("tight compression control %#x", ctl)
	}
	size := w * h * 3
	if kind&0x04 != 0 { // explicit filter
		f, err := rc.r.ReadByte()
		if err != nil {
			return err
		}
		switch f {
		case 0, 2: // copy, gradient
		case 1: // palette
			nc, err := rc.r.ReadByte()
			if err != nil {
				return err
			}
			colors := int(nc) + 1
			if _, err := rc.r.Discard(colors * 3); err != nil {
				return err
			}
			if colors == 2 {
				size = (w + 7) / 8 * h
			} else {
				size = w * h
			}
		default:
			return fmt.Errorf("tight filter %d", f)
		}
	}
	if size < 12 {
		_, err := rc.r.Discard(size)
		return err
	}
	l, err := rc.compactLen()
	if err != nil {
		return err
	}
	_, err = rc.r.Discard(l)
	return err
}

func (rc *Conn) compactLen() (int, error) {
	l := 0
	for i := 0; i < 3; i++ {
		b, err := rc.r.ReadByte()
		if err != nil {
			return 0, err
		}
		if i == 2 {
			l |= int(b) << 14
			break
		}
		l |= int(b&0x7f) << (7 * i)
		if b&0x80 == 0 {
			break
		}
	}
	return l, nil
}
