//go:build linux

// Package nettest gives root tests of sandbox networking an "outside host":
// a network namespace the test creates, attached to the host by a veth pair
// like a machine on the host's network, with an HTTP server and a DNS
// server in it. Tests talk to nothing else (the network rule of these
// machines).
package nettest

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/forkfleet/forkfleet/api/netnsfile"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
)

// Outside is a host outside the sandboxes, in a namespace of the test's.
type Outside struct {
	Addr     netip.Addr // its address, reachable from the host (and from sandboxes, by routing)
	HostAddr netip.Addr // the host's end of the link
	HTTPURL  string     // http://Addr:80/
	DNS      netip.AddrPort
	nsPath   string
	hostIf   string
	srv      *http.Server
	dnsConn  *net.UDPConn
	wg       sync.WaitGroup
}

// NewOutside creates the outside host; t.Cleanup removes it. Its DNS
// server answers every A query with answer.
func NewOutside(t testing.TB, answer netip.Addr) *Outside {
	t.Helper()
	var rnd [2]byte
	rand.Read(rnd[:])
	n := binary.BigEndian.Uint16(rnd[:]) % 8192 // a /30 of 198.18.0.0/15
	base := netip.AddrFrom4([4]byte{198, 18 + byte(n>>13), byte(n >> 6), byte(n<<2) & 0xff})
	b4 := base.As4()
	host := netip.AddrFrom4([4]byte{b4[0], b4[1], b4[2], b4[3] + 1})
	out := netip.AddrFrom4([4]byte{b4[0], b4[1], b4[2], b4[3] + 2})
	o := &Outside{Addr: out, HostAddr: host, HTTPURL: "http://" + out.String() + "/",
		DNS: netip.AddrPortFrom(out, 53), hostIf: fmt.Sprintf("fto%04x", n)}
	o.nsPath = filepath.Join(t.TempDir(), "outside")
	if err := netnsfile.New(o.nsPath); err != nil {
		t.Fatalf("outside netns: %v", err)
	}
	t.Cleanup(o.close)
	ns, err := netns.GetFromPath(o.nsPath)
	if err != nil {
		t.Fatal(err)
	}
	defer ns.Close()
	if err := netlink.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: o.hostIf}, PeerName: "eth0", PeerNamespace: netlink.NsFd(ns)}); err != nil {
		t.Fatalf("outside link: %v", err)
	}
	must := func(err error) {
		if err != nil {
			t.Helper()
			t.Fatalf("outside host: %v", err)
		}
	}
	hl, err := netlink.LinkByName(o.hostIf)
	must(err)
	must(netlink.AddrAdd(hl, &netlink.Addr{IPNet: ipnet(host, 30)}))
	must(netlink.LinkSetUp(hl))
	h, err := netlink.NewHandleAt(ns)
	must(err)
	defer h.Close()
	for _, name := range []string{"lo", "eth0"} {
		l, err := h.LinkByName(name)
		must(err)
		if name == "eth0" {
			must(h.AddrAdd(l, &netlink.Addr{IPNet: ipnet(out, 30)}))
		}
		must(h.LinkSetUp(l))
	}
	must(h.RouteAdd(&netlink.Route{Gw: net.IP(host.AsSlice())}))

	var ln net.Listener
	must(netnsfile.Run(o.nsPath, func() error {
		var err error
		if ln, err = net.Listen("tcp4", out.String()+":80"); err != nil {
			return err
		}
		o.dnsConn, err = net.ListenUDP("udp4", net.UDPAddrFromAddrPort(o.DNS))
		return err
	}))
	mux := http.NewServeMux()
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, "outside %s\n", r.RemoteAddr)
	})
	// /bytes?n=N streams N zero bytes (throughput).
	mux.HandleFunc("/bytes", func(w http.ResponseWriter, r *http.Request) {
		var n int64
		fmt.Sscan(r.URL.Query().Get("n"), &n)
		w.Header().Set("Content-Length", fmt.Sprint(n))
		io.CopyN(w, zeroReader{}, n)
	})
	o.srv = &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	o.wg.Add(2)
	go func() { defer o.wg.Done(); o.srv.Serve(ln) }()
	go func() { defer o.wg.Done(); serveDNS(o.dnsConn, answer) }()
	return o
}

// NSPath is the outside host's namespace.
func (o *Outside) NSPath() string { return o.nsPath }

func (o *Outside) close() {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	if o.srv != nil {
		o.srv.Shutdown(ctx)
	}
	if o.dnsConn != nil {
		o.dnsConn.Close()
	}
	o.wg.Wait()
	if l, err := netlink.LinkByName(o.hostIf); err == nil {
		netlink.LinkDel(l)
	}
	netnsfile.Remove(o.nsPath)
}

type zeroReader struct{}

func (zeroReader) Read(p []byte) (int, error) {
	clear(p)
	return len(p), nil
}

func ipnet(a netip.Addr, bits int) *net.IPNet {
	return &net.IPNet{IP: net.IP(a.AsSlice()), Mask: net.CIDRMask(bits, 32)}
}

// serveDNS answers every query of class IN type A with answer (TTL 5 s),
// anything else with NOTIMP, until the socket closes.
func serveDNS(c *net.UDPConn, answer netip.Addr) {
	buf := make([]byte, 1500)
	for {
		n, from, err := c.ReadFromUDPAddrPort(buf)
		if err != nil {
			return
		}
		if resp := dnsAnswer(buf[:n], answer); resp != nil {
			c.WriteToUDPAddrPort(resp, from)
		}
	}
}

func dnsAnswer(q []byte, answer netip.Addr) []byte {
	if len(q) < 12 || binary.BigEndian.Uint16(q[4:]) != 1 {
		return nil
	}
	// The question: labels up to a zero byte, then type and class.
	i := 12
	for i < len(q) && q[i] != 0 {
		i += int(q[i]) + 1
	}
	if i+5 > len(q) {
		return nil
	}
	question := q[12 : i+5]
	qtype := binary.BigEndian.Uint16(q[i+1:])
	resp := append([]byte{}, q[:2]...)
	if qtype != 1 {
		resp = append(resp, 0x81, 0x84, 0, 1, 0, 0, 0, 0, 0, 0) // NOTIMP
		return append(resp, question...)
	}
	resp = append(resp, 0x81, 0x80, 0, 1, 0, 1, 0, 0, 0, 0)
	resp = append(resp, question...)
	a := answer.As4()
	resp = append(resp, 0xc0, 12, 0, 1, 0, 1, 0, 0, 0, 5, 0, 4)
	return append(resp, a[:]...)
}
