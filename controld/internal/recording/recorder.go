package recording

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	aciv1 "github.com/forkfleet/forkfleet/api/gen/forkfleet/aci/v1"
	controldv1 "github.com/forkfleet/forkfleet/api/gen/forkfleet/controld/v1"
)

// Files of a recording, in its directory.
const (
	StreamFile     = "screencast.ffrec"
	TrajectoryFile = "trajectory.jsonl"
	MetaFile       = "recording.json"
	MP4File        = "recording.mp4"
	FramesDir      = "frames"
)

// Bounds of what a recorder holds in memory.
const (
	// maxQueue bounds what waits for the disk: past it frames are skipped
	// up to the next keyframe, and ACI messages are counted as lost.
	maxQueue = 32 << 20
	// keepClient and keepServer bound one ACI message the recorder keeps
	// (longer ones are cut: the trajectory then has their id and kind).
	keepClient = 1 << 20
	keepServer = 8 << 20
	// maxPending bounds requests awaiting their reply per connection.
	maxPending = 4096
	// flushEvery is how often buffered writes reach the files.
	flushEvery = 250 * time.Millisecond
)

// A Sink is an active recording as controld's gateway feeds it: the
// shared screencast's frames (after its compositor accepted them) and the
// bytes of every ACI connection to the sandbox. Its methods never block.
type Sink interface {
	// Frame takes an accepted frame; it returns false when the recorder
	// skipped it and the hub should ask guestd for a keyframe.
	Frame(f *aciv1.ScreencastFrame, captured time.Time) bool
	Cursor(x, y int32)
	// TapACI returns the writers that see a new ACI connection's bytes:
	// the client's after its upgrade request, and guestd's from its
	// upgrade response on. done is called when the connection ends.
	TapACI() (client, server io.Writer, done func())
	// ViewStep takes the input of a live viewer in control mode, which
	// the gateway ran as a step on its own session at sent.
	ViewStep(actions []*aciv1.Action, sent time.Time, resp *aciv1.StepResponse, err error)
	// SandboxGone ends the recording: the sandbox was deleted.
	SandboxGone()
}

type itemKind int

const (
	itemFrame itemKind = iota
	itemCursor
	itemClient
	itemServer
	itemConnEnd
	itemView
)

type item struct {
	kind      itemKind
	at        time.Time
	frame     *aciv1.ScreencastFrame
	captured  time.Time
	x, y      int32
	conn      uint64
	text      bool
	data      []byte
	truncated bool
	// itemView: the viewer's step, its reply (nil on err) and error.
	actions []*aciv1.Action
	sent    time.Time
	resp    *aciv1.StepResponse
	err     error
}

// itemCost is what a queued message or event holds besides its data.
const itemCost = 256

type pendingReq struct {
	req    decodedRequest
	sent   time.Time
	before *frameRef
}

// recorder writes one recording. The gateway's goroutines enqueue; one
// writer goroutine decodes and writes, so the capture and the agent's
// traffic never wait for the disk.
type recorder struct {
	m    *Manager
	dir  string
	meta *controldv1.Recording // guarded by m.mu

	mu       sync.Mutex
	queue    []item
	qbytes   int
	skipping bool // frames are dropped until a keyframe
	askedKey time.Time
	stopping bool
	wake     chan struct{}
	done     chan struct{}
	detach   func()
	stopOnce sync.Once
	reason   controldv1.RecordingStopReason
	message  string

	conns atomic.Uint64

	// Writer goroutine state.
	stream     *os.File
	sw         *bufio.Writer
	traj       *os.File
	tw         *bufio.Writer
	written    uint64
	frames     uint64
	requests   uint64
	skipped    atomic.Uint64
	lost       atomic.Uint64
	last       *frameRef
	synced     bool
	pending    map[uint64]map[uint64]*pendingReq // conn -> id -> request
	lines      uint64
	sinceCheck uint64
	width      uint32
	height     uint32
}

// enqueue queues it for the writer unless that passes maxQueue (cost is
// what it holds) or the recording is stopping.
func (r *recorder) enqueue(it item, cost int) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.stopping || r.qbytes+cost > maxQueue {
		return false
	}
	r.queue = append(r.queue, it)
	r.qbytes += cost
	select {
	case r.wake <- struct{}{}:
	default:
	}
	return true
}

// Frame implements Sink. While it skips to a keyframe it asks for one at
// most once a second (the first request may be lost with a checkpoint).
func (r *recorder) Frame(f *aciv1.ScreencastFrame, captured time.Time) bool {
	r.mu.Lock()
	if r.skipping && !f.GetKeyframe() {
		ask := time.Since(r.askedKey) >= time.Second
		if ask {
			r.askedKey = time.Now()
		}
		r.mu.Unlock()
		r.skipped.Add(1)
		return !ask
	}
	r.skipping = false
	r.mu.Unlock()
	if !r.enqueue(item{kind: itemFrame, at: time.Now(), frame: f, captured: captured}, frameCost(f)) {
		r.mu.Lock()
		r.skipping, r.askedKey = true, time.Now()
		r.mu.Unlock()
		r.skipped.Add(1)
		return false
	}
	return true
}

func frameCost(f *aciv1.ScreencastFrame) int {
	n := 256 + len(f.GetZlibChunk())
	for _, t := range f.GetTiles() {
		n += 32 + len(t.GetData())
	}
	return n
}

// Cursor implements Sink.
func (r *recorder) Cursor(x, y int32) {
	r.enqueue(item{kind: itemCursor, at: time.Now(), x: x, y: y}, itemCost)
}

// TapACI implements Sink.
func (r *recorder) TapACI() (io.Writer, io.Writer, func()) {
	conn := r.conns.Add(1)
	deliver := func(kind itemKind) func(bool, []byte, uint64, bool) {
		return func(text bool, data []byte, _ uint64, truncated bool) {
			if !r.enqueue(item{kind: kind, at: time.Now(), conn: conn, text: text, data: data, truncated: truncated}, itemCost+len(data)) {
				r.lost.Add(1)
			}
		}
	}
	client := &wsReader{keep: keepClient, onMessage: deliver(itemClient)}
	server := &wsReader{keep: keepServer, httpHead: true, onMessage: deliver(itemServer)}
	// The reader hands each message's buffer over: it starts a new one.
	client.onMessage = handOver(client, client.onMessage)
	server.onMessage = handOver(server, server.onMessage)
	// A connection's end is never dropped while the recording runs: its
	// requests without a reply are written then.
	return client, server, func() { r.enqueue(item{kind: itemConnEnd, at: time.Now(), conn: conn}, 0) }
}

// handOver makes the reader drop its buffer after each message, which the
// queue now owns.
func handOver(w *wsReader, fn func(bool, []byte, uint64, bool)) func(bool, []byte, uint64, bool) {
	return func(text bool, data []byte, size uint64, truncated bool) {
		fn(text, data, size, truncated)
		w.msg = nil
	}
}

// ViewStep implements Sink.
func (r *recorder) ViewStep(actions []*aciv1.Action, sent time.Time, resp *aciv1.StepResponse, err error) {
	if !r.enqueue(item{kind: itemView, at: time.Now(), actions: actions, sent: sent, resp: resp, err: err}, itemCost+proto.Size(resp)) {
		r.lost.Add(1)
	}
}

// SandboxGone implements Sink.
func (r *recorder) SandboxGone() {
	go r.stop(controldv1.RecordingStopReason_RECORDING_STOP_REASON_SANDBOX_GONE, "")
}

// stop ends the recording once: no more input, the queue drained, the
// files closed, the record final. It waits for the writer.
func (r *recorder) stop(reason controldv1.RecordingStopReason, msg string) {
	r.stopOnce.Do(func() {
		r.mu.Lock()
		r.stopping = true
		r.reason, r.message = reason, msg
		select {
		case r.wake <- struct{}{}:
		default:
		}
		r.mu.Unlock()
		if r.detach != nil {
			r.detach()
		}
	})
	<-r.done
}

// open creates the recording's files.
func (r *recorder) open() error {
	var err error
	if r.stream, err = os.OpenFile(filepath.Join(r.dir, StreamFile), os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600); err != nil {
		return err
	}
	if r.traj, err = os.OpenFile(filepath.Join(r.dir, TrajectoryFile), os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600); err != nil {
		r.stream.Close()
		return err
	}
	r.sw = bufio.NewWriterSize(r.stream, 1<<20)
	r.tw = bufio.NewWriterSize(r.traj, 1<<16)
	r.pending = map[uint64]map[uint64]*pendingReq{}
	return r.write(r.sw, streamMagic[:])
}

// errCap: writing would pass the recording's cap or the host's floor.
var errCap = errors.New("cap reached")

// write appends b to w within the cap.
func (r *recorder) write(w *bufio.Writer, b []byte) error {
	if r.written+uint64(len(b)) > r.maxBytes() {
		return fmt.Errorf("%w: the recording holds %d bytes and may hold %d", errCap, r.written, r.maxBytes())
	}
	r.sinceCheck += uint64(len(b))
	if r.sinceCheck >= diskCheckEvery {
		r.sinceCheck = 0
		if err := r.m.checkFloor(); err != nil {
			return fmt.Errorf("%w: %v", errCap, err)
		}
	}
	if _, err := w.Write(b); err != nil {
		return err
	}
	r.written += uint64(len(b))
	return nil
}

func (r *recorder) maxBytes() uint64 {
	r.m.mu.Lock()
	defer r.m.mu.Unlock()
	return r.meta.GetMaxBytes()
}

// run is the writer goroutine.
func (r *recorder) run() {
	defer close(r.done)
	tick := time.NewTicker(flushEvery)
	defer tick.Stop()
	var failed error
	for {
		r.mu.Lock()
		q := r.queue
		r.queue, r.qbytes = nil, 0
		stopping := r.stopping
		r.mu.Unlock()
		for i := range q {
			if failed == nil {
				failed = r.handle(&q[i])
			}
		}
		if failed != nil && !stopping {
			reason := controldv1.RecordingStopReason_RECORDING_STOP_REASON_FAILED
			if errors.Is(failed, errCap) {
				reason = controldv1.RecordingStopReason_RECORDING_STOP_REASON_CAP_REACHED
			}
			r.m.log.Warn("recording stopped", "recording", r.meta.GetId(), "reason", reason, "err", failed)
			go r.stop(reason, failed.Error())
			// Keep draining until stop marks stopping.
		}
		if stopping {
			r.finish(failed)
			return
		}
		if len(q) == 0 {
			select {
			case <-r.wake:
			case <-tick.C:
				if failed == nil {
					if err := r.flush(); err != nil {
						failed = err
					}
				}
			}
		}
		r.publish()
	}
}

// handle writes one item.
func (r *recorder) handle(it *item) error {
	switch it.kind {
	case itemFrame:
		f := it.frame
		if !r.synced && !f.GetKeyframe() {
			return nil // a recording (and a replica's) starts with a keyframe
		}
		if f.GetKeyframe() {
			r.synced = true
			r.width, r.height = f.GetWidth(), f.GetHeight()
		}
		b, err := frameRecord(f, it.at)
		if err != nil {
			return err
		}
		if err := r.write(r.sw, b); err != nil {
			return err
		}
		r.frames++
		r.last = &frameRef{Index: r.frames, Hash: hexOrEmpty(f.GetFrameHash())}
		if !it.captured.IsZero() {
			r.last.CapturedNs = it.captured.UnixNano()
		}
	case itemCursor:
		if !r.synced {
			return nil
		}
		return r.write(r.sw, cursorRecord(it.x, it.y, it.at))
	case itemClient:
		d := decodeRequest(it.text, it.data, it.truncated)
		if d.invalid {
			return r.line(&trajectoryLine{Conn: it.conn, SentNs: it.at.UnixNano(), Outcome: "undecodable"})
		}
		p := r.pending[it.conn]
		if p == nil {
			p = map[uint64]*pendingReq{}
			r.pending[it.conn] = p
		}
		if _, dup := p[d.id]; dup || len(p) >= maxPending || d.id == 0 {
			// A duplicate id, a client past the bound, or a message without
			// an id: written now, its reply cannot be matched.
			return r.line(&trajectoryLine{Conn: it.conn, ID: d.id, Method: d.method, Request: d.json, Elided: d.elided,
				SentNs: it.at.UnixNano(), Outcome: "unmatched", FrameBefore: r.last})
		}
		p[d.id] = &pendingReq{req: d, sent: it.at, before: r.last}
	case itemServer:
		d := decodeReply(it.text, it.data, it.truncated)
		if d.event || d.invalid || d.id == 0 {
			return nil
		}
		pr := r.pending[it.conn][d.id]
		if pr == nil {
			return nil // a reply to nothing we saw (the connection began before the recording)
		}
		delete(r.pending[it.conn], d.id)
		l := &trajectoryLine{Conn: it.conn, ID: d.id, Method: pr.req.method, Request: pr.req.json, Reply: d.json,
			Elided: pr.req.elided + d.elided, SentNs: pr.sent.UnixNano(), RepliedNs: it.at.UnixNano(), Outcome: "ok",
			Error: d.err, FrameBefore: pr.before, FrameAfter: r.last, ObservationHash: hexOrEmpty(d.hash)}
		switch {
		case pr.req.tooBig || d.tooBig:
			l.Outcome = "too_large"
		case d.err != nil:
			l.Outcome = "error"
		}
		return r.line(l)
	case itemConnEnd:
		return r.endConn(it.conn, it.at)
	case itemView:
		return r.line(viewLine(it, r.last))
	}
	return nil
}

// endConn writes the requests of a connection that never got a reply.
func (r *recorder) endConn(conn uint64, at time.Time) error {
	p := r.pending[conn]
	delete(r.pending, conn)
	for id, pr := range p {
		if err := r.line(&trajectoryLine{Conn: conn, ID: id, Method: pr.req.method, Request: pr.req.json, Elided: pr.req.elided,
			SentNs: pr.sent.UnixNano(), RepliedNs: at.UnixNano(), Outcome: "no_reply", FrameBefore: pr.before, FrameAfter: r.last}); err != nil {
			return err
		}
	}
	return nil
}

func (r *recorder) line(l *trajectoryLine) error {
	r.lines++
	l.Seq = r.lines
	b, err := json.Marshal(l)
	if err != nil {
		return err
	}
	if err := r.write(r.tw, append(b, '\n')); err != nil {
		r.lines--
		return err
	}
	if l.Outcome != "lost" {
		r.requests++
	}
	return nil
}

func (r *recorder) flush() error {
	if err := r.sw.Flush(); err != nil {
		return err
	}
	return r.tw.Flush()
}

// publish copies the writer's counters into the record.
func (r *recorder) publish() {
	r.m.mu.Lock()
	defer r.m.mu.Unlock()
	r.meta.Bytes = r.written
	r.meta.Frames = r.frames
	r.meta.Requests = r.requests
	r.meta.FramesSkipped = r.skipped.Load()
	r.meta.Width, r.meta.Height = r.width, r.height
}

// finish writes what is pending, closes the files and makes the record
// final.
func (r *recorder) finish(failed error) {
	if n := r.lost.Load(); n > 0 && failed == nil {
		// Said once, in the trajectory itself: it is incomplete.
		failed = r.line(&trajectoryLine{Outcome: "lost", SentNs: time.Now().UnixNano(),
			Error: &lineError{Code: "recorder", Message: fmt.Sprintf("%d ACI messages were not recorded: the recorder's queue was full", n)}})
	}
	if failed == nil {
		for conn := range r.pending {
			if err := r.endConn(conn, time.Now()); err != nil {
				failed = err
				break
			}
		}
	}
	ferr := r.flush()
	serr := r.stream.Sync()
	terr := r.traj.Sync()
	r.stream.Close()
	r.traj.Close()
	if err := errors.Join(ferr, serr, terr); err != nil && failed == nil {
		failed = err
	}
	r.publish()
	r.mu.Lock()
	reason, msg := r.reason, r.message
	r.mu.Unlock()
	if failed != nil && reason == controldv1.RecordingStopReason_RECORDING_STOP_REASON_REQUESTED {
		// It failed before the stop request was handled.
		reason = controldv1.RecordingStopReason_RECORDING_STOP_REASON_FAILED
		if errors.Is(failed, errCap) {
			reason = controldv1.RecordingStopReason_RECORDING_STOP_REASON_CAP_REACHED
		}
		msg = failed.Error()
	}
	r.m.mu.Lock()
	r.meta.State = controldv1.RecordingState_RECORDING_STATE_STOPPED
	r.meta.StoppedAt = timestamppb.Now()
	r.meta.StopReason = reason
	r.meta.StopMessage = msg
	r.m.mu.Unlock()
	r.m.finished(r)
}
