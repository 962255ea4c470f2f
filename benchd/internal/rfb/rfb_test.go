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
		c.Write([]byte("RFB 003.008\n"))
		io.ReadFull(c, make([]byte, 12))
		c.Write([]byte{1, 1})
		io.ReadFull(c, make([]byte, 1))
		c.Write([]byte{0, 0, 0, 0})
		io.ReadFull(c, make([]byte, 1))
		si := make([]byte, 24)
		be.PutUint16(si[0:], 1280)
		be.PutUint16(si[2:], 800)
		be.PutUint32(si[20:], 2)
		c.Write(append(si, 'x', 'y'))
		io.ReadFull(c, make([]byte, 20+4+4*3+10))
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
}
