package net

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
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/shalefs/shale/internal/shaletest"
	"github.com/shalefs/shale/journal"
	"github.com/shalefs/shale/p9net"
	"github.com/shalefs/shale/p9wire"
)

// Bounds no client can break (issue 28): connections that never speak,
// or speak and go quiet, do not lock others out; journals of clients gone
// do not grow the server without bound.

// raiseNoFile lets the test process hold n descriptors.
func raiseNoFile(t *testing.T, n uint64) {
	if got, err := shaletest.RaiseNoFile(n); err != nil || got < n {
		t.Skipf("cannot hold %d descriptors (limit %d): %v", n, got, err)
	}
}

// keep closes c when the test ends.
func keep(t *testing.T, mu *sync.Mutex, c net.Conn) {
	mu.Lock()
	defer mu.Unlock()
	t.Cleanup(func() { c.Close() })
}

// TestConnectionFlood: 1,000 connections that never start TLS and 1,000
// that authenticate, attach and go quiet leave a client with the key able
// to mount. Before, 128 silent ones held every handshake slot and 64
// quiet ones every session, for as long as they stayed: the mount was
// refused ("the server holds another key").
func TestConnectionFlood(t *testing.T) {
	raiseNoFile(t, 8192)
	lower, _ := lowerTree(t)
	key := filepath.Join(tempDir(t), "key")
	writeFile(t, key, []byte("a key of twenty-four b\n"), 0o600)
	addr := freePort(t)
	serve(t, addr, "--keyfile", key, lower)
	k, err := p9net.LoadKey(key)
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	t0 := time.Now()
	for range 1000 {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		keep(t, &mu, c)
	}
	// The quiet ones, 32 at a time: each authenticates, asks for a
	// session, attaches and says no more.
	var wg sync.WaitGroup
	sem := make(chan struct{}, 32)
	for range 1000 {
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			c, err := p9net.Dial(ctx, p9net.Addr{Network: "tcp", Address: addr}, k)
			if err != nil {
				return // its handshake made room for another's
			}
			keep(t, &mu, c)
			c.SetWriteDeadline(time.Now().Add(30 * time.Second))
			c.Write(append(frame9p(p9wire.Tversion, 0xffff, uint32(64<<10), p9wire.Version),
				frame9p(p9wire.Tattach, 1, uint32(0), p9wire.NoFid, "", "", uint32(0))...))
		})
	}
	wg.Wait()
	t.Logf("flood made in %v", time.Since(t0).Round(time.Millisecond))

	start := time.Now()
	m := mount(t, "9p://"+addr+"/?keyfile="+key)
	took := time.Since(start)
	if b, err := os.ReadFile(filepath.Join(m, "hello")); err != nil || string(b) != "hello\n" {
		t.Fatalf("read through the mount: %q, %v", b, err)
	}
	ss := urlStats(t, "9p://"+addr+"/?keyfile="+key)
	t.Logf("mounted in %v with 1,000 silent and 1,000 quiet connections (issue 28's target: 2 s); reaped %d, refused %d",
		took, ss["connections.reaped"], ss["connections.refused"])
	// The target is 2 s on an idle machine: a quiet session must have
	// been idle --idle (2 s) to make room. Generous for a busy one.
	if took > 20*time.Second {
		t.Errorf("mount took %v", took)
	}
}

// TestReapedMountWorks: a mount that is merely quiet, closed to admit
// another client when --max-conns are connected, goes on working: its
// delayed write reaches the server, and it reads and lists.
func TestReapedMountWorks(t *testing.T) {
	lower, _ := lowerTree(t)
	addr := freePort(t)
	serve(t, addr, append(spriteArgs(), "--max-conns", "2", lower)...) // its log ends a failure
	log := filepath.Join(tempDir(t), "a.log")
	a := mount(t, "9p://"+addr+"/", "--write-delay", "1h", "--log", log)
	writeFile(t, filepath.Join(a, "delayed"), []byte("written while quiet"), 0o644)
	// A client with a file open: busier than the quiet mount.
	dial := func() *p9 { return dialAs(t, "tcp", addr, 0) }
	r1 := dial()
	r1.rpc("walk", p9wire.Twalk, uint32(0), uint32(1), uint16(1), "hello")
	r1.rpc("open", p9wire.Tlopen, uint32(1), uint32(syscall.O_RDONLY))
	// Takes the quiet mount's session, once it has been idle. On a busy
	// machine the mount may have taken a session again meanwhile (its
	// journal reconnects), and is reaped again once idle: asked again.
	waitFor(t, "a session for another client", func() string {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			return err.Error()
		}
		p := &p9{t, c}
		if _, e := p.try("version", p9wire.Tversion, uint32(64<<10), p9wire.Version); e != 0 {
			c.Close()
			time.Sleep(100 * time.Millisecond)
			return "version: " + e.Error()
		}
		t.Cleanup(func() { c.Close() })
		p.rpc("attach", p9wire.Tattach, uint32(0), p9wire.NoFid, "", "", uint32(0))
		return ""
	})
	waitFor(t, "the mount's connection closed", func() string {
		if ss := serverStats(t, addr); ss["connections.reaped"] < 1 {
			return fmt.Sprintf("reaped %d", ss["connections.reaped"])
		}
		return ""
	})
	if b, err := os.ReadFile(filepath.Join(a, "sub", "a")); err != nil || string(b) != "a" {
		t.Fatalf("read through the reaped mount: %q, %v", b, err)
	}
	if es, err := os.ReadDir(a); err != nil || len(es) < 4 {
		t.Fatalf("list through the reaped mount: %d entries, %v", len(es), err)
	}
	run(t, "sync", filepath.Join(a, "delayed"))
	if msg := lowerHas(filepath.Join(lower, "delayed"), []byte("written while quiet"))(); msg != "" {
		t.Error(msg)
	}
}

// rss is process pid's resident set, in bytes.
func rss(t *testing.T, pid int) uint64 {
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "VmRSS:"); ok {
			kb, _ := strconv.ParseUint(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			return kb << 10
		}
	}
	t.Fatal("no VmRSS")
	return 0
}

// TestAbandonedJournals: 1,000 journals of clients gone and 100,000
// changes (mkdir and rmdir) to what they cached keep the server under
// 100 MB. Before, every
// journal queued up to 65,536 records for an hour: 200 journals and
// 40,000 mkdirs took it to 690 MB.
func TestAbandonedJournals(t *testing.T) {
	const journals, changes, limit = 1000, 100000, 100 << 20
	lower := tempDir(t)
	os.Mkdir(filepath.Join(lower, "d"), 0o755)
	addr := freePort(t)
	s := serve(t, addr, "--no-root-squash", lower)
	dial := func() *p9 { return dialAs(t, "tcp", addr, 0) }
	// Eight clients at a time, each sequential: a request whose reply
	// is an Rlerror ends the connection, and the count comes short.
	start := time.Now()
	var made atomic.Int64
	var wg sync.WaitGroup
	for w := range 8 {
		wg.Go(func() {
			for i := w; i < journals; i += 8 {
				c, err := net.Dial("tcp", addr)
				if err != nil {
					return
				}
				c.SetDeadline(time.Now().Add(60 * time.Second))
				p := &p9{t, c}
				for _, m := range [][]byte{
					frame9p(p9wire.Tversion, 0xffff, uint32(64<<10), p9wire.Version),
					frame9p(p9wire.Tattach, 1, uint32(0), p9wire.NoFid, "", "", uint32(0)),
					frame9p(p9wire.Tattach, 1, uint32(100), p9wire.NoFid, "", journal.Aname, uint32(0)),
					frame9p(p9wire.Tlcreate, 1, uint32(100), fmt.Sprintf("00000000-0000-4000-8000-%012d", i), uint32(syscall.O_RDWR), uint32(0o600), p9wire.NoUID),
					frame9p(p9wire.Twalk, 1, uint32(0), uint32(1), uint16(1), "d"),
					frame9p(p9wire.Tgetattr, 1, uint32(1), uint64(p9wire.GetattrAll)),
				} {
					if _, err := c.Write(m); err != nil {
						break
					}
					if typ, _, err := p.recv(); err != nil || typ == p9wire.Rlerror {
						break
					}
					if m[4] == p9wire.Tgetattr {
						made.Add(1)
					}
				}
				c.Close()
			}
		})
	}
	wg.Wait()
	if made.Load() != journals {
		t.Fatalf("made %d journals of %d", made.Load(), journals)
	}
	t.Logf("%d journals made in %v", journals, time.Since(start).Round(time.Millisecond))
	before := rss(t, s.cmd.Process.Pid)
	p := dial()
	p.rpc("walk", p9wire.Twalk, uint32(0), uint32(1), uint16(1), "d")
	// Pipelined, 32 at a time.
	start, peak := time.Now(), before
	const batch = 32
	var b []byte
	for i := 0; i < changes; i += batch {
		b = b[:0]
		// A batch of mkdirs, then one of their rmdirs: as many changes,
		// and no 100,000 directories to remove at the end.
		for j := range batch {
			name := fmt.Sprintf("%07d", i/(2*batch)*batch+j)
			if i/batch%2 == 0 {
				b = append(b, frame9p(p9wire.Tmkdir, uint16(j), uint32(1), name, uint32(0o755), uint32(0))...)
			} else {
				b = append(b, frame9p(p9wire.Tunlinkat, uint16(j), uint32(1), name, uint32(unix.AT_REMOVEDIR))...)
			}
		}
		p.c.SetDeadline(time.Now().Add(60 * time.Second))
		if _, err := p.c.Write(b); err != nil {
			t.Fatal(err)
		}
		for range batch {
			if typ, body, err := p.recv(); err != nil || typ == p9wire.Rlerror {
				t.Fatalf("mkdir or rmdir: %v %v", err, body)
			}
		}
		if i%(100*batch) == 0 {
			if r := rss(t, s.cmd.Process.Pid); r > peak {
				peak = r
				if r > limit {
					t.Fatalf("after %d changes the server holds %d MB (%d MB before them)", i+batch, r>>20, before>>20)
				}
			}
		}
	}
	peak = max(peak, rss(t, s.cmd.Process.Pid))
	ss := serverStats(t, addr)
	t.Logf("%d changes in %v: RSS %d MB before, peak %d MB; journals %d, bytes %d (abandoned %d), resets %d",
		changes, time.Since(start).Round(time.Millisecond), before>>20, peak>>20, ss["journals"], ss["journals.bytes"], ss["journals.bytes.abandoned"], ss["resets"])
	if peak > limit {
		t.Errorf("the server holds %d MB", peak>>20)
	}
	// A client that comes back is told to drop what it cached.
	q := dial()
	q.rpc("attach #journal", p9wire.Tattach, uint32(100), p9wire.NoFid, "", journal.Aname, uint32(0))
	q.rpc("walk", p9wire.Twalk, uint32(100), uint32(100), uint16(1), "00000000-0000-4000-8000-000000000000")
	q.rpc("open", p9wire.Tlopen, uint32(100), uint32(syscall.O_RDWR))
	if recs := q.readJournal(0); len(recs) == 0 || recs[0].Kind != journal.Reset {
		t.Errorf("a client back after its journal overflowed reads %v, want a Reset first", shows(recs))
	}
}
