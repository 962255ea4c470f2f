package aci

import (
	"context"
	"errors"
	"io"
	"net"
	"sync"
	"time"

	"github.com/coder/websocket"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	aciv1 "github.com/forkfleet/forkfleet/api/gen/forkfleet/aci/v1"
)

// Queue depths. A full request queue stops the read loop, which pushes back
// on the client through TCP; a full reply queue stops the executor. The
// bytes behind both are bounded too (Options.MaxSessionBytes, byteBudget):
// 128 requests of 64 MiB must not all be held at once.
const (
	requestQueue = 128
	replyQueue   = 64
	// Read buffers that grew past this are dropped after the message so one
	// large upload does not pin memory for the session's lifetime.
	keepReadBuf = 1 << 20
)

// session is one WebSocket client. Three goroutines: the read loop (the HTTP
// handler's goroutine) decodes and queues, the executor runs requests in
// order, the writer sends replies and events.
type session struct {
	// raw is the connection under conn when the server knows it (see
	// WithRawConn).
	raw  net.Conn
	srv  *Server
	conn *websocket.Conn
	role Role
	json bool
	id   string

	ctx    context.Context
	cancel context.CancelFunc

	queue chan *job
	out   chan outMsg
	// inBytes holds the wire size of requests read and not yet executed,
	// outBytes that of replies and events not yet written.
	inBytes, outBytes byteBudget

	// streams are this session's screencast streams (the executor's only).
	streams map[uint32]struct{}

	// Guarded by srv.mu.
	welcomed         bool
	wantsReadyEvents bool

	inflightMu sync.Mutex
	inflight   map[uint64]*job // cancelable requests, queued or running

	closeOnce sync.Once
	closeDone chan struct{} // closed when closeWith's handshake finished
	exec      executorState
}

// outMsg is one marshaled message for the writer. done, when set, is closed
// once the message was written (or the session ended): screencast frames wait
// on it so a slow client holds one frame per stream, not a queue of them.
type outMsg struct {
	b    *[]byte
	done chan struct{}
	cost int64 // taken from outBytes
}

// job is one request on its way through the executor.
type job struct {
	msg    *aciv1.ClientMessage
	ctx    context.Context
	cancel context.CancelFunc
	// reply, when set, is sent as is (precomputed by the read loop).
	reply *aciv1.ServerMessage
	cost  int64 // taken from inBytes
}

var outBufPool = sync.Pool{New: func() any { b := make([]byte, 0, 4096); return &b }}

func (s *Server) newSession(conn *websocket.Conn, role Role, json bool) *session {
	ctx, cancel := context.WithCancel(context.Background())
	ss := &session{
		srv: s, conn: conn, role: role, json: json,
		id:        s.rng.id(),
		ctx:       ctx,
		cancel:    cancel,
		queue:     make(chan *job, requestQueue),
		out:       make(chan outMsg, replyQueue),
		streams:   make(map[uint32]struct{}),
		inflight:  make(map[uint64]*job),
		closeDone: make(chan struct{}),
		inBytes:   byteBudget{max: s.opts.MaxSessionBytes},
		outBytes:  byteBudget{max: s.opts.MaxSessionBytes},
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		cancel()
		return nil
	}
	s.sessions[ss] = struct{}{}
	s.bg.Add(1)
	return ss
}

func (ss *session) run() {
	s := ss.srv
	defer s.bg.Done()
	var wg sync.WaitGroup
	wg.Add(2)
	go func() { defer wg.Done(); ss.executor() }()
	go func() { defer wg.Done(); ss.writer() }()
	// A connection that upgraded but says nothing holds a session slot:
	// it gets HelloTimeout to say hello.
	helloTimer := time.AfterFunc(s.opts.HelloTimeout, func() {
		s.mu.Lock()
		welcomed := ss.welcomed
		s.mu.Unlock()
		if !welcomed {
			ss.closeWith(websocket.StatusPolicyViolation, "no hello within "+s.opts.HelloTimeout.String())
		}
	})
	ss.readLoop()
	helloTimer.Stop()
	// A close we initiated should finish its handshake before CloseNow,
	// but a peer that never answers must not hold the session.
	ss.closeOnce.Do(func() { close(ss.closeDone) })
	t := time.NewTimer(closeHandshakeGrace)
	select {
	case <-ss.closeDone:
	case <-t.C:
	}
	t.Stop()
	// The connection is done: replies still queued have nobody to go to.
	ss.cancel()
	close(ss.queue)
	wg.Wait()
	s.mu.Lock()
	delete(s.sessions, ss)
	s.mu.Unlock()
	ss.exec.release()
	ss.conn.CloseNow()
}

// closeWith ends the session with a close frame carrying code and reason.
// The close handshake runs aside: from Shutdown the read loop is blocked in a
// read and is what receives the peer's answering close frame. The session
// context is canceled only after the frame went out, so run's CloseNow
// cannot cut it off.
func (ss *session) closeWith(code websocket.StatusCode, reason string) {
	ss.closeOnce.Do(func() {
		ss.srv.bg.Add(1)
		go func() {
			defer ss.srv.bg.Done()
			defer close(ss.closeDone)
			ss.conn.Close(code, reason)
			ss.cancel()
		}()
	})
}

func (ss *session) readLoop() {
	var buf []byte
	for {
		typ, r, err := ss.conn.Reader(ss.ctx)
		if err != nil {
			// Peer closed, network gone, or the read limit tripped (the
			// library has then already sent StatusMessageTooBig).
			return
		}
		buf, err = readAll(buf[:0], r)
		if err != nil {
			return
		}
		size := int64(len(buf))
		want := websocket.MessageBinary
		if ss.json {
			want = websocket.MessageText
		}
		if typ != want {
			ss.closeWith(websocket.StatusUnsupportedData, "wrong frame type for the negotiated subprotocol")
			return
		}
		msg := &aciv1.ClientMessage{}
		if ss.json {
			err = protojson.UnmarshalOptions{DiscardUnknown: true}.Unmarshal(buf, msg)
		} else {
			err = proto.Unmarshal(buf, msg)
		}
		if cap(buf) > keepReadBuf {
			buf = nil
		}
		if err != nil {
			ss.closeWith(websocket.StatusInvalidFramePayloadData, truncateReason("malformed ClientMessage: "+err.Error()))
			return
		}
		// Stop reading while the requests queued ahead hold the budget: TCP
		// then pushes back on the client.
		cost, err := ss.inBytes.take(ss.ctx, size)
		if err != nil {
			return
		}
		j := &job{msg: msg, ctx: ss.ctx, cost: cost}
		switch {
		case msg.GetId() == 0:
			j.reply = errReply(0, errInvalid("id", "request id must be non-zero").Proto())
		case msg.GetCancel() != nil:
			// Handled on receipt so it can reach a running request; the reply
			// still travels through the queue and keeps its place in order.
			j.reply = &aciv1.ServerMessage{Id: msg.GetId(), Reply: &aciv1.ServerMessage_Cancel{
				Cancel: &aciv1.CancelResponse{Found: ss.cancelTarget(msg.GetCancel().GetTargetId())}}}
		case cancelable(msg):
			if !ss.track(j) {
				j.reply = errReply(msg.GetId(), errInvalid("id", "id %d is already in flight", msg.GetId()).Proto())
			}
		}
		select {
		case ss.queue <- j:
		case <-ss.ctx.Done():
			return
		}
	}
}

// byteBudget bounds the bytes a session holds in one direction. take waits
// while the budget is spent; a message larger than the whole budget is let
// through alone (the message limit bounds it).
type byteBudget struct {
	max int64

	mu    sync.Mutex
	used  int64
	freed chan struct{} // closed by release when someone waits
}

// take reserves n bytes (at most max) and returns what it reserved, for
// release.
func (b *byteBudget) take(ctx context.Context, n int64) (int64, error) {
	n = min(n, b.max)
	for {
		b.mu.Lock()
		if b.used+n <= b.max {
			b.used += n
			b.mu.Unlock()
			return n, nil
		}
		if b.freed == nil {
			b.freed = make(chan struct{})
		}
		freed := b.freed
		b.mu.Unlock()
		select {
		case <-freed:
		case <-ctx.Done():
			return 0, ctx.Err()
		}
	}
}

func (b *byteBudget) release(n int64) {
	if n == 0 {
		return
	}
	b.mu.Lock()
	b.used -= n
	if b.freed != nil {
		close(b.freed)
		b.freed = nil
	}
	b.mu.Unlock()
}

// truncateReason fits a close reason into the 123 bytes a close frame allows.
func truncateReason(s string) string {
	if len(s) > 120 {
		return s[:120]
	}
	return s
}

func readAll(b []byte, r io.Reader) ([]byte, error) {
	for {
		if len(b) == cap(b) {
			b = append(b, 0)[:len(b)]
		}
		n, err := r.Read(b[len(b):cap(b)])
		b = b[:len(b)+n]
		if err != nil {
			if errors.Is(err, io.EOF) {
				return b, nil
			}
			return b, err
		}
	}
}

// cancelable requests can block for long (exec, settle waits, sleeps) and
// get their own context so CancelRequest can reach them.
func cancelable(m *aciv1.ClientMessage) bool {
	switch r := m.GetRequest().(type) {
	case *aciv1.ClientMessage_Exec:
		return true
	case *aciv1.ClientMessage_Screenshot:
		return r.Screenshot.GetSettleMs() > 0
	case *aciv1.ClientMessage_Step:
		return true
	case *aciv1.ClientMessage_ClipboardGet:
		return true
	}
	return false
}

func (ss *session) track(j *job) bool {
	id := j.msg.GetId()
	ss.inflightMu.Lock()
	defer ss.inflightMu.Unlock()
	if _, dup := ss.inflight[id]; dup {
		return false
	}
	j.ctx, j.cancel = context.WithCancel(ss.ctx)
	ss.inflight[id] = j
	return true
}

func (ss *session) untrack(j *job) {
	if j.cancel == nil {
		return
	}
	ss.inflightMu.Lock()
	delete(ss.inflight, j.msg.GetId())
	ss.inflightMu.Unlock()
	j.cancel()
}

func (ss *session) cancelTarget(id uint64) bool {
	ss.inflightMu.Lock()
	j, ok := ss.inflight[id]
	ss.inflightMu.Unlock()
	if ok {
		j.cancel()
	}
	return ok
}

func (ss *session) executor() {
	for j := range ss.queue {
		if ss.ctx.Err() != nil {
			ss.untrack(j)
			ss.inBytes.release(j.cost)
			continue
		}
		reply := j.reply
		if reply == nil {
			reply = ss.handle(j)
		}
		ss.untrack(j)
		ss.inBytes.release(j.cost)
		if reply == nil {
			// The handler emitted its reply itself (screencast start:
			// the reply must precede the stream's first frame).
			continue
		}
		ss.emit(reply)
		if reply.GetHello() != nil {
			ss.afterHello()
		}
	}
}

// emit marshals m once into a pooled buffer and hands it to the writer. The
// executor's image buffers are reused only after this returns.
func (ss *session) emit(m *aciv1.ServerMessage) {
	bp := outBufPool.Get().(*[]byte)
	var err error
	if ss.json {
		var b []byte
		b, err = protojson.Marshal(m)
		*bp = append((*bp)[:0], b...)
	} else {
		*bp, err = proto.MarshalOptions{}.MarshalAppend((*bp)[:0], m)
	}
	if err != nil {
		// Only invalid UTF-8 in a string field can get here (a window title
		// from a misbehaving X client, say).
		ss.srv.log.Error("marshal reply", "id", m.GetId(), "err", err)
		*bp, _ = proto.Marshal(errReply(m.GetId(), &aciv1.Error{Code: aciv1.ErrorCode_ERROR_CODE_INTERNAL, Message: "reply could not be encoded: " + err.Error()}))
	}
	cost, err := ss.outBytes.take(ss.ctx, int64(len(*bp)))
	if err != nil {
		outBufPool.Put(bp)
		return
	}
	select {
	case ss.out <- outMsg{b: bp, cost: cost}:
	case <-ss.ctx.Done():
		outBufPool.Put(bp)
	}
}

// marshal encodes a server-initiated message in the session's encoding.
func (ss *session) marshal(m *aciv1.ServerMessage) ([]byte, error) {
	if ss.json {
		return protojson.Marshal(m)
	}
	return proto.Marshal(m)
}

// send queues a server-initiated message (events) from any goroutine.
func (ss *session) send(m *aciv1.ServerMessage) {
	b, err := ss.marshal(m)
	if err != nil {
		ss.srv.log.Error("marshal event", "err", err)
		return
	}
	cost, err := ss.outBytes.take(ss.ctx, int64(len(b)))
	if err != nil {
		return
	}
	select {
	case ss.out <- outMsg{b: &b, cost: cost}:
	case <-ss.ctx.Done():
	}
}

// sendWait queues a server-initiated message and waits until the writer has
// written it. It fails once the session is gone.
func (ss *session) sendWait(m *aciv1.ServerMessage) error {
	b, err := ss.marshal(m)
	if err != nil {
		return err
	}
	cost, err := ss.outBytes.take(ss.ctx, int64(len(b)))
	if err != nil {
		return err
	}
	done := make(chan struct{})
	select {
	case ss.out <- outMsg{b: &b, done: done, cost: cost}:
	case <-ss.ctx.Done():
		return ss.ctx.Err()
	}
	select {
	case <-done:
		return nil
	case <-ss.ctx.Done():
		return ss.ctx.Err()
	}
}

func (ss *session) writer() {
	typ := websocket.MessageBinary
	if ss.json {
		typ = websocket.MessageText
	}
	for {
		var m outMsg
		select {
		case m = <-ss.out:
		case <-ss.ctx.Done():
			return
		}
		err := ss.conn.Write(ss.ctx, typ, *m.b)
		ss.outBytes.release(m.cost)
		if m.done != nil {
			close(m.done)
		} else if cap(*m.b) <= keepReadBuf {
			outBufPool.Put(m.b)
		}
		if err != nil {
			// The executor and senders select on ctx, so nobody blocks on
			// this dead connection.
			ss.cancel()
			return
		}
	}
}

// afterHello marks the session welcomed and, when the desktop is already
// ready, pushes the ReadyEvent right after the HelloResponse.
func (ss *session) afterHello() {
	s := ss.srv
	s.mu.Lock()
	ss.welcomed = true
	ss.wantsReadyEvents = ss.exec.wantsReady
	r := s.ready
	s.mu.Unlock()
	if r != nil && ss.exec.wantsReady {
		ss.emit(&aciv1.ServerMessage{Reply: &aciv1.ServerMessage_Event{Event: &aciv1.Event{
			Event: &aciv1.Event_Ready{Ready: &aciv1.ReadyEvent{State: r}}}}})
	}
}

func errReply(id uint64, e *aciv1.Error) *aciv1.ServerMessage {
	return &aciv1.ServerMessage{Id: id, Reply: &aciv1.ServerMessage_Error{Error: e}}
}
