// Command testinit is the init of the test sandboxes of package
// containerdrt: a stand-in for guestd that listens on guestd's socket and
// holds a value in memory, so a fork can prove its memory came from the
// checkpoint. Protocol: one command line per connection, one reply line.
//
//	get                 the value held in memory
//	set VALUE           replace it
//	write PATH CONTENT  write a file (kept open, like a log)
//	read PATH           a file's content
//	unlink PATH         remove a file (one write keeps open stays open)
//	readfd PATH         the content of the open file write made at PATH
//	chown PATH ID       give PATH (not followed) owner and group ID
//	env NAME            an environment variable
//	pid                 the process id
//	symlink TARGET LINK replace LINK with a symlink to TARGET (an attack:
//	                    root in a sandbox can plant links anywhere)
//	swap A B            exchange A and B (renameat2 RENAME_EXCHANGE) in a
//	                    loop from now on, as fast as possible
//	swaps               how many exchanges the loop made
//	exit CODE           exit with CODE after replying
//	listen ADDR         listen on TCP ADDR; each connection is answered
//	                    with a line "value VALUE" and echoes lines after it
//	dial ADDR           connect to ADDR and return its first line
//	hold ADDR           connect to ADDR and keep the connection open
//	held LINE           send LINE on the held connection, return the answer
//	lo                  the flags of lo (/sys/class/net/lo/flags)
//	fetch HOST:PORT PATH  an HTTP GET (the status line and first body line)
//	fill MIB            hold MIB MiB of pseudo-random bytes (a sandbox
//	                    whose memory a restore must bring back)
//	sum                 a checksum of the bytes fill holds
//	reserve GIB         reserve GIB GiB of address space, PROT_NONE (as
//	                    Chromium reserves V8's cages)
//	traced              start a child that this process traces (as a
//	                    debugger would) and return its pid
package main

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

const socketPath = "/run/forkfleet/aci.sock"

var (
	swaps atomic.Int64
	held  *bufio.ReadWriter // a TCP connection kept open (hold)
	heldC net.Conn
	mu    sync.Mutex
	value = "initial"
	open  []*os.File // files kept open, as openbox keeps its log open
	fill  []byte     // fill's bytes
	kept  [][]byte   // reserve's reservations
)

func main() {
	if err := os.MkdirAll(filepath.Dir(socketPath), 0o755); err != nil {
		fatal(err)
	}
	os.Remove(socketPath)
	var lc net.ListenConfig
	lc.SetMultipathTCP(false)
	ln, err := lc.Listen(context.Background(), "unix", socketPath)
	if err != nil {
		fatal(err)
	}
	logf, err := os.OpenFile("/var/log/testinit.log", os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		fatal(err)
	}
	fmt.Fprintf(logf, "started pid %d\n", os.Getpid())
	for {
		c, err := ln.Accept()
		if err != nil {
			fatal(err)
		}
		go serve(c, logf)
	}
}

func serve(c net.Conn, logf *os.File) {
	defer c.Close()
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil {
		return
	}
	cmd, arg, _ := strings.Cut(strings.TrimSpace(line), " ")
	mu.Lock()
	fmt.Fprintf(logf, "%s\n", cmd)
	var reply string
	exitCode := -1
	switch cmd {
	case "get":
		reply = value
	case "fill":
		n, _ := strconv.Atoi(arg)
		fill = make([]byte, n<<20)
		x := uint64(0x9e3779b97f4a7c15)
		for i := range fill {
			x ^= x << 13
			x ^= x >> 7
			x ^= x << 17
			fill[i] = byte(x)
		}
		reply = "ok"
	case "reserve":
		n, _ := strconv.Atoi(arg)
		m, err := unix.Mmap(-1, 0, n<<30, unix.PROT_NONE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
		reply = "ok"
		if err != nil {
			reply = "error " + err.Error()
		}
		kept = append(kept, m)
	case "sum":
		var h uint64 = 14695981039346656037
		for _, b := range fill {
			h = (h ^ uint64(b)) * 1099511628211
		}
		reply = strconv.FormatUint(h, 16)
	case "set":
		value = arg
		shown.Store(arg)
		reply = "ok"
	case "write":
		path, content, _ := strings.Cut(arg, " ")
		reply = "ok"
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			reply = "error " + err.Error()
			break
		}
		f, err := os.Create(path)
		if err == nil {
			_, err = f.WriteString(content)
		}
		if err != nil {
			reply = "error " + err.Error()
			break
		}
		open = append(open, f)
	case "read":
		b, err := os.ReadFile(arg)
		if err != nil {
			reply = "error " + err.Error()
		} else {
			reply = string(b)
		}
	case "unlink":
		reply = "ok"
		if err := os.Remove(arg); err != nil {
			reply = "error " + err.Error()
		}
	case "readfd":
		reply = "error not open"
		for _, f := range open {
			if f.Name() != arg {
				continue
			}
			b := make([]byte, 4096)
			n, err := f.ReadAt(b, 0)
			if n == 0 && err != nil {
				reply = "error " + err.Error()
				break
			}
			reply = string(b[:n])
		}
	case "chown":
		path, id, _ := strings.Cut(arg, " ")
		n, _ := strconv.Atoi(id)
		reply = "ok"
		if err := os.Lchown(path, n, n); err != nil {
			reply = "error " + err.Error()
		}
	case "env":
		reply = os.Getenv(arg)
	case "pid":
		reply = strconv.Itoa(os.Getpid())
	case "swap":
		a, b, _ := strings.Cut(arg, " ")
		go func() {
			for {
				if unix.Renameat2(unix.AT_FDCWD, a, unix.AT_FDCWD, b, unix.RENAME_EXCHANGE) == nil {
					swaps.Add(1)
				}
			}
		}()
		reply = "ok"
	case "swaps":
		reply = strconv.FormatInt(swaps.Load(), 10)
	case "symlink":
		target, link, _ := strings.Cut(arg, " ")
		reply = "ok"
		if err := os.RemoveAll(link); err != nil {
			reply = "error " + err.Error()
		} else if err := os.Symlink(target, link); err != nil {
			reply = "error " + err.Error()
		}
	case "listen":
		ln, err := listenTCP(arg)
		if err != nil {
			reply = "error " + err.Error()
			break
		}
		go acceptLoop(ln)
		reply = "ok " + ln.Addr().String()
	case "dial":
		reply = dialLine(arg)
	case "hold":
		c, err := net.DialTimeout("tcp", arg, 2*time.Second)
		if err != nil {
			reply = "error " + err.Error()
			break
		}
		heldC, held = c, bufio.NewReadWriter(bufio.NewReader(c), bufio.NewWriter(c))
		line, err := held.ReadString('\n')
		if err != nil {
			reply = "error " + err.Error()
			break
		}
		reply = strings.TrimSpace(line)
	case "held":
		if held == nil {
			reply = "error nothing held"
			break
		}
		heldC.SetDeadline(time.Now().Add(2 * time.Second))
		fmt.Fprintln(held, arg)
		if err := held.Flush(); err != nil {
			reply = "error " + err.Error()
			break
		}
		line, err := held.ReadString('\n')
		if err != nil {
			reply = "error " + err.Error()
		} else {
			reply = strings.TrimSpace(line)
		}
	case "lo":
		b, err := os.ReadFile("/sys/class/net/lo/flags")
		if err != nil {
			reply = "error " + err.Error()
		} else {
			reply = strings.TrimSpace(string(b))
		}
	case "fetch":
		hostport, path, _ := strings.Cut(arg, " ")
		reply = fetch(hostport, path)
	case "traced":
		reply = startTraced()
	case "exit":
		exitCode, _ = strconv.Atoi(arg)
		reply = "ok"
	default:
		reply = "error unknown command"
	}
	mu.Unlock()
	fmt.Fprintln(c, reply)
	if exitCode >= 0 {
		c.Close()
		os.Exit(exitCode)
	}
}

// shown is value for the TCP handlers, which must not wait for mu (a
// command holds it while it talks to them).
var shown atomic.Value

func current() string {
	if v, ok := shown.Load().(string); ok {
		return v
	}
	return "initial"
}

func listenTCP(addr string) (net.Listener, error) {
	var lc net.ListenConfig
	lc.SetMultipathTCP(false) // CRIU cannot dump MPTCP sockets
	return lc.Listen(context.Background(), "tcp", addr)
}

func acceptLoop(ln net.Listener) {
	for {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		go func() {
			defer c.Close()
			fmt.Fprintf(c, "value %s\n", current())
			r := bufio.NewReader(c)
			for {
				line, err := r.ReadString('\n')
				if err != nil {
					return
				}
				fmt.Fprintf(c, "echo %s %s\n", strings.TrimSpace(line), current())
			}
		}()
	}
}

func dialLine(addr string) string {
	var d net.Dialer
	d.SetMultipathTCP(false)
	d.Timeout = 2 * time.Second
	c, err := d.Dial("tcp", addr)
	if err != nil {
		return "error " + err.Error()
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(2 * time.Second))
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil {
		return "error " + err.Error()
	}
	return strings.TrimSpace(line)
}

// fetch does a minimal HTTP/1.0 GET (the image has no curl).
func fetch(hostport, path string) string {
	var d net.Dialer
	d.SetMultipathTCP(false)
	d.Timeout = 2 * time.Second
	c, err := d.Dial("tcp", hostport)
	if err != nil {
		return "error " + err.Error()
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(3 * time.Second))
	fmt.Fprintf(c, "GET %s HTTP/1.0\r\nHost: %s\r\n\r\n", path, hostport)
	r := bufio.NewReader(c)
	status, err := r.ReadString('\n')
	if err != nil {
		return "error " + err.Error()
	}
	for {
		l, err := r.ReadString('\n')
		if err != nil || strings.TrimSpace(l) == "" {
			break
		}
	}
	body, _ := r.ReadString('\n')
	return strings.TrimSpace(status) + " | " + strings.TrimSpace(body)
}

func fatal(err error) {
	fmt.Fprintln(os.Stderr, "testinit:", err)
	os.Exit(1)
}

// startTraced starts a child under PTRACE_TRACEME: it stops at its exec
// and stays stopped, traced by this process, which never waits for it.
func startTraced() string {
	self, err := os.Executable()
	if err != nil {
		return "error " + err.Error()
	}
	p, err := os.StartProcess(self, []string{self, "traced-child"}, &os.ProcAttr{
		Sys: &syscall.SysProcAttr{Ptrace: true},
	})
	if err != nil {
		return "error " + err.Error()
	}
	return strconv.Itoa(p.Pid)
}
