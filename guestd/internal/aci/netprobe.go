package aci

import (
	"bufio"
	"context"
	"encoding/hex"
	"fmt"
	"net"
	"strings"
	"sync"
	"time"

	"github.com/forkfleet/forkfleet/api/aci/wire"
	aciv1 "github.com/forkfleet/forkfleet/api/gen/forkfleet/aci/v1"
	"github.com/forkfleet/forkfleet/guestd/internal/acierr"
)

// The network verifier of a fork (net_probe_listen, net_probe): guestd holds
// a TCP listener on its loopback whose accept loop answers a nonce with an
// HMAC keyed by a value controld set before the checkpoint. CRIU restores
// the listening socket into every replica; a replica's guestd connecting to
// it from inside the replica proves its loopback is up, its restored
// listener accepts, and the process behind it holds the checkpoint's value.

const (
	netProbeMaxLine   = 2*4096 + 1 // a hex nonce of at most 4096 bytes
	netProbeTimeout   = 3 * time.Second
	netProbeMaxServed = 8 // connections answered at once; more wait in the backlog
)

type netProbe struct {
	mu    sync.Mutex
	ln    net.Listener
	value []byte
	slots chan struct{}
}

func (s *Server) netProbeListen(req *aciv1.NetProbeListenRequest) (*aciv1.NetProbeListenResponse, error) {
	v := req.GetValue()
	if len(v) == 0 || len(v) > 4096 {
		return nil, errInvalid("net_probe_listen.value", "value must be 1..4096 bytes, got %d", len(v))
	}
	p := &s.netProbe
	p.mu.Lock()
	defer p.mu.Unlock()
	p.value = append([]byte(nil), v...)
	if p.ln == nil {
		var lc net.ListenConfig
		lc.SetMultipathTCP(false) // CRIU cannot dump MPTCP sockets
		ln, err := lc.Listen(context.Background(), "tcp4", "127.0.0.1:0")
		if err != nil {
			return nil, acierr.New(aciv1.ErrorCode_ERROR_CODE_INTERNAL, "", "net probe listener: %v", err)
		}
		p.ln, p.slots = ln, make(chan struct{}, netProbeMaxServed)
		s.bg.Add(1)
		go func() {
			defer s.bg.Done()
			s.netProbeServe(ln)
		}()
	}
	return &aciv1.NetProbeListenResponse{Port: uint32(p.ln.Addr().(*net.TCPAddr).Port)}, nil
}

// close stops the listener (guestd's shutdown; a sandbox ends with it).
func (p *netProbe) close() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.ln != nil {
		p.ln.Close()
	}
}

func (s *Server) netProbeServe(ln net.Listener) {
	p := &s.netProbe
	for {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		p.slots <- struct{}{}
		go func() {
			defer func() { <-p.slots }()
			defer c.Close()
			c.SetDeadline(time.Now().Add(netProbeTimeout))
			// ReadSlice, not ReadString: a line longer than the buffer is
			// refused, never accumulated.
			line, err := bufio.NewReaderSize(c, netProbeMaxLine+1).ReadSlice('\n')
			if err != nil {
				return
			}
			nonce, err := hex.DecodeString(strings.TrimSpace(string(line)))
			if err != nil || len(nonce) == 0 {
				return
			}
			p.mu.Lock()
			key := p.value
			p.mu.Unlock()
			fmt.Fprintf(c, "%x\n", wire.ProofMAC(key, nonce))
		}()
	}
}

// netProbeDial connects to 127.0.0.1:port from inside the sandbox and
// returns the answer to nonce.
func (s *Server) netProbeDial(ctx context.Context, req *aciv1.NetProbeRequest) (*aciv1.NetProbeResponse, error) {
	if req.GetPort() < 1 || req.GetPort() > 65535 {
		return nil, errInvalid("net_probe.port", "%d is not a TCP port", req.GetPort())
	}
	if n := len(req.GetNonce()); n == 0 || n > 4096 {
		return nil, errInvalid("net_probe.nonce", "nonce must be 1..4096 bytes, got %d", n)
	}
	ctx, cancel := context.WithTimeout(ctx, netProbeTimeout)
	defer cancel()
	var d net.Dialer
	d.SetMultipathTCP(false)
	c, err := d.DialContext(ctx, "tcp4", fmt.Sprintf("127.0.0.1:%d", req.GetPort()))
	if err != nil {
		return nil, acierr.New(aciv1.ErrorCode_ERROR_CODE_UNAVAILABLE, "", "net probe: %v", err)
	}
	defer c.Close()
	if dl, ok := ctx.Deadline(); ok {
		c.SetDeadline(dl)
	}
	if _, err := fmt.Fprintf(c, "%x\n", req.GetNonce()); err != nil {
		return nil, acierr.New(aciv1.ErrorCode_ERROR_CODE_UNAVAILABLE, "", "net probe: %v", err)
	}
	line, err := bufio.NewReaderSize(c, 256).ReadSlice('\n')
	if err != nil {
		return nil, acierr.New(aciv1.ErrorCode_ERROR_CODE_UNAVAILABLE, "", "net probe: no answer: %v", err)
	}
	mac, err := hex.DecodeString(strings.TrimSpace(string(line)))
	if err != nil {
		return nil, acierr.New(aciv1.ErrorCode_ERROR_CODE_INTERNAL, "", "net probe: malformed answer")
	}
	return &aciv1.NetProbeResponse{Mac: mac}, nil
}
