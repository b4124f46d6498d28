package export

import (
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"
)

// reply is a reply's type (0 if the connection failed) and body.
type reply struct {
	typ  uint8
	body []byte
}

// send sends m over r and returns a channel that gets the reply, so that
// a test may watch a request wait.
func (r *raw) send(m []byte) <-chan reply {
	done := make(chan reply, 1)
	go func() {
		r.c.SetDeadline(time.Now().Add(time.Minute))
		var rp reply
		if _, err := r.c.Write(m); err == nil {
			if typ, body, err := r.recv(); err == nil {
				rp = reply{typ, body}
			}
		}
		done <- rp
	}()
	return done
}

// answeredOnly checks that ch gets no reply for a while, until the
// test's own step, then gets one of type typ: a request that waits for
// what step does.
func answeredOnly(t *testing.T, ch <-chan reply, typ uint8, what, after string, step func()) {
	t.Helper()
	select {
	case <-ch:
		t.Fatalf("%s was answered before %s", what, after)
	case <-time.After(2 * time.Second):
	}
	step()
	select {
	case r := <-ch:
		if r.typ != typ {
			t.Fatalf("%s: reply type %d", what, r.typ)
		}
	case <-time.After(30 * time.Second):
		t.Fatalf("%s was not answered once %s", what, after)
	}
}

// A request that changes names is answered once the other clients that
// cache the directory applied its record: a stat there after the change
// returned finds no old entry. A client that lets the wait time out is
// not waited for again until it caught up.
func TestNameChangeWaitsForJournals(t *testing.T) {
	f := newFixture(t, Options{NoRootSquash: true, NameWait: time.Minute})
	os.Mkdir(filepath.Join(f.dir, "d"), 0o755)
	c := f.jdial(t, testUUID, true)
	c.walkTo(t, 1, "d")
	j := f.s.ctl.find(testUUID)
	o := f.other(t)
	o.must(t, "walk d", twalk(1, 0, 60, "d"))
	created := o.send(frame(tLcreate, 2, uint32(60), "x", uint32(syscall.O_WRONLY), uint32(0o644), ^uint32(0)))
	recs := c.read(t, 0) // read, not yet applied: that is the next read
	// The client's next read says it applied the records before it; it
	// waits for more, which this test never reads.
	answeredOnly(t, created, tLcreate+1, "the create", "the other client applied its record", func() {
		c.c.Write(frame(tRead, 9, uint32(jfid), seqAfter(recs), uint32(60000)))
	})

	// The client reads no more: the unlink waits NameWait, once.
	f.s.ctl.nameWait = 100 * time.Millisecond
	o.must(t, "walk d", twalk(3, 0, 61, "d"))
	if r := <-o.send(frame(tUnlinkat, 4, uint32(61), "x", uint32(0))); r.typ != tUnlinkat+1 {
		t.Fatalf("the unlink: reply type %d", r.typ)
	}
	j.mu.Lock()
	late, base := j.late, j.base
	j.mu.Unlock()
	if late <= base {
		t.Fatalf("a client that did not apply the unlink's record in time is not late (late %d, applied %d)", late, base)
	}
	for _, m := range f.s.ctl.marks(nil) {
		if m.j == j {
			t.Fatal("a late client is waited for again")
		}
	}
}
