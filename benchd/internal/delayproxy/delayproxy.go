// Package delayproxy is a TCP proxy that adds a fixed round-trip time:
// every chunk is held for RTT/2 in each direction, in order, without
// limiting bandwidth. It stands in for a WAN link where netem is not at hand.
package delayproxy

import (
	"errors"
	"net"
	"sync"
	"time"
)

// Proxy forwards connections accepted on Addr to an upstream address.
type Proxy struct {
	ln       net.Listener
	upstream string
	oneWay   time.Duration
	wg       sync.WaitGroup
	mu       sync.Mutex
	conns    map[net.Conn]struct{}
	closed   bool
}

// New listens on a free loopback port and forwards to upstream with rtt
// added to every round trip.
func New(upstream string, rtt time.Duration) (*Proxy, error) {
	if rtt < 0 {
		return nil, errors.New("delayproxy: negative rtt")
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	p := &Proxy{ln: ln, upstream: upstream, oneWay: rtt / 2, conns: map[net.Conn]struct{}{}}
	p.wg.Add(1)
	go p.accept()
	return p, nil
}

// Addr is the proxy's listening address.
func (p *Proxy) Addr() string { return p.ln.Addr().String() }

// Close stops accepting and tears down every proxied connection.
func (p *Proxy) Close() error {
	p.mu.Lock()
	p.closed = true
	for c := range p.conns {
		c.Close()
	}
	p.mu.Unlock()
	err := p.ln.Close()
	p.wg.Wait()
	return err
}

func (p *Proxy) track(c net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		c.Close()
		return false
	}
	p.conns[c] = struct{}{}
	return true
}

func (p *Proxy) accept() {
	defer p.wg.Done()
	for {
		down, err := p.ln.Accept()
		if err != nil {
			return
		}
		p.wg.Add(1)
		go func() {
			defer p.wg.Done()
			p.serve(down)
		}()
	}
}

func (p *Proxy) serve(down net.Conn) {
	if !p.track(down) {
		return
	}
	up, err := net.DialTimeout("tcp", p.upstream, 10*time.Second)
	if err != nil {
		down.Close()
		return
	}
	if !p.track(up) {
		down.Close()
		return
	}
	for _, c := range []net.Conn{up, down} {
		if tc, ok := c.(*net.TCPConn); ok {
			tc.SetNoDelay(true)
		}
	}
	var wg sync.WaitGroup
	wg.Add(2)
	go func() { defer wg.Done(); p.pipe(up, down) }()
	go func() { defer wg.Done(); p.pipe(down, up) }()
	wg.Wait()
	p.mu.Lock()
	delete(p.conns, up)
	delete(p.conns, down)
	p.mu.Unlock()
	up.Close()
	down.Close()
}

type chunk struct {
	due  time.Time
	data []byte
}

// pipe copies src to dst, releasing each chunk oneWay after it was read.
func (p *Proxy) pipe(dst, src net.Conn) {
	q := make(chan chunk, 4096)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for c := range q {
			if d := time.Until(c.due); d > 0 {
				time.Sleep(d)
			}
			if _, err := dst.Write(c.data); err != nil {
				// Drain so the reader never blocks on a dead writer.
				for range q {
				}
				return
			}
		}
	}()
	buf := make([]byte, 64<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			data := make([]byte, n)
			copy(data, buf[:n])
			q <- chunk{due: time.Now().Add(p.oneWay), data: data}
		}
		if err != nil {
			break
		}
	}
	close(q)
	<-done
	// Half-close so the other side sees EOF after the last delayed bytes.
	if tc, ok := dst.(*net.TCPConn); ok {
		tc.CloseWrite()
	} else {
		dst.Close()
	}
}
