package sysops

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"sync"
	"syscall"
	"time"

	aciv1 "github.com/forkfleet/forkfleet/api/gen/forkfleet/aci/v1"
	"github.com/forkfleet/forkfleet/guestd/internal/acierr"
)

// FileLimits bound the file requests.
type FileLimits struct {
	// MaxFileBytes caps a published file.
	MaxFileBytes int64
	// MaxReadBytes caps one FileGetResponse's data (leave room under the
	// message limit for the envelope).
	MaxReadBytes int64
	// MaxUploads caps concurrent chunked uploads.
	MaxUploads int
	// UploadIdle: a chunked upload idle this long is dropped with its temp
	// file.
	UploadIdle time.Duration
}

// Files serves file requests. Chunked uploads live here, not in a session, so
// a client that reconnects can continue an upload.
type Files struct {
	limits FileLimits
	now    func() time.Time

	mu      sync.Mutex
	uploads map[string]*upload
}

type upload struct {
	path     string
	tmp      *os.File
	size     int64
	mode     fs.FileMode
	lastUsed time.Time
}

// NewFiles returns a file server with the given limits.
func NewFiles(l FileLimits) *Files {
	return &Files{limits: l, now: time.Now, uploads: make(map[string]*upload)}
}

// Close removes every unfinished upload.
func (f *Files) Close() {
	f.mu.Lock()
	defer f.mu.Unlock()
	for id, u := range f.uploads {
		u.discard()
		delete(f.uploads, id)
	}
}

// SweepStale removes uploads idle longer than the limit; it runs lazily on
// every chunked put and from guestd's janitor tick.
func (f *Files) SweepStale() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.sweepLocked()
}

func (f *Files) sweepLocked() int {
	n := 0
	cutoff := f.now().Add(-f.limits.UploadIdle)
	for id, u := range f.uploads {
		if u.lastUsed.Before(cutoff) {
			u.discard()
			delete(f.uploads, id)
			n++
		}
	}
	return n
}

func (u *upload) discard() {
	name := u.tmp.Name()
	u.tmp.Close()
	os.Remove(name)
}

// cleanPath validates a request path: absolute, no NUL, cleaned.
func cleanPath(p, field string) (string, *acierr.Error) {
	if p == "" {
		return "", acierr.Invalid(field, "path is empty")
	}
	if !filepath.IsAbs(p) {
		return "", acierr.Invalid(field, "path %q is not absolute", p)
	}
	for i := 0; i < len(p); i++ {
		if p[i] == 0 {
			return "", acierr.Invalid(field, "path contains a NUL byte")
		}
	}
	return filepath.Clean(p), nil
}

func fileMode(m uint32, def fs.FileMode, field string) (fs.FileMode, *acierr.Error) {
	if m == 0 {
		return def, nil
	}
	if m&^0o7777 != 0 {
		return 0, acierr.Invalid(field, "mode %#o has bits outside 07777", m)
	}
	// Go's FileMode keeps setuid/setgid/sticky in its own bits.
	mode := fs.FileMode(m & 0o777)
	if m&0o4000 != 0 {
		mode |= fs.ModeSetuid
	}
	if m&0o2000 != 0 {
		mode |= fs.ModeSetgid
	}
	if m&0o1000 != 0 {
		mode |= fs.ModeSticky
	}
	return mode, nil
}

// Put handles FilePutRequest.
func (f *Files) Put(req *aciv1.FilePutRequest) (*aciv1.FilePutResponse, error) {
	path, aerr := cleanPath(req.GetPath(), "file_put.path")
	if aerr != nil {
		return nil, aerr
	}
	mode, aerr := fileMode(req.GetMode(), 0o644, "file_put.mode")
	if aerr != nil {
		return nil, aerr
	}
	if req.GetUploadId() == "" {
		if req.GetOffset() != 0 {
			return nil, acierr.Invalid("file_put.offset", "offset needs an upload_id")
		}
		if int64(len(req.GetData())) > f.limits.MaxFileBytes {
			return nil, acierr.New(aciv1.ErrorCode_ERROR_CODE_RESOURCE_EXHAUSTED, "file_put.data", "file exceeds %d bytes", f.limits.MaxFileBytes)
		}
		tmp, err := f.createTemp(path, req.GetMakeParents())
		if err != nil {
			return nil, err
		}
		u := &upload{path: path, tmp: tmp, mode: mode}
		if _, err := tmp.Write(req.GetData()); err != nil {
			u.discard()
			return nil, acierr.WithField(err, "file_put.path")
		}
		if err := u.publish(); err != nil {
			return nil, err
		}
		return &aciv1.FilePutResponse{Size: uint64(len(req.GetData())), Published: true}, nil
	}
	return f.putChunk(path, mode, req)
}

func (f *Files) createTemp(path string, parents bool) (*os.File, error) {
	dir, base := filepath.Split(path)
	if base == "" {
		return nil, acierr.Invalid("file_put.path", "path %q names a directory", path)
	}
	if st, err := os.Stat(path); err == nil && st.IsDir() {
		return nil, acierr.New(aciv1.ErrorCode_ERROR_CODE_FAILED_PRECONDITION, "file_put.path", "%s is a directory", path)
	}
	if parents {
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return nil, acierr.WithField(err, "file_put.path")
		}
	}
	// Same directory as the target so the final rename is atomic.
	tmp, err := os.CreateTemp(dir, "."+base+".forkfleet-*")
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return nil, acierr.New(aciv1.ErrorCode_ERROR_CODE_NOT_FOUND, "file_put.path", "parent directory %s does not exist (set make_parents)", dir)
		}
		return nil, acierr.WithField(err, "file_put.path")
	}
	return tmp, nil
}

// publish renames the temp file over the target: readers see the old file
// or the whole new one. It does not fsync: a sandbox's files live no longer
// than the sandbox (a host crash ends both), and checkpoints read the
// writable layer through the page cache; an fsync cost 5 to 8 ms per put.
func (u *upload) publish() error {
	name := u.tmp.Name()
	fail := func(err error) error {
		u.tmp.Close()
		os.Remove(name)
		return acierr.WithField(err, "file_put.path")
	}
	if err := u.tmp.Chmod(u.mode); err != nil {
		return fail(err)
	}
	if err := u.tmp.Close(); err != nil {
		os.Remove(name)
		return acierr.WithField(err, "file_put.path")
	}
	if err := os.Rename(name, u.path); err != nil {
		os.Remove(name)
		return acierr.WithField(err, "file_put.path")
	}
	return nil
}

func (f *Files) putChunk(path string, mode fs.FileMode, req *aciv1.FilePutRequest) (*aciv1.FilePutResponse, error) {
	id := req.GetUploadId()
	if len(id) > 128 {
		return nil, acierr.Invalid("file_put.upload_id", "upload_id longer than 128 bytes")
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.sweepLocked()
	u, ok := f.uploads[id]
	if !ok {
		if req.GetOffset() != 0 {
			return nil, acierr.New(aciv1.ErrorCode_ERROR_CODE_NOT_FOUND, "file_put.upload_id", "no upload %q in progress (expired or never started)", id)
		}
		if len(f.uploads) >= f.limits.MaxUploads {
			return nil, acierr.New(aciv1.ErrorCode_ERROR_CODE_RESOURCE_EXHAUSTED, "file_put.upload_id", "%d uploads already in progress", len(f.uploads))
		}
		tmp, err := f.createTemp(path, req.GetMakeParents())
		if err != nil {
			return nil, err
		}
		u = &upload{path: path, tmp: tmp, mode: mode}
		f.uploads[id] = u
	}
	if u.path != path {
		return nil, acierr.Invalid("file_put.path", "upload %q writes %s, not %s", id, u.path, path)
	}
	if int64(req.GetOffset()) != u.size {
		return nil, acierr.Invalid("file_put.offset", "offset %d, upload %q has %d bytes", req.GetOffset(), id, u.size)
	}
	if u.size+int64(len(req.GetData())) > f.limits.MaxFileBytes {
		u.discard()
		delete(f.uploads, id)
		return nil, acierr.New(aciv1.ErrorCode_ERROR_CODE_RESOURCE_EXHAUSTED, "file_put.data", "file exceeds %d bytes; upload dropped", f.limits.MaxFileBytes)
	}
	if _, err := u.tmp.Write(req.GetData()); err != nil {
		u.discard()
		delete(f.uploads, id)
		return nil, acierr.WithField(err, "file_put.data")
	}
	u.size += int64(len(req.GetData()))
	u.lastUsed = f.now()
	if req.GetMode() != 0 {
		u.mode = mode
	}
	if !req.GetLast() {
		return &aciv1.FilePutResponse{Size: uint64(u.size)}, nil
	}
	delete(f.uploads, id)
	if err := u.publish(); err != nil {
		return nil, err
	}
	return &aciv1.FilePutResponse{Size: uint64(u.size), Published: true}, nil
}

// Get handles FileGetRequest.
func (f *Files) Get(req *aciv1.FileGetRequest) (*aciv1.FileGetResponse, error) {
	path, aerr := cleanPath(req.GetPath(), "file_get.path")
	if aerr != nil {
		return nil, aerr
	}
	// Only regular files are read. Anything else is refused before it is
	// opened (opening a device can act on it), and the open itself does
	// not wait: a FIFO planted in the sandbox, swapped in after the stat,
	// would otherwise block the session's executor until a writer came.
	if st, err := os.Stat(path); err != nil {
		return nil, acierr.WithField(err, "file_get.path")
	} else if !st.Mode().IsRegular() {
		return nil, notRegular(path, st.Mode())
	}
	fh, err := os.OpenFile(path, os.O_RDONLY|syscall.O_NONBLOCK, 0)
	if err != nil {
		return nil, acierr.WithField(err, "file_get.path")
	}
	defer fh.Close()
	st, err := fh.Stat()
	if err != nil {
		return nil, acierr.WithField(err, "file_get.path")
	}
	if !st.Mode().IsRegular() {
		return nil, notRegular(path, st.Mode())
	}
	size := st.Size()
	off := req.GetOffset()
	if off > uint64(size) {
		return nil, acierr.Invalid("file_get.offset", "offset %d beyond size %d", off, size)
	}
	n := uint64(size) - off
	if l := req.GetLength(); l > 0 && l < n {
		n = l
	}
	if n > uint64(f.limits.MaxReadBytes) {
		n = uint64(f.limits.MaxReadBytes)
	}
	buf := make([]byte, n)
	got, err := fh.ReadAt(buf, int64(off))
	if err != nil && !errors.Is(err, io.EOF) {
		return nil, acierr.WithField(err, "file_get.path")
	}
	buf = buf[:got]
	return &aciv1.FileGetResponse{Data: buf, Size: uint64(size), Eof: off+uint64(got) >= uint64(size)}, nil
}

func notRegular(path string, m fs.FileMode) error {
	kind := "not a regular file"
	switch {
	case m&fs.ModeNamedPipe != 0:
		kind = "a named pipe (FIFO)"
	case m&fs.ModeSocket != 0:
		kind = "a socket"
	case m&fs.ModeDevice != 0:
		kind = "a device"
	case m.IsDir():
		kind = "a directory"
	}
	return acierr.New(aciv1.ErrorCode_ERROR_CODE_FAILED_PRECONDITION, "file_get.path", "%s is %s; file_get reads regular files only", path, kind)
}

func fileInfo(name string, st fs.FileInfo) *aciv1.FileInfo {
	m := st.Mode()
	mode := uint32(m.Perm())
	if m&fs.ModeSetuid != 0 {
		mode |= 0o4000
	}
	if m&fs.ModeSetgid != 0 {
		mode |= 0o2000
	}
	if m&fs.ModeSticky != 0 {
		mode |= 0o1000
	}
	fi := &aciv1.FileInfo{
		Name:           name,
		Size:           uint64(st.Size()),
		Mode:           mode,
		IsDir:          st.IsDir(),
		IsSymlink:      m&fs.ModeSymlink != 0,
		ModifiedUnixNs: st.ModTime().UnixNano(),
	}
	if sys, ok := st.Sys().(*syscall.Stat_t); ok {
		fi.Uid, fi.Gid = sys.Uid, sys.Gid
	}
	return fi
}

// Stat handles FileStatRequest (lstat: a symlink is reported as such).
func (f *Files) Stat(req *aciv1.FileStatRequest) (*aciv1.FileStatResponse, error) {
	path, aerr := cleanPath(req.GetPath(), "file_stat.path")
	if aerr != nil {
		return nil, aerr
	}
	st, err := os.Lstat(path)
	if err != nil {
		return nil, acierr.WithField(err, "file_stat.path")
	}
	return &aciv1.FileStatResponse{Info: fileInfo(filepath.Base(path), st)}, nil
}

// maxListEntries bounds a listing so the reply stays under the message limit.
const maxListEntries = 100000

// List handles FileListRequest; entries are sorted by name.
func (f *Files) List(req *aciv1.FileListRequest) (*aciv1.FileListResponse, error) {
	path, aerr := cleanPath(req.GetPath(), "file_list.path")
	if aerr != nil {
		return nil, aerr
	}
	ents, err := os.ReadDir(path)
	if err != nil {
		return nil, acierr.WithField(err, "file_list.path")
	}
	if len(ents) > maxListEntries {
		return nil, acierr.New(aciv1.ErrorCode_ERROR_CODE_RESOURCE_EXHAUSTED, "file_list.path", "%s has %d entries (limit %d); use exec", path, len(ents), maxListEntries)
	}
	out := make([]*aciv1.FileInfo, 0, len(ents))
	for _, e := range ents {
		st, err := e.Info()
		if err != nil {
			// Removed between readdir and lstat.
			continue
		}
		out = append(out, fileInfo(e.Name(), st))
	}
	return &aciv1.FileListResponse{Entries: out}, nil
}

// Mkdir handles FileMkdirRequest. Without parents an existing path is
// ALREADY_EXISTS; with parents an existing directory is success (mkdir -p).
func (f *Files) Mkdir(req *aciv1.FileMkdirRequest) (*aciv1.FileMkdirResponse, error) {
	path, aerr := cleanPath(req.GetPath(), "file_mkdir.path")
	if aerr != nil {
		return nil, aerr
	}
	mode, aerr := fileMode(req.GetMode(), 0o755, "file_mkdir.mode")
	if aerr != nil {
		return nil, aerr
	}
	var err error
	if req.GetParents() {
		err = os.MkdirAll(path, mode)
	} else {
		err = os.Mkdir(path, mode)
	}
	if err != nil {
		return nil, acierr.WithField(err, "file_mkdir.path")
	}
	return &aciv1.FileMkdirResponse{}, nil
}

// Delete handles FileDeleteRequest. A missing path is NOT_FOUND even when
// recursive, so a client learns it deleted nothing.
func (f *Files) Delete(req *aciv1.FileDeleteRequest) (*aciv1.FileDeleteResponse, error) {
	path, aerr := cleanPath(req.GetPath(), "file_delete.path")
	if aerr != nil {
		return nil, aerr
	}
	if path == "/" {
		return nil, acierr.New(aciv1.ErrorCode_ERROR_CODE_PERMISSION_DENIED, "file_delete.path", "refusing to delete /")
	}
	st, err := os.Lstat(path)
	if err != nil {
		return nil, acierr.WithField(err, "file_delete.path")
	}
	if st.IsDir() && req.GetRecursive() {
		err = os.RemoveAll(path)
	} else {
		err = os.Remove(path)
	}
	if err != nil {
		var pe *fs.PathError
		if errors.As(err, &pe) && st.IsDir() && !req.GetRecursive() {
			return nil, acierr.New(aciv1.ErrorCode_ERROR_CODE_FAILED_PRECONDITION, "file_delete.recursive", "%s is a non-empty directory (set recursive): %v", path, pe.Err)
		}
		return nil, acierr.WithField(err, "file_delete.path")
	}
	return &aciv1.FileDeleteResponse{}, nil
}

// String describes the limits, for the startup log.
func (l FileLimits) String() string {
	return fmt.Sprintf("max_file=%d max_read=%d max_uploads=%d upload_idle=%s", l.MaxFileBytes, l.MaxReadBytes, l.MaxUploads, l.UploadIdle)
}
