// Command testinit is the init of the test sandboxes of package
// containerdrt: a stand-in for guestd that listens on guestd's socket and
// holds a value in memory, so a fork can prove its memory came from the
// checkpoint. Protocol: one command line per connection, one reply line.
//
//	get                 the value held in memory
//	set VALUE           replace it
//	write PATH CONTENT  write a file (kept open, like a log)
//	read PATH           a file's content
//	env NAME            an environment variable
//	pid                 the process id
//	symlink TARGET LINK replace LINK with a symlink to TARGET (an attack:
//	                    root in a sandbox can plant links anywhere)
//	swap A B            exchange A and B (renameat2 RENAME_EXCHANGE) in a
//	                    loop from now on, as fast as possible
//	swaps               how many exchanges the loop made
//	exit CODE           exit with CODE after replying
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

	"golang.org/x/sys/unix"
)

const socketPath = "/run/forkfleet/aci.sock"

var (
	swaps atomic.Int64
	mu    sync.Mutex
	value = "initial"
	open  []*os.File // files kept open, as openbox keeps its log open
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
	case "set":
		value = arg
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

func fatal(err error) {
	fmt.Fprintln(os.Stderr, "testinit:", err)
	os.Exit(1)
}
