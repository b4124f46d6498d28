package net

import (
	"bufio"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/shalefs/shale/journal"
	"github.com/shalefs/shale/p9net"
	"github.com/shalefs/shale/p9wire"
)

// Network trust II: who may act as whom. A program of another user
// (nobody, through setpriv) probes the server with raw 9P: this test
// binary again, in TestIdentHelperProbe.

// probeEnv holds the probe's operation and arguments, separated by
// spaces (see TestIdentHelperProbe).
const probeEnv = "SHALE_NET_PROBE"

// probeBinary is this test binary where every user may run it.
var probeBinary = sync.OnceValues(func() (string, error) {
	b, err := os.ReadFile(os.Args[0])
	if err != nil {
		return "", err
	}
	p := filepath.Join(base, "probe.test")
	return p, os.WriteFile(p, b, 0o755)
})

// prober is a probe running as nobody.
type prober struct {
	cmd   *exec.Cmd
	out   *bufio.Scanner
	stdin io.WriteCloser
	lines []string
}

// probe starts the probe op with args as nobody, and reads its output up
// to its line "ready" (or its end).
func probe(t *testing.T, op string, args ...string) *prober {
	t.Helper()
	bin, err := probeBinary()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups", bin, "-test.run=^TestIdentHelperProbe$")
	cmd.Env = append(os.Environ(), probeEnv+"="+strings.Join(append([]string{op}, args...), " "))
	cmd.Stderr = os.Stderr
	p := &prober{cmd: cmd}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if p.stdin, err = cmd.StdinPipe(); err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.stdin.Close(); cmd.Wait() })
	p.out = bufio.NewScanner(out)
	for p.out.Scan() && p.out.Text() != "ready" {
		p.lines = append(p.lines, p.out.Text())
	}
	return p
}

// said is the probe's line that starts with what, without it.
func (p *prober) said(what string) string {
	for _, l := range p.lines {
		if v, ok := strings.CutPrefix(l, what+" "); ok {
			return v
		}
	}
	return "(nothing: " + strings.Join(p.lines, "; ") + ")"
}

// TestIdentHelperProbe is no test of its own: it is the probe other tests
// run as another user. Its operations:
//
//	read NETWORK ADDRESS UID NAME: attach as UID, read NAME; says
//	  "attach ERRNO", "read ERRNO DATA".
//	claim NETWORK ADDRESS GID GROUP NAME: claim GID and GROUP for itself
//	  (credentials over 9P), attach with them, read NAME; says "claim
//	  ERRNO", "read ERRNO DATA".
//	dirty NETWORK ADDRESS PATH UUID: attach as itself, make a journal,
//	  send a Dirty of QID PATH; says "dirty ERRNO", then tries to open
//	  the journal UUID: "journal ERRNO"; then "ready", and keeps its
//	  connection until its standard input ends.
func TestIdentHelperProbe(t *testing.T) {
	spec := os.Getenv(probeEnv)
	if spec == "" {
		t.Skip("a helper process of the identity tests")
	}
	f := strings.Fields(spec)
	defer func() {
		fmt.Println("ready")
		io.Copy(io.Discard, os.Stdin)
	}()
	p := dialAs(t, f[1], f[2], uint32(os.Geteuid()))
	switch f[0] {
	case "read":
		uid, _ := strconv.ParseUint(f[3], 10, 32)
		_, e := p.try("attach", p9wire.Tattach, uint32(10), p9wire.NoFid, "", "", uint32(uid))
		fmt.Println("attach", int(e))
		if e != 0 {
			return
		}
		p.rpc("walk", p9wire.Twalk, uint32(10), uint32(11), uint16(1), f[4])
		if _, e = p.try("open", p9wire.Tlopen, uint32(11), uint32(syscall.O_RDONLY)); e != 0 {
			fmt.Println("read", int(e))
			return
		}
		b := p.rpc("read", p9wire.Tread, uint32(11), uint64(0), uint32(4096))
		fmt.Printf("read 0 %q\n", b[4:])
	case "claim":
		gid, _ := strconv.ParseUint(f[3], 10, 32)
		group, _ := strconv.ParseUint(f[4], 10, 32)
		e := p.claimAttach(10, 20, uint32(os.Geteuid()), uint32(gid), uint32(group))
		fmt.Println("claim", int(e))
		if e == 0 {
			b, e := p.readAt(10, f[5])
			fmt.Printf("read %d %q\n", int(e), b)
		}
	case "dirty":
		path, _ := strconv.ParseUint(f[3], 10, 64)
		p.openJournal(newUUID(t))
		fmt.Println("dirty", int(p.sendRecord(journal.Record{Kind: journal.Dirty, Qid: p9wire.Qid{Path: path}})))
		// On a connection of its own: a connection has one journal.
		q := dialAs(t, f[1], f[2], uint32(os.Geteuid()))
		q.rpc("attach #journal", p9wire.Tattach, uint32(103), p9wire.NoFid, "", journal.Aname, uint32(os.Geteuid()))
		if _, e := q.try("walk", p9wire.Twalk, uint32(103), uint32(104), uint16(1), f[4]); e != 0 {
			fmt.Println("journal", int(e))
			return
		}
		_, e := q.try("open journal", p9wire.Tlopen, uint32(104), uint32(syscall.O_RDWR))
		fmt.Println("journal", int(e))
	}
}

// sendRecord writes rec to the journal opened as fid 100.
func (p *p9) sendRecord(rec journal.Record) syscall.Errno {
	b := journal.Append(nil, &rec)
	_, e := p.try("write journal", p9wire.Twrite, uint32(100), uint64(0), uint32(len(b)), b)
	return e
}

// newUUID is a random UUID (version 4, variant 1).
func newUUID(t *testing.T) string {
	h := []byte(hex.EncodeToString(randomBytes(t, 16)))
	h[12], h[16] = '4', '8'
	return string(h[:8]) + "-" + string(h[8:12]) + "-" + string(h[12:16]) + "-" + string(h[16:20]) + "-" + string(h[20:])
}

// secretTree is a LOWER with "secret", uid 1000's, mode 600.
func secretTree(t *testing.T) (lower string, ino uint64) {
	lower = tempDir(t)
	p := filepath.Join(lower, "secret")
	writeFile(t, p, []byte("secret\n"), 0o600)
	if err := os.Chown(p, 1000, 1000); err != nil {
		t.Fatal(err)
	}
	var st syscall.Stat_t
	if err := syscall.Stat(p, &st); err != nil {
		t.Fatal(err)
	}
	return lower, st.Ino
}

// openSocket lets every user connect to the unix socket sock, as an
// administrator may: what a peer may do is the kernel's word on who it is.
func openSocket(t *testing.T, sock string) {
	if err := os.Chmod(sock, 0o666); err != nil {
		t.Fatal(err)
	}
}

// TestIdentLocalPeers: without a key, a program of another user reaches
// the server over a unix socket or loopback TCP and attaches as uid 1000:
// refused (EPERM), while as itself it gets its own permissions, and root
// (a shale mount serving its users) may attach as anyone. Before the fix
// nobody read uid 1000's mode-600 file.
func TestIdentLocalPeers(t *testing.T) {
	lower, _ := secretTree(t)
	sock := filepath.Join(tempDir(t), "s.sock")
	serve(t, sock, lower)
	if fi, err := os.Stat(sock); err != nil || fi.Mode().Perm() != 0o660 {
		t.Errorf("the unix socket: %v, %v; want mode 0660", fi.Mode(), err)
	}
	openSocket(t, sock)
	addr := freePort(t)
	serve(t, addr, lower)
	for _, at := range [][2]string{{"unix", sock}, {"tcp", addr}} {
		p := probe(t, "read", at[0], at[1], "1000", "secret")
		if got := p.said("attach"); got != strconv.Itoa(int(syscall.EPERM)) {
			t.Errorf("%s: nobody attached as uid 1000: attach %s, read %s; want EPERM", at[0], got, p.said("read"))
		}
		p = probe(t, "read", at[0], at[1], "65534", "secret")
		if a, r := p.said("attach"), p.said("read"); a != "0" || r != strconv.Itoa(int(syscall.EACCES)) {
			t.Errorf("%s: nobody as itself: attach %s, read %s; want 0, EACCES", at[0], a, r)
		}
		root := dialAs(t, at[0], at[1], 1000)
		root.rpc("walk", p9wire.Twalk, uint32(0), uint32(1), uint16(1), "secret")
		root.rpc("open", p9wire.Tlopen, uint32(1), uint32(syscall.O_RDONLY))
		if b := root.rpc("read", p9wire.Tread, uint32(1), uint64(0), uint32(100)); string(b[4:]) != "secret\n" {
			t.Errorf("%s: root attached as uid 1000 read %q", at[0], b[4:])
		}
	}
}

// TestJournalForgedDirty: nobody names uid 1000's mode-600 file in a
// Dirty record: refused (EPERM), and the owner's open waits for nothing;
// nor may nobody open the owner's journal by its UUID. Before the fix the
// open waited the whole recall timeout (10 s).
func TestJournalForgedDirty(t *testing.T) {
	lower, ino := secretTree(t)
	sock := filepath.Join(tempDir(t), "s.sock")
	serve(t, sock, append(spriteArgs(), "--recall-timeout", "10s", lower)...)
	openSocket(t, sock)
	owner := dialAs(t, "unix", sock, 1000)
	uuid := newUUID(t)
	owner.openJournal(uuid)
	p := probe(t, "dirty", "unix", sock, strconv.FormatUint(ino, 10), uuid)
	if got := p.said("dirty"); got != strconv.Itoa(int(syscall.EPERM)) {
		t.Errorf("nobody's Dirty of uid 1000's file: %s, want EPERM", got)
	}
	if got := p.said("journal"); got != strconv.Itoa(int(syscall.EACCES)) {
		t.Errorf("nobody opened uid 1000's client's journal: %s, want EACCES", got)
	}
	owner.rpc("walk", p9wire.Twalk, uint32(0), uint32(1), uint16(1), "secret")
	start := time.Now()
	owner.rpc("open", p9wire.Tlopen, uint32(1), uint32(syscall.O_RDWR))
	el := time.Since(start)
	t.Logf("the owner's open after nobody's Dirty took %v", el)
	if el > 3*time.Second {
		t.Errorf("the owner's open took %v after nobody's Dirty: it waited for a recall", el)
	}
}

// TestJournalReclaimAfterRestart: after a server's kill -9, nobody
// reconnects first and reclaims the file uid 1000's client was writing:
// refused (EPERM), and the real writer's reclaim is taken. Before the fix
// nobody took the reclaim over and the writer's was refused (ESTALE).
func TestJournalReclaimAfterRestart(t *testing.T) {
	lower, ino := secretTree(t)
	sock := filepath.Join(tempDir(t), "s.sock")
	args := append(spriteArgs(), "--grace", "5s", lower)
	s := serve(t, sock, args...)
	writer := dialAs(t, "unix", sock, 1000)
	uuid := newUUID(t)
	writer.openJournal(uuid)
	writer.sendRecord(journal.Record{Kind: journal.Clean}) // the hello: it follows Sprite's rules
	writer.rpc("walk", p9wire.Twalk, uint32(0), uint32(1), uint16(1), "secret")
	writer.rpc("open", p9wire.Tlopen, uint32(1), uint32(syscall.O_RDWR))
	// The server records the writer's right on its disk; then it dies.
	rights := stateFile("rights-", "unix:"+sock, lower)
	waitFor(t, "the server records the writer's right to reclaim", func() string {
		if b, _ := os.ReadFile(rights); !strings.Contains(string(b), uuid) {
			return rights + ": " + string(b)
		}
		return ""
	})
	kill9(s)
	writer.c.Close()
	serve(t, sock, args...)
	openSocket(t, sock)
	p := probe(t, "dirty", "unix", sock, strconv.FormatUint(ino, 10), uuid)
	if got := p.said("dirty"); got != strconv.Itoa(int(syscall.EPERM)) {
		t.Errorf("nobody's reclaim of the file uid 1000's client wrote: %s, want EPERM", got)
	}
	again := dialAs(t, "unix", sock, 1000)
	again.openJournal(uuid)
	if e := again.sendRecord(journal.Record{Kind: journal.Dirty, Qid: p9wire.Qid{Path: ino}}); e != 0 {
		t.Errorf("the writer's own reclaim after the restart: %v", e)
	}
}

// publicLine is the line of keygen's output to list in authorized keys.
func publicLine(out string) string {
	for _, l := range strings.Split(out, "\n") {
		if strings.HasPrefix(l, "ed25519 ") {
			return l + "\n"
		}
	}
	return out
}

// stateFile is shale serve's file of the state dir for listen and what
// (cmd/shale/marker.go).
func stateFile(prefix, listen, what string) string {
	h := sha256.Sum256([]byte(listen + "\x00" + what))
	return filepath.Join("/var/lib/shale", prefix+hex.EncodeToString(h[:8]))
}

// TestIdentUserKey: a user key's holder may attach only as its user; the
// host key's as anyone; a key not listed, or one that trusts another
// server, gets no session.
func TestIdentUserKey(t *testing.T) {
	lower, _ := secretTree(t)
	dir := tempDir(t)
	host, user, stranger := filepath.Join(dir, "host"), filepath.Join(dir, "user"), filepath.Join(dir, "stranger")
	run(t, shale, "keygen", host)
	pub := strings.TrimSpace(run(t, shale, "keygen", "--public", host))
	line := publicLine(run(t, shale, "keygen", "--user", "nobody", "--server", pub, user))
	run(t, shale, "keygen", "--user", "nobody", "--server", pub, stranger)
	auth := filepath.Join(dir, "authorized")
	writeFile(t, auth, []byte("# test\n"+line), 0o644)
	addr := freePort(t)
	serve(t, addr, "--keyfile", host, "--authorized-keys", auth, lower)
	a := p9net.Addr{Network: "tcp", Address: addr}
	dial := func(key string) (net.Conn, error) {
		k, err := p9net.LoadKey(key)
		if err != nil {
			t.Fatal(err)
		}
		return p9net.Dial(context.Background(), a, k)
	}

	c, err := dial(user)
	if err != nil {
		t.Fatal(err)
	}
	p := session(t, c, 65534)
	if _, e := p.try("attach", p9wire.Tattach, uint32(1), p9wire.NoFid, "", "", uint32(1000)); e != syscall.EPERM {
		t.Errorf("a user key of nobody attached as uid 1000: %v, want EPERM", e)
	}
	c, err = dial(host)
	if err != nil {
		t.Fatal(err)
	}
	p = session(t, c, 1000)
	p.rpc("walk", p9wire.Twalk, uint32(0), uint32(1), uint16(1), "secret")
	p.rpc("open", p9wire.Tlopen, uint32(1), uint32(syscall.O_RDONLY))

	if c, err := dial(stranger); err == nil && answers(c) {
		t.Error("a user key the server does not list got a session")
	}
	other := filepath.Join(dir, "other")
	run(t, shale, "keygen", other)
	otherPub := strings.TrimSpace(run(t, shale, "keygen", "--public", other))
	pinned := filepath.Join(dir, "pinned")
	run(t, shale, "keygen", "--user", "nobody", "--server", otherPub, pinned)
	if c, err := dial(pinned); err == nil && answers(c) {
		t.Error("a user key that trusts another server took this one")
	}
}

// answers tells whether a server answers a Tversion on c (a TLS 1.3
// client's handshake ends before the server has checked its key), and
// closes c.
func answers(c net.Conn) bool {
	defer c.Close()
	c.SetDeadline(time.Now().Add(30 * time.Second))
	msg := p9wire.Encode(&p9wire.VersionReq{Msize: 8192, Version: p9wire.Version}, p9wire.NoTag)
	if _, err := c.Write(msg); err != nil {
		return false
	}
	_, err := io.ReadFull(c, make([]byte, 7))
	return err == nil
}
