package gateway

import (
	"errors"
	"net/http"
	"strconv"
	"time"

	"github.com/forkfleet/forkfleet/api/errdefs"
	"github.com/forkfleet/forkfleet/controld/internal/recording"
)

// Recording downloads: GET /v1/recordings/{id}/files/{name}?ticket=T
// sends one file of a stopped recording to the holder of a recording
// ticket (CreateRecordingTicket; package recording keeps and spends them).
// The ticket names the recording and the file; controld resolves the file
// under the recording's directory itself, following no link, so nothing in
// the request is a path. One GET spends the ticket. Every refusal is the
// same 401, whether the recording exists or not.

// Downloads opens recordings' files for their tickets (recording.Manager
// implements it).
type Downloads interface {
	OpenDownload(id, name, ticket string) (*recording.Download, error)
}

func (g *Gateway) serveDownload(w http.ResponseWriter, r *http.Request) {
	securityHeaders(w)
	d, err := g.opts.Downloads.OpenDownload(r.PathValue("id"), r.PathValue("name"), r.URL.Query().Get("ticket"))
	switch {
	case errors.Is(err, errdefs.ErrFailedPrecondition):
		// A valid ticket (kept): the recording is being exported.
		w.Header().Set("Retry-After", "5")
		http.Error(w, err.Error(), http.StatusConflict)
		return
	case err != nil:
		http.Error(w, "missing, invalid, expired or spent recording ticket", http.StatusUnauthorized)
		return
	}
	defer d.Close()
	h := w.Header()
	h.Set("Content-Type", d.ContentType)
	h.Set("Content-Length", strconv.FormatInt(d.Size, 10))
	h.Set("Content-Disposition", `attachment; filename="`+r.PathValue("id")+"-"+d.Name+`"`)
	w.WriteHeader(http.StatusOK)
	if r.Method == http.MethodHead {
		return
	}
	// A client that stops reading is dropped after downloadWriteTimeout
	// without progress (the server itself has no write timeout: the ACI
	// connections it hijacks are long-lived).
	if err := d.Send(&deadlineWriter{w: w, rc: http.NewResponseController(w)}); err != nil {
		// The status is out: the client sees a body shorter than its
		// Content-Length (net/http closes the connection).
		g.log.Warn("recording download cut short", "recording", r.PathValue("id"), "file", d.Name, "err", err)
	}
}

// downloadWriteTimeout bounds each write of a download.
const downloadWriteTimeout = 30 * time.Second

type deadlineWriter struct {
	w  http.ResponseWriter
	rc *http.ResponseController
}

func (d *deadlineWriter) Write(p []byte) (int, error) {
	d.rc.SetWriteDeadline(time.Now().Add(downloadWriteTimeout))
	return d.w.Write(p)
}
