package aci

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	aciv1 "github.com/forkfleet/forkfleet/api/gen/forkfleet/aci/v1"
)

func fuzzSeeds() []*aciv1.ClientMessage {
	pt := func(x, y int32) *aciv1.Point { return &aciv1.Point{X: x, Y: y} }
	return []*aciv1.ClientMessage{
		{Id: 1, Request: &aciv1.ClientMessage_Hello{Hello: &aciv1.HelloRequest{ProtocolVersion: 1, Capabilities: []string{"dedup"}}}},
		{Id: 2, Request: &aciv1.ClientMessage_Ping{Ping: &aciv1.PingRequest{Payload: []byte("p")}}},
		{Id: 3, Request: &aciv1.ClientMessage_Step{Step: &aciv1.StepRequest{Actions: []*aciv1.Action{
			{Action: &aciv1.Action_Move{Move: &aciv1.MoveAction{To: pt(3, 4)}}},
			{Action: &aciv1.Action_Click{Click: &aciv1.ClickAction{At: pt(1, 1), Count: 2}}},
			{Action: &aciv1.Action_Drag{Drag: &aciv1.DragAction{From: pt(1, 1), To: pt(9, 9), Steps: 3}}},
			{Action: &aciv1.Action_Scroll{Scroll: &aciv1.ScrollAction{Dy: 3}}},
			{Action: &aciv1.Action_KeyCombo{KeyCombo: &aciv1.KeyComboAction{Keys: []string{"ctrl", "a"}}}},
			{Action: &aciv1.Action_TypeText{TypeText: &aciv1.TypeTextAction{Text: "héllo"}}},
			{Action: &aciv1.Action_Wait{Wait: &aciv1.WaitAction{Milliseconds: 1}}},
		}, Observe: &aciv1.ScreenshotRequest{MaxLongEdge: 16}}}},
		{Id: 4, Request: &aciv1.ClientMessage_Screenshot{Screenshot: &aciv1.ScreenshotRequest{Format: aciv1.ImageFormat_IMAGE_FORMAT_JPEG,
			Region: &aciv1.Rect{X: 1, Y: 2, Width: 30, Height: 20}, IncludeCursor: true, IfNoneMatch: make([]byte, 16)}}},
		{Id: 5, Request: &aciv1.ClientMessage_WindowAction{WindowAction: &aciv1.WindowActionRequest{WindowId: 7, Op: aciv1.WindowOp_WINDOW_OP_MOVE_RESIZE,
			Geometry: &aciv1.Rect{Width: 5, Height: 5}}}},
		{Id: 6, Request: &aciv1.ClientMessage_MemoryChallenge{MemoryChallenge: &aciv1.MemoryChallengeRequest{Nonce: []byte("n")}}},
		{Id: 7, Request: &aciv1.ClientMessage_ClipboardSet{ClipboardSet: &aciv1.ClipboardSetRequest{Text: "x"}}},
		{Id: 8, Request: &aciv1.ClientMessage_Exec{Exec: &aciv1.ExecRequest{Argv: []string{"true"}}}},
		{Id: 9, Request: &aciv1.ClientMessage_MemoryMark{MemoryMark: &aciv1.MemoryMarkRequest{Value: []byte("v")}}},
	}
}

// fuzzSession is a session without a connection: the executor's dispatcher
// alone, on a fake desktop. Exec and files are disabled (Runner/Files nil)
// so fuzz inputs cannot touch the machine.
func fuzzSession(t testing.TB) *session {
	srv, err := New(Options{InsecureNoAuth: true, Log: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	srv.desk.Store(&deskBox{d: newFakeDesktop(64, 48), cancel: func() {}})
	ss := &session{srv: srv, role: RoleAgent, ctx: context.Background(), inflight: map[uint64]*job{}}
	ss.exec.hello = true
	return ss
}

// FuzzDispatch decodes arbitrary bytes as a ClientMessage and runs whatever
// decodes through the dispatcher: no panic, exactly one reply with the
// request's id, and a reply that marshals.
func FuzzDispatch(f *testing.F) {
	for _, m := range fuzzSeeds() {
		b, err := proto.Marshal(m)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	f.Add([]byte{0xff, 0x01})
	f.Add([]byte{0x08, 0x05, 0xfa, 0x06, 0x00})
	ss := fuzzSession(f)
	f.Fuzz(func(t *testing.T, data []byte) {
		msg := &aciv1.ClientMessage{}
		if err := proto.Unmarshal(data, msg); err != nil {
			return
		}
		dispatchOne(t, ss, msg)
	})
}

// FuzzDispatchJSON is the same through the debug protojson framing.
func FuzzDispatchJSON(f *testing.F) {
	for _, m := range fuzzSeeds() {
		b, err := protojson.Marshal(m)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	f.Add([]byte(`{"id":"1","unknownKind":{}}`))
	ss := fuzzSession(f)
	f.Fuzz(func(t *testing.T, data []byte) {
		msg := &aciv1.ClientMessage{}
		if err := (protojson.UnmarshalOptions{DiscardUnknown: true}).Unmarshal(data, msg); err != nil {
			return
		}
		dispatchOne(t, ss, msg)
	})
}

func dispatchOne(t *testing.T, ss *session, msg *aciv1.ClientMessage) {
	if _, ok := msg.GetRequest().(*aciv1.ClientMessage_Cancel); ok {
		return // answered by the read loop, not the dispatcher
	}
	// Bound sleeps and settle waits so one input cannot stall the fuzzer.
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	reply := ss.handle(&job{msg: msg, ctx: ctx})
	if reply == nil || reply.GetId() != msg.GetId() || reply.GetReply() == nil {
		t.Fatalf("bad reply %v for %v", reply, msg)
	}
	if _, err := proto.Marshal(reply); err != nil {
		t.Fatalf("reply does not marshal: %v", err)
	}
	// Keep the session past its handshake whatever the input was.
	ss.exec.hello = true
}
