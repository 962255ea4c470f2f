package suites

import (
	"context"
	"crypto/rand"
	"errors"
	"flag"
	"fmt"
	"net"
	"net/http"
	"os"
	"sync/atomic"
	"time"

	"github.com/coder/websocket"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	"github.com/forkfleet/forkfleet/api/aci"
	aciv1 "github.com/forkfleet/forkfleet/api/gen/forkfleet/aci/v1"
)

// RunPeer is `benchd peer`: a synthetic ACI server that speaks the real wire
// protocol (binary protobuf envelopes over WebSocket, Hello first, replies by
// id) and answers every screenshot, and every step's observation, with a
// fixed payload of --frame-bytes.
// clientscale runs several in separate processes so the client under test
// never shares its address space or scheduler with the servers.
//
// It prints "listening ADDR" on stdout once ready and serves until stdin is
// closed or it is signalled.
func RunPeer(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("peer", flag.ContinueOnError)
	frameBytes := fs.Int("frame-bytes", 90000, "payload bytes per screenshot reply")
	listen := fs.String("listen", "127.0.0.1:0", "address to listen on")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *frameBytes < 0 || *frameBytes > 64<<20 {
		return fmt.Errorf("--frame-bytes %d out of range", *frameBytes)
	}
	ln, err := net.Listen("tcp", *listen)
	if err != nil {
		return err
	}
	p := newPeerServer(*frameBytes)
	srv := &http.Server{Handler: p, ReadHeaderTimeout: 10 * time.Second}
	fmt.Printf("listening %s\n", ln.Addr())
	// The parent closes our stdin to stop us; that also covers the parent
	// dying without cleaning up.
	go func() {
		buf := make([]byte, 1)
		for {
			if _, err := os.Stdin.Read(buf); err != nil {
				srv.Close()
				return
			}
		}
	}()
	go func() { <-ctx.Done(); srv.Close() }()
	if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}

// peerServer is the synthetic ACI endpoint.
type peerServer struct {
	// screenshotField is the encoded ServerMessage.screenshot field (tag,
	// length, body) built once; a reply is the id field plus these bytes,
	// which is a valid protobuf encoding of the whole envelope.
	screenshotField []byte
	// screenshotBody is the ScreenshotResponse alone, a step's observation.
	screenshotBody []byte
	sessions       atomic.Int64
}

func newPeerServer(frameBytes int) *peerServer {
	data := make([]byte, frameBytes)
	_, _ = rand.Read(data) // incompressible, like an encoded image
	ss := &aciv1.ScreenshotResponse{Format: aciv1.ImageFormat_IMAGE_FORMAT_JPEG, Width: 1280, Height: 800, Data: data,
		FrameHash: make([]byte, 16), Region: &aciv1.Rect{Width: 1280, Height: 800}}
	body, err := proto.Marshal(&aciv1.ServerMessage{Reply: &aciv1.ServerMessage_Screenshot{Screenshot: ss}})
	if err != nil {
		panic(err) // a fixed, valid message
	}
	obs, err := proto.Marshal(ss)
	if err != nil {
		panic(err)
	}
	return &peerServer{screenshotField: body, screenshotBody: obs}
}

func (p *peerServer) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	ws, err := websocket.Accept(w, r, &websocket.AcceptOptions{
		Subprotocols: []string{aci.SubprotocolProto}, CompressionMode: websocket.CompressionDisabled})
	if err != nil {
		return
	}
	defer ws.CloseNow()
	if ws.Subprotocol() != aci.SubprotocolProto {
		ws.Close(websocket.StatusPolicyViolation, "subprotocol "+aci.SubprotocolProto+" required")
		return
	}
	ws.SetReadLimit(1 << 20)
	n := p.sessions.Add(1)
	ctx := r.Context()
	hello := false
	out := make([]byte, 0, len(p.screenshotField)+16)
	for {
		typ, data, err := ws.Read(ctx)
		if err != nil {
			return
		}
		if typ != websocket.MessageBinary {
			ws.Close(websocket.StatusUnsupportedData, "binary frames only")
			return
		}
		var m aciv1.ClientMessage
		if err := proto.Unmarshal(data, &m); err != nil {
			ws.Close(websocket.StatusUnsupportedData, "bad envelope")
			return
		}
		var reply []byte
		switch req := m.Request.(type) {
		case *aciv1.ClientMessage_Hello:
			hello = true
			reply, _ = proto.Marshal(&aciv1.ServerMessage{Id: m.Id, Reply: &aciv1.ServerMessage_Hello{Hello: &aciv1.HelloResponse{
				ProtocolVersion: 1, ServerVersion: "benchd-peer", Capabilities: []string{"codec.jpeg", "codec.png"},
				SessionId: fmt.Sprintf("peer-%d-%d", os.Getpid(), n), Screen: &aciv1.ScreenSizeResponse{Width: 1280, Height: 800},
				MaxMessageBytes: 1 << 20, BootId: fmt.Sprintf("peer-%d", os.Getpid())}}})
		case *aciv1.ClientMessage_Ping:
			reply, _ = proto.Marshal(&aciv1.ServerMessage{Id: m.Id, Reply: &aciv1.ServerMessage_Ping{Ping: &aciv1.PingResponse{Payload: req.Ping.Payload}}})
		case *aciv1.ClientMessage_Screenshot:
			out = protowire.AppendTag(out[:0], 1, protowire.VarintType)
			out = protowire.AppendVarint(out, m.Id)
			out = append(out, p.screenshotField...)
			reply = out
		case *aciv1.ClientMessage_Step:
			// One empty (successful) outcome per action, then the fixed
			// observation when one was asked for.
			var step []byte
			for range req.Step.GetActions() {
				step = protowire.AppendTag(step, 1, protowire.BytesType)
				step = protowire.AppendBytes(step, nil)
			}
			if req.Step.GetObserve() != nil {
				step = protowire.AppendTag(step, 2, protowire.BytesType)
				step = protowire.AppendBytes(step, p.screenshotBody)
			}
			out = protowire.AppendTag(out[:0], 1, protowire.VarintType)
			out = protowire.AppendVarint(out, m.Id)
			out = protowire.AppendTag(out, 5, protowire.BytesType)
			out = protowire.AppendBytes(out, step)
			reply = out
		default:
			reply, _ = proto.Marshal(&aciv1.ServerMessage{Id: m.Id, Reply: &aciv1.ServerMessage_Error{Error: &aciv1.Error{
				Code: aciv1.ErrorCode_ERROR_CODE_UNIMPLEMENTED, Message: "benchd peer answers hello, ping, screenshot and step only"}}})
		}
		if !hello {
			ws.Close(websocket.StatusPolicyViolation, "hello first")
			return
		}
		if err := ws.Write(ctx, websocket.MessageBinary, reply); err != nil {
			return
		}
	}
}
