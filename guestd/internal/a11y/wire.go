package a11y

import (
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// wireConn is guestd's own D-Bus client for the tree's calls: a tree is
// thousands of small calls, and a general library's reflection and
// per-call goroutines cost more CPU than the application answering them.
// It speaks what the tree needs: method calls with uint32, int32 and
// string arguments, replies and errors decoded by their signature into
// plain values; signals and calls to guestd are dropped.
type wireConn struct {
	nc net.Conn

	wmu    sync.Mutex
	w      *bufio.Writer
	serial uint32

	mu      sync.Mutex
	pending map[uint32]*wireCall
	err     error // set once the reader stopped
	done    chan struct{}
	// onSignal, when set, is told of each signal (its sender, path,
	// interface and member; the body is not read). It runs on the reader:
	// it must be quick and never call on the connection.
	onSignal func(sender string, path objectPath, iface, member string)
}

// wireCall is one call in flight.
type wireCall struct {
	conn *wireConn
	done chan struct{}
	body []any // the reply's values
	err  error
	ctx  context.Context
}

// dbusError is an error reply.
type dbusError struct{ Name, Message string }

func (e *dbusError) Error() string { return e.Name + ": " + e.Message }

// maxWireMessage bounds one message from the bus (the image's bus allows 32
// MiB; anything larger is refused before it is read).
const maxWireMessage = 64 << 20

var errWireClosed = errors.New("a11y: bus connection closed")

// dialWire connects to the bus at addr, authenticates (EXTERNAL) and says
// Hello, all within ctx.
func dialWire(ctx context.Context, addr string) (*wireConn, error) {
	path, ok := strings.CutPrefix(addr, "unix:path=")
	if !ok {
		return nil, fmt.Errorf("address %q: want unix:path=", addr)
	}
	var d net.Dialer
	nc, err := d.DialContext(ctx, "unix", path)
	if err != nil {
		return nil, err
	}
	return handshake(ctx, nc, os.Getuid(), true)
}

// handshake authenticates nc as uid (EXTERNAL: the peer checks it against
// the socket's credentials) and, on a bus, says Hello (an application's
// own server has none).
func handshake(ctx context.Context, nc net.Conn, id int, hello bool) (*wireConn, error) {
	if dl, ok := ctx.Deadline(); ok {
		nc.SetDeadline(dl)
	}
	r := bufio.NewReaderSize(nc, 64<<10)
	uid := strconv.Itoa(id)
	if _, err := fmt.Fprintf(nc, "\x00AUTH EXTERNAL %x\r\n", uid); err != nil {
		nc.Close()
		return nil, err
	}
	line, err := r.ReadString('\n')
	if err != nil || !strings.HasPrefix(line, "OK ") {
		nc.Close()
		return nil, fmt.Errorf("auth: %q %v", strings.TrimSpace(line), err)
	}
	if _, err := io.WriteString(nc, "BEGIN\r\n"); err != nil {
		nc.Close()
		return nil, err
	}
	nc.SetDeadline(time.Time{})
	c := &wireConn{nc: nc, w: bufio.NewWriterSize(nc, 16<<10), pending: map[uint32]*wireCall{}, done: make(chan struct{})}
	go c.read(r)
	if !hello {
		return c, nil
	}
	var name string
	if err := c.call(ctx, ref{"org.freedesktop.DBus", "/org/freedesktop/DBus"}, "org.freedesktop.DBus.Hello", nil, &name); err != nil {
		c.Close()
		return nil, err
	}
	return c, nil
}

func (c *wireConn) Close() error {
	err := c.nc.Close()
	<-c.done
	return err
}

// setSignalHandler sets onSignal (nil: signals are dropped unread).
func (c *wireConn) setSignalHandler(f func(sender string, path objectPath, iface, member string)) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.onSignal = f
}

func (c *wireConn) Connected() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.err == nil
}

// send writes a method call and registers it.
func (c *wireConn) send(ctx context.Context, to ref, method string, args []any) *wireCall {
	wc := &wireCall{conn: c, done: make(chan struct{}), ctx: ctx}
	i := strings.LastIndexByte(method, '.')
	if i < 0 {
		wc.err = fmt.Errorf("method %q: want interface.member", method)
		close(wc.done)
		return wc
	}
	c.wmu.Lock()
	defer c.wmu.Unlock()
	c.serial++
	serial := c.serial
	msg, err := encodeCall(serial, to, method[:i], method[i+1:], args)
	if err == nil {
		c.mu.Lock()
		if c.err != nil {
			err = c.err
		} else {
			if len(c.pending) > 16384 {
				c.purgeLocked()
			}
			c.pending[serial] = wc
		}
		c.mu.Unlock()
	}
	if err == nil {
		// Buffered: the calls of a level leave in a few writes; wait
		// flushes (and the buffer does when full).
		if c.w.Available() < len(msg) {
			c.nc.SetWriteDeadline(time.Now().Add(connectTimeout)) // the write reaches the socket
		}
		if _, err = c.w.Write(msg); err != nil {
			c.nc.Close() // a bus that stops reading: the reader fails every call
		}
	}
	if err != nil {
		c.mu.Lock()
		delete(c.pending, serial)
		c.mu.Unlock()
		wc.err = err
		close(wc.done)
	}
	return wc
}

// purgeLocked forgets calls whose caller gave up: their replies may never
// come (a stopped application).
func (c *wireConn) purgeLocked() {
	for s, wc := range c.pending {
		if wc.ctx.Err() != nil {
			delete(c.pending, s)
		}
	}
}

func (c *wireConn) call(ctx context.Context, to ref, method string, args []any, out ...any) error {
	wc := c.send(ctx, to, method, args)
	return wc.wait(ctx, out...)
}

// flush sends the calls written so far, giving up (and closing) at ctx's
// deadline: a peer that stops reading cannot hold the caller.
func (c *wireConn) flush(ctx context.Context) {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	if c.w.Buffered() == 0 {
		return
	}
	dl := time.Now().Add(connectTimeout)
	if d, ok := ctx.Deadline(); ok && d.Before(dl) {
		dl = d
	}
	c.nc.SetWriteDeadline(dl)
	if err := c.w.Flush(); err != nil {
		c.nc.Close()
	}
}

func (wc *wireCall) wait(ctx context.Context, out ...any) error {
	if wc.conn != nil {
		wc.conn.flush(ctx)
	}
	// A reply that arrived is used even when ctx ended meanwhile: a select
	// on both picks at random, and the pid the bus answered before a stopped
	// application's ping used up the deadline was lost half the time.
	select {
	case <-wc.done:
	default:
		select {
		case <-wc.done:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	if wc.err != nil {
		return wc.err
	}
	if len(out) > len(wc.body) {
		return fmt.Errorf("a11y: reply has %d values, want %d", len(wc.body), len(out))
	}
	for i, o := range out {
		if err := storeValue(o, wc.body[i]); err != nil {
			return err
		}
	}
	return nil
}

// read dispatches replies until the connection fails.
func (c *wireConn) read(r *bufio.Reader) {
	var err error
	var buf []byte
	for err == nil {
		err = c.readOne(r, &buf)
	}
	c.nc.Close()
	c.mu.Lock()
	c.err = fmt.Errorf("%w: %v", errWireClosed, err)
	pending := c.pending
	c.pending = nil
	c.mu.Unlock()
	for _, wc := range pending {
		wc.err = errWireClosed
		close(wc.done)
	}
	close(c.done)
}

func (c *wireConn) readOne(r *bufio.Reader, buf *[]byte) error {
	var fixed [16]byte
	if _, err := io.ReadFull(r, fixed[:]); err != nil {
		return err
	}
	var order binary.ByteOrder
	switch fixed[0] {
	case 'l':
		order = binary.LittleEndian
	case 'B':
		order = binary.BigEndian
	default:
		return fmt.Errorf("bad byte order %q", fixed[0])
	}
	typ := fixed[1]
	bodyLen := order.Uint32(fixed[4:])
	fieldsLen := order.Uint32(fixed[12:])
	headLen := 16 + int(fieldsLen)
	headPadded := (headLen + 7) &^ 7
	if int64(headPadded)+int64(bodyLen) > maxWireMessage {
		return fmt.Errorf("message of %d bytes", int64(headPadded)+int64(bodyLen))
	}
	// One buffer for the usual small messages: decoded values copy what
	// they keep. A signal's body is skipped unread (only its header
	// matters): an application's events cost guestd no memory.
	size := headPadded + int(bodyLen)
	if typ != 2 && typ != 3 {
		size = headPadded
	}
	var b []byte
	switch {
	case size > 64<<10:
		b = make([]byte, size)
	case cap(*buf) < size:
		*buf = make([]byte, 64<<10)
		fallthrough
	default:
		b = (*buf)[:size]
	}
	copy(b, fixed[:])
	if _, err := io.ReadFull(r, b[16:]); err != nil {
		return err
	}
	if size < headPadded+int(bodyLen) {
		if _, err := r.Discard(int(bodyLen)); err != nil {
			return err
		}
	}
	c.mu.Lock()
	onSignal := c.onSignal
	c.mu.Unlock()
	if typ != 2 && typ != 3 && (typ != 4 || onSignal == nil) {
		return nil // signals nobody asked for, and calls to guestd: not ours to answer
	}
	var replySerial uint32
	var errName, sig string
	var sender, iface, member string
	var path objectPath
	d := &decoder{b: b[:headLen], order: order, pos: 16}
	for d.pos < headLen {
		d.align(8)
		if d.pos >= headLen {
			break
		}
		code := d.byte()
		s := d.signature()
		if s == "" || sigLen(s) != len(s) {
			return fmt.Errorf("header field signature %q", s)
		}
		// The fields a reply is read by; the others (sender,
		// destination) are skipped without being copied: a tree is
		// thousands of replies.
		switch {
		case code == 5 && s == "u":
			d.align(4)
			replySerial = d.order.Uint32(d.take(4))
		case code == 4 || code == 8:
			v, err := d.value(s)
			if err != nil {
				return err
			}
			if code == 4 {
				errName, _ = v.(string)
			} else {
				sig, _ = v.(string)
			}
		case typ == 4 && (code == 1 || code == 2 || code == 3 || code == 7) && (s == "s" || s == "o"):
			v, _ := d.value(s)
			str, _ := v.(string)
			switch code {
			case 1:
				path = objectPath(str)
			case 2:
				iface = str
			case 3:
				member = str
			case 7:
				sender = str
			}
		case s == "s" || s == "o":
			d.align(4)
			n := int(d.order.Uint32(d.take(4)))
			d.take(n + 1)
		default:
			if _, err := d.value(s); err != nil {
				return err
			}
		}
		if d.err != nil {
			return d.err
		}
	}
	if typ == 4 {
		onSignal(sender, path, iface, member)
		return nil
	}
	c.mu.Lock()
	wc := c.pending[replySerial]
	delete(c.pending, replySerial)
	c.mu.Unlock()
	if wc == nil {
		return nil
	}
	bd := &decoder{b: b[headPadded:], order: order}
	var vals []any
	if typ == 2 && sig == cacheItemsSig {
		// A cache's items (thousands from a browser) decode straight into
		// their struct: the generic decoder boxes every field.
		vals = []any{bd.cacheItems()}
		sig = ""
	}
	for s := sig; s != "" && bd.err == nil; {
		n := sigLen(s)
		if n == 0 {
			bd.fail("signature %q", sig)
			break
		}
		v, err := bd.value(s[:n])
		if err != nil {
			bd.err = err
			break
		}
		vals = append(vals, v)
		s = s[n:]
	}
	switch {
	case bd.err != nil:
		wc.err = fmt.Errorf("a11y: reply %q: %v", sig, bd.err)
	case typ == 3:
		msg := ""
		if len(vals) > 0 {
			msg, _ = vals[0].(string)
		}
		wc.err = &dbusError{Name: errName, Message: msg}
	default:
		wc.body = vals
	}
	close(wc.done)
	return nil
}

// encodeCall marshals a method call (little endian).
func encodeCall(serial uint32, to ref, iface, member string, args []any) ([]byte, error) {
	var body encoder
	var sig strings.Builder
	for _, a := range args {
		switch v := a.(type) {
		case uint32:
			sig.WriteByte('u')
			body.align(4)
			body.u32(v)
		case int32:
			sig.WriteByte('i')
			body.align(4)
			body.u32(uint32(v))
		case string:
			sig.WriteByte('s')
			body.str(v)
		case []string:
			sig.WriteString("as")
			body.align(4)
			at := len(body.b)
			body.u32(0)
			for _, e := range v {
				body.str(e)
			}
			binary.LittleEndian.PutUint32(body.b[at:], uint32(len(body.b)-at-4))
		case float64: // sent as a variant of a double (Properties.Set's value)
			sig.WriteByte('v')
			body.b = append(body.b, 1, 'd', 0)
			body.align(8)
			body.b = binary.LittleEndian.AppendUint64(body.b, math.Float64bits(v))
		default:
			return nil, fmt.Errorf("argument %T", a)
		}
	}
	var m encoder
	m.b = append(m.b, 'l', 1, 0, 1)
	m.u32(uint32(len(body.b)))
	m.u32(serial)
	m.u32(0) // fields length, set below
	field := func(code byte, typ byte, v string) {
		m.align(8)
		m.b = append(m.b, code, 1, typ, 0)
		if typ == 'g' {
			m.b = append(m.b, byte(len(v)))
			m.b = append(m.b, v...)
			m.b = append(m.b, 0)
			return
		}
		m.str(v)
	}
	field(1, 'o', string(to.Path))
	field(2, 's', iface)
	field(3, 's', member)
	field(6, 's', to.Bus)
	if sig.Len() > 0 {
		field(8, 'g', sig.String())
	}
	binary.LittleEndian.PutUint32(m.b[12:], uint32(len(m.b)-16))
	m.align(8)
	return append(m.b, body.b...), nil
}

type encoder struct{ b []byte }

func (e *encoder) align(n int) {
	for len(e.b)%n != 0 {
		e.b = append(e.b, 0)
	}
}
func (e *encoder) u32(v uint32) { e.b = binary.LittleEndian.AppendUint32(e.b, v) }
func (e *encoder) str(s string) {
	e.align(4)
	e.u32(uint32(len(s)))
	e.b = append(e.b, s...)
	e.b = append(e.b, 0)
}

// decoder reads values of a D-Bus signature; positions (for alignment)
// count from a message's start or from its body's, which is 8-aligned.
type decoder struct {
	b     []byte
	pos   int
	order binary.ByteOrder
	err   error
	depth int
}

func (d *decoder) fail(format string, a ...any) {
	if d.err == nil {
		d.err = fmt.Errorf(format, a...)
	}
}

func (d *decoder) align(n int) {
	d.pos = (d.pos + n - 1) &^ (n - 1)
	if d.pos > len(d.b) {
		d.fail("truncated")
		d.pos = len(d.b)
	}
}

func (d *decoder) take(n int) []byte {
	if d.err != nil || n < 0 || n > len(d.b)-d.pos {
		d.fail("truncated")
		// Zeros for the fixed-size readers; never sized by what the
		// message claims.
		return make([]byte, 8)
	}
	p := d.b[d.pos : d.pos+n]
	d.pos += n
	return p
}

func (d *decoder) byte() byte { return d.take(1)[0] }

func (d *decoder) signature() string {
	n := int(d.byte())
	s := string(d.take(n))
	d.take(1)
	return s
}

// sigLen is the length of the first complete type of s (0 when s is
// malformed, which value then refuses).
func sigLen(s string) int {
	if s == "" {
		return 0
	}
	switch s[0] {
	case 'a':
		if n := sigLen(s[1:]); n > 0 {
			return 1 + n
		}
		return 0
	case '(', '{':
		closeCh := byte(')')
		if s[0] == '{' {
			closeCh = '}'
		}
		i := 1
		for i < len(s) && s[i] != closeCh {
			n := sigLen(s[i:])
			if n == 0 {
				return 0
			}
			i += n
		}
		if i >= len(s) || i == 1 {
			return 0 // unterminated, or empty: D-Bus has no empty struct
		}
		return i + 1
	}
	return 1
}

// variant is a decoded D-Bus variant.
type variant struct {
	sig string
	v   any
}

// value decodes one value of complete type sig.
func (d *decoder) value(sig string) (any, error) {
	if d.depth > 64 {
		d.fail("nested too deep")
	}
	if sig == "" {
		d.fail("empty signature")
	}
	if d.err != nil {
		return nil, d.err
	}
	d.depth++
	v, err := d.decode(sig)
	d.depth--
	return v, err
}

func (d *decoder) decode(sig string) (any, error) {
	switch sig[0] {
	case 'y':
		return d.byte(), d.err
	case 'b':
		d.align(4)
		return d.order.Uint32(d.take(4)) != 0, d.err
	case 'n', 'q':
		d.align(2)
		v := d.order.Uint16(d.take(2))
		if sig[0] == 'n' {
			return int16(v), d.err
		}
		return v, d.err
	case 'i':
		d.align(4)
		return int32(d.order.Uint32(d.take(4))), d.err
	case 'u', 'h':
		d.align(4)
		return d.order.Uint32(d.take(4)), d.err
	case 'x', 't', 'd':
		d.align(8)
		v := d.order.Uint64(d.take(8))
		switch sig[0] {
		case 'x':
			return int64(v), d.err
		case 'd':
			return math.Float64frombits(v), d.err
		}
		return v, d.err
	case 's', 'o':
		d.align(4)
		n := int(d.order.Uint32(d.take(4)))
		s := string(d.take(n))
		d.take(1)
		return s, d.err
	case 'g':
		return d.signature(), d.err
	case 'v':
		s := d.signature()
		if sigLen(s) != len(s) || s == "" {
			d.fail("variant signature %q", s)
			return nil, d.err
		}
		v, err := d.value(s)
		return variant{s, v}, err
	case 'a':
		d.align(4)
		n := int(d.order.Uint32(d.take(4)))
		elem := sig[1:]
		switch elem[0] {
		case 'x', 't', 'd', '(', '{':
			d.align(8)
		}
		end := d.pos + n
		if n > len(d.b)-d.pos {
			d.fail("array of %d bytes", n)
			return nil, d.err
		}
		var out []any
		for d.pos < end && d.err == nil {
			at := d.pos
			v, err := d.value(elem)
			if err != nil {
				return nil, err
			}
			if d.pos == at {
				// An element that takes no bytes would repeat forever.
				d.fail("array of %q: an element of no size", elem)
				return nil, d.err
			}
			out = append(out, v)
		}
		return out, d.err
	case '(', '{':
		d.align(8)
		inner := sig[1 : len(sig)-1]
		var out []any
		for inner != "" && d.err == nil {
			n := sigLen(inner)
			if n == 0 {
				d.fail("signature %q", sig)
				break
			}
			v, err := d.value(inner[:n])
			if err != nil {
				return nil, err
			}
			out = append(out, v)
			inner = inner[n:]
		}
		return out, d.err
	}
	d.fail("type %q", sig)
	return nil, d.err
}

// storeValue converts a decoded value into what the caller's pointer wants.
func storeValue(dst, v any) error {
	bad := func() error { return fmt.Errorf("a11y: reply value %T does not fit %T", v, dst) }
	switch d := dst.(type) {
	case *any:
		if vv, ok := v.(variant); ok {
			v = vv.v
		}
		*d = v
	case *string:
		s, ok := v.(string)
		if !ok {
			return bad()
		}
		*d = s
	case *uint32:
		u, ok := v.(uint32)
		if !ok {
			return bad()
		}
		*d = u
	case *int32:
		i, ok := v.(int32)
		if !ok {
			return bad()
		}
		*d = i
	case *bool:
		b, ok := v.(bool)
		if !ok {
			return bad()
		}
		*d = b
	case *[]uint32:
		l, _ := v.([]any)
		out := make([]uint32, 0, len(l))
		for _, e := range l {
			u, ok := e.(uint32)
			if !ok {
				return bad()
			}
			out = append(out, u)
		}
		*d = out
	case *[]string:
		l, _ := v.([]any)
		out := make([]string, 0, len(l))
		for _, e := range l {
			s, ok := e.(string)
			if !ok {
				return bad()
			}
			out = append(out, s)
		}
		*d = out
	case *ref:
		r, ok := toRef(v)
		if !ok {
			return bad()
		}
		*d = r
	case *[]ref:
		l, _ := v.([]any)
		out := make([]ref, 0, len(l))
		for _, e := range l {
			r, ok := toRef(e)
			if !ok {
				return bad()
			}
			out = append(out, r)
		}
		*d = out
	case *map[string]any:
		l, _ := v.([]any)
		m := make(map[string]any, len(l))
		for _, e := range l {
			kv, ok := e.([]any)
			if !ok || len(kv) != 2 {
				return bad()
			}
			k, ok := kv[0].(string)
			vv, ok2 := kv[1].(variant)
			if !ok || !ok2 {
				return bad()
			}
			m[k] = vv.v
		}
		*d = m
	case *struct{ X, Y, W, H int32 }:
		l, _ := v.([]any)
		if len(l) != 4 {
			return bad()
		}
		var xs [4]int32
		for i, e := range l {
			n, ok := e.(int32)
			if !ok {
				return bad()
			}
			xs[i] = n
		}
		d.X, d.Y, d.W, d.H = xs[0], xs[1], xs[2], xs[3]
	case *[]actionInfo:
		l, _ := v.([]any)
		out := make([]actionInfo, 0, len(l))
		for _, e := range l {
			f, ok := e.([]any)
			if !ok || len(f) != 3 {
				return bad()
			}
			n, _ := f[0].(string)
			ds, _ := f[1].(string)
			k, _ := f[2].(string)
			out = append(out, actionInfo{n, ds, k})
		}
		*d = out
	case *[]cacheItem:
		if items, ok := v.([]cacheItem); ok {
			*d = items
			return nil
		}
		l, _ := v.([]any)
		out := make([]cacheItem, 0, len(l))
		for _, e := range l {
			f, ok := e.([]any)
			if !ok || len(f) != 10 {
				return bad()
			}
			var ci cacheItem
			var ok1, ok2, ok3 bool
			ci.Obj, ok1 = toRef(f[0])
			ci.App, ok2 = toRef(f[1])
			ci.Parent, ok3 = toRef(f[2])
			ci.Index, _ = f[3].(int32)
			ci.Count, _ = f[4].(int32)
			if err := storeValue(&ci.Ifaces, f[5]); err != nil || !ok1 || !ok2 || !ok3 {
				return bad()
			}
			ci.Name, _ = f[6].(string)
			ci.Role, _ = f[7].(uint32)
			ci.Desc, _ = f[8].(string)
			if err := storeValue(&ci.States, f[9]); err != nil {
				return bad()
			}
			out = append(out, ci)
		}
		*d = out
	default:
		return fmt.Errorf("a11y: cannot store into %T", dst)
	}
	return nil
}

// cacheItemsSig is Cache.GetItems' reply: an array of cacheItem.
const cacheItemsSig = "a((so)(so)(so)iiassusau)"

// cacheItems decodes a cacheItemsSig value. Strings are copied (the
// buffer is reused); bounds are the decoder's, as for every value.
func (d *decoder) cacheItems() []cacheItem {
	d.align(4)
	n := int(d.order.Uint32(d.take(4)))
	d.align(8)
	if n > len(d.b)-d.pos {
		d.fail("array of %d bytes", n)
		return nil
	}
	end := d.pos + n
	str := func() string {
		d.align(4)
		l := int(d.order.Uint32(d.take(4)))
		s := string(d.take(l))
		d.take(1)
		return s
	}
	refOf := func() ref {
		d.align(8)
		return ref{Bus: str(), Path: objectPath(str())}
	}
	i32 := func() int32 {
		d.align(4)
		return int32(d.order.Uint32(d.take(4)))
	}
	var out []cacheItem
	for d.pos < end && d.err == nil {
		d.align(8)
		var ci cacheItem
		ci.Obj, ci.App, ci.Parent = refOf(), refOf(), refOf()
		ci.Index, ci.Count = i32(), i32()
		d.align(4)
		if m := int(d.order.Uint32(d.take(4))); m <= len(d.b)-d.pos {
			for e := d.pos + m; d.pos < e && d.err == nil; {
				ci.Ifaces = append(ci.Ifaces, str())
			}
		} else {
			d.fail("array of %d bytes", m)
		}
		ci.Name, ci.Role, ci.Desc = str(), uint32(i32()), str()
		d.align(4)
		if m := int(d.order.Uint32(d.take(4))); m <= len(d.b)-d.pos && m%4 == 0 {
			for e := d.pos + m; d.pos < e && d.err == nil; {
				ci.States = append(ci.States, uint32(i32()))
			}
		} else {
			d.fail("array of %d bytes", m)
		}
		if d.pos > end {
			d.fail("item past its array")
		}
		out = append(out, ci)
	}
	if d.err != nil {
		return nil
	}
	return out
}

// toRef converts a decoded (so).
func toRef(v any) (ref, bool) {
	f, ok := v.([]any)
	if !ok || len(f) != 2 {
		return ref{}, false
	}
	bus, ok1 := f[0].(string)
	path, ok2 := f[1].(string)
	return ref{bus, objectPath(path)}, ok1 && ok2
}

// dialPeer connects to an application's own D-Bus server at path as the
// application's user: atk-bridge's server admits its own uid only, and
// SO_PEERCRED, which EXTERNAL is checked against, records the effective
// ids at connect. The ids change on a fresh thread locked to its goroutine
// and never unlocked, so the thread exits with it (as in fscred).
func dialPeer(ctx context.Context, path string, uid, gid int) (*wireConn, error) {
	type result struct {
		nc  net.Conn
		err error
	}
	ch := make(chan result, 1)
	go func() {
		runtime.LockOSThread() // never unlocked
		if _, _, e := unix.RawSyscall(unix.SYS_SETRESGID, ^uintptr(0), uintptr(gid), ^uintptr(0)); e != 0 {
			ch <- result{err: fmt.Errorf("setresgid: %w", e)}
			return
		}
		if _, _, e := unix.RawSyscall(unix.SYS_SETRESUID, ^uintptr(0), uintptr(uid), ^uintptr(0)); e != 0 {
			ch <- result{err: fmt.Errorf("setresuid: %w", e)}
			return
		}
		var d net.Dialer
		nc, err := d.DialContext(ctx, "unix", path)
		ch <- result{nc, err}
	}()
	r := <-ch
	if r.err != nil {
		return nil, r.err
	}
	return handshake(ctx, r.nc, uid, false)
}
