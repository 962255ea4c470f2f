// Package browsertest runs Debian's headless Chromium and drives its pages
// over the DevTools protocol (a WebSocket of JSON commands), for the tests
// and benchmarks that need a real browser (controld's live view). It talks
// only to the browser it started, on the loopback.
package browsertest

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"regexp"
	"sync"
	"sync/atomic"
	"time"

	"github.com/coder/websocket"
)

// Paths are where Debian's chromium package puts the browser (`make
// browser` installs it).
var Paths = []string{"/usr/bin/chromium", "/usr/lib/chromium/chromium"}

// ErrNoBrowser: Chromium is not installed.
var ErrNoBrowser = errors.New("browsertest: chromium is not installed (make browser)")

// Path returns the installed Chromium.
func Path() (string, error) {
	for _, p := range Paths {
		if _, err := os.Stat(p); err == nil {
			return p, nil
		}
	}
	return "", ErrNoBrowser
}

// Browser is a headless Chromium with its DevTools endpoint on the loopback.
type Browser struct {
	cmd  *exec.Cmd
	addr string // 127.0.0.1:port
	dir  string

	mu    sync.Mutex
	pages []*Page
}

var devtoolsRE = regexp.MustCompile(`DevTools listening on ws://(127\.0\.0\.1:[0-9]+)/`)

// Start runs the browser at path with a fresh profile until Close.
func Start(ctx context.Context, path string) (*Browser, error) {
	dir, err := os.MkdirTemp("", "browsertest-")
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(path, "--headless=new", "--no-sandbox", "--disable-gpu", "--no-first-run",
		"--no-default-browser-check", "--disable-extensions", "--disable-background-networking",
		"--disable-component-update", "--disable-sync", "--metrics-recording-only",
		"--remote-debugging-address=127.0.0.1", "--remote-debugging-port=0", "--user-data-dir="+dir,
		"--window-size=1600,1000", "about:blank")
	stderr, err := cmd.StderrPipe()
	if err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	b := &Browser{cmd: cmd, dir: dir}
	addr := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			if m := devtoolsRE.FindStringSubmatch(sc.Text()); m != nil {
				select {
				case addr <- m[1]:
				default:
				}
			}
		}
		io.Copy(io.Discard, stderr)
	}()
	select {
	case b.addr = <-addr:
		return b, nil
	case <-time.After(30 * time.Second):
		b.Close()
		return nil, errors.New("browsertest: chromium printed no DevTools address in 30 s")
	case <-ctx.Done():
		b.Close()
		return nil, ctx.Err()
	}
}

// Close ends the browser and removes its profile.
func (b *Browser) Close() error {
	b.mu.Lock()
	pages := b.pages
	b.pages = nil
	b.mu.Unlock()
	for _, p := range pages {
		p.c.CloseNow()
	}
	b.cmd.Process.Kill()
	b.cmd.Wait()
	return os.RemoveAll(b.dir)
}

// Pid is the browser's main process.
func (b *Browser) Pid() int { return b.cmd.Process.Pid }

// Page is one tab.
type Page struct {
	c  *websocket.Conn
	id atomic.Int64
	mu sync.Mutex // one command at a time
}

// Open makes a new tab and navigates it to url.
func (b *Browser) Open(ctx context.Context, url string) (*Page, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPut, "http://"+b.addr+"/json/new?about:blank", nil)
	if err != nil {
		return nil, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	var target struct {
		WebSocketDebuggerURL string `json:"webSocketDebuggerUrl"`
	}
	if err := json.NewDecoder(io.LimitReader(resp.Body, 1<<20)).Decode(&target); err != nil {
		return nil, fmt.Errorf("browsertest: new tab: %w", err)
	}
	c, _, err := websocket.Dial(ctx, target.WebSocketDebuggerURL, nil)
	if err != nil {
		return nil, err
	}
	c.SetReadLimit(256 << 20)
	p := &Page{c: c}
	b.mu.Lock()
	b.pages = append(b.pages, p)
	b.mu.Unlock()
	if err := p.Call(ctx, "Page.navigate", map[string]any{"url": url}, nil); err != nil {
		return nil, err
	}
	return p, nil
}

// Call sends one DevTools command and waits for its result (events are
// skipped).
func (p *Page) Call(ctx context.Context, method string, params any, result any) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	id := p.id.Add(1)
	msg, err := json.Marshal(map[string]any{"id": id, "method": method, "params": params})
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if err := p.c.Write(ctx, websocket.MessageText, msg); err != nil {
		return fmt.Errorf("%s: %w", method, err)
	}
	for {
		_, data, err := p.c.Read(ctx)
		if err != nil {
			return fmt.Errorf("%s: %w", method, err)
		}
		var r struct {
			ID     int64           `json:"id"`
			Result json.RawMessage `json:"result"`
			Error  *struct {
				Message string `json:"message"`
			} `json:"error"`
		}
		if json.Unmarshal(data, &r) != nil || r.ID != id {
			continue
		}
		if r.Error != nil {
			return fmt.Errorf("%s: %s", method, r.Error.Message)
		}
		if result != nil {
			return json.Unmarshal(r.Result, result)
		}
		return nil
	}
}

// Eval returns a JavaScript expression's value (promises awaited) as a
// string; a thrown exception is an error.
func (p *Page) Eval(ctx context.Context, expr string) (string, error) {
	var r struct {
		Result struct {
			Value any `json:"value"`
		} `json:"result"`
		Exception *struct {
			Text      string `json:"text"`
			Exception struct {
				Description string `json:"description"`
			} `json:"exception"`
		} `json:"exceptionDetails"`
	}
	if err := p.Call(ctx, "Runtime.evaluate", map[string]any{"expression": expr, "returnByValue": true, "awaitPromise": true}, &r); err != nil {
		return "", err
	}
	if r.Exception != nil {
		return "", fmt.Errorf("browsertest: %s %s", r.Exception.Text, r.Exception.Exception.Description)
	}
	return fmt.Sprint(r.Result.Value), nil
}

// WaitFor polls until the JavaScript condition is true.
func (p *Page) WaitFor(ctx context.Context, cond string, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		v, err := p.Eval(ctx, "!!("+cond+")")
		if err == nil && v == "true" {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("browsertest: %s not true after %v (last error %v)", cond, timeout, err)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// TypeKeys presses a key per character, as a person at the page would.
func (p *Page) TypeKeys(ctx context.Context, text string) error {
	for _, r := range text {
		k := string(r)
		if err := p.Call(ctx, "Input.dispatchKeyEvent", map[string]any{"type": "keyDown", "key": k, "text": k}, nil); err != nil {
			return err
		}
		if err := p.Call(ctx, "Input.dispatchKeyEvent", map[string]any{"type": "keyUp", "key": k}, nil); err != nil {
			return err
		}
	}
	return nil
}

// Key presses a named key (DOM key name and Windows virtual key code, e.g.
// "Enter", 13).
func (p *Page) Key(ctx context.Context, name string, code int) error {
	for _, typ := range []string{"rawKeyDown", "keyUp"} {
		if err := p.Call(ctx, "Input.dispatchKeyEvent", map[string]any{"type": typ, "key": name, "code": name, "windowsVirtualKeyCode": code}, nil); err != nil {
			return err
		}
	}
	return nil
}
