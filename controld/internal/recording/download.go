package recording

import (
	"archive/tar"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"net/url"
	"os"
	"path/filepath"
	"sort"
	"time"

	"golang.org/x/sys/unix"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/forkfleet/forkfleet/api/errdefs"
	controldv1 "github.com/forkfleet/forkfleet/api/gen/forkfleet/controld/v1"
	"github.com/forkfleet/forkfleet/api/rules"
)

// Downloads: a client on another machine gets a recording's files over
// HTTP from controld's gateway (GET /v1/recordings/{id}/files/{name}).
// Access is a recording ticket (CreateRecordingTicket): short-lived,
// single-use, one recording and one file, like the live view's tickets but
// kept here, because a recording outlives its sandbox. Only the ticket's
// SHA-256 is kept, in memory: a restart forgets them. The file is the one
// the ticket names, resolved by controld under the recording's directory
// without following any link; nothing in the request is a path.

// MaxRecordingTickets bounds the tickets outstanding per recording.
const MaxRecordingTickets = 64

type recordingTicket struct {
	id      string
	file    controldv1.RecordingFile
	expires time.Time
}

// ErrTicket is every refusal of OpenDownload: unknown, expired or spent
// ticket, another recording or file, a recording deleted meanwhile.
var ErrTicket = errdefs.WithReason(errdefs.ErrPermissionDenied, "RECORDING_TICKET_INVALID", "invalid, expired or spent recording ticket")

// CreateTicket mints a download ticket for a file of a stopped recording.
func (m *Manager) CreateTicket(_ context.Context, req *controldv1.CreateRecordingTicketRequest) (*controldv1.CreateRecordingTicketResponse, error) {
	ttl, err := rules.RecordingTicket(req)
	if err != nil {
		return nil, err
	}
	id, file := req.GetId(), req.GetFile()
	m.mu.Lock()
	rec, known := m.recs[id]
	running := known && (rec.GetState() != controldv1.RecordingState_RECORDING_STATE_STOPPED || m.byID[id] != nil)
	exporting := m.exporting[id]
	m.mu.Unlock()
	switch {
	case !known:
		return nil, rules.RecordingNotFound(id)
	case running:
		return nil, rules.RecordingRunning(id)
	case exporting:
		return nil, rules.RecordingExporting(id)
	}
	if _, err := m.stat(id, file); err != nil {
		return nil, err
	}
	ticket := rand.Text()
	now := time.Now()
	m.ticketMu.Lock()
	defer m.ticketMu.Unlock()
	if m.tickets == nil {
		m.tickets = map[[sha256.Size]byte]recordingTicket{}
	}
	n := 0
	for k, t := range m.tickets {
		switch {
		case !now.Before(t.expires):
			delete(m.tickets, k)
		case t.id == id:
			n++
		}
	}
	if n >= MaxRecordingTickets {
		return nil, errdefs.WithReason(errdefs.ErrResourceExhausted, "TOO_MANY_RECORDING_TICKETS",
			"recording %s has %d tickets outstanding (at most %d)", id, n, MaxRecordingTickets)
	}
	t := recordingTicket{id: id, file: file, expires: now.Add(ttl)}
	m.tickets[sha256.Sum256([]byte(ticket))] = t
	scheme := "http"
	if m.opts.GatewayTLS {
		scheme = "https"
	}
	name := rules.RecordingFileName(file)
	return &controldv1.CreateRecordingTicketResponse{
		Url:       fmt.Sprintf("%s://%s%s?ticket=%s", scheme, m.opts.GatewayHost, DownloadPath(id, name), url.QueryEscape(ticket)),
		Ticket:    ticket,
		ExpiresAt: timestamppb.New(t.expires),
		Name:      name,
	}, nil
}

// DownloadPath is the gateway's path of a recording's file.
func DownloadPath(id, name string) string { return "/v1/recordings/" + id + "/files/" + name }

// Download is one file of a recording, open for one response.
type Download struct {
	Name        string
	ContentType string
	// Size is exactly what Send writes when nothing fails.
	Size  int64
	write func(w io.Writer) error
	close func()
}

// Send writes the file (Size bytes) to w.
func (d *Download) Send(w io.Writer) error { return d.write(w) }

// Close releases the file.
func (d *Download) Close() { d.close() }

// OpenDownload spends a ticket of recording id for the file called name
// and opens it. Every refusal of the ticket is ErrTicket (the gateway
// answers them all with the same 401), spending nothing that was not the
// ticket's; a valid ticket of a recording being exported is kept and the
// refusal is RECORDING_EXPORTING (the export rewrites its files).
func (m *Manager) OpenDownload(id, name, ticket string) (*Download, error) {
	t, err := m.spend(id, name, ticket)
	if err != nil {
		return nil, err
	}
	d, err := m.open(id, t.file)
	if err != nil {
		m.log.Warn("recording: download", "recording", id, "file", name, "err", err)
		return nil, ErrTicket
	}
	return d, nil
}

// spend takes a ticket of recording id for name out of the outstanding
// ones (ticketMu, then mu: never the other way round).
func (m *Manager) spend(id, name, ticket string) (recordingTicket, error) {
	key := sha256.Sum256([]byte(ticket))
	m.ticketMu.Lock()
	defer m.ticketMu.Unlock()
	t, ok := m.tickets[key]
	if !ok || t.id != id || rules.RecordingFileName(t.file) != name {
		return t, ErrTicket
	}
	m.mu.Lock()
	_, known := m.recs[id]
	exporting := m.exporting[id]
	m.mu.Unlock()
	switch {
	case !time.Now().Before(t.expires) || !known:
		delete(m.tickets, key)
		return t, ErrTicket
	case exporting:
		// An export rewrites the files: the holder may retry after it.
		return t, rules.RecordingExporting(id)
	}
	delete(m.tickets, key)
	return t, nil
}

// openBeneath opens rel under the recordings directory following no
// symbolic link (and no "..": the names are controld's own anyway).
func (m *Manager) openBeneath(rel string, flags int) (*os.File, error) {
	fd, err := unix.Openat2(unix.AT_FDCWD, filepath.Join(m.opts.Dir, rel), &unix.OpenHow{
		Flags:   uint64(flags | unix.O_CLOEXEC | unix.O_NOFOLLOW),
		Resolve: unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS,
	})
	if err != nil {
		return nil, &os.PathError{Op: "openat2", Path: rel, Err: err}
	}
	return os.NewFile(uintptr(fd), rel), nil
}

// stat checks that a recording has the file (an export: that it was made).
func (m *Manager) stat(id string, file controldv1.RecordingFile) (int64, error) {
	d, err := m.open(id, file)
	if errors.Is(err, os.ErrNotExist) {
		if file == controldv1.RecordingFile_RECORDING_FILE_MP4 || file == controldv1.RecordingFile_RECORDING_FILE_FRAMES {
			return 0, rules.RecordingNotExported(id, file)
		}
		return 0, rules.RecordingNotFound(id)
	}
	if err != nil {
		return 0, fmt.Errorf("recording: %s: %w", id, err)
	}
	d.Close()
	return d.Size, nil
}

var contentTypes = map[controldv1.RecordingFile]string{
	controldv1.RecordingFile_RECORDING_FILE_MP4:        "video/mp4",
	controldv1.RecordingFile_RECORDING_FILE_FRAMES:     "application/x-tar",
	controldv1.RecordingFile_RECORDING_FILE_TRAJECTORY: "application/x-ndjson",
	controldv1.RecordingFile_RECORDING_FILE_SCREENCAST: "application/octet-stream",
}

// open opens a recording's file: a regular file as it is, the frames
// directory as a tar archive.
func (m *Manager) open(id string, file controldv1.RecordingFile) (*Download, error) {
	d := &Download{Name: rules.RecordingFileName(file), ContentType: contentTypes[file]}
	if file == controldv1.RecordingFile_RECORDING_FILE_FRAMES {
		return m.openFrames(id, d)
	}
	var rel string
	switch file {
	case controldv1.RecordingFile_RECORDING_FILE_MP4:
		rel = MP4File
	case controldv1.RecordingFile_RECORDING_FILE_TRAJECTORY:
		rel = TrajectoryFile
	case controldv1.RecordingFile_RECORDING_FILE_SCREENCAST:
		rel = StreamFile
	default:
		return nil, fmt.Errorf("%w: recording file %v", errdefs.ErrInvalidArgument, file)
	}
	f, err := m.openBeneath(filepath.Join(id, rel), unix.O_RDONLY)
	if err != nil {
		return nil, err
	}
	fi, err := f.Stat()
	if err != nil || !fi.Mode().IsRegular() {
		f.Close()
		return nil, fmt.Errorf("%s/%s: not a regular file (%v)", id, rel, err)
	}
	d.Size = fi.Size()
	d.write = func(w io.Writer) error {
		n, err := io.Copy(w, io.LimitReader(f, d.Size))
		if err == nil && n != d.Size {
			err = fmt.Errorf("%s/%s: %d of %d bytes", id, rel, n, d.Size)
		}
		return err
	}
	d.close = func() { f.Close() }
	return d, nil
}

// openFrames lists the frames directory (regular files only) and sizes its
// ustar archive: each member is a 512-byte header and its content padded
// to 512 bytes, the archive ends with two zero blocks.
func (m *Manager) openFrames(id string, d *Download) (*Download, error) {
	dir, err := m.openBeneath(filepath.Join(id, FramesDir), unix.O_RDONLY|unix.O_DIRECTORY)
	if err != nil {
		return nil, err
	}
	ents, err := dir.ReadDir(-1)
	if err != nil {
		dir.Close()
		return nil, err
	}
	type member struct {
		name string
		size int64
		mod  time.Time
	}
	var ms []member
	size := int64(2 * 512)
	for _, e := range ents {
		if !e.Type().IsRegular() {
			continue
		}
		// Relative to the directory's descriptor (DirEntry.Info would
		// resolve the directory's path again).
		var st unix.Stat_t
		if err := unix.Fstatat(int(dir.Fd()), e.Name(), &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
			dir.Close()
			return nil, err
		}
		if st.Mode&unix.S_IFMT != unix.S_IFREG {
			continue
		}
		ms = append(ms, member{e.Name(), st.Size, time.Unix(st.Mtim.Sec, 0)})
		size += 512 + (st.Size+511)/512*512
	}
	sort.Slice(ms, func(i, j int) bool { return ms[i].name < ms[j].name })
	d.Size = size
	d.write = func(w io.Writer) error {
		tw := tar.NewWriter(w)
		for _, mb := range ms {
			fd, err := unix.Openat(int(dir.Fd()), mb.name, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
			if err != nil {
				return fmt.Errorf("%s/%s/%s: %w", id, FramesDir, mb.name, err)
			}
			f := os.NewFile(uintptr(fd), mb.name)
			err = tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: FramesDir + "/" + mb.name, Size: mb.size,
				Mode: 0o644, ModTime: mb.mod, Format: tar.FormatUSTAR})
			if err == nil {
				var n int64
				n, err = io.Copy(tw, io.LimitReader(f, mb.size))
				if err == nil && n != mb.size {
					err = fmt.Errorf("%s/%s/%s: %d of %d bytes", id, FramesDir, mb.name, n, mb.size)
				}
			}
			f.Close()
			if err != nil {
				return err
			}
		}
		return tw.Close()
	}
	d.close = func() { dir.Close() }
	return d, nil
}
