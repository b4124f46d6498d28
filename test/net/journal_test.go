package net

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/shalefs/shale/journal"
	"github.com/shalefs/shale/p9wire"
)

// p9 is a raw 9P2000.L connection: what the journal tests send is small
// and exact, and no client library speaks the journal tree.
type p9 struct {
	t *testing.T
	c net.Conn
}

// dialAs connects to a server and attaches its tree as fid 0 as uid.
func dialAs(t *testing.T, network, address string, uid uint32) *p9 {
	t.Helper()
	c, err := net.Dial(network, address)
	if err != nil {
		t.Fatal(err)
	}
	return session(t, c, uid)
}

// session starts 9P on c and attaches as uid, as fid 0.
func session(t *testing.T, c net.Conn, uid uint32) *p9 {
	t.Helper()
	t.Cleanup(func() { c.Close() })
	p := &p9{t, c}
	p.rpc("version", p9wire.Tversion, uint32(64<<10), p9wire.Version)
	p.rpc("attach", p9wire.Tattach, uint32(0), p9wire.NoFid, "", "", uid)
	return p
}

// frame9p is a request of typ with tag and fields (uint8/16/32/64,
// string, []byte).
func frame9p(typ uint8, tag uint16, fields ...any) []byte {
	var b bytes.Buffer
	b.Write([]byte{0, 0, 0, 0, typ, byte(tag), byte(tag >> 8)})
	for _, f := range fields {
		switch v := f.(type) {
		case string:
			binary.Write(&b, binary.LittleEndian, uint16(len(v)))
			b.WriteString(v)
		case []byte:
			b.Write(v)
		default:
			binary.Write(&b, binary.LittleEndian, v)
		}
	}
	m := b.Bytes()
	binary.LittleEndian.PutUint32(m, uint32(len(m)))
	return m
}

// recv reads a reply: its type and body.
func (p *p9) recv() (uint8, []byte, error) {
	var hdr [7]byte
	if _, err := io.ReadFull(p.c, hdr[:]); err != nil {
		return 0, nil, err
	}
	body := make([]byte, binary.LittleEndian.Uint32(hdr[:])-7)
	_, err := io.ReadFull(p.c, body)
	return hdr[4], body, err
}

// rpc sends a request of typ with fields (uint8/16/32/64, string, []byte)
// and returns the reply's body; an Rlerror fails the test.
func (p *p9) rpc(what string, typ uint8, fields ...any) []byte {
	p.t.Helper()
	body, e := p.try(what, typ, fields...)
	if e != 0 {
		p.t.Fatalf("%s: %v", what, e)
	}
	return body
}

// try is rpc that returns an Rlerror's errno.
func (p *p9) try(what string, typ uint8, fields ...any) ([]byte, syscall.Errno) {
	p.t.Helper()
	// Generous: a journal read waits for another request's change.
	p.c.SetDeadline(time.Now().Add(60 * time.Second))
	if _, err := p.c.Write(frame9p(typ, 1, fields...)); err != nil {
		p.t.Fatalf("%s: %v", what, err)
	}
	rtyp, body, err := p.recv()
	if err != nil {
		p.t.Fatalf("%s: %v", what, err)
	}
	if rtyp == p9wire.Rlerror {
		return nil, syscall.Errno(binary.LittleEndian.Uint32(body))
	}
	return body, 0
}

// walkStat walks fid 0 to name as fid and returns its QID from Rgetattr.
func (p *p9) walkStat(fid uint32, name string) p9wire.Qid {
	p.t.Helper()
	p.rpc("walk "+name, p9wire.Twalk, uint32(0), fid, uint16(1), name)
	d := p9wire.Dec{B: p.rpc("getattr "+name, p9wire.Tgetattr, fid, uint64(p9wire.GetattrAll))}
	return d.Getattr().Qid
}

// openJournal attaches the journal tree as fid 100 and creates uuid's.
func (p *p9) openJournal(uuid string) {
	p.t.Helper()
	p.rpc("attach #journal", p9wire.Tattach, uint32(100), p9wire.NoFid, "", journal.Aname, uint32(os.Geteuid()))
	p.rpc("create journal", p9wire.Tlcreate, uint32(100), uuid, uint32(syscall.O_RDWR), uint32(0o600), p9wire.NoUID)
}

// readJournal reads the journal after seq off.
func (p *p9) readJournal(off uint64) []journal.Record {
	p.t.Helper()
	body := p.rpc("read journal", p9wire.Tread, uint32(100), off, uint32(60000))
	var recs []journal.Record
	for b := body[4:]; len(b) > 0; {
		r, rest, err := journal.Next(b)
		if err != nil {
			p.t.Fatal(err)
		}
		recs, b = append(recs, r), rest
	}
	return recs
}

// write writes data at 0 into name, on fid.
func (p *p9) write(fid uint32, name, data string) {
	p.t.Helper()
	p.rpc("walk "+name, p9wire.Twalk, uint32(0), fid, uint16(1), name)
	p.rpc("open "+name, p9wire.Tlopen, fid, uint32(syscall.O_WRONLY))
	p.rpc("write "+name, p9wire.Twrite, fid, uint64(0), uint32(len(data)), []byte(data))
	p.rpc("clunk", p9wire.Tclunk, fid)
}

// TestJournalUpstream: shale serve --upstream in front of diod. Two
// clients: a change through one is recorded in the other's journal, and
// not in its own.
func TestJournalUpstream(t *testing.T) {
	lower, _ := lowerTree(t)
	dir := tempDir(t)
	diodSock := filepath.Join(dir, "diod.sock")
	diod := exec.Command("diod", "-f", "-n", "-e", lower, "-l", diodSock, "-L", filepath.Join(dir, "diod.log"))
	if err := diod.Start(); err != nil {
		t.Skip("no diod:", err)
	}
	t.Cleanup(func() { diod.Process.Kill(); diod.Wait() })
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		if c, err := net.Dial("unix", diodSock); err == nil {
			c.Close()
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("diod did not listen within 30s")
		}
	}
	sock := filepath.Join(dir, "shale.sock")
	serve(t, sock, "--no-root-squash", "--upstream", "unix:"+diodSock+"?aname="+lower)

	a, b := dialAs(t, "unix", sock, 0), dialAs(t, "unix", sock, 0)
	a.openJournal("6a1b2c3d-0000-4000-8000-00000000000a")
	b.openJournal("6a1b2c3d-0000-4000-8000-00000000000b")
	qa := a.walkStat(1, "hello")
	b.walkStat(1, "hello")
	b.write(2, "hello", "HELLO")

	recs := a.readJournal(0)
	want := fmt.Sprintf("change %d data 0+5", qa.Path)
	if len(recs) == 0 || show(recs[0]) != want {
		t.Fatalf("a's journal: %v, want first %q", shows(recs), want)
	}
	if got, _ := os.ReadFile(filepath.Join(lower, "hello")); string(got) != "HELLO\n" {
		t.Errorf("upstream's file: %q", got)
	}
	// b's own write is not in its journal: its first record is a's.
	a.write(2, "hello", "h")
	recs = b.readJournal(0)
	if len(recs) == 0 || show(recs[0]) != want[:len(want)-1]+"1" {
		t.Fatalf("b's journal: %v, want first a's write", shows(recs))
	}
	// The stats file counts both journals.
	a.rpc("walk stats", p9wire.Twalk, uint32(100), uint32(101), uint16(2), "..", "stats")
	a.rpc("open stats", p9wire.Tlopen, uint32(101), uint32(syscall.O_RDONLY))
	stats := string(a.rpc("read stats", p9wire.Tread, uint32(101), uint64(0), uint32(60000))[4:])
	if !strings.Contains(stats, "\njournals 2\n") || !strings.Contains(stats, "\nrecords.sent 2\n") {
		t.Errorf("stats:\n%s", stats)
	}
}

// show and shows put records in a form tests compare.
func show(r journal.Record) string {
	if r.Kind != journal.Change {
		return fmt.Sprintf("kind %d", r.Kind)
	}
	s := fmt.Sprintf("change %d", r.Qid.Path)
	for _, f := range r.Fields {
		switch f.Type {
		case journal.Attrs:
			s += " attrs"
		case journal.Data:
			s += fmt.Sprintf(" data %d+%d", f.Off, f.Len)
		case journal.Entry:
			s += fmt.Sprintf(" entry %d %s", f.Op, f.Name)
		default:
			s += fmt.Sprintf(" type %d", f.Type)
		}
	}
	return s
}

func shows(rs []journal.Record) []string {
	var s []string
	for _, r := range rs {
		s = append(s, show(r))
	}
	return s
}
