// Package net tests shale over 9P with real peers: diod's clients against
// shale serve, authentication and identity on the command line, coherence
// between a 9P export and a FUSE view of one stack, and a server killed
// mid-write. The conformance suite (test/conformance) runs its cases on
// 9P mounts beside native; this package covers what it cannot.
package net

import (
	"bytes"
	"crypto/rand"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/shalefs/shale/export"
	"github.com/shalefs/shale/internal/shaletest"
)

var (
	shale string
	base  string // 0755, so that every uid reaches what tests make in it
)

// tempDir is t.TempDir, but reachable by every uid (t.TempDir's parent is
// 0700).
func tempDir(t *testing.T) string {
	d, err := os.MkdirTemp(base, "t-")
	if err != nil {
		t.Fatal(err)
	}
	os.Chmod(d, 0o755)
	t.Cleanup(func() { os.RemoveAll(d) })
	return d
}

func TestMain(m *testing.M) {
	if os.Getenv(writerEnv) != "" || os.Getenv(faultWorkEnv) != "" || os.Getenv(probeEnv) != "" {
		// A helper process of a test: it runs programs on a mount, or
		// probes a server as another user, and needs no shale of its own.
		os.Exit(m.Run())
	}
	if os.Geteuid() != 0 {
		fmt.Fprintln(os.Stderr, "test/net: must run as root: it mounts FUSE and serves other uids")
		os.Exit(1)
	}
	dir, err := os.MkdirTemp("", "shale-net-")
	if err == nil {
		base = dir
		os.Chmod(dir, 0o755)
		shale, err = shaletest.Build(dir)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "test/net:", err)
		os.Exit(1)
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// freePort returns a loopback TCP port nothing listens on now.
func freePort(t *testing.T) string {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

// server is a shale serve process.
type server struct {
	cmd  *exec.Cmd
	done chan error
	log  *bytes.Buffer
	addr string // as serve was given it
}

// serve starts shale serve with args, listening on the network address
// (host:port or a socket path), and waits until it answers.
func serve(t *testing.T, address string, args ...string) *server {
	t.Helper()
	listen := "tcp:" + address
	if strings.HasPrefix(address, "/") {
		listen = "unix:" + address
	}
	s := &server{log: &bytes.Buffer{}, done: make(chan error, 1), addr: address}
	if netDebug() {
		args = append([]string{"--log-level", "debug"}, args...)
	}
	s.cmd = exec.Command(shale, append([]string{"serve", "--listen", listen}, args...)...)
	s.cmd.Stdout, s.cmd.Stderr = s.log, s.log
	if err := s.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { s.done <- s.cmd.Wait() }()
	t.Cleanup(func() {
		s.stop()
		logTail(t, "serve "+address, s.log.Bytes())
	})
	network := "tcp"
	if strings.HasPrefix(address, "/") {
		network = "unix"
	}
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		select {
		case err := <-s.done:
			s.done <- err
			t.Fatalf("shale serve ended before it listened (%v):\n%s", err, s.log)
		default:
		}
		if c, err := net.Dial(network, address); err == nil {
			c.Close()
			return s
		}
	}
	t.Fatalf("shale serve did not listen on %s within 30s:\n%s", address, s.log)
	return nil
}

// counters reads the server's stats file ("name value" lines) through
// shale status; it fails t if the server does not answer.
func (s *server) counters(t *testing.T) map[string]uint64 {
	out, err := exec.Command(shale, "status", "--json").Output()
	if err != nil {
		t.Errorf("shale status: %v", err)
		return nil
	}
	for _, line := range strings.Split(string(out), "\n") {
		var st struct {
			Server *struct {
				Pid   int    `json:"pid"`
				Stats string `json:"stats"`
			} `json:"server"`
		}
		if json.Unmarshal([]byte(line), &st) != nil || st.Server == nil || st.Server.Pid != s.cmd.Process.Pid {
			continue
		}
		m, _ := export.ParseStats([]byte(st.Server.Stats))
		return m
	}
	t.Errorf("shale status lists no server of pid %d", s.cmd.Process.Pid)
	return nil
}

func (s *server) stop() {
	s.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case err := <-s.done:
		s.done <- err
	case <-time.After(30 * time.Second):
		s.cmd.Process.Kill()
	}
}

// run runs a command and returns its combined output; it fails t on error.
func run(t *testing.T, name string, args ...string) string {
	t.Helper()
	out, err := exec.Command(name, args...).CombinedOutput()
	if err != nil {
		t.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, out)
	}
	return string(out)
}

// mount mounts lower (a 9p:// URL) at a new directory and returns it.
// Its log goes to a file, whose end a failed test prints.
func mount(t *testing.T, lower string, args ...string) string {
	t.Helper()
	mnt := tempDir(t)
	if !slices.Contains(args, "--log") {
		log := filepath.Join(tempDir(t), "mount.log")
		args = append(args, "--log", log)
		t.Cleanup(func() {
			// go-fuse turns a handler's panic into EIO and logs it: a
			// bug, whatever the program made of the EIO.
			b, _ := os.ReadFile(log)
			if bytes.Contains(b, []byte("panic")) {
				t.Errorf("mount %s logged a panic", mnt)
			}
			logTail(t, "mount "+mnt, b)
		})
	}
	if netDebug() {
		args = append(args, "--log-level", "debug")
	}
	run(t, shale, append(append([]string{"mount"}, args...), lower, mnt)...)
	t.Cleanup(func() { umount(mnt) })
	return mnt
}

// netDebug: SHALE_NET_DEBUG=1 makes servers and mounts log at debug
// level, for a failure that needs their walks and discards; set to a
// directory, a failed test's whole logs are kept there too.
func netDebug() bool { return os.Getenv("SHALE_NET_DEBUG") != "" }

// logTail prints the last lines of what's log b if t failed, and keeps
// the whole log in SHALE_NET_DEBUG's directory, if it names one.
func logTail(t *testing.T, what string, b []byte) {
	if !t.Failed() {
		return
	}
	t.Logf("the end of %s's log:\n%s", what, tail(string(b), 60))
	dir := os.Getenv("SHALE_NET_DEBUG")
	if !filepath.IsAbs(dir) {
		return
	}
	f, err := os.CreateTemp(dir, strings.NewReplacer("/", "_", " ", "_").Replace(what)+"-*.log")
	if err != nil {
		t.Log(err)
		return
	}
	f.Write(b)
	f.Close()
	t.Logf("%s's whole log: %s", what, f.Name())
}

// tail is the last n lines of s.
func tail(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}

func umount(mnt string) {
	for i := 0; i < 20; i++ {
		if exec.Command(shale, "umount", mnt).Run() == nil {
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
	unix.Unmount(mnt, unix.MNT_DETACH)
}

func randomBytes(t *testing.T, n int) []byte {
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return b
}

func writeFile(t *testing.T, p string, b []byte, mode os.FileMode) {
	t.Helper()
	if err := os.WriteFile(p, b, mode); err != nil {
		t.Fatal(err)
	}
}

// syncFile writes p and fsyncs it before closing: through a mount of a
// server that follows Sprite's rules, the bytes are on the server then.
func syncFile(t *testing.T, p string, b []byte) {
	t.Helper()
	f, err := os.Create(p)
	if err == nil {
		_, err = f.Write(b)
	}
	if err == nil {
		err = f.Sync()
	}
	if err == nil {
		err = f.Close()
	}
	if err != nil {
		t.Fatal(err)
	}
}

// lowerTree makes a directory to export: files, a subdirectory, and ctl/
// with the files diodload copies between (it reads zero and writes null at
// offset 0, as diod's synthetic ctl tree serves them).
func lowerTree(t *testing.T) (string, []byte) {
	lower := tempDir(t)
	data := randomBytes(t, 1<<20+123)
	writeFile(t, filepath.Join(lower, "data"), data, 0o644)
	writeFile(t, filepath.Join(lower, "hello"), []byte("hello\n"), 0o644)
	os.Mkdir(filepath.Join(lower, "sub"), 0o755)
	writeFile(t, filepath.Join(lower, "sub", "a"), []byte("a"), 0o644)
	os.Mkdir(filepath.Join(lower, "ctl"), 0o755)
	writeFile(t, filepath.Join(lower, "ctl", "zero"), make([]byte, 1<<20), 0o644)
	writeFile(t, filepath.Join(lower, "ctl", "null"), nil, 0o666)
	return lower, data
}

// TestDiodClients: diod's independent clients list, read, and load shale
// serve (as root, squashed to nobody).
func TestDiodClients(t *testing.T) {
	lower, data := lowerTree(t)
	addr := freePort(t)
	serve(t, addr, lower)

	out := run(t, "diodls", "-s", addr, "-a", "/")
	for _, name := range []string{"data", "hello", "sub", "ctl"} {
		if !strings.Contains("\n"+out, "\n"+name+"\n") {
			t.Errorf("diodls does not list %s:\n%s", name, out)
		}
	}
	if out := run(t, "diodls", "-s", addr, "-a", "", "sub"); !strings.Contains(out, "a") {
		t.Errorf("diodls sub: %q", out)
	}
	got, err := exec.Command("diodcat", "-s", addr, "-a", "/", "data").Output()
	if err != nil || !bytes.Equal(got, data) {
		t.Errorf("diodcat data: %v, %d bytes of %d, equal %v", err, len(got), len(data), bytes.Equal(got, data))
	}
	// diodload copies ctl/zero to ctl/null with 4 threads, then stats.
	for _, args := range [][]string{{"-r", "3", "-n", "4"}, {"-r", "2", "-n", "4", "-g"}} {
		out := run(t, "diodload", append([]string{"-s", addr}, args...)...)
		if !strings.Contains(out, "ops/s") || strings.Contains(strings.ToLower(out), "error") {
			t.Errorf("diodload %v: %s", args, out)
		}
	}
	// A file root cannot read, as nobody.
	writeFile(t, filepath.Join(lower, "secret"), []byte("x"), 0o600)
	if out, err := exec.Command("diodcat", "-s", addr, "-a", "/", "secret").CombinedOutput(); err == nil {
		t.Errorf("squashed root read a 0600 file: %s", out)
	}
}
