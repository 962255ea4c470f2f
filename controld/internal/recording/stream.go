package recording

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"time"

	"google.golang.org/protobuf/proto"

	aciv1 "github.com/forkfleet/forkfleet/api/gen/forkfleet/aci/v1"
)

// The screencast file (screencast.ffrec) is the delta stream as guestd sent
// it and the compositor accepted it: an 8-byte magic, then records of
//
//	length u32 LE (of the payload), kind u8, host time i64 LE (Unix ns), payload
//
// kind 1 is an aciv1.ScreencastFrame in protobuf, kind 2 the cursor (x, y
// int32 LE). Frames are stored exactly as received, so a reader replays
// them through api/screencast's Compositor as the gateway did; every file
// starts with a keyframe and every later screencast session (after a
// checkpoint) starts with one too.
var streamMagic = [8]byte{'F', 'F', 'R', 'E', 'C', 0, 1, '\n'}

// Record kinds.
const (
	kindFrame  = 1
	kindCursor = 2
)

const recordHeader = 4 + 1 + 8

// maxRecord bounds one record's payload when reading: the gateway's read
// limit for one message from guestd.
const maxRecord = 32 << 20

// ErrBadStream: the screencast file is not one controld wrote, or is cut
// inside a record (a crash mid-write: what precedes the cut is readable).
var ErrBadStream = errors.New("recording: malformed screencast file")

// appendRecord appends one record to b.
func appendRecord(b []byte, kind byte, at time.Time, payload []byte) []byte {
	b = binary.LittleEndian.AppendUint32(b, uint32(len(payload)))
	b = append(b, kind)
	b = binary.LittleEndian.AppendUint64(b, uint64(at.UnixNano()))
	return append(b, payload...)
}

// frameRecord encodes a frame record.
func frameRecord(f *aciv1.ScreencastFrame, at time.Time) ([]byte, error) {
	p, err := proto.Marshal(f)
	if err != nil {
		return nil, err
	}
	return appendRecord(make([]byte, 0, recordHeader+len(p)), kindFrame, at, p), nil
}

func cursorRecord(x, y int32, at time.Time) []byte {
	var p [8]byte
	binary.LittleEndian.PutUint32(p[:], uint32(x))
	binary.LittleEndian.PutUint32(p[4:], uint32(y))
	return appendRecord(make([]byte, 0, recordHeader+8), kindCursor, at, p[:])
}

// StreamRecord is one record of a screencast file.
type StreamRecord struct {
	At     time.Time
	Frame  *aciv1.ScreencastFrame // kind frame
	Cursor [2]int32               // kind cursor
}

// StreamReader reads a screencast file.
type StreamReader struct {
	r   *bufio.Reader
	buf []byte
}

// NewStreamReader checks the magic and returns a reader of the records.
func NewStreamReader(r io.Reader) (*StreamReader, error) {
	br := bufio.NewReaderSize(r, 1<<16)
	var m [8]byte
	if _, err := io.ReadFull(br, m[:]); err != nil || m != streamMagic {
		return nil, fmt.Errorf("%w: no header", ErrBadStream)
	}
	return &StreamReader{r: br}, nil
}

// Next returns the next record, io.EOF after the last. A record cut short
// (the file ends inside it) is io.EOF too: controld stopped mid-write.
func (s *StreamReader) Next() (StreamRecord, error) {
	var h [recordHeader]byte
	if _, err := io.ReadFull(s.r, h[:]); err != nil {
		if errors.Is(err, io.ErrUnexpectedEOF) {
			return StreamRecord{}, io.EOF
		}
		return StreamRecord{}, err
	}
	n := binary.LittleEndian.Uint32(h[:])
	if n > maxRecord {
		return StreamRecord{}, fmt.Errorf("%w: a record of %d bytes (at most %d)", ErrBadStream, n, maxRecord)
	}
	if cap(s.buf) < int(n) {
		s.buf = make([]byte, n)
	}
	p := s.buf[:n]
	if _, err := io.ReadFull(s.r, p); err != nil {
		return StreamRecord{}, io.EOF
	}
	rec := StreamRecord{At: time.Unix(0, int64(binary.LittleEndian.Uint64(h[5:])))}
	switch h[4] {
	case kindFrame:
		rec.Frame = &aciv1.ScreencastFrame{}
		if err := proto.Unmarshal(p, rec.Frame); err != nil {
			return StreamRecord{}, fmt.Errorf("%w: frame: %v", ErrBadStream, err)
		}
	case kindCursor:
		if n != 8 {
			return StreamRecord{}, fmt.Errorf("%w: cursor record of %d bytes", ErrBadStream, n)
		}
		rec.Cursor = [2]int32{int32(binary.LittleEndian.Uint32(p)), int32(binary.LittleEndian.Uint32(p[4:]))}
	default:
		return StreamRecord{}, fmt.Errorf("%w: record kind %d", ErrBadStream, h[4])
	}
	return rec, nil
}
