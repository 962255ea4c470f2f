//go:build linux

package network

import (
	"encoding/binary"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"sync"
	"time"

	"github.com/forkfleet/forkfleet/api/netnsfile"
)

// Limits of one sandbox's DNS stub: everything it sends is hostile, so
// neither its queries in flight nor its connections may grow without bound.
const (
	dnsMaxInflight  = 64 // UDP queries being forwarded; more are dropped
	dnsMaxTCPConns  = 8
	dnsTimeout      = 4 * time.Second
	dnsTCPIdle      = 10 * time.Second
	dnsMaxUDPPacket = 4096
)

// dnsStub answers DNS on the sandbox's gateway address, from sockets
// controld creates in the router namespace, by forwarding every query to
// the host's resolvers from the host's namespace.
type dnsStub struct {
	udp      *net.UDPConn
	tcp      *net.TCPListener
	upstream []netip.AddrPort
	log      *slog.Logger
	inflight chan struct{}
	conns    chan struct{}
	wg       sync.WaitGroup
	once     sync.Once
}

func startDNS(routerNS string, upstream []netip.AddrPort, log *slog.Logger) (*dnsStub, error) {
	d := &dnsStub{upstream: upstream, log: log,
		inflight: make(chan struct{}, dnsMaxInflight), conns: make(chan struct{}, dnsMaxTCPConns)}
	addr := netip.AddrPortFrom(GatewayAddr.Addr(), 53)
	err := netnsfile.Run(routerNS, func() error {
		u, err := net.ListenUDP("udp4", net.UDPAddrFromAddrPort(addr))
		if err != nil {
			return err
		}
		t, err := net.ListenTCP("tcp4", net.TCPAddrFromAddrPort(addr))
		if err != nil {
			u.Close()
			return err
		}
		d.udp, d.tcp = u, t
		return nil
	})
	if err != nil {
		return nil, err
	}
	d.wg.Add(2)
	go d.serveUDP()
	go d.serveTCP()
	return d, nil
}

func (d *dnsStub) close() {
	d.once.Do(func() {
		d.udp.Close()
		d.tcp.Close()
	})
	d.wg.Wait()
}

func (d *dnsStub) serveUDP() {
	defer d.wg.Done()
	buf := make([]byte, dnsMaxUDPPacket)
	for {
		n, from, err := d.udp.ReadFromUDPAddrPort(buf)
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			continue
		}
		if n < 12 { // shorter than a DNS header
			continue
		}
		select {
		case d.inflight <- struct{}{}:
		default:
			continue // too many in flight: the client retries
		}
		q := append([]byte(nil), buf[:n]...)
		d.wg.Add(1)
		go func() {
			defer d.wg.Done()
			defer func() { <-d.inflight }()
			ans := d.exchangeUDP(q)
			if ans == nil {
				ans = servfail(q) // fail fast: the client would wait out its timeout
			}
			d.udp.WriteToUDPAddrPort(ans, from)
		}()
	}
}

// exchangeUDP asks each upstream in turn and returns the first answer
// carrying the query's id.
func (d *dnsStub) exchangeUDP(q []byte) []byte {
	for _, up := range d.upstream {
		c, err := net.DialUDP("udp", nil, net.UDPAddrFromAddrPort(up))
		if err != nil {
			continue
		}
		c.SetDeadline(time.Now().Add(dnsTimeout))
		if _, err := c.Write(q); err != nil {
			c.Close()
			continue
		}
		buf := make([]byte, dnsMaxUDPPacket)
		for {
			n, err := c.Read(buf)
			if err != nil {
				break
			}
			if n >= 12 && buf[0] == q[0] && buf[1] == q[1] {
				c.Close()
				return buf[:n]
			}
		}
		c.Close()
	}
	return nil
}

func (d *dnsStub) serveTCP() {
	defer d.wg.Done()
	for {
		c, err := d.tcp.AcceptTCP()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			continue
		}
		select {
		case d.conns <- struct{}{}:
		default:
			c.Close()
			continue
		}
		d.wg.Add(1)
		go func() {
			defer d.wg.Done()
			defer func() { <-d.conns }()
			d.relayTCP(c)
		}()
	}
}

// relayTCP answers length-prefixed queries on one connection, one at a
// time, until the client stops or idles.
func (d *dnsStub) relayTCP(c *net.TCPConn) {
	defer c.Close()
	for {
		c.SetDeadline(time.Now().Add(dnsTCPIdle))
		q, err := readTCPMsg(c)
		if err != nil {
			return
		}
		ans := d.exchangeTCP(q)
		if ans == nil {
			ans = servfail(q)
		}
		c.SetDeadline(time.Now().Add(dnsTimeout))
		if err := writeTCPMsg(c, ans); err != nil {
			return
		}
	}
}

func (d *dnsStub) exchangeTCP(q []byte) []byte {
	for _, up := range d.upstream {
		c, err := net.DialTimeout("tcp", up.String(), dnsTimeout)
		if err != nil {
			continue
		}
		c.SetDeadline(time.Now().Add(dnsTimeout))
		var ans []byte
		if err = writeTCPMsg(c, q); err == nil {
			ans, err = readTCPMsg(c)
		}
		c.Close()
		if err == nil {
			return ans
		}
	}
	return nil
}

func readTCPMsg(r io.Reader) ([]byte, error) {
	var l [2]byte
	if _, err := io.ReadFull(r, l[:]); err != nil {
		return nil, err
	}
	n := binary.BigEndian.Uint16(l[:])
	if n < 12 {
		return nil, errors.New("dns message shorter than its header")
	}
	b := make([]byte, n)
	_, err := io.ReadFull(r, b)
	return b, err
}

func writeTCPMsg(w io.Writer, b []byte) error {
	out := make([]byte, 2+len(b))
	binary.BigEndian.PutUint16(out, uint16(len(b)))
	copy(out[2:], b)
	_, err := w.Write(out)
	return err
}

// servfail answers a query the upstreams did not: its header (id, opcode,
// question count) and question, with QR set and RCODE 2 (server failure).
func servfail(q []byte) []byte {
	out := append([]byte(nil), q...)
	out[2] = out[2]&0x79 | 0x80             // QR=1, keep opcode and RD, clear AA and TC
	out[3] = out[3]&0x70 | 0x02             // keep Z bits, RCODE=SERVFAIL, no RA
	binary.BigEndian.PutUint32(out[6:], 0)  // no answers, no authority
	binary.BigEndian.PutUint16(out[10:], 0) // no additional records
	return trimQuestions(out, int(binary.BigEndian.Uint16(out[4:])))
}

// trimQuestions cuts a message after its question section (questions are
// kept; what followed them in the query, an EDNS OPT record, is not).
func trimQuestions(m []byte, qd int) []byte {
	i := 12
	for range qd {
		for i < len(m) && m[i] != 0 {
			if m[i]&0xc0 != 0 { // a compression pointer ends the name
				i++
				break
			}
			i += int(m[i]) + 1
		}
		i += 5 // the zero byte (or pointer's second byte), type, class
	}
	if i > len(m) {
		return m[:12]
	}
	return m[:i]
}
