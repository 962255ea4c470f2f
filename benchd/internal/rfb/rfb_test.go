package rfb

import (
	"encoding/binary"
	"io"
	"net"
	"testing"
	"time"
)

// fakeServer speaks just enough RFB 3.8 to send one update of three
// rectangles (Raw 2x2, ZRLE with a 5-byte payload, Tight fill) and a bell.
func fakeServer(t *testing.T) (string, int) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	var upd []byte
	be := binary.BigEndian
	rect := func(w, h uint16, enc int32) {
		b := make([]byte, 12)
		be.PutUint16(b[4:], w)
		be.PutUint16(b[6:], h)
		be.PutUint32(b[8:], uint32(enc))
		upd = append(upd, b...)
	}
	upd = append(upd, 0, 0, 0, 3)
	rect(2, 2, EncRaw)
	upd = append(upd, make([]byte, 16)...)
	rect(10, 10, EncZRLE)
	upd = append(upd, 0, 0, 0, 5, 1, 2, 3, 4, 5)
	rect(64, 64, EncTight)
	upd = append(upd, 0x80, 9, 9, 9)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		serverHandshake(c, 1280, 800, "xy", 20+4+4*3+10)
		c.Write([]byte{2}) // bell
		c.Write(upd)
		time.Sleep(200 * time.Millisecond)
	}()
	return ln.Addr().String(), len(upd)
}

func TestHandshakeAndUpdateAccounting(t *testing.T) {
	addr, want := fakeServer(t)
	c, err := Dial(addr, 2*time.Second, EncZRLE, EncTight, EncRaw)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if c.Width != 1280 || c.Height != 800 || c.Name != "xy" {
		t.Fatalf("server init: %+v", c)
	}
	if err := c.Request(false); err != nil {
		t.Fatal(err)
	}
	u, err := c.ReadUpdate(time.Now().Add(2 * time.Second))
	if err != nil {
		t.Fatal(err)
	}
	if u.Bytes != int64(want) || u.Rects != 3 || u.Pixels != 4+100+4096 {
		t.Fatalf("update %+v, want %d bytes", u, want)
	}
	// Raw 16 + ZRLE 5 (its length prefix is framing) + Tight 4.
	if u.Payload != 16+5+4 {
		t.Fatalf("payload %d bytes, want %d", u.Payload, 16+5+4)
	}
	if u.FirstByte.IsZero() || u.FirstByte.After(u.Received) {
		t.Fatalf("first byte at %v, received at %v", u.FirstByte, u.Received)
	}
}

// TestFirstByteOfBufferedUpdate: an update that was already buffered when
// ReadUpdate started is dated by the socket read that brought it, not by
// the moment it was parsed.
func TestFirstByteOfBufferedUpdate(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	empty := []byte{0, 0, 0, 1, 0, 0, 0, 0, 0, 1, 0, 1, 0, 0, 0, 1, 0, 0, 0, 0} // one 1x1 CopyRect
	go func() {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		serverHandshake(c, 16, 16, "", 20+4+4)
		c.Write(append(append([]byte(nil), empty...), empty...)) // two updates, one write
		time.Sleep(200 * time.Millisecond)
	}()
	c, err := Dial(ln.Addr().String(), 2*time.Second, EncCopyRect)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	u1, err := c.ReadUpdate(time.Now().Add(2 * time.Second))
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(20 * time.Millisecond)
	buffered := c.r.Buffered()
	u2, err := c.ReadUpdate(time.Now().Add(2 * time.Second))
	if err != nil {
		t.Fatal(err)
	}
	if u1.Bytes != int64(len(empty)) || u2.Bytes != int64(len(empty)) || u2.Rects != 1 {
		t.Fatalf("updates %+v %+v", u1, u2)
	}
	if buffered == len(empty) && !u2.FirstByte.Equal(u1.FirstByte) {
		t.Fatalf("buffered update dated %v, its read returned at %v", u2.FirstByte, u1.FirstByte)
	}
	if u2.Received.Sub(u2.FirstByte) < 20*time.Millisecond && buffered == len(empty) {
		t.Fatalf("buffered update: first byte %v not before the parse at %v", u2.FirstByte, u2.Received)
	}
}

// serverHandshake plays an RFB 3.8 server up to ServerInit (security type
// None, a w x h screen called name), then reads the client's first
// clientMsgBytes (SetPixelFormat and SetEncodings).
func serverHandshake(c net.Conn, w, h uint16, name string, clientMsgBytes int) {
	be := binary.BigEndian
	c.Write([]byte("RFB 003.008\n"))
	io.ReadFull(c, make([]byte, 12))
	c.Write([]byte{1, 1})
	io.ReadFull(c, make([]byte, 1))
	c.Write([]byte{0, 0, 0, 0})
	io.ReadFull(c, make([]byte, 1))
	si := make([]byte, 24)
	be.PutUint16(si[0:], w)
	be.PutUint16(si[2:], h)
	be.PutUint32(si[20:], uint32(len(name)))
	c.Write(append(si, name...))
	io.ReadFull(c, make([]byte, clientMsgBytes))
}
