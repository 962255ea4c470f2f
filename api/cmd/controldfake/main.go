// Command controldfake serves the in-memory controld (package controldfake)
// on a unix socket for the tests of clients in other languages (the Python
// SDK's), so they run against the one fake that follows controld's
// validation rules. Every sandbox's endpoint is one fake guestd (package
// acitest) on loopback.
//
//	controldfake --socket /tmp/x/controld.sock [--token T] [--hosts a=3GiB,b=8GiB]
//
// With --hosts it serves one fake per host (its name and admission memory),
// each on <socket>-<name>, sharing one registry: the hosts of a fleet for
// the clients of many hosts. It prints one JSON line, {"target": ...,
// "aci_url": ..., "aci_token": ..., "hosts": {name: target}},
// then reads commands from stdin, one per line, and answers each with "ok"
// or "error: ..." on stdout:
//
//	frame R G B        the desktop shows a solid colour (a real 1280x800 PNG)
//	drop               drop every ACI connection (as a crash or a restore does)
//	generation N       the restore generation later connections report
//	ready 0|1          readiness, pushed to every session as a ReadyEvent
//	fail-replica I     replica I of every later fork fails (UNAVAILABLE)
//	sandbox-state ID S set a sandbox's state (a SandboxState number)
//	stop-host NAME     stop serving host NAME (--hosts), as a lost host
//
// It stops when stdin closes.
package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"image"
	"image/color"
	"image/png"
	"os"
	"strconv"
	"strings"
	"sync/atomic"

	"github.com/forkfleet/forkfleet/api/aci/acitest"
	"github.com/forkfleet/forkfleet/api/controldfake"
	"github.com/forkfleet/forkfleet/api/errdefs"
	controldv1 "github.com/forkfleet/forkfleet/api/gen/forkfleet/controld/v1"
	"github.com/forkfleet/forkfleet/api/limits"
)

const acitoken = "fake-aci-token"

func main() {
	if err := run(); err != nil {
		fmt.Fprintf(os.Stderr, "controldfake: %v\n", err)
		os.Exit(1)
	}
}

func run() error {
	socket := flag.String("socket", "", "unix socket to serve controld's gRPC API on")
	token := flag.String("token", "", "bearer token the API requires (none when empty)")
	hostsFlag := flag.String("hosts", "", "serve one fake per name=admission-memory (comma-separated) on <socket>-<name>, sharing a registry")
	flag.Parse()
	if *socket == "" {
		return errors.New("--socket is required")
	}
	guest := acitest.NewServer()
	guest.Token = acitoken
	guest.Capabilities = append(append([]string(nil), acitest.DefaultCapabilities...), "region", "downscale", "cursor")
	defer guest.Close()
	var failReplica atomic.Int64 // set from stdin, read by fork RPCs
	failReplica.Store(-1)
	newFake := func() *controldfake.Fake {
		fake := controldfake.New()
		fake.Token = *token
		fake.SetEndpoint(func(sb *controldv1.Sandbox) *controldv1.Endpoint {
			return &controldv1.Endpoint{Url: guest.URL(), Token: acitoken}
		})
		fake.FailReplica = func(_ string, i int) error {
			if int64(i) == failReplica.Load() {
				return errdefs.WithReason(errdefs.ErrUnavailable, "REPLICA_FAILED", "replica %d failed (controldfake)", i)
			}
			return nil
		}
		return fake
	}
	type host struct {
		name string
		srv  *controldfake.Server
	}
	var hosts []host
	if *hostsFlag == "" {
		srv, err := controldfake.ListenFake(newFake(), *socket)
		if err != nil {
			return err
		}
		hosts = append(hosts, host{srv: srv})
	} else {
		reg := controldfake.NewRegistry()
		for _, spec := range strings.Split(*hostsFlag, ",") {
			name, mem, ok := strings.Cut(spec, "=")
			n, err := limits.ParseBytes(mem)
			if !ok || name == "" || err != nil {
				return fmt.Errorf("--hosts %q: want name=memory,...", spec)
			}
			fake := newFake()
			fake.Host, fake.Registry = name, reg
			fake.Limits = limits.Default()
			fake.Limits.MaxMemoryBytes = n
			srv, err := controldfake.ListenFake(fake, *socket+"-"+name)
			if err != nil {
				return err
			}
			hosts = append(hosts, host{name: name, srv: srv})
		}
	}
	defer func() {
		for _, h := range hosts {
			h.srv.Close()
		}
	}()
	srv := hosts[0].srv
	if err := setFrame(guest, 40, 80, 160); err != nil {
		return err
	}
	out := json.NewEncoder(os.Stdout)
	targets := map[string]string{}
	for _, h := range hosts {
		if h.name != "" {
			targets[h.name] = h.srv.Target
		}
	}
	if err := out.Encode(map[string]any{"target": srv.Target, "aci_url": guest.URL(), "aci_token": acitoken, "hosts": targets}); err != nil {
		return err
	}
	in := bufio.NewScanner(os.Stdin)
	for in.Scan() {
		f := strings.Fields(in.Text())
		if len(f) == 0 {
			continue
		}
		var err error
		switch {
		case f[0] == "frame" && len(f) == 4:
			var rgb [3]uint8
			for i := range rgb {
				v, perr := strconv.ParseUint(f[i+1], 10, 8)
				err = errors.Join(err, perr)
				rgb[i] = uint8(v)
			}
			if err == nil {
				err = setFrame(guest, rgb[0], rgb[1], rgb[2])
			}
		case f[0] == "drop" && len(f) == 1:
			guest.DropConnections()
		case f[0] == "generation" && len(f) == 2:
			var g uint64
			if g, err = strconv.ParseUint(f[1], 10, 64); err == nil {
				guest.SetGeneration(g)
			}
		case f[0] == "ready" && len(f) == 2:
			guest.SetReady(f[1] == "1")
		case f[0] == "fail-replica" && len(f) == 2:
			var i int64
			if i, err = strconv.ParseInt(f[1], 10, 64); err == nil {
				failReplica.Store(i)
			}
		case f[0] == "sandbox-state" && len(f) == 3:
			var st int
			if st, err = strconv.Atoi(f[2]); err == nil {
				for _, h := range hosts {
					if err = h.srv.SetState(f[1], controldv1.SandboxState(st), "set by controldfake"); err == nil {
						break
					}
				}
			}
		case f[0] == "stop-host" && len(f) == 2:
			err = fmt.Errorf("no host %q", f[1])
			for _, h := range hosts {
				if h.name == f[1] {
					err = h.srv.Close()
				}
			}
		default:
			err = fmt.Errorf("unknown command %q", in.Text())
		}
		if err != nil {
			fmt.Printf("error: %v\n", err)
		} else {
			fmt.Println("ok")
		}
	}
	return in.Err()
}

// setFrame makes the fake desktop a solid colour, encoded as a real PNG so
// clients can decode what they receive.
func setFrame(s *acitest.Server, r, g, b uint8) error {
	img := image.NewRGBA(image.Rect(0, 0, 1280, 800))
	c := color.RGBA{R: r, G: g, B: b, A: 0xff}
	for i := 0; i < len(img.Pix); i += 4 {
		img.Pix[i], img.Pix[i+1], img.Pix[i+2], img.Pix[i+3] = c.R, c.G, c.B, c.A
	}
	var buf bytes.Buffer
	if err := png.Encode(&buf, img); err != nil {
		return err
	}
	s.SetFrame(buf.Bytes())
	return nil
}
