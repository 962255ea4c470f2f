package aci

import (
	"bytes"
	"errors"
	"strings"
	"testing"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	aciv1 "github.com/forkfleet/forkfleet/api/gen/forkfleet/aci/v1"
)

// TestDecodeBounds: the element bound holds on both subprotocols, and
// honest replies at the protocol's own limits pass it.
func TestDecodeBounds(t *testing.T) {
	// A window list of empty entries just past the bound, as JSON text and
	// as protobuf.
	n := MaxMessageElements + 1
	js := `{"id":"1","listWindows":{"windows":[{}` + strings.Repeat(",{}", n-1) + `]}}`
	if _, err := decodeServerMessage([]byte(js), true); !errors.Is(err, ErrProtocol) {
		t.Fatalf("json: %v", err)
	}
	ws := make([]*aciv1.Window, n)
	for i := range ws {
		ws[i] = &aciv1.Window{}
	}
	b, err := proto.Marshal(&aciv1.ServerMessage{Id: 1, Reply: &aciv1.ServerMessage_ListWindows{ListWindows: &aciv1.ListWindowsResponse{Windows: ws}}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := decodeServerMessage(b, false); !errors.Is(err, ErrProtocol) {
		t.Fatalf("proto: %v", err)
	}
	// guestd's largest listing (100,000 entries with names) and a frame of
	// 65,536 tiles decode, both ways.
	entries := make([]*aciv1.FileInfo, 100_000)
	for i := range entries {
		entries[i] = &aciv1.FileInfo{Name: "file-name", Size: 123, Mode: 0o644, ModifiedUnixNs: 1}
	}
	tiles := make([]*aciv1.Tile, 65_536)
	for i := range tiles {
		tiles[i] = &aciv1.Tile{Rect: &aciv1.Rect{X: 1, Y: 2, Width: 3, Height: 4}, Data: []byte{1}}
	}
	for _, m := range []*aciv1.ServerMessage{
		{Id: 2, Reply: &aciv1.ServerMessage_FileList{FileList: &aciv1.FileListResponse{Entries: entries}}},
		{Reply: &aciv1.ServerMessage_Event{Event: &aciv1.Event{Event: &aciv1.Event_Frame{Frame: &aciv1.ScreencastFrame{Tiles: tiles}}}}},
	} {
		b, err := proto.Marshal(m)
		if err != nil {
			t.Fatal(err)
		}
		if got, err := decodeServerMessage(b, false); err != nil || proto.Size(got) != len(b) {
			t.Fatalf("honest reply (proto): %v", err)
		}
	}
	// JSON (slow; debugging only) spends more commas per element: a
	// listing's worth of them passes.
	list := &aciv1.ServerMessage{Id: 2, Reply: &aciv1.ServerMessage_FileList{FileList: &aciv1.FileListResponse{Entries: entries[:20_000]}}}
	j, err := protojson.Marshal(list)
	if err != nil {
		t.Fatal(err)
	}
	if got, err := decodeServerMessage(j, true); err != nil || !proto.Equal(got, list) {
		t.Fatalf("honest reply (json): %v", err)
	}
	// Malformed wire data is a protocol error, not a panic.
	for _, b := range [][]byte{{0xff}, {0x0a, 0x05, 0x01}, bytes.Repeat([]byte{0x92, 0x01}, 3)} {
		if _, err := decodeServerMessage(b, false); !errors.Is(err, ErrProtocol) {
			t.Errorf("%x: %v", b, err)
		}
	}
}

// FuzzDecodeServerMessage: whatever a guestd sends, the client's decoder
// returns a message or ErrProtocol; what passes the element bound decodes
// exactly as the protobuf library decodes it.
func FuzzDecodeServerMessage(f *testing.F) {
	for _, m := range []*aciv1.ServerMessage{
		{Id: 1, Reply: &aciv1.ServerMessage_Ping{Ping: &aciv1.PingResponse{Payload: []byte("p")}}},
		{Id: 2, Reply: &aciv1.ServerMessage_ListWindows{ListWindows: &aciv1.ListWindowsResponse{Windows: []*aciv1.Window{{Id: 7, Title: "t"}, {}}}}},
		{Id: 3, Reply: &aciv1.ServerMessage_FileList{FileList: &aciv1.FileListResponse{Entries: []*aciv1.FileInfo{{Name: "a"}}}}},
		{Reply: &aciv1.ServerMessage_Event{Event: &aciv1.Event{Event: &aciv1.Event_Frame{Frame: &aciv1.ScreencastFrame{
			Tiles: []*aciv1.Tile{{Rect: &aciv1.Rect{Width: 1, Height: 1}, Data: []byte{1}}}}}}}},
		{Id: 4, Reply: &aciv1.ServerMessage_Error{Error: &aciv1.Error{Code: aciv1.ErrorCode_ERROR_CODE_NOT_FOUND, Field: "x"}}},
	} {
		b, _ := proto.Marshal(m)
		f.Add(b, false)
		j, _ := protojson.Marshal(m)
		f.Add(j, true)
	}
	f.Fuzz(func(t *testing.T, b []byte, json bool) {
		m, err := decodeServerMessage(b, json)
		if err != nil {
			if !errors.Is(err, ErrProtocol) {
				t.Fatalf("error outside ErrProtocol: %v", err)
			}
			return
		}
		if json {
			return
		}
		want := &aciv1.ServerMessage{}
		if err := proto.Unmarshal(b, want); err != nil || !proto.Equal(m, want) {
			t.Fatalf("decoded %v, protobuf says %v (%v)", m, want, err)
		}
	})
}
