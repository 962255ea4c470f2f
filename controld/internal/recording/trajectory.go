package recording

import (
	"encoding/hex"
	"encoding/json"
	"errors"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/reflect/protoreflect"

	"github.com/forkfleet/forkfleet/api/aci"
	aciv1 "github.com/forkfleet/forkfleet/api/gen/forkfleet/aci/v1"
)

// The trajectory (trajectory.jsonl) has one line per ACI request that went
// through controld's gateway to the recorded sandbox, written when its
// reply arrived (or when its connection ended without one).
type trajectoryLine struct {
	// Line number, from 1.
	Seq uint64 `json:"seq"`
	// "view" for the input of a live viewer in control mode (run by the
	// gateway on its own session: conn and id are 0); empty for agents.
	Source string `json:"source,omitempty"`
	// The gateway connection it came on (from 1 within the recording) and
	// the client's request id on it.
	Conn uint64 `json:"conn"`
	ID   uint64 `json:"id"`
	// The request's kind: the ClientMessage field set ("step",
	// "screenshot", ...).
	Method string `json:"method"`
	// The request and reply in protobuf JSON, with bytes fields longer than
	// elideOver left out (elided_bytes counts them).
	Request json.RawMessage `json:"request,omitempty"`
	Reply   json.RawMessage `json:"reply,omitempty"`
	Elided  int             `json:"elided_bytes,omitempty"`
	// Host times (Unix ns) the request and its reply passed the gateway.
	SentNs    int64 `json:"sent_ns"`
	RepliedNs int64 `json:"replied_ns,omitempty"`
	// ok, error (Error says which), no_reply (the connection ended first),
	// or too_large (the message passed the recorder's read bound: only its
	// id, kind and size are known).
	Outcome string     `json:"outcome"`
	Error   *lineError `json:"error,omitempty"`
	// The last screencast frame recorded when the request passed and when
	// the reply did.
	FrameBefore *frameRef `json:"frame_before,omitempty"`
	FrameAfter  *frameRef `json:"frame_after,omitempty"`
	// The reply's frame_hash (a screenshot's or a step's observation), hex.
	ObservationHash string `json:"observation_hash,omitempty"`
}

type lineError struct {
	Code    string `json:"code"`
	Message string `json:"message,omitempty"`
	Field   string `json:"field,omitempty"`
}

// frameRef names a recorded frame: its index in screencast.ffrec (from 1),
// guestd's frame_hash of it (hex) and its capture time (Unix ns).
type frameRef struct {
	Index      uint64 `json:"index"`
	Hash       string `json:"hash,omitempty"`
	CapturedNs int64  `json:"captured_ns,omitempty"`
}

// elideOver: bytes fields longer than this are left out of the trajectory
// (images, file contents); hashes and short payloads stay.
const elideOver = 256

var (
	clientOneof = (&aciv1.ClientMessage{}).ProtoReflect().Descriptor().Oneofs().ByName("request")
	serverOneof = (&aciv1.ServerMessage{}).ProtoReflect().Descriptor().Oneofs().ByName("reply")
)

var jsonOpts = protojson.MarshalOptions{UseProtoNames: true}

// decodedRequest is a client message as the trajectory keeps it.
type decodedRequest struct {
	id      uint64
	method  string
	json    json.RawMessage
	elided  int
	tooBig  bool
	invalid bool
}

// decodeRequest decodes a client message (data may be cut at the read
// bound: then only its id and kind are read from the prefix).
func decodeRequest(text bool, data []byte, truncated bool) decodedRequest {
	if truncated {
		id, method := peekEnvelope(data, clientOneof)
		return decodedRequest{id: id, method: method, tooBig: true}
	}
	m, err := aci.DecodeClientMessage(data, text)
	if err != nil {
		return decodedRequest{invalid: true}
	}
	d := decodedRequest{id: m.GetId(), method: whichOneof(m.ProtoReflect(), clientOneof)}
	d.elided = elide(m.ProtoReflect())
	d.json, _ = jsonOpts.Marshal(m)
	return d
}

// decodedReply is a server message as the trajectory keeps it.
type decodedReply struct {
	id      uint64
	event   bool
	json    json.RawMessage
	elided  int
	err     *lineError
	hash    []byte
	tooBig  bool
	invalid bool
}

func decodeReply(text bool, data []byte, truncated bool) decodedReply {
	if truncated {
		id, _ := peekEnvelope(data, serverOneof)
		return decodedReply{id: id, tooBig: true}
	}
	m, err := aci.DecodeServerMessage(data, text)
	if err != nil {
		return decodedReply{invalid: true}
	}
	if m.GetEvent() != nil {
		return decodedReply{event: true}
	}
	d := decodedReply{id: m.GetId()}
	if e := m.GetError(); e != nil {
		d.err = &lineError{Code: e.GetCode().String(), Message: e.GetMessage(), Field: e.GetField()}
	}
	d.hash = findFrameHash(m.ProtoReflect(), 0)
	d.elided = elide(m.ProtoReflect())
	d.json, _ = jsonOpts.Marshal(m)
	return d
}

// viewLine is the trajectory line of a live viewer's step.
func viewLine(it *item, last *frameRef) *trajectoryLine {
	req := &aciv1.ClientMessage{Request: &aciv1.ClientMessage_Step{Step: &aciv1.StepRequest{Actions: it.actions}}}
	l := &trajectoryLine{Source: "view", Method: "step", SentNs: it.sent.UnixNano(), RepliedNs: it.at.UnixNano(), Outcome: "ok", FrameAfter: last}
	l.Elided = elide(req.ProtoReflect())
	l.Request, _ = jsonOpts.Marshal(req)
	if it.err != nil {
		l.Outcome = "error"
		l.Error = &lineError{Code: "gateway", Message: it.err.Error()}
		if e := (*aci.Error)(nil); errors.As(it.err, &e) {
			l.Error.Code = e.Code.String()
		}
		return l
	}
	rep := &aciv1.ServerMessage{Reply: &aciv1.ServerMessage_Step{Step: it.resp}}
	l.ObservationHash = hexOrEmpty(findFrameHash(rep.ProtoReflect(), 0))
	l.Elided += elide(rep.ProtoReflect())
	l.Reply, _ = jsonOpts.Marshal(rep)
	return l
}

func whichOneof(m protoreflect.Message, o protoreflect.OneofDescriptor) string {
	if fd := m.WhichOneof(o); fd != nil {
		return string(fd.Name())
	}
	return ""
}

// peekEnvelope reads the id and the oneof field's name from the start of an
// envelope's wire form (Go and guestd write fields in number order: the id
// first, then the request or reply).
func peekEnvelope(b []byte, o protoreflect.OneofDescriptor) (uint64, string) {
	var id uint64
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			break
		}
		b = b[n:]
		if num == 1 && typ == protowire.VarintType {
			v, n := protowire.ConsumeVarint(b)
			if n < 0 {
				break
			}
			id, b = v, b[n:]
			continue
		}
		if fd := o.Fields().ByNumber(num); fd != nil {
			return id, string(fd.Name())
		}
		n = protowire.ConsumeFieldValue(num, typ, b)
		if n < 0 {
			break
		}
		b = b[n:]
	}
	return id, ""
}

// elide clears bytes fields longer than elideOver in m and below, and
// returns how many bytes it left out.
func elide(m protoreflect.Message) int {
	n := 0
	m.Range(func(fd protoreflect.FieldDescriptor, v protoreflect.Value) bool {
		switch {
		case fd.Kind() == protoreflect.BytesKind && !fd.IsList() && !fd.IsMap():
			if l := len(v.Bytes()); l > elideOver {
				n += l
				m.Clear(fd)
			}
		case fd.Message() != nil && fd.IsList():
			l := v.List()
			for i := 0; i < l.Len(); i++ {
				n += elide(l.Get(i).Message())
			}
		case fd.Message() != nil && !fd.IsMap():
			n += elide(v.Message())
		}
		return true
	})
	return n
}

// findFrameHash returns the first frame_hash field set in m (a screenshot's,
// a step's observation), searching depth first.
func findFrameHash(m protoreflect.Message, depth int) []byte {
	if depth > 8 {
		return nil
	}
	var out []byte
	m.Range(func(fd protoreflect.FieldDescriptor, v protoreflect.Value) bool {
		switch {
		case fd.Name() == "frame_hash" && fd.Kind() == protoreflect.BytesKind && !fd.IsList():
			out = v.Bytes()
		case fd.Message() != nil && !fd.IsList() && !fd.IsMap():
			out = findFrameHash(v.Message(), depth+1)
		}
		return out == nil
	})
	return out
}

func hexOrEmpty(b []byte) string {
	if len(b) == 0 {
		return ""
	}
	return hex.EncodeToString(b)
}
