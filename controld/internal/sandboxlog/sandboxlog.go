// Package sandboxlog keeps a sandbox's stdout and stderr on the host within
// a byte budget: the most recent output, in two files that together never
// pass the budget. It is the body of forkfleet-log, the logging binary
// containerd's runc shim starts for every sandbox task (a binary:// stdio
// URI): the shim hands it the task's stdout and stderr pipes, and it drains
// them as fast as the sandbox writes, so a sandbox printing without end
// neither fills the host's disk nor blocks on a full pipe.
//
// Layout: <path> receives output until it holds budget/2 bytes, then it
// becomes <path>.1 (replacing the older half) and a new <path> starts. What
// the sandbox wrote before the last two halves is gone.
package sandboxlog

import (
	"errors"
	"fmt"
	"io"
	"os"
	"sync"
	"syscall"
)

// MinBudget is the smallest budget: two halves of 32 KiB.
const MinBudget = 64 << 10

// Writer appends to a rotating pair of files. Safe for concurrent use (the
// stdout and stderr copiers share one).
type Writer struct {
	path string
	half int64 // bytes per file

	mu      sync.Mutex
	f       *os.File
	n       int64 // bytes in f
	dropped int64 // bytes rotated away
	err     error // the first write error: later output is drained, not kept
}

// Open starts a log at path with the given budget (the whole of both
// files). An existing file at path is replaced: a sandbox id is never
// reused while its log is wanted.
func Open(path string, budget int64) (*Writer, error) {
	if budget < MinBudget {
		return nil, fmt.Errorf("sandboxlog: budget %d is below %d", budget, MinBudget)
	}
	w := &Writer{path: path, half: budget / 2}
	f, err := create(path)
	if err != nil {
		return nil, err
	}
	os.Remove(path + ".1") // an older sandbox's with this id
	w.f = f
	return w, nil
}

// create opens a new log file without following a link planted at its path
// (the log directory is the runtime's own; this is belt and braces).
func create(path string) (*os.File, error) {
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, err
	}
	return os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL|syscall.O_NOFOLLOW|syscall.O_CLOEXEC, 0o640)
}

// Write keeps p's bytes, rotating as the budget requires. It never fails:
// once the host refuses a write (say its disk is full) the output is
// dropped, so the sandbox is never held up by its log.
func (w *Writer) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	total := len(p)
	for len(p) > 0 && w.err == nil {
		room := w.half - w.n
		if room <= 0 {
			w.err = w.rotate()
			continue
		}
		chunk := p[:min(int64(len(p)), room)]
		n, err := w.f.Write(chunk)
		w.n += int64(n)
		p = p[n:]
		if err != nil {
			w.err = err
		}
	}
	return total, nil
}

func (w *Writer) rotate() error {
	if err := w.f.Close(); err != nil {
		return err
	}
	if err := os.Rename(w.path, w.path+".1"); err != nil {
		return err
	}
	w.dropped += w.half // what .1 held before
	f, err := create(w.path)
	if err != nil {
		return err
	}
	w.f, w.n = f, 0
	return nil
}

// Err is the write error that stopped the log, if any.
func (w *Writer) Err() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.err
}

// Close closes the current file.
func (w *Writer) Close() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.f.Close()
}

// Drain copies every reader into w until each ends. A reader's error ends
// only that reader.
func Drain(w *Writer, rs ...io.Reader) {
	var wg sync.WaitGroup
	for _, r := range rs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			buf := make([]byte, 64<<10)
			io.CopyBuffer(w, r, buf) //nolint:errcheck // w never fails; a read error is the end
		}()
	}
	wg.Wait()
}

// Tail returns up to n of the last bytes logged at path (both files).
func Tail(path string, n int64) []byte {
	cur := tailOf(path, n)
	if int64(len(cur)) >= n {
		return cur
	}
	return append(tailOf(path+".1", n-int64(len(cur))), cur...)
}

func tailOf(path string, n int64) []byte {
	f, err := os.Open(path)
	if err != nil {
		return nil
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil || !st.Mode().IsRegular() {
		return nil
	}
	off := max(st.Size()-n, 0)
	buf := make([]byte, st.Size()-off)
	k, _ := f.ReadAt(buf, off)
	return buf[:k]
}
