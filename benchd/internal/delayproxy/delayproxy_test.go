package delayproxy

import (
	"bufio"
	"net"
	"testing"
	"time"
)

func echoServer(t *testing.T) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				r := bufio.NewReader(c)
				for {
					line, err := r.ReadBytes('\n')
					if err != nil {
						return
					}
					c.Write(line)
				}
			}()
		}
	}()
	return ln.Addr().String()
}

func rtt(t *testing.T, addr string) time.Duration {
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	r := bufio.NewReader(c)
	best := time.Hour
	for i := 0; i < 5; i++ {
		t0 := time.Now()
		c.Write([]byte("ping\n"))
		if _, err := r.ReadBytes('\n'); err != nil {
			t.Fatal(err)
		}
		best = min(best, time.Since(t0))
	}
	return best
}

func TestAddsRTT(t *testing.T) {
	up := echoServer(t)
	for _, want := range []time.Duration{0, 40 * time.Millisecond} {
		p, err := New(up, want)
		if err != nil {
			t.Fatal(err)
		}
		got := rtt(t, p.Addr())
		p.Close()
		if got < want || got > want+30*time.Millisecond {
			t.Errorf("rtt %v through a %v proxy", got, want)
		}
	}
}

func TestOrderPreserved(t *testing.T) {
	up := echoServer(t)
	p, err := New(up, 10*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	c, err := net.Dial("tcp", p.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	for i := 0; i < 100; i++ {
		c.Write([]byte{byte('a' + i%26), '\n'})
	}
	r := bufio.NewReader(c)
	for i := 0; i < 100; i++ {
		line, err := r.ReadBytes('\n')
		if err != nil || line[0] != byte('a'+i%26) {
			t.Fatalf("line %d: %q %v", i, line, err)
		}
	}
}
