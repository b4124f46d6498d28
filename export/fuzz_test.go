package export

import (
	"bytes"
	"io"
	"net"
	"os"
	"runtime"
	"testing"
	"time"

	"github.com/shalefs/shale/journal"
	"github.com/shalefs/shale/p9wire"
)

// seeds are message sequences of a whole session (also in
// testdata/fuzz/FuzzServe, which TestWriteFuzzCorpus writes).
func seeds() [][]byte {
	const nofid = ^uint32(0)
	cat := func(ms ...[]byte) []byte { return bytes.Join(ms, nil) }
	dropped := journal.Append(nil, &journal.Record{Kind: journal.Dropped, Qid: p9wire.Qid{Type: p9wire.QTDir, Path: 1}})
	hello := cat(
		frame(tVersion, 0xffff, uint32(8192), "9P2000.L"),
		frame(tAttach, 1, uint32(0), nofid, "", "", uint32(nobodyUid)),
	)
	return [][]byte{
		// List the root.
		cat(hello,
			twalk(2, 0, 1),
			frame(tLopen, 2, uint32(1), uint32(0)),
			frame(tReaddir, 2, uint32(1), uint64(0), uint32(4000)),
			frame(tClunk, 2, uint32(1))),
		// Create, write, read, stat, sync.
		cat(hello,
			twalk(2, 0, 1),
			frame(tLcreate, 2, uint32(1), "f", uint32(2), uint32(0o644), nofid),
			frame(tWrite, 3, uint32(1), uint64(0), uint32(5), []byte("hello")),
			frame(tRead, 4, uint32(1), uint64(0), uint32(100)),
			frame(tGetattr, 5, uint32(1), uint64(0x3fff)),
			frame(26, 6, uint32(1), uint32(8), uint32(0), uint32(0), uint32(0), uint64(2), uint64(0), uint64(0), uint64(0), uint64(0)), // Tsetattr size 2
			frame(50, 7, uint32(1), uint32(0)),                                                                                         // Tfsync
			frame(tClunk, 8, uint32(1))),
		// Directories and xattrs.
		cat(hello,
			frame(tMkdir, 2, uint32(0), "d", uint32(0o755), nofid),
			twalk(3, 0, 1, "d"),
			twalk(4, 1, 2),
			frame(tXattrcreate, 5, uint32(2), "user.x", uint64(3), uint32(0)),
			frame(tWrite, 6, uint32(2), uint64(0), uint32(3), []byte("abc")),
			frame(tClunk, 7, uint32(2)),
			frame(tXattrwalk, 8, uint32(1), uint32(3), "user.x"),
			frame(tRead, 9, uint32(3), uint64(0), uint32(3)),
			frame(tClunk, 10, uint32(3)),
			frame(tXattrwalk, 11, uint32(1), uint32(3), ""),
			frame(tClunk, 12, uint32(1)),
			frame(tUnlinkat, 13, uint32(0), "d", uint32(0x200))),
		// Locks, statfs, flush, remove.
		cat(hello,
			twalk(2, 0, 1),
			frame(tLcreate, 2, uint32(1), "l", uint32(2), uint32(0o644), nofid),
			tlock(3, 1, 1, 0, 0, 10),
			tlock(4, 1, 0, 1, 5, 0),
			tlock(5, 1, 2, 0, 0, 0),
			frame(tStatfs, 6, uint32(0)),
			frame(108, 7, uint16(6)),  // Tflush
			frame(122, 8, uint32(1))), // Tremove
		// Names: symlink, readlink, link, rename, mknod.
		cat(hello,
			frame(16, 2, uint32(0), "s", "target", nofid), // Tsymlink
			twalk(3, 0, 1, "s"),
			frame(22, 4, uint32(1)), // Treadlink
			frame(18, 5, uint32(0), "p", uint32(0o10644), uint32(0), uint32(0), nofid), // Tmknod fifo
			twalk(6, 0, 2, "p"),
			frame(tLopen, 7, uint32(2), uint32(0)),
			frame(70, 8, uint32(0), uint32(2), "p2"),       // Tlink
			frame(74, 9, uint32(0), "p2", uint32(0), "p3"), // Trenameat
			frame(20, 10, uint32(2), uint32(0), "p4"),      // Trename
			frame(tUnlinkat, 11, uint32(0), "p3", uint32(0)),
			frame(tUnlinkat, 12, uint32(0), "p4", uint32(0)),
			frame(tUnlinkat, 13, uint32(0), "s", uint32(0))),
		// A message larger than msize.
		cat(hello, frame(tWrite, 2, uint32(0), uint64(0), uint32(9000), make([]byte, 9000))),
		// Walks past the root, and a long one.
		cat(hello, twalk(2, 0, 1, "a", "b", "c"), twalk(3, 0, 0, "..")),
		// Tauth, "..", Tgetlock, a flush of a request in flight, Tversion again.
		cat(hello,
			frame(102, 2, nofid, "", "", uint32(0)), // Tauth
			frame(tMkdir, 3, uint32(0), "d", uint32(0o755), nofid),
			twalk(4, 0, 1, "d", "..", "d"),
			frame(tLcreate, 5, uint32(1), "g", uint32(2), uint32(0o644), nofid),
			frame(tGetlock, 6, uint32(1), uint8(1), uint64(0), uint64(0), uint32(1), "c"),
			twalk(7, 0, 2, blockName),
			frame(tFlush, 8, uint16(7)),
			frame(tVersion, 0xffff, uint32(8192), "9P2000.L")),
		// The journal tree: create a journal, read stats, follow a
		// directory, drop it, read (and flush) the journal, list the tree.
		cat(hello,
			frame(tAttach, 2, uint32(5), nofid, "", journal.Aname, uint32(nobodyUid)),
			frame(tLcreate, 3, uint32(5), "01234567-89ab-cdef-0123-456789abcdef", uint32(2), uint32(0o600), nofid),
			twalk(4, 5, 6, "..", "stats"),
			frame(tLopen, 5, uint32(6), uint32(0)),
			frame(tRead, 6, uint32(6), uint64(0), uint32(4000)),
			frame(tGetattr, 7, uint32(6), uint64(0x3fff)),
			frame(tMkdir, 8, uint32(0), "j", uint32(0o755), nofid),
			twalk(9, 0, 1, "j"),
			frame(tGetattr, 10, uint32(1), uint64(0x3fff)),
			frame(tWrite, 11, uint32(5), uint64(0), uint32(len(dropped)), dropped),
			frame(tRead, 12, uint32(5), uint64(0), uint32(4000)),
			frame(tFlush, 13, uint16(12)),
			twalk(14, 5, 7, ".."),
			frame(tLopen, 15, uint32(7), uint32(0)),
			frame(tReaddir, 16, uint32(7), uint64(0), uint32(4000)),
			frame(tUnlinkat, 17, uint32(0), "j", uint32(0x200))),
	}
}

// FuzzServe feeds arbitrary bytes to ServeConn: no panic, no hang, and
// when the connection ends no goroutine, node, handle or directory stream
// of it is left. Its bounds add up to under 10 s: past that the fuzzer
// kills the worker without a word, and a hang's stacks are lost.
func FuzzServe(f *testing.F) {
	for _, s := range seeds() {
		f.Add(s)
	}
	fx := newFixture(f, Options{MaxFids: 256})
	os.Chmod(fx.dir, 0o777) // nobody may make files
	f.Fuzz(func(t *testing.T, data []byte) {
		before := runtime.NumGoroutine()
		cli, srv := net.Pipe()
		served := make(chan struct{})
		go func() {
			fx.s.ServeConn(srv)
			close(served)
		}()
		go io.Copy(io.Discard, cli)
		wrote := make(chan struct{})
		go func() {
			cli.Write(data)
			close(wrote)
		}()
		// Whatever the server made of the bytes, the client then goes.
		select {
		case <-wrote:
		case <-served:
		case <-time.After(3 * time.Second):
			t.Fatal("the server neither read the input nor ended")
		}
		cli.Close()
		select {
		case <-served:
		case <-time.After(3 * time.Second):
			buf := make([]byte, 1<<20)
			t.Fatalf("ServeConn did not return after the client went:\n%s", buf[:runtime.Stack(buf, true)])
		}
		<-wrote
		if n := fx.s.panics.Load(); n != 0 {
			t.Fatalf("%d requests panicked (the log has their stacks)", n)
		}
		fx.c.check(t)
		// The library's goroutines of the connection end with it.
		deadline := time.Now().Add(3 * time.Second)
		for runtime.NumGoroutine() > before {
			if time.Now().After(deadline) {
				buf := make([]byte, 1<<20)
				t.Fatalf("%d goroutines before, %d after:\n%s", before, runtime.NumGoroutine(), buf[:runtime.Stack(buf, true)])
			}
			time.Sleep(time.Millisecond)
		}
	})
}

// TestWriteFuzzCorpus writes the seeds to testdata/fuzz/FuzzServe when
// EXPORT_WRITE_CORPUS is set; otherwise it checks that they are there.
func TestWriteFuzzCorpus(t *testing.T) {
	dir := "testdata/fuzz/FuzzServe"
	for i, s := range seeds() {
		name := dir + "/seed-" + string(rune('a'+i))
		want := []byte("go test fuzz v1\n[]byte(" + quote(s) + ")\n")
		if os.Getenv("EXPORT_WRITE_CORPUS") != "" {
			os.MkdirAll(dir, 0o755)
			if err := os.WriteFile(name, want, 0o644); err != nil {
				t.Fatal(err)
			}
			continue
		}
		if got, err := os.ReadFile(name); err != nil || !bytes.Equal(got, want) {
			t.Errorf("%s is not the seed (%v): run with EXPORT_WRITE_CORPUS=1", name, err)
		}
	}
}

// quote writes b as a Go string literal, as the fuzz corpus format wants.
func quote(b []byte) string {
	var s bytes.Buffer
	s.WriteByte('"')
	for _, c := range b {
		s.WriteString(`\x`)
		s.WriteByte("0123456789abcdef"[c>>4])
		s.WriteByte("0123456789abcdef"[c&15])
	}
	s.WriteByte('"')
	return s.String()
}
