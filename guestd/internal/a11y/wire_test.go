package a11y

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"strings"
	"testing"

	"github.com/godbus/dbus/v5"
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

// testReply is a method return to serial with one string, as a bus sends
// it (sender and destination fields first, which the reader skips).
func testReply(serial uint32, body string) []byte {
	var m encoder
	m.b = append(m.b, 'l', 2, 0, 1)
	m.u32(0) // body length, set below
	m.u32(99)
	m.u32(0) // fields length, set below
	m.align(8)
	m.b = append(m.b, 7, 1, 's', 0)
	m.str(":1.7")
	m.align(8)
	m.b = append(m.b, 6, 1, 's', 0)
	m.str(":1.1")
	m.align(8)
	m.b = append(m.b, 5, 1, 'u', 0)
	m.u32(serial)
	m.align(8)
	m.b = append(m.b, 8, 1, 'g', 0, 1, 's', 0)
	binary.LittleEndian.PutUint32(m.b[12:], uint32(len(m.b)-16))
	m.align(8)
	head := len(m.b)
	m.str(body)
	binary.LittleEndian.PutUint32(m.b[4:], uint32(len(m.b)-head))
	return m.b
}

func TestReadReply(t *testing.T) {
	c := &wireConn{pending: map[uint32]*wireCall{}}
	calls := []*wireCall{{done: make(chan struct{})}, {done: make(chan struct{})}}
	c.pending[1], c.pending[2] = calls[0], calls[1]
	r := bufio.NewReader(bytes.NewReader(append(testReply(2, strings.Repeat("x", 70000)), testReply(1, "one")...)))
	var buf []byte
	for range 2 {
		if err := c.readOne(r, &buf); err != nil {
			t.Fatal(err)
		}
	}
	for i, want := range []string{"one", strings.Repeat("x", 70000)} {
		var got string
		if err := calls[i].wait(context.Background(), &got); err != nil || got != want {
			t.Fatalf("reply %d: %.10q %v", i+1, got, err)
		}
	}
}

// A hostile peer cannot crash the reader with any message: it answers an
// error or a reply, never a panic.
func FuzzReadMessage(f *testing.F) {
	f.Add(testReply(1, "one"))
	f.Add(testReply(2, ""))
	f.Add(append(testReply(3, "x"), testReply(1, "y")...))
	f.Fuzz(func(t *testing.T, b []byte) {
		c := &wireConn{pending: map[uint32]*wireCall{}}
		for s := uint32(1); s <= 3; s++ {
			c.pending[s] = &wireCall{done: make(chan struct{})}
		}
		r := bufio.NewReader(bytes.NewReader(b))
		var buf []byte
		for range 4 {
			if h, _ := r.Peek(16); len(h) == 16 && uint64(binary.LittleEndian.Uint32(h[4:]))+uint64(binary.LittleEndian.Uint32(h[12:])) > 1<<20 {
				return // a huge message: refused or read as claimed, nothing to learn
			}
			if c.readOne(r, &buf) != nil {
				return
			}
		}
	})
}

// getItemsBody marshals items as Cache.GetItems' reply body (godbus, the
// reference encoder).
func getItemsBody(t testing.TB, items []godbusCacheItem) []byte {
	msg := &dbus.Message{Type: dbus.TypeMethodReply, Headers: map[dbus.HeaderField]dbus.Variant{
		dbus.FieldReplySerial: dbus.MakeVariant(uint32(1)),
		dbus.FieldSignature:   dbus.MakeVariant(dbus.SignatureOf(items)),
	}, Body: []any{items}}
	var buf bytes.Buffer
	if err := msg.EncodeTo(&buf, binary.LittleEndian); err != nil {
		t.Fatal(err)
	}
	b := buf.Bytes()
	fields := int(binary.LittleEndian.Uint32(b[12:]))
	return b[(16+fields+7)&^7:]
}

type godbusCacheItem struct {
	Obj, App, Parent dref
	Index, Count     int32
	Ifaces           []string
	Name             string
	Role             uint32
	Desc             string
	States           []uint32
}

// The typed GetItems decoder reads what the generic one does.
func TestCacheItemsDecoder(t *testing.T) {
	items := []godbusCacheItem{
		{dref{":1.2", "/a/1"}, dref{":1.2", "/org/a11y/atspi/accessible/root"}, dref{":1.2", "/"}, 0, 2, []string{ifAccessible, ifComponent}, "héllo", 43, "d", []uint32{1 << 25, 1}},
		{dref{":1.2", "/a/2"}, dref{":1.2", "/r"}, dref{":1.2", "/a/1"}, 1, 0, nil, "", 0, "", nil},
	}
	body := getItemsBody(t, items)
	if sig := dbus.SignatureOf(items).String(); sig != cacheItemsSig {
		t.Fatalf("signature %q", sig)
	}
	typed := (&decoder{b: body, order: binary.LittleEndian}).cacheItems()
	v, err := (&decoder{b: body, order: binary.LittleEndian}).value(cacheItemsSig)
	if err != nil {
		t.Fatal(err)
	}
	var generic []cacheItem
	if err := storeValue(&generic, v); err != nil {
		t.Fatal(err)
	}
	if len(typed) != 2 || fmt.Sprintf("%+v", typed) != fmt.Sprintf("%+v", generic) {
		t.Fatalf("typed %+v\ngeneric %+v", typed, generic)
	}
	if typed[0].Name != "héllo" || typed[0].States[0] != 1<<25 || typed[1].Parent.Path != "/a/1" || typed[0].Ifaces[1] != ifComponent {
		t.Fatalf("%+v", typed)
	}
}

// A hostile application's GetItems reply cannot crash the typed decoder,
// and whatever it accepts, the generic decoder reads the same.
func FuzzCacheItems(f *testing.F) {
	f.Add(getItemsBody(f, []godbusCacheItem{{dref{":1.2", "/a"}, dref{":1.2", "/r"}, dref{":1.2", "/"}, 0, 1, []string{"x"}, "n", 1, "", []uint32{1, 2}}}))
	f.Add([]byte{255, 255, 255, 255})
	f.Fuzz(func(t *testing.T, b []byte) {
		d := &decoder{b: b, order: binary.LittleEndian}
		typed := d.cacheItems()
		if d.err != nil {
			return
		}
		v, err := (&decoder{b: b, order: binary.LittleEndian}).value(cacheItemsSig)
		if err != nil {
			t.Fatalf("typed read %d items where the generic decoder fails: %v", len(typed), err)
		}
		var generic []cacheItem
		if storeValue(&generic, v) == nil && len(generic) != len(typed) {
			t.Fatalf("typed %d items, generic %d", len(typed), len(generic))
		}
	})
}

// A reply that arrived before the caller waited is used, even when the
// caller's deadline has passed meanwhile (every time, not half the time).
func TestWaitPrefersArrivedReply(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	for i := 0; i < 200; i++ {
		wc := &wireCall{done: make(chan struct{}), body: []any{uint32(42)}}
		close(wc.done)
		var pid uint32
		if err := wc.wait(ctx, &pid); err != nil || pid != 42 {
			t.Fatalf("wait after the reply, ctx done: pid %d, %v", pid, err)
		}
	}
	wc := &wireCall{done: make(chan struct{})}
	if err := wc.wait(ctx); err != context.Canceled {
		t.Fatalf("wait without a reply, ctx done: %v", err)
	}
}
