package remote

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/hugelgupf/p9/fsimpl/localfs"
	"github.com/hugelgupf/p9/p9"

	"github.com/shalefs/shale/layer"
	"github.com/shalefs/shale/p9net"
	"github.com/shalefs/shale/stack"
)

const testTimeout = 2 * time.Second

// server is a 9P server under test that can be killed and started again
// on the same address.
type server interface {
	remote() p9net.Remote
	start(t *testing.T)
	kill(t *testing.T)
}

// localServer is hugelgupf/p9's localfs over a directory on a unix
// socket. It ignores uids. It runs in a child process (this test binary,
// see TestMain): the library's server has a data race of its own that
// would fail -race runs, and a process is what a test kills.
type localServer struct {
	dir, sock string
	cmd       *exec.Cmd
}

const serveEnv = "REMOTE_TEST_SERVE" // DIR:SOCKET for the child

func TestMain(m *testing.M) {
	if v := os.Getenv(serveEnv); v != "" {
		dir, sock, _ := strings.Cut(v, ":")
		os.Remove(sock)
		ln, err := net.Listen("unix", sock)
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		p9.NewServer(localfs.Attacher(dir)).Serve(ln)
		os.Exit(0)
	}
	os.Exit(m.Run())
}

func newLocal(t *testing.T) *localServer {
	s := &localServer{dir: t.TempDir(), sock: filepath.Join(t.TempDir(), "9p.sock")}
	s.start(t)
	t.Cleanup(func() { s.kill(t) })
	return s
}

func (s *localServer) remote() p9net.Remote {
	return p9net.Remote{Addr: p9net.Addr{Network: "unix", Address: s.sock}}
}

func (s *localServer) start(t *testing.T) {
	os.Remove(s.sock)
	s.cmd = exec.Command(os.Args[0])
	s.cmd.Env = append(os.Environ(), serveEnv+"="+s.dir+":"+s.sock)
	if err := s.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	waitListen(t, "unix", s.sock)
}

func (s *localServer) kill(t *testing.T) {
	if s.cmd == nil {
		return
	}
	s.cmd.Process.Kill()
	s.cmd.Wait()
	s.cmd = nil
}

func waitListen(t *testing.T, network, addr string) {
	for deadline := time.Now().Add(20 * time.Second); ; {
		c, err := net.Dial(network, addr)
		if err == nil {
			c.Close()
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("no server listens on %s: %v", addr, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// diodServer is a real diod exporting a directory over TCP on loopback.
type diodServer struct {
	dir, addr string
	cmd       *exec.Cmd
}

func newDiod(t *testing.T) *diodServer {
	if _, err := exec.LookPath("diod"); err != nil {
		t.Skip("diod is not installed")
	}
	if os.Geteuid() != 0 {
		t.Skip("diod serves other users only as root")
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	s := &diodServer{dir: t.TempDir(), addr: addr}
	os.Chmod(s.dir, 0o777)
	s.start(t)
	t.Cleanup(func() { s.kill(t) })
	return s
}

func (s *diodServer) remote() p9net.Remote {
	return p9net.Remote{Addr: p9net.Addr{Network: "tcp", Address: s.addr}, Aname: s.dir}
}

func (s *diodServer) start(t *testing.T) {
	s.cmd = exec.Command("diod", "-f", "-n", "-d", "0", "-e", s.dir, "-l", s.addr, "-L", "stderr")
	if testing.Verbose() {
		s.cmd.Stderr = os.Stderr
	}
	if err := s.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	waitListen(t, "tcp", s.addr)
}

func (s *diodServer) kill(t *testing.T) {
	if s.cmd == nil {
		return
	}
	s.cmd.Process.Signal(syscall.SIGCONT) // in case a test stopped it
	s.cmd.Process.Kill()
	s.cmd.Wait()
	s.cmd = nil
}

// servers runs fn against each server the machine has.
func servers(t *testing.T, fn func(t *testing.T, mk func(t *testing.T) server)) {
	t.Run("localfs", func(t *testing.T) {
		fn(t, func(t *testing.T) server { return newLocal(t) })
	})
	t.Run("diod", func(t *testing.T) {
		fn(t, func(t *testing.T) server { return newDiod(t) })
	})
}

// mount is a client of srv at the bottom of a new stack.
func mount(t *testing.T, srv server) (*node, *stack.Stack) {
	t.Helper()
	st := stack.New(stack.Options{})
	root, err := New(context.Background(), st, srv.remote(), Options{Timeout: testTimeout})
	if err != nil {
		t.Fatal(err)
	}
	n := root.(*node)
	t.Cleanup(func() { n.Close() })
	return n, st
}

// as is a ctx for a caller.
func as(uid, gid, umask uint32) context.Context {
	return layer.WithCaller(context.Background(), layer.Caller{Uid: uid, Gid: gid, Umask: umask})
}

var bg = context.Background()

func must(t *testing.T, e layer.Errno, what string, args ...any) {
	t.Helper()
	if e != 0 {
		t.Fatalf("%s: %v", fmt.Sprintf(what, args...), e)
	}
}

func lookup(t *testing.T, dir layer.Node, name string) layer.Node {
	t.Helper()
	var a layer.Attr
	n, e := dir.Lookup(bg, name, &a)
	must(t, e, "lookup %s", name)
	return n
}
