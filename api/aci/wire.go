package aci

import (
	"bytes"
	"errors"
	"fmt"
	"net/url"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"

	"github.com/coder/websocket"
	aciv1 "github.com/forkfleet/forkfleet/api/gen/forkfleet/aci/v1"
	"github.com/forkfleet/forkfleet/api/internal/loopback"
)

// MaxMessageElements bounds the nested messages and repeated-field elements
// one ServerMessage may hold. Decoding allocates per element (a Window or a
// FileInfo costs 100 to 200 bytes) where the wire may spend 2 bytes on it,
// so without a bound a hostile guestd could turn a 64 MiB message into
// gigabytes in its client (in controld, too). Honest replies stay far below
// it: a file_list holds at most 100,000 entries, a screencast frame one tile
// per changed 32x32 cell (65,536 at 8192x8192).
const MaxMessageElements = 1 << 18

// maxMessageDepth bounds the nesting the element count follows (the ACI
// schema has no recursive message; a deeper message is hostile).
const maxMessageDepth = 32

var (
	errTooManyElements = fmt.Errorf("more than %d messages and list elements", MaxMessageElements)
)

// encodeClientMessage encodes m for the subprotocol, the binary form
// appended to buf, and returns the frame type that carries it.
func encodeClientMessage(buf []byte, m *aciv1.ClientMessage, json bool) (websocket.MessageType, []byte, error) {
	if json {
		b, err := protojson.Marshal(m)
		return websocket.MessageText, b, err
	}
	b, err := proto.MarshalOptions{}.MarshalAppend(buf, m)
	return websocket.MessageBinary, b, err
}

// decodeServerMessage decodes one server envelope after checking, without
// allocating, that it holds no more than MaxMessageElements elements.
func decodeServerMessage(b []byte, json bool) (*aciv1.ServerMessage, error) {
	m := &aciv1.ServerMessage{}
	return m, decodeChecked(b, json, m)
}

// DecodeServerMessage decodes one server envelope with the checks a Session
// applies (element budget before any allocation), for readers of the wire
// that are not a Session: controld's recorder reads the gateway's traffic.
func DecodeServerMessage(b []byte, json bool) (*aciv1.ServerMessage, error) {
	return decodeServerMessage(b, json)
}

// DecodeClientMessage decodes one client envelope with the same checks.
func DecodeClientMessage(b []byte, json bool) (*aciv1.ClientMessage, error) {
	m := &aciv1.ClientMessage{}
	return m, decodeChecked(b, json, m)
}

// decodeChecked decodes b into m after checking, without allocating, that
// it holds no more than MaxMessageElements elements.
func decodeChecked(b []byte, json bool, m proto.Message) error {
	var err error
	if json {
		// Every JSON object is a message (one '{' each), and list elements
		// and fields are separated by commas: both bound what decoding
		// allocates. Braces and commas inside strings only count extra.
		if bytes.Count(b, []byte("{")) > MaxMessageElements || bytes.Count(b, []byte(",")) > 8*MaxMessageElements {
			return fmt.Errorf("%w: decode: %v", ErrProtocol, errTooManyElements)
		}
		err = protojson.UnmarshalOptions{DiscardUnknown: true}.Unmarshal(b, m)
	} else {
		if _, err := countElements(b, m.ProtoReflect().Descriptor(), MaxMessageElements, 0); err != nil {
			return fmt.Errorf("%w: decode: %v", ErrProtocol, err)
		}
		err = proto.Unmarshal(b, m)
	}
	if err != nil {
		return fmt.Errorf("%w: decode: %v", ErrProtocol, err)
	}
	return nil
}

// countElements walks the wire form of a message of type md and counts its
// nested messages and list elements (an upper bound for packed scalars),
// failing once the count passes budget. Bytes and string fields are
// skipped in O(1); unknown fields are kept by the decoder as raw bytes and
// are not counted.
func countElements(b []byte, md protoreflect.MessageDescriptor, budget, depth int) (int, error) {
	if depth > maxMessageDepth {
		return 0, errors.New("messages nested too deep")
	}
	fields := md.Fields()
	n := 0
	for len(b) > 0 {
		num, typ, tl := protowire.ConsumeTag(b)
		if tl < 0 {
			return n, protowire.ParseError(tl)
		}
		b = b[tl:]
		vl := protowire.ConsumeFieldValue(num, typ, b)
		if vl < 0 {
			return n, protowire.ParseError(vl)
		}
		if fd := fields.ByNumber(num); fd != nil {
			if fd.IsList() || fd.IsMap() || fd.Message() != nil {
				n++
			}
			if typ == protowire.BytesType {
				v, _ := protowire.ConsumeBytes(b)
				switch {
				case fd.Message() != nil:
					m, err := countElements(v, fd.Message(), budget-n, depth+1)
					n += m
					if err != nil {
						return n, err
					}
				case fd.IsList() && fd.Kind() != protoreflect.StringKind && fd.Kind() != protoreflect.BytesKind:
					n += len(v) // packed scalars: at least one byte each
				}
			}
			if n > budget {
				return n, errTooManyElements
			}
		}
		b = b[vl:]
	}
	return n, nil
}

// checkPlaintext refuses to send a bearer token over plaintext to a host
// that is not the loopback: ws:// (or http://) to a remote name or address,
// unless the transport is local (DialUnix) or WithInsecure says the network
// is trusted. api/client applies the same rule to the gRPC API.
func checkPlaintext(u *url.URL, hasToken bool, cfg *dialConfig) error {
	if !hasToken || cfg.local || cfg.insecure || u.Scheme == "wss" || u.Scheme == "https" || loopback.Host(u.Hostname()) {
		return nil
	}
	return fmt.Errorf("aci: dial %s: %w: refusing to send a bearer token in plaintext to %s (use wss://, or WithInsecure on a trusted network)",
		u.Redacted(), ErrInvalidArgument, u.Host)
}
