package export

import (
	"bytes"
	"encoding/binary"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/hugelgupf/p9/linux"

	"github.com/shalefs/shale/journal"
	"github.com/shalefs/shale/p9wire"
)

const (
	testUUID = "0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0"
	jfid     = 100 // the journal's fid in these tests
)

// jclient is a raw connection with its journal open on jfid and the main
// tree attached on fid 0.
type jclient struct {
	*raw
	tag uint16
}

// jdial connects, attaches both trees and opens the journal of uuid,
// creating it if create is set (else walking to it). It fails t if the
// open fails.
func (f *fixture) jdial(t *testing.T, uuid string, create bool) *jclient {
	t.Helper()
	c, e := f.tryJdial(t, uuid, create)
	if e != 0 {
		t.Fatalf("opening journal %s (create %v): errno %d", uuid, create, e)
	}
	return c
}

func (f *fixture) tryJdial(t *testing.T, uuid string, create bool) (*jclient, uint32) {
	t.Helper()
	c := &jclient{raw: f.rawDial(t), tag: 1}
	c.handshake(t, 64<<10, 0)
	c.must(t, "attach #journal", frame(tAttach, 2, uint32(jfid), ^uint32(0), "", journal.Aname, uint32(0)))
	var typ uint8
	var body []byte
	if create {
		typ, body = c.rpc(t, frame(tLcreate, 3, uint32(jfid), uuid, uint32(syscall.O_RDWR), uint32(0o600), ^uint32(0)))
	} else {
		if typ, body = c.rpc(t, twalk(3, jfid, jfid, uuid)); typ != rLerror {
			typ, body = c.rpc(t, frame(tLopen, 3, uint32(jfid), uint32(syscall.O_RDWR)))
		}
	}
	if e, err := lerror(typ, body); err == nil {
		return nil, e
	}
	return c, 0
}

// walkTo walks fid 0 to path into newfid and getattrs it: the client
// caches what it learnt.
func (c *jclient) walkTo(t *testing.T, newfid uint32, path ...string) p9wire.Qid {
	t.Helper()
	c.must(t, "walk", twalk(4, 0, newfid, path...))
	body := c.must(t, "getattr", frame(tGetattr, 4, newfid, uint64(0x3fff)))
	d := p9wire.Dec{B: body}
	return d.Getattr().Qid
}

// read reads the journal at off and returns its records; it fails t if
// nothing comes within the timeout.
func (c *jclient) read(t *testing.T, off uint64) []journal.Record {
	t.Helper()
	body := c.must(t, "journal read", frame(tRead, 9, uint32(jfid), off, uint32(60000)))
	n := binary.LittleEndian.Uint32(body)
	var recs []journal.Record
	for b := body[4 : 4+n]; len(b) > 0; {
		r, rest, err := journal.Next(b)
		if err != nil {
			t.Fatalf("journal read: %v", err)
		}
		recs = append(recs, r)
		b = rest
	}
	if len(recs) == 0 {
		t.Fatal("journal read: no records")
	}
	return recs
}

// other is a second client, without a journal, that changes files.
func (f *fixture) other(t *testing.T) *raw {
	r := f.rawDial(t)
	r.handshake(t, 64<<10, 0)
	return r
}

// write writes data at off into path below the root, over r.
func write(t *testing.T, r *raw, path string, off uint64, data string) {
	t.Helper()
	r.must(t, "walk", twalk(1, 0, 50, strings.Split(path, "/")...))
	r.must(t, "open", frame(tLopen, 1, uint32(50), uint32(syscall.O_WRONLY)))
	r.must(t, "write", frame(tWrite, 1, uint32(50), off, uint32(len(data)), []byte(data)))
	r.must(t, "clunk", frame(tClunk, 1, uint32(50)))
}

func chmod(t *testing.T, r *raw, path string, mode uint32) {
	t.Helper()
	r.must(t, "walk", twalk(1, 0, 51, strings.Split(path, "/")...))
	r.must(t, "setattr", frame(tSetattr, 1, uint32(51), uint32(p9wire.SetattrMode), mode, uint32(0), uint32(0), uint64(0),
		uint64(0), uint64(0), uint64(0), uint64(0)))
	r.must(t, "clunk", frame(tClunk, 1, uint32(51)))
}

// show is a record in a form tests compare.
func show(r journal.Record) string {
	var b strings.Builder
	switch r.Kind {
	case journal.Reset:
		return "reset"
	case journal.Change:
		b.WriteString("change " + strconv.FormatUint(r.Qid.Path, 10))
	default:
		return "kind " + strconv.Itoa(int(r.Kind))
	}
	for _, f := range r.Fields {
		switch f.Type {
		case journal.Attrs:
			b.WriteString(" attrs")
		case journal.Data:
			b.WriteString(" data " + strconv.FormatUint(f.Off, 10) + "+" + strconv.FormatUint(f.Len, 10))
		case journal.Entry:
			b.WriteString(" entry " + strconv.Itoa(int(f.Op)) + " " + f.Name)
		default:
			b.WriteString(" type " + strconv.Itoa(int(f.Type)))
		}
	}
	return b.String()
}

func shows(rs []journal.Record) []string {
	var s []string
	for _, r := range rs {
		s = append(s, show(r))
	}
	return s
}

// What another client changes in what a journal's client walked to comes
// as Change records with exact fields, in order, with the server's epoch
// and growing seqs; what nobody walked to makes none.
func TestJournalChanges(t *testing.T) {
	f := newFixture(t, Options{NoRootSquash: true})
	os.WriteFile(filepath.Join(f.dir, "f"), []byte("0123456789"), 0o644)
	os.WriteFile(filepath.Join(f.dir, "unseen"), nil, 0o644)
	os.Mkdir(filepath.Join(f.dir, "d"), 0o755)
	c := f.jdial(t, testUUID, true)
	qf := c.walkTo(t, 1, "f")
	qd := c.walkTo(t, 2, "d")
	o := f.other(t)

	write(t, o, "unseen", 0, "x")
	write(t, o, "f", 3, "abcd")
	chmod(t, o, "f", 0o600)
	o.must(t, "walk d", twalk(1, 0, 60, "d"))
	o.must(t, "create d/x", frame(tLcreate, 1, uint32(60), "x", uint32(syscall.O_WRONLY), uint32(0o644), ^uint32(0)))
	o.must(t, "clunk", frame(tClunk, 1, uint32(60)))
	o.must(t, "walk d", twalk(1, 0, 61, "d"))
	o.must(t, "unlink d/x", frame(tUnlinkat, 1, uint32(61), "x", uint32(0)))

	var got []journal.Record
	for len(got) < 4 {
		var off uint64
		if len(got) > 0 {
			off = got[len(got)-1].Seq
		}
		got = append(got, c.read(t, off)...)
	}
	fp, dp := strconv.FormatUint(qf.Path, 10), strconv.FormatUint(qd.Path, 10)
	want := []string{
		"change " + fp + " data 3+4",
		"change " + fp + " attrs",
		"change " + dp + " attrs entry 0 x",
		"change " + dp + " attrs entry 0 x",
	}
	if s := shows(got); strings.Join(s, "\n") != strings.Join(want, "\n") {
		t.Fatalf("records:\n%s\nwant:\n%s", strings.Join(s, "\n"), strings.Join(want, "\n"))
	}
	for i, r := range got {
		if r.Epoch != f.s.Epoch() || r.Seq != uint64(i+1) || r.Qid.Type != []uint8{0, 0, p9wire.QTDir, p9wire.QTDir}[i] {
			t.Errorf("record %d: epoch %x seq %d qid type %d; want epoch %x, seq %d", i, r.Epoch, r.Seq, r.Qid.Type, f.s.Epoch(), i+1)
		}
	}
	_ = qd
	_ = bytes.Equal
	_ = time.Second
	_ = linux.EINTR
}

// KeepsOffsets: the counting layer passes data through as it is, so
// journals may name byte ranges.
func (n *cnode) KeepsOffsets() bool { return true }
