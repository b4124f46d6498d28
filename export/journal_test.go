package export

import (
	"encoding/binary"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/hugelgupf/p9/linux"

	"github.com/shalefs/shale/fuseview"
	"github.com/shalefs/shale/hostfs"
	"github.com/shalefs/shale/journal"
	"github.com/shalefs/shale/layer"
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
func (f *fixture) jdial(t testing.TB, uuid string, create bool) *jclient {
	t.Helper()
	c, e := f.tryJdial(t, uuid, create)
	if e != 0 {
		t.Fatalf("opening journal %s (create %v): errno %d", uuid, create, e)
	}
	return c
}

func (f *fixture) tryJdial(t testing.TB, uuid string, create bool) (*jclient, uint32) {
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
}

// KeepsOffsets: the counting layer passes data through as it is, so
// journals may name byte ranges.
func (n *cnode) KeepsOffsets() bool { return true }

// seqAfter is the seq to read after: the last record's.
func seqAfter(rs []journal.Record) uint64 { return rs[len(rs)-1].Seq }

// A client's own changes are not echoed to it; Dropped QIDs make no more
// records. The record after them is the other client's change to d.
func TestJournalOwnAndDropped(t *testing.T) {
	f := newFixture(t, Options{NoRootSquash: true})
	os.WriteFile(filepath.Join(f.dir, "f"), []byte("0123456789"), 0o644)
	os.Mkdir(filepath.Join(f.dir, "d"), 0o755)
	c := f.jdial(t, testUUID, true)
	qf := c.walkTo(t, 1, "f")
	qd := c.walkTo(t, 2, "d")
	write(t, c.raw, "f", 0, "own")
	chmod(t, c.raw, "d", 0o700)

	var drop []byte
	drop = journal.Append(drop, &journal.Record{Kind: journal.Dropped, Qid: qf})
	c.must(t, "write Dropped", frame(tWrite, 5, uint32(jfid), uint64(0), uint32(len(drop)), drop))
	o := f.other(t)
	write(t, o, "f", 0, "other")
	chmod(t, o, "d", 0o755)
	got := c.read(t, 0)
	if s := shows(got); len(s) != 1 || s[0] != "change "+strconv.FormatUint(qd.Path, 10)+" attrs" {
		t.Fatalf("records: %q; want only the other's chmod of d", s)
	}
	// Walking to f again follows it again.
	c.walkTo(t, 3, "f")
	write(t, o, "f", 0, "again")
	if s := shows(c.read(t, seqAfter(got))); len(s) != 1 || s[0] != "change "+strconv.FormatUint(qf.Path, 10)+" data 0+5" {
		t.Fatalf("records after walking to f again: %q", s)
	}
	// A write of anything but well-framed Dropped records is refused.
	bad := journal.Append(nil, &journal.Record{Kind: journal.Reset})
	for _, b := range [][]byte{bad, drop[:len(drop)-1]} {
		if e, err := lerror(c.rpc(t, frame(tWrite, 5, uint32(jfid), uint64(0), uint32(len(b)), b))); err != nil || e != uint32(linux.EINVAL) {
			t.Errorf("write of %x: %d %v, want EINVAL", b, e, err)
		}
	}
}

// A blocked read ends with its Tflush (EINTR, before Rflush), with the
// fid's clunk and with the connection.
func TestJournalBlockedRead(t *testing.T) {
	f := newFixture(t, Options{})
	c := f.jdial(t, testUUID, true)
	c.c.SetDeadline(time.Now().Add(30 * time.Second))
	if _, err := c.c.Write(frame(tRead, 9, uint32(jfid), uint64(0), uint32(4096))); err != nil {
		t.Fatal(err)
	}
	// Other requests are served meanwhile.
	c.must(t, "getattr while the read waits", frame(tGetattr, 6, uint32(0), uint64(0x3fff)))
	if _, err := c.c.Write(frame(tFlush, 10, uint16(9))); err != nil {
		t.Fatal(err)
	}
	typ, body, err := c.recv()
	if e, lerr := lerror(typ, body); err != nil || lerr != nil || e != uint32(linux.EINTR) {
		t.Fatalf("the flushed read: type %d %x %v; want EINTR", typ, body, err)
	}
	if typ, _, err := c.recv(); err != nil || typ != tFlush+1 {
		t.Fatalf("after the read: type %d %v, want Rflush", typ, err)
	}

	// A clunk ends a read on its fid.
	c.must(t, "walk", twalk(7, jfid, 101))
	c.must(t, "open", frame(tLopen, 7, uint32(101), uint32(syscall.O_RDWR)))
	if _, err := c.c.Write(frame(tRead, 9, uint32(101), uint64(0), uint32(4096))); err != nil {
		t.Fatal(err)
	}
	if _, err := c.c.Write(frame(tClunk, 11, uint32(101))); err != nil {
		t.Fatal(err)
	}
	tags := map[uint16]uint8{}
	for len(tags) < 2 {
		var hdr [7]byte
		if _, err := io.ReadFull(c.c, hdr[:]); err != nil {
			t.Fatalf("after clunk: %v", err)
		}
		io.CopyN(io.Discard, c.c, int64(binary.LittleEndian.Uint32(hdr[:]))-7)
		tags[binary.LittleEndian.Uint16(hdr[5:])] = hdr[4]
	}
	if tags[9] != rLerror || tags[11] != tClunk+1 {
		t.Fatalf("replies by tag: %v; want an error for the read and Rclunk", tags)
	}

	// A Tversion ends the reads of the session before.
	if _, err := c.c.Write(frame(tRead, 9, uint32(jfid), uint64(0), uint32(4096))); err != nil {
		t.Fatal(err)
	}
	if _, err := c.c.Write(frame(tVersion, 0xffff, uint32(64<<10), "9P2000.L")); err != nil {
		t.Fatal(err)
	}
	for _, want := range []uint8{rLerror, tVersion + 1} {
		if typ, _, err := c.recv(); err != nil || typ != want {
			t.Fatalf("after Tversion: type %d %v, want %d", typ, err, want)
		}
	}
	c.must(t, "attach", frame(tAttach, 1, uint32(0), ^uint32(0), "", "", uint32(0)))
	c.must(t, "attach #journal", frame(tAttach, 2, uint32(jfid), ^uint32(0), "", journal.Aname, uint32(0)))
	c.must(t, "walk", twalk(3, jfid, jfid, testUUID))
	c.must(t, "open", frame(tLopen, 3, uint32(jfid), uint32(syscall.O_RDWR)))

	// The connection's end ends a read.
	if _, err := c.c.Write(frame(tRead, 9, uint32(jfid), uint64(0), uint32(4096))); err != nil {
		t.Fatal(err)
	}
	c.c.Close()
	select {
	case <-c.done:
	case <-time.After(30 * time.Second):
		t.Fatal("the connection's end left a journal read waiting")
	}
}

// A journal outlives its connection: a client back reads what it missed,
// about what it walked to before. One gone longer than JournalAge is
// deleted: walking to it fails, and Tlcreate makes a new one.
func TestJournalReconnect(t *testing.T) {
	f := newFixture(t, Options{NoRootSquash: true, JournalAge: time.Hour})
	os.WriteFile(filepath.Join(f.dir, "f"), nil, 0o644)
	c := f.jdial(t, testUUID, true)
	qf := c.walkTo(t, 1, "f")
	o := f.other(t)
	write(t, o, "f", 0, "one")
	got := c.read(t, 0)
	c.c.Close()
	<-c.done
	write(t, o, "f", 3, "two")
	if _, e := f.tryJdial(t, testUUID, true); e != uint32(linux.EEXIST) {
		t.Fatalf("Tlcreate of a journal that exists: errno %d, want EEXIST", e)
	}
	c = f.jdial(t, testUUID, false)
	want := "change " + strconv.FormatUint(qf.Path, 10) + " data 3+3"
	if s := shows(c.read(t, seqAfter(got))); len(s) != 1 || s[0] != want {
		t.Fatalf("after reconnecting: %q, want %q", s, want)
	}

	f.s.ctl.maxAge = time.Nanosecond
	c.c.Close()
	<-c.done
	time.Sleep(time.Millisecond)
	if _, e := f.tryJdial(t, testUUID, false); e != uint32(linux.ENOENT) {
		t.Fatalf("walk to a journal gone too long: errno %d, want ENOENT", e)
	}
	c = f.jdial(t, testUUID, true)
	c.walkTo(t, 1, "f")
	write(t, o, "f", 0, "three")
	if got := c.read(t, 0); len(got) != 1 || got[0].Seq != 1 {
		t.Fatalf("the new journal's first read: %q", shows(got))
	}
}

// Past JournalRecords the queue becomes one Reset; past JournalInterest
// too; a read at a seq the journal does not have (one from before a
// Reset, or from another journal) is answered a Reset with a new seq.
// After a Reset the journal follows nothing until walked to again.
func TestJournalBounds(t *testing.T) {
	f := newFixture(t, Options{NoRootSquash: true, JournalRecords: 2, JournalInterest: 3})
	os.WriteFile(filepath.Join(f.dir, "f"), nil, 0o644)
	os.WriteFile(filepath.Join(f.dir, "g"), nil, 0o644)
	os.WriteFile(filepath.Join(f.dir, "h"), nil, 0o644)
	c := f.jdial(t, testUUID, true)
	c.walkTo(t, 1, "f") // the root and f
	o := f.other(t)
	for i := range 3 {
		write(t, o, "f", uint64(i), "x")
	}
	got := c.read(t, 0)
	if s := shows(got); len(s) != 1 || s[0] != "reset" || got[0].Seq != 3 {
		t.Fatalf("after 3 records into 2: %q (seq %d), want one reset of seq 3", s, got[0].Seq)
	}
	write(t, o, "f", 0, "y") // followed no more: no record
	// Read again before the reset, it is still the reply; past the
	// journal's newest seq, a new reset.
	for _, w := range []struct{ off, seq uint64 }{{1, 3}, {100, 4}, {2, 4}} {
		r := c.read(t, w.off)
		if s := shows(r); len(s) != 1 || s[0] != "reset" || r[0].Seq != w.seq {
			t.Fatalf("read at %d: %q (seq %d), want a reset of seq %d", w.off, s, r[0].Seq, w.seq)
		}
		got = r
	}
	c.walkTo(t, 11, "f")
	c.walkTo(t, 12, "g")
	c.walkTo(t, 0)       // the root, by the getattr
	c.walkTo(t, 13, "h") // the fourth QID
	r := c.read(t, seqAfter(got))
	if s := shows(r); len(s) != 1 || s[0] != "reset" {
		t.Fatalf("past the interest bound: %q, want a reset", s)
	}
	// The QID that overflowed is followed: the reset came before it.
	write(t, o, "h", 0, "z")
	if s := shows(c.read(t, seqAfter(r))); len(s) != 1 || !strings.HasSuffix(s[0], " data 0+1") {
		t.Fatalf("after the interest reset: %q", s)
	}
}

// A restarted controller (a new server on the same stack) knows no
// journal: walking to one fails, Tlcreate makes it; its epoch differs.
func TestJournalRestart(t *testing.T) {
	f := newFixture(t, Options{})
	c := f.jdial(t, testUUID, true)
	c.c.Close()
	<-c.done
	epoch := f.s.Epoch()
	f.s = New(f.st, map[string]layer.Node{"": f.root}, Options{})
	if _, e := f.tryJdial(t, testUUID, false); e != uint32(linux.ENOENT) {
		t.Fatalf("walk to a journal of before the restart: errno %d, want ENOENT", e)
	}
	f.jdial(t, testUUID, true)
	if f.s.Epoch() == epoch {
		t.Errorf("epoch %x both before and after the restart", epoch)
	}
}

// Names the journal tree refuses, a second journal on one connection, a
// count too small for a record.
func TestJournalRefusals(t *testing.T) {
	f := newFixture(t, Options{NoRootSquash: true})
	os.WriteFile(filepath.Join(f.dir, "f"), nil, 0o644)
	for _, name := range []string{"x", strings.ToUpper(testUUID), testUUID[:35] + "g", testUUID + "0", "stats"} {
		_, e := f.tryJdial(t, name, true)
		if want := uint32(linux.EINVAL); name == "stats" && e == 0 || name != "stats" && e != want {
			t.Errorf("Tlcreate %q: errno %d", name, e)
		}
		if _, e := f.tryJdial(t, name, false); e != uint32(linux.ENOENT) && name != "stats" {
			t.Errorf("walk to %q: errno %d, want ENOENT", name, e)
		}
	}
	c := f.jdial(t, testUUID, true)
	c.must(t, "attach #journal", frame(tAttach, 2, uint32(200), ^uint32(0), "", journal.Aname, uint32(0)))
	other := "11111111-2222-3333-4444-555555555555"
	if e, err := lerror(c.rpc(t, frame(tLcreate, 3, uint32(200), other, uint32(syscall.O_RDWR), uint32(0o600), ^uint32(0)))); err != nil || e != uint32(linux.EBUSY) {
		t.Errorf("a second journal on one connection: %d %v, want EBUSY", e, err)
	}
	c.walkTo(t, 1, "f")
	write(t, f.other(t), "f", 0, "x")
	if e, err := lerror(c.rpc(t, frame(tRead, 9, uint32(jfid), uint64(0), uint32(20)))); err != nil || e != uint32(linux.EINVAL) {
		t.Errorf("a read too small for the record: %d %v, want EINVAL", e, err)
	}
	if len(c.read(t, 0)) != 1 {
		t.Error("the record is lost after a read too small for it")
	}
}

// The stats file: one "name value" a line, counting requests, journals and
// records.
func TestJournalStats(t *testing.T) {
	f := newFixture(t, Options{NoRootSquash: true})
	os.WriteFile(filepath.Join(f.dir, "f"), nil, 0o644)
	c := f.jdial(t, testUUID, true)
	c.walkTo(t, 1, "f")
	write(t, f.other(t), "f", 0, "x")
	c.read(t, 0)
	c.must(t, "walk stats", twalk(7, jfid, 102, "..", "stats"))
	c.must(t, "open stats", frame(tLopen, 7, uint32(102), uint32(syscall.O_RDONLY)))
	body := c.must(t, "read stats", frame(tRead, 7, uint32(102), uint64(0), uint32(60000)))
	stats := map[string]uint64{}
	for _, l := range strings.Split(strings.TrimSuffix(string(body[4:]), "\n"), "\n") {
		name, v, ok := strings.Cut(l, " ")
		n, err := strconv.ParseUint(v, 10, 64)
		if !ok || err != nil || strings.Contains(v, " ") {
			t.Fatalf("stats line %q", l)
		}
		stats[name] = n
	}
	for name, want := range map[string]uint64{"journals": 1, "journals.connected": 1, "records.sent": 1, "records.made": 1,
		"records.queued": 1, "resets": 0, "requests.Tlcreate": 1, "connections": 2, "interest": 1, "epoch": f.s.Epoch()} {
		if stats[name] != want {
			t.Errorf("stats %s = %d, want %d", name, stats[name], want)
		}
	}
	if stats["requests"] < 10 || stats["bytes.in"] == 0 || stats["bytes.out"] == 0 {
		t.Errorf("stats: %v", stats)
	}
}

// Changes made beside shale in the lower directory reach journals
// through the watch.
func TestJournalLowerChange(t *testing.T) {
	f := newFixture(t, Options{NoRootSquash: true})
	os.WriteFile(filepath.Join(f.dir, "f"), nil, 0o644)
	stop, err := hostfs.Watch(f.host, "inotify", nil)
	if err != nil {
		t.Skip("no watch:", err)
	}
	defer stop()
	c := f.jdial(t, testUUID, true)
	qf := c.walkTo(t, 1, "f")
	root := c.walkTo(t, 2)
	if err := os.WriteFile(filepath.Join(f.dir, "f"), []byte("beside"), 0o644); err != nil {
		t.Fatal(err)
	}
	os.WriteFile(filepath.Join(f.dir, "new"), nil, 0o644)
	var seen []string
	for off := uint64(0); ; {
		rs := c.read(t, off)
		seen = append(seen, shows(rs)...)
		off = seqAfter(rs)
		all := strings.Join(seen, "\n")
		if strings.Contains(all, "change "+strconv.FormatUint(qf.Path, 10)+" data") &&
			strings.Contains(all, "change "+strconv.FormatUint(root.Path, 10)+" attrs entry 0 new") {
			break
		}
	}
}

// Changes made through a FUSE view of the same stack reach journals.
func TestJournalFUSEChange(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("mounting FUSE needs root")
	}
	f := newFixture(t, Options{NoRootSquash: true})
	os.WriteFile(filepath.Join(f.dir, "f"), []byte("old"), 0o644)
	mnt := t.TempDir()
	srv, err := fuseview.Mount(mnt, f.st, f.host, fuseview.Options{Timeout: time.Hour, Coherent: true, Source: f.dir})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Unmount() })
	c := f.jdial(t, testUUID, true)
	qf := c.walkTo(t, 1, "f")
	if err := os.Chmod(filepath.Join(mnt, "f"), 0o600); err != nil {
		t.Fatal(err)
	}
	want := "change " + strconv.FormatUint(qf.Path, 10) + " attrs"
	if s := shows(c.read(t, 0)); len(s) == 0 || s[0] != want {
		t.Fatalf("records after a chmod through FUSE: %q, want first %q", s, want)
	}
}
