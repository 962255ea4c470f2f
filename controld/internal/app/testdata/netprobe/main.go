// Command netprobe runs inside a test sandbox (copied in through the ACI and
// started there) for the real-stack networking tests:
//
//	netprobe serve ADDR    HTTP on ADDR: GET / answers "value V", POST /set?v=V sets V
//	netprobe get URL       prints the status and body of a GET (exit 1 on failure)
//	netprobe lookup NAME   resolves NAME through /etc/resolv.conf (Go's resolver)
//	netprobe dial ADDR     connects to a TCP address (exit 1 on failure)
package main

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"sync"
	"time"
)

func main() {
	if len(os.Args) != 3 {
		fmt.Fprintln(os.Stderr, "usage: netprobe serve|get|lookup|dial ARG")
		os.Exit(2)
	}
	arg := os.Args[2]
	switch os.Args[1] {
	case "serve":
		serve(arg)
	case "get":
		c := &http.Client{Timeout: 3 * time.Second, Transport: &http.Transport{DialContext: dialer().DialContext}}
		resp, err := c.Get(arg)
		if err != nil {
			fail(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		fmt.Printf("%d %s", resp.StatusCode, b)
	case "lookup":
		r := &net.Resolver{PreferGo: true}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		addrs, err := r.LookupIPAddr(ctx, arg)
		if err != nil {
			fail(err)
		}
		for _, a := range addrs {
			fmt.Println(a.IP)
		}
	case "dial":
		c, err := dialer().Dial("tcp", arg)
		if err != nil {
			fail(err)
		}
		c.Close()
		fmt.Println("connected")
	default:
		fail(fmt.Errorf("unknown mode %q", os.Args[1]))
	}
}

func dialer() *net.Dialer {
	d := &net.Dialer{Timeout: 2 * time.Second}
	d.SetMultipathTCP(false) // CRIU cannot dump MPTCP sockets
	return d
}

func serve(addr string) {
	var lc net.ListenConfig
	lc.SetMultipathTCP(false)
	ln, err := lc.Listen(context.Background(), "tcp", addr)
	if err != nil {
		fail(err)
	}
	var mu sync.Mutex
	value := "initial"
	mux := http.NewServeMux()
	mux.HandleFunc("GET /", func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		defer mu.Unlock()
		fmt.Fprintf(w, "value %s", value)
	})
	mux.HandleFunc("POST /set", func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		defer mu.Unlock()
		value = r.URL.Query().Get("v")
		fmt.Fprintf(w, "value %s", value)
	})
	fail((&http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}).Serve(ln))
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, "netprobe:", err)
	os.Exit(1)
}
