package aci

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"io/fs"

	aciv1 "github.com/forkfleet/forkfleet/api/gen/forkfleet/aci/v1"
)

// PutOption configures PutFile.
type PutOption func(*putConfig)

type putConfig struct {
	mode        uint32
	makeParents bool
	chunkSize   int
}

// FileMode sets the permission bits of the written file (0644 by default).
func FileMode(m fs.FileMode) PutOption {
	return func(c *putConfig) { c.mode = uint32(m.Perm()) }
}

// MakeParents creates missing parent directories.
func MakeParents() PutOption {
	return func(c *putConfig) { c.makeParents = true }
}

// ChunkSize overrides the chunk size of large uploads (bounded by the
// server's max_message_bytes).
func ChunkSize(n int) PutOption {
	return func(c *putConfig) { c.chunkSize = n }
}

const (
	maxChunk     = 4 << 20
	envelopeRoom = 64 << 10 // path, ids and framing around a chunk's bytes
	putWindow    = 4        // chunks in flight: overlaps transfer and disk writes
)

// chunkSize is the largest data payload one message may carry.
func (s *Session) chunkSize(want int) int {
	n := maxChunk
	if want > 0 {
		n = want
	}
	if m := s.Welcome().GetMaxMessageBytes(); m > 0 {
		limit := int(min(m, 1<<40))
		if limit > 2*envelopeRoom {
			limit -= envelopeRoom
		} else {
			limit /= 2
		}
		n = min(n, limit)
	}
	return max(n, 1)
}

// PutFile writes data to path atomically (the file appears complete or not
// at all). Data larger than one message is sent in pipelined chunks of one
// upload that the last chunk publishes.
func (s *Session) PutFile(ctx context.Context, path string, data []byte, opts ...PutOption) error {
	if path == "" {
		return fmt.Errorf("aci: put file: %w: empty path", ErrInvalidArgument)
	}
	var cfg putConfig
	for _, o := range opts {
		o(&cfg)
	}
	chunk := s.chunkSize(cfg.chunkSize)
	base := func() *aciv1.FilePutRequest {
		return &aciv1.FilePutRequest{Path: path, Mode: cfg.mode, MakeParents: cfg.makeParents}
	}
	if len(data) <= chunk {
		req := base()
		req.Data = data
		return s.putOne(ctx, req)
	}
	if !s.HasCapability("files.chunked") {
		return fmt.Errorf("aci: put file %s: %w: %d bytes need a chunked upload and the server does not offer files.chunked (limit %d bytes per message)",
			path, ErrFailedPrecondition, len(data), chunk)
	}
	var idb [16]byte
	if _, err := rand.Read(idb[:]); err != nil {
		return fmt.Errorf("aci: put file: upload id: %w", err)
	}
	uploadID := hex.EncodeToString(idb[:])
	var (
		inflight []*Call
		firstErr error
	)
	collect := func(call *Call) {
		m, err := call.Wait(ctx)
		if err == nil && m.GetFilePut() == nil {
			err = unexpected("file_put", m)
		}
		if err != nil && firstErr == nil {
			firstErr = fmt.Errorf("aci: put file %s: %w", path, err)
		}
	}
	for off := 0; off < len(data) && firstErr == nil; off += chunk {
		end := min(off+chunk, len(data))
		req := base()
		req.Data = data[off:end]
		req.UploadId = uploadID
		req.Offset = uint64(off)
		req.Last = end == len(data)
		call, err := s.Start(ctx, &aciv1.ClientMessage{Request: &aciv1.ClientMessage_FilePut{FilePut: req}})
		if err != nil {
			firstErr = fmt.Errorf("aci: put file %s: %w", path, err)
			break
		}
		inflight = append(inflight, call)
		if len(inflight) == putWindow {
			collect(inflight[0])
			inflight = inflight[1:]
		}
	}
	for _, call := range inflight {
		collect(call)
	}
	return firstErr
}

func (s *Session) putOne(ctx context.Context, req *aciv1.FilePutRequest) error {
	m, err := s.Do(ctx, &aciv1.ClientMessage{Request: &aciv1.ClientMessage_FilePut{FilePut: req}})
	if err != nil {
		return fmt.Errorf("aci: put file %s: %w", req.GetPath(), err)
	}
	if m.GetFilePut() == nil {
		return unexpected("file_put", m)
	}
	return nil
}

// GetOption configures GetFile.
type GetOption func(*getConfig)

type getConfig struct{ max uint64 }

// UpTo makes GetFile fail (ErrResourceExhausted) rather than read a file
// larger than n bytes: when the caller knows what size to expect, a guestd
// cannot make it download more.
func UpTo(n int64) GetOption {
	return func(c *getConfig) { c.max = uint64(max(n, 0)) }
}

// GetFile reads a whole file, in as many replies as it takes.
func (s *Session) GetFile(ctx context.Context, path string, opts ...GetOption) ([]byte, error) {
	if path == "" {
		return nil, fmt.Errorf("aci: get file: %w: empty path", ErrInvalidArgument)
	}
	cfg := getConfig{max: ^uint64(0)}
	for _, o := range opts {
		o(&cfg)
	}
	chunk := uint64(s.chunkSize(0))
	var out []byte
	for {
		m, err := s.Do(ctx, &aciv1.ClientMessage{Request: &aciv1.ClientMessage_FileGet{FileGet: &aciv1.FileGetRequest{
			Path: path, Offset: uint64(len(out)), Length: chunk,
		}}})
		if err != nil {
			return nil, fmt.Errorf("aci: get file %s: %w", path, err)
		}
		r := m.GetFileGet()
		if r == nil {
			return nil, unexpected("file_get", m)
		}
		if uint64(len(r.GetData())) > chunk {
			return nil, fmt.Errorf("aci: get file %s: %w: %d bytes in a reply, %d asked for", path, ErrProtocol, len(r.GetData()), chunk)
		}
		if r.GetSize() > cfg.max || uint64(len(out)+len(r.GetData())) > cfg.max {
			return nil, fmt.Errorf("aci: get file %s: %w: larger than %d bytes", path, ErrResourceExhausted, cfg.max)
		}
		if out == nil {
			if r.GetEof() {
				return r.GetData(), nil // one reply: keep its buffer
			}
			// size is the server's word: reserve ahead at most what one
			// more reply could carry, and let the bytes that arrive grow it.
			out = make([]byte, 0, min(r.GetSize(), 2*chunk))
		}
		out = append(out, r.GetData()...)
		if r.GetEof() {
			return out, nil
		}
		if len(r.GetData()) == 0 {
			return nil, fmt.Errorf("aci: get file %s: %w: empty chunk before eof", path, ErrProtocol)
		}
	}
}

// Stat describes path.
func (s *Session) Stat(ctx context.Context, path string) (*aciv1.FileInfo, error) {
	m, err := s.Do(ctx, &aciv1.ClientMessage{Request: &aciv1.ClientMessage_FileStat{FileStat: &aciv1.FileStatRequest{Path: path}}})
	if err != nil {
		return nil, fmt.Errorf("aci: stat %s: %w", path, err)
	}
	if r := m.GetFileStat(); r != nil {
		return r.GetInfo(), nil
	}
	return nil, unexpected("file_stat", m)
}

// List returns the entries of directory path.
func (s *Session) List(ctx context.Context, path string) ([]*aciv1.FileInfo, error) {
	m, err := s.Do(ctx, &aciv1.ClientMessage{Request: &aciv1.ClientMessage_FileList{FileList: &aciv1.FileListRequest{Path: path}}})
	if err != nil {
		return nil, fmt.Errorf("aci: list %s: %w", path, err)
	}
	if r := m.GetFileList(); r != nil {
		return r.GetEntries(), nil
	}
	return nil, unexpected("file_list", m)
}

// Mkdir creates directory path (and its parents with parents set) with
// mode (0755 when 0).
func (s *Session) Mkdir(ctx context.Context, path string, parents bool, mode fs.FileMode) error {
	m, err := s.Do(ctx, &aciv1.ClientMessage{Request: &aciv1.ClientMessage_FileMkdir{FileMkdir: &aciv1.FileMkdirRequest{
		Path: path, Parents: parents, Mode: uint32(mode.Perm()),
	}}})
	if err != nil {
		return fmt.Errorf("aci: mkdir %s: %w", path, err)
	}
	if m.GetFileMkdir() == nil {
		return unexpected("file_mkdir", m)
	}
	return nil
}

// Delete removes path (a directory tree with recursive set).
func (s *Session) Delete(ctx context.Context, path string, recursive bool) error {
	m, err := s.Do(ctx, &aciv1.ClientMessage{Request: &aciv1.ClientMessage_FileDelete{FileDelete: &aciv1.FileDeleteRequest{
		Path: path, Recursive: recursive,
	}}})
	if err != nil {
		return fmt.Errorf("aci: delete %s: %w", path, err)
	}
	if m.GetFileDelete() == nil {
		return unexpected("file_delete", m)
	}
	return nil
}
