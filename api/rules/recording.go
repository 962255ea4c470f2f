package rules

import (
	"time"

	"github.com/forkfleet/forkfleet/api/errdefs"
	controldv1 "github.com/forkfleet/forkfleet/api/gen/forkfleet/controld/v1"
)

// Recordings (StartRecording, ExportRecording): the disk cap of one
// recording and the MP4 export's frame rate.
const (
	DefaultRecordingBytes = 1 << 30
	MinRecordingBytes     = 1 << 20
	MaxRecordingBytes     = 64 << 30
	DefaultExportFPS      = 30
	MaxExportFPS          = 60
)

// RecordingID checks a required recording id.
func RecordingID(field, id string) error {
	if id == "" {
		return errdefs.InvalidField(field, "required")
	}
	if !ValidID(PrefixRecording, id) {
		return errdefs.InvalidField(field, "%q is not a recording id (rc-...)", id)
	}
	return nil
}

// StartRecording checks a StartRecordingRequest and returns its effective
// disk cap.
func StartRecording(req *controldv1.StartRecordingRequest) (uint64, error) {
	if err := SandboxID("sandbox_id", req.GetSandboxId()); err != nil {
		return 0, err
	}
	n := req.GetMaxBytes()
	switch {
	case n == 0:
		return DefaultRecordingBytes, nil
	case n < MinRecordingBytes || n > MaxRecordingBytes:
		return 0, errdefs.InvalidField("max_bytes", "%d out of range %d..%d (0: %d)", n, MinRecordingBytes, MaxRecordingBytes, DefaultRecordingBytes)
	}
	return n, nil
}

// ListRecordings checks a ListRecordingsRequest's filter (paging is Page's).
func ListRecordings(req *controldv1.ListRecordingsRequest) error {
	if req.GetSandboxId() != "" {
		return SandboxID("sandbox_id", req.GetSandboxId())
	}
	return nil
}

// ExportRecording checks an ExportRecordingRequest and returns its
// effective frame rate (MP4; 0 for frames).
func ExportRecording(req *controldv1.ExportRecordingRequest) (uint32, error) {
	if err := RecordingID("id", req.GetId()); err != nil {
		return 0, err
	}
	switch req.GetFormat() {
	case controldv1.RecordingExportFormat_RECORDING_EXPORT_FORMAT_MP4:
		switch fps := req.GetFps(); {
		case fps == 0:
			return DefaultExportFPS, nil
		case fps > MaxExportFPS:
			return 0, errdefs.InvalidField("fps", "%d above %d", fps, MaxExportFPS)
		default:
			return fps, nil
		}
	case controldv1.RecordingExportFormat_RECORDING_EXPORT_FORMAT_FRAMES:
		if req.GetFps() != 0 {
			return 0, errdefs.InvalidField("fps", "only for MP4 (a frame sequence has every recorded frame)")
		}
		return 0, nil
	default:
		return 0, errdefs.InvalidField("format", "MP4 or FRAMES")
	}
}

// RecordingKey orders recordings oldest first (started_at, then id).
func RecordingKey(r *controldv1.Recording) string { return createdKey(r.GetStartedAt(), r.GetId()) }

// The refusals of the recording RPCs, the same from controld and its fake.

// RecordingNotFound: no recording with this id.
func RecordingNotFound(id string) error {
	return errdefs.WithReason(errdefs.ErrNotFound, "RECORDING_NOT_FOUND", "recording %s not found", id)
}

// SandboxRecording: StartRecording on a sandbox that already records.
func SandboxRecording(sandboxID, recordingID string) error {
	return errdefs.WithReason(errdefs.ErrAlreadyExists, "SANDBOX_RECORDING", "sandbox %s is already recording (%s)", sandboxID, recordingID)
}

// RecordingRunning: export or delete of a recording not stopped yet.
func RecordingRunning(id string) error {
	return errdefs.WithReason(errdefs.ErrFailedPrecondition, "RECORDING_RUNNING", "recording %s is running: stop it first", id)
}

// RecordingEmpty: export of a recording that holds no frame.
func RecordingEmpty(id string) error {
	return errdefs.WithReason(errdefs.ErrFailedPrecondition, "RECORDING_EMPTY", "recording %s holds no frame", id)
}

// RecordingCapReached: a recording or an export would pass its disk cap or
// the host's floor of free space.
func RecordingCapReached(format string, args ...any) error {
	return errdefs.WithReason(errdefs.ErrResourceExhausted, "RECORDING_CAP_REACHED", format, args...)
}

// recordingFiles name the files a recording ticket downloads.
var recordingFiles = map[controldv1.RecordingFile]string{
	controldv1.RecordingFile_RECORDING_FILE_MP4:        "recording.mp4",
	controldv1.RecordingFile_RECORDING_FILE_FRAMES:     "frames.tar",
	controldv1.RecordingFile_RECORDING_FILE_TRAJECTORY: "trajectory.jsonl",
	controldv1.RecordingFile_RECORDING_FILE_SCREENCAST: "screencast.ffrec",
}

// RecordingFileName is the download name of a recording file ("" for
// UNSPECIFIED or an unknown value).
func RecordingFileName(f controldv1.RecordingFile) string { return recordingFiles[f] }

// RecordingTicket checks a CreateRecordingTicketRequest and returns its
// effective lifetime (the view tickets' default and bound).
func RecordingTicket(req *controldv1.CreateRecordingTicketRequest) (time.Duration, error) {
	if err := RecordingID("id", req.GetId()); err != nil {
		return 0, err
	}
	if RecordingFileName(req.GetFile()) == "" {
		return 0, errdefs.InvalidField("file", "MP4, FRAMES, TRAJECTORY or SCREENCAST")
	}
	return ViewTicketTTL("ttl", req.GetTtl())
}

// RecordingNotExported: a ticket for an export the recording does not have.
func RecordingNotExported(id string, f controldv1.RecordingFile) error {
	return errdefs.WithReason(errdefs.ErrFailedPrecondition, "RECORDING_NOT_EXPORTED",
		"recording %s has no %s: ExportRecording it first", id, RecordingFileName(f))
}

// RecordingExporting: export, delete, ticket or download of a recording an
// export is rewriting.
func RecordingExporting(id string) error {
	return errdefs.WithReason(errdefs.ErrFailedPrecondition, "RECORDING_EXPORTING", "recording %s is being exported", id)
}
