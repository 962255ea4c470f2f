package aci_test

import (
	"bufio"
	"context"
	"fmt"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/coder/websocket"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	"github.com/forkfleet/forkfleet/api/aci"
	aciv1 "github.com/forkfleet/forkfleet/api/gen/forkfleet/aci/v1"
)

// The frame-ingest benchmark drives sessions against a synthetic ACI peer
// in a separate process (this test binary re-executed with peerEnv set), so
// the client's CPU is measured alone: the peer answers every screenshot
// with a fixed 90 KB frame, pre-encoded, and does nothing else.
const (
	peerEnv     = "FORKFLEET_ACI_SYNTHETIC_PEER"
	peerPayload = 90 << 10
)

func maybeRunPeer() bool {
	if os.Getenv(peerEnv) != "1" {
		return false
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	frame := make([]byte, peerPayload)
	for i := range frame {
		frame[i] = byte(rand.Uint32())
	}
	// The reply minus its id: field 6 (screenshot) bytes, marshaled once.
	body, _ := proto.Marshal(&aciv1.ServerMessage{Reply: &aciv1.ServerMessage_Screenshot{Screenshot: &aciv1.ScreenshotResponse{
		Format: aciv1.ImageFormat_IMAGE_FORMAT_JPEG, Width: 1280, Height: 800, Data: frame, FrameHash: make([]byte, 16),
	}}})
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ws, err := websocket.Accept(w, r, &websocket.AcceptOptions{Subprotocols: []string{aci.SubprotocolProto}})
		if err != nil {
			return
		}
		defer ws.CloseNow()
		ws.SetReadLimit(64 << 20)
		out := make([]byte, 0, len(body)+16)
		for {
			_, b, err := ws.Read(context.Background())
			if err != nil {
				return
			}
			var m aciv1.ClientMessage
			if err := proto.Unmarshal(b, &m); err != nil {
				return
			}
			var reply []byte
			if m.GetHello() != nil {
				reply, _ = proto.Marshal(&aciv1.ServerMessage{Id: m.GetId(), Reply: &aciv1.ServerMessage_Hello{Hello: &aciv1.HelloResponse{
					ProtocolVersion: 1, Capabilities: []string{"codec.jpeg"}, MaxMessageBytes: 64 << 20}}})
			} else {
				out = protowire.AppendTag(out[:0], 1, protowire.VarintType)
				out = protowire.AppendVarint(out, m.GetId())
				reply = append(out, body...)
			}
			if err := ws.Write(context.Background(), websocket.MessageBinary, reply); err != nil {
				return
			}
		}
	})}
	fmt.Printf("ADDR ws://%s/aci\n", ln.Addr())
	go srv.Serve(ln)
	// Serve until the parent closes our stdin.
	bufio.NewReader(os.Stdin).ReadString('\n')
	return true
}

func startPeer(tb testing.TB) string {
	tb.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), peerEnv+"=1")
	stdin, err := cmd.StdinPipe()
	if err != nil {
		tb.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		tb.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() {
		stdin.Close()
		cmd.Wait()
	})
	line, err := bufio.NewReader(stdout).ReadString('\n')
	if err != nil || !strings.HasPrefix(line, "ADDR ") {
		tb.Fatalf("peer: %q, %v", line, err)
	}
	return strings.TrimSpace(strings.TrimPrefix(line, "ADDR "))
}

func cpuTime() time.Duration {
	var ru syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// BenchmarkFrameIngest: 90 KB screenshot replies through the real session
// (demux, decode) from a separate-process peer. frames/cpu-s is the number
// that matters: frames ingested per second of client CPU, i.e. per core.
func BenchmarkFrameIngest(b *testing.B) {
	for _, n := range []int{1, 16, 64} {
		b.Run(fmt.Sprintf("sessions=%d", n), func(b *testing.B) {
			url := startPeer(b)
			ctx := context.Background()
			sessions := make([]*aci.Session, n)
			for i := range sessions {
				s, err := aci.Dial(ctx, url, "")
				if err != nil {
					b.Fatal(err)
				}
				defer s.Close()
				sessions[i] = s
			}
			const depth = 2 // requests in flight per session
			var left atomic.Int64
			left.Store(int64(b.N))
			b.SetBytes(peerPayload)
			b.ReportAllocs()
			b.ResetTimer()
			cpu0, t0 := cpuTime(), time.Now()
			var wg sync.WaitGroup
			for _, s := range sessions {
				for range depth {
					wg.Add(1)
					go func() {
						defer wg.Done()
						req := aci.JPEG(80)
						for left.Add(-1) >= 0 {
							r, err := s.Screenshot(ctx, req)
							if err != nil || len(r.GetData()) != peerPayload {
								b.Error(err)
								return
							}
						}
					}()
				}
			}
			wg.Wait()
			cpu, wall := cpuTime()-cpu0, time.Since(t0)
			b.StopTimer()
			b.ReportMetric(float64(b.N)/wall.Seconds(), "frames/s")
			b.ReportMetric(float64(b.N)/cpu.Seconds(), "frames/cpu-s")
		})
	}
}
