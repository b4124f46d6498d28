package net

import (
	"bytes"
	"errors"
	"fmt"
	"hash/fnv"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// The fault harness's workload (TestFaultLoops): a process of its own per
// client, in its own directory of the mount, doing a seeded random run
// of operations on a few dozen small files (f00..f23 take every kind;
// pub0..pub2 are only overwritten, and the other workloads read them;
// k00..k15 are written once in a while, then left alone until their
// write-back by age), and printing, one flushed line each, what it is
// about to do and what it was told:
//
//	MONO do SEQ write NAME SIZE SYNC   create or overwrite (O_TRUNC) with chunk SEQ; SYNC 1: fsync before close
//	MONO do SEQ append NAME SIZE       append chunk SEQ
//	MONO do SEQ fsync NAME             open, fsync, close
//	MONO do SEQ rename A B             within the directory, B may exist (rename-over)
//	MONO do SEQ unlink A
//	MONO do SEQ link A B               a hard link, B new
//	MONO do SEQ read A                 read back an own file: must be what the model says
//	MONO do SEQ peek INST/pubK         read another client's published file (staleness)
//	MONO ok SEQ [CLASS N]              the operation returned success (a peek says what it read)
//	MONO fail SEQ ERROR                it failed (EIO during a fault is allowed)
//	MONO bad SEQ WHAT                  a read back differed from the model
//
// MONO is CLOCK_MONOTONIC in nanoseconds, the same clock in every process
// of the machine: the test orders one workload's acknowledgements against
// another's reads and against its own faults with it. Every file's bytes
// are chunks (faultChunk): a header naming the workload, the chunk's
// number (SEQ) and size, then bytes drawn from them, so that the checker
// recognises every version it finds. The workload keeps the model the
// checker builds (faultModel) to choose its operations and check its
// reads. It runs until its standard input ends, then exits.

const (
	faultWorkEnv = "SHALE_FAULT_WORKLOAD" // the workload's directory (its base name is the instance)
	faultSeedEnv = "SHALE_FAULT_WSEED"    // its seed
	faultFiles   = 24                     // f00..f23, beside pub0..pub2
	faultPubs    = 3                      // pubK: only ever overwritten; other clients read them
	faultColds   = 16                     // kNN: written now and then, then left alone (see coldWrite)
	faultMaxSets = 8                      // possible contents of a file before it counts as unknown
)

// faultMono is CLOCK_MONOTONIC in nanoseconds.
func faultMono() int64 {
	var ts unix.Timespec
	unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts)
	return ts.Nano()
}

// faultChunk is chunk n of workload inst: size bytes, a header, then
// letters drawn from inst and n, and a newline.
func faultChunk(inst string, n int64, size int) []byte {
	h := fmt.Sprintf("<%s #%d %d>\n", inst, n, size)
	if size < len(h)+1 {
		size = len(h) + 1
	}
	b := make([]byte, size)
	copy(b, h)
	f := fnv.New64a()
	f.Write([]byte(inst))
	r := rand.New(rand.NewPCG(f.Sum64(), uint64(n)))
	for i := len(h); i < size-1; i++ {
		b[i] = 'a' + byte(r.IntN(26))
	}
	b[size-1] = '\n'
	return b
}

// faultParse reads the chunk header at the start of b: inst, n and size.
func faultParse(b []byte) (inst string, n int64, size int, ok bool) {
	if len(b) == 0 || b[0] != '<' {
		return "", 0, 0, false
	}
	end := bytes.IndexByte(b, '\n')
	if end < 0 || end > 80 || b[end-1] != '>' {
		return "", 0, 0, false
	}
	f := strings.Fields(string(b[1 : end-1]))
	if len(f) != 3 || !strings.HasPrefix(f[1], "#") {
		return "", 0, 0, false
	}
	n, err1 := strconv.ParseInt(f[1][1:], 10, 64)
	size, err2 := strconv.Atoi(f[2])
	if err1 != nil || err2 != nil || size <= end {
		return "", 0, 0, false
	}
	return f[0], n, size, true
}

// faultDescribe says what b is made of: "c1.0#12(456B)+c1.0#30(88B)",
// with a chunk cut short as "c1.0#31(88B)[:40]", zeros as "zeros(N)"
// and anything else as "junk@OFF(...)"; "empty" for no bytes.
func faultDescribe(b []byte) string {
	if len(b) == 0 {
		return "empty"
	}
	var parts []string
	for off := 0; off < len(b); {
		rest := b[off:]
		if rest[0] == 0 {
			k := 0
			for k < len(rest) && rest[k] == 0 {
				k++
			}
			parts = append(parts, fmt.Sprintf("zeros(%d)", k))
			off += k
			continue
		}
		inst, n, size, ok := faultParse(rest)
		if ok {
			want := faultChunk(inst, n, size)
			if len(rest) >= size && bytes.Equal(rest[:size], want) {
				parts = append(parts, fmt.Sprintf("%s#%d(%dB)", inst, n, size))
				off += size
				continue
			}
			k := firstDiff(rest, want)
			if k < 0 || k == len(rest) {
				k = len(rest)
			}
			parts = append(parts, fmt.Sprintf("%s#%d(%dB)[:%d]", inst, n, size, k))
			off += k
			continue
		}
		parts = append(parts, fmt.Sprintf("junk@%d(%q)", off, rest[:min(len(rest), 24)]))
		break
	}
	return strings.Join(parts, "+")
}

// faultClass classifies what a peek read of a published file found: "v
// N" (chunk N whole, maybe followed by the kernel's zeros), "part N" (a
// prefix of chunk N), "zeros", "empty" or "junk".
func faultClass(b []byte) string {
	t := bytes.TrimRight(b, "\x00")
	if len(b) == 0 {
		return "empty 0"
	}
	if len(t) == 0 {
		return "zeros 0"
	}
	inst, n, size, ok := faultParse(t)
	if !ok {
		if len(t) < 80 && t[0] == '<' && !bytes.Contains(t, []byte("\n")) {
			return "part -1" // a header cut short
		}
		return "junk 0"
	}
	want := faultChunk(inst, n, size)
	switch {
	case bytes.Equal(t, want):
		return fmt.Sprintf("v %d", n)
	case len(t) < len(want) && bytes.Equal(t, want[:len(t)]):
		return fmt.Sprintf("part %d", n)
	}
	return "junk 0"
}

// faultOp is one operation of a workload, as its lines tell it.
type faultOp struct {
	seq    int64
	kind   string
	a, b   string
	size   int
	sync   bool
	do     int64  // when it began (CLOCK_MONOTONIC)
	res    int64  // when it returned; 0 if it never did
	result string // "ok", "fail", "bad"; "" if it never returned
	detail string // the rest of the result line
}

// faultInode is a file of the model: what it may hold now (one content
// once an operation's outcome is known; more after a failed one), and
// what the server may hold if the client died now: everything it may
// have held since its last fsync.
type faultInode struct {
	id    int // in the order made
	cur   []string
	since map[string]bool
}

// faultModel is a workload's directory as what it was told makes it:
// names to files (hard links share one), and names a failed name
// operation left unknown (wild: present or not, any bytes). Wild names
// come in groups that may share files (a failed rename of a to b may
// have made b a's file); a wild name shares no file with a known one, so
// that an operation on a known name never changes a wild one's file, and
// the reverse.
type faultModel struct {
	inst      string
	names     map[string]*faultInode
	wild      map[string]int // name: its group
	groups    int
	made      int      // files made
	anomalies []string // operations that succeeded where the model says they cannot
}

// TestFaultHelperWorkload is no test of its own: it is TestFaultLoops'
// workload, in a process of its own (run with SHALE_FAULT_WORKLOAD=DIR),
// so that the test's process holds no file of a mount when it starts a
// server (see TestSpriteHelperWriter). It works in DIR until its standard
// input ends.
func TestFaultHelperWorkload(t *testing.T) {
	dir := os.Getenv(faultWorkEnv)
	if dir == "" {
		t.Skip("a helper process of TestFaultLoops")
	}
	seed, _ := strconv.ParseUint(os.Getenv(faultSeedEnv), 10, 64)
	w := &faultWorker{
		dir:   dir,
		root:  filepath.Dir(dir),
		inst:  filepath.Base(dir),
		rng:   rand.New(rand.NewPCG(seed, 0xfa017)),
		model: newFaultModel(filepath.Base(dir)),
	}
	go func() {
		io.Copy(io.Discard, os.Stdin)
		w.stop.Store(true)
	}()
	w.emit("start %s", w.inst)
	for !w.stop.Load() {
		err := os.Mkdir(dir, 0o755)
		if err == nil || errors.Is(err, os.ErrExist) {
			break
		}
		w.emit("mkdir %v", err)
		time.Sleep(100 * time.Millisecond)
	}
	w.emit("ready")
	for !w.stop.Load() {
		w.step()
	}
	w.emit("end")
}

type faultWorker struct {
	dir, root, inst string
	rng             *rand.Rand
	model           *faultModel
	seq             int64
	peers           []string             // INST/pubK of other workloads, from the mount's root
	cold            map[string]time.Time // when each cold file was last written
	stop            atomic.Bool
}

func (w *faultWorker) emit(format string, args ...any) {
	fmt.Fprintf(os.Stdout, "%d "+format+"\n", append([]any{faultMono()}, args...)...)
}

func (w *faultWorker) path(name string) string { return filepath.Join(w.dir, name) }

// pick is a random name of the model's (present: one that may exist;
// pubs: published files too), or "" if there is none.
func (w *faultWorker) pick(present, pubs bool) string {
	var ns []string
	if present {
		for _, n := range w.model.present() {
			if (pubs || !strings.HasPrefix(n, "pub")) && !strings.HasPrefix(n, "k") {
				ns = append(ns, n)
			}
		}
	} else {
		for i := range faultFiles {
			ns = append(ns, fmt.Sprintf("f%02d", i))
		}
	}
	if len(ns) == 0 {
		return ""
	}
	return ns[w.rng.IntN(len(ns))]
}

// absent is a random name of f00.. the model has not, or "".
func (w *faultWorker) absent() string {
	var ns []string
	for i := range faultFiles {
		n := fmt.Sprintf("f%02d", i)
		if w.model.names[n] == nil && !w.model.isWild(n) {
			ns = append(ns, n)
		}
	}
	if len(ns) == 0 {
		return ""
	}
	return ns[w.rng.IntN(len(ns))]
}

// coldWrite is a cold file to write, or "": one not written for 10 s.
// Nothing else touches it: it waits, delayed, for its write-back by age,
// through a fault or not; a client that lost track of it meanwhile (the
// kernel forgot its node after a reconnection, say) loses it.
func (w *faultWorker) coldWrite() string {
	if w.cold == nil {
		w.cold = map[string]time.Time{}
	}
	k := fmt.Sprintf("k%02d", w.rng.IntN(faultColds))
	if time.Since(w.cold[k]) < 10*time.Second {
		return ""
	}
	w.cold[k] = time.Now()
	return k
}

// step does one random operation and says what it was told.
func (w *faultWorker) step() {
	w.seq++
	o := &faultOp{seq: w.seq}
	r := w.rng.IntN(100)
	switch {
	case r < 28:
		o.kind, o.size, o.sync = "write", 64+w.rng.IntN(3000), w.rng.IntN(5) == 0
		if w.rng.IntN(4) == 0 {
			o.a = fmt.Sprintf("pub%d", w.rng.IntN(faultPubs))
		} else {
			o.a = w.pick(false, false)
		}
	case r < 42:
		o.kind, o.a, o.size = "append", w.pick(true, false), 48+w.rng.IntN(600)
	case r < 50:
		o.kind, o.a = "fsync", w.pick(true, true)
	case r < 58:
		o.kind, o.a, o.b = "rename", w.pick(true, false), w.pick(false, false)
		if o.a == o.b {
			o.a = ""
		}
	case r < 64:
		o.kind, o.a = "unlink", w.pick(true, false)
	case r < 68:
		o.kind, o.a, o.b = "link", w.pick(true, false), w.absent()
		if o.b == "" {
			o.a = ""
		}
	case r < 70:
		o.kind, o.size, o.a = "write", 64+w.rng.IntN(3000), w.coldWrite()
	case r < 84:
		o.kind, o.a = "read", w.pick(true, true)
	default:
		if len(w.peers) == 0 || w.seq%100 == 0 {
			w.listPeers()
		}
		if len(w.peers) > 0 {
			o.kind, o.a = "peek", w.peers[w.rng.IntN(len(w.peers))]
		}
	}
	if o.kind == "" || o.a == "" {
		w.seq--
		return
	}
	switch o.kind {
	case "write":
		w.emit("do %d write %s %d %s", o.seq, o.a, o.size, map[bool]string{false: "0", true: "1"}[o.sync])
	case "append":
		w.emit("do %d append %s %d", o.seq, o.a, o.size)
	case "rename", "link":
		w.emit("do %d %s %s %s", o.seq, o.kind, o.a, o.b)
	default:
		w.emit("do %d %s %s", o.seq, o.kind, o.a)
	}
	result, err := w.run(o)
	switch {
	case err != nil:
		w.emit("fail %d %v", o.seq, err)
	case strings.HasPrefix(result, "bad "):
		w.emit("bad %d %s", o.seq, strings.TrimPrefix(result, "bad "))
	case result != "":
		w.emit("ok %d %s", o.seq, result)
	default:
		w.emit("ok %d", o.seq)
	}
	if o.kind != "read" && o.kind != "peek" {
		w.model.apply(o, err == nil)
	}
}

// run does o: a peek's or a read's result, or the error.
func (w *faultWorker) run(o *faultOp) (string, error) {
	switch o.kind {
	case "write":
		f, err := os.OpenFile(w.path(o.a), os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o644)
		if err != nil {
			return "", err
		}
		_, err = f.Write(faultChunk(w.inst, o.seq, o.size))
		if err == nil && o.sync {
			err = f.Sync()
		}
		if cerr := f.Close(); err == nil {
			err = cerr
		}
		return "", err
	case "append":
		f, err := os.OpenFile(w.path(o.a), os.O_WRONLY|os.O_APPEND, 0)
		if err != nil {
			return "", err
		}
		_, err = f.Write(faultChunk(w.inst, o.seq, o.size))
		if cerr := f.Close(); err == nil {
			err = cerr
		}
		return "", err
	case "fsync":
		f, err := os.OpenFile(w.path(o.a), os.O_RDWR, 0)
		if err != nil {
			return "", err
		}
		err = f.Sync()
		if cerr := f.Close(); err == nil {
			err = cerr
		}
		return "", err
	case "rename":
		return "", os.Rename(w.path(o.a), w.path(o.b))
	case "unlink":
		return "", os.Remove(w.path(o.a))
	case "link":
		return "", os.Link(w.path(o.a), w.path(o.b))
	case "read":
		b, err := os.ReadFile(w.path(o.a))
		exists := err == nil
		if err != nil && !errors.Is(err, syscall.ENOENT) {
			return "", err
		}
		if msg := w.model.check(o.a, b, exists, false); msg != "" {
			return "bad " + msg, nil
		}
		return "", nil
	case "peek":
		b, err := os.ReadFile(filepath.Join(w.root, o.a))
		if errors.Is(err, syscall.ENOENT) {
			return "absent 0", nil
		}
		if err != nil {
			return "", err
		}
		class := faultClass(b)
		if class == "junk 0" {
			class += " " + faultDescribe(b) // what it is made of, for the report
		}
		return class, nil
	}
	return "", fmt.Errorf("unknown operation %s", o.kind)
}

// listPeers lists the mount's root for the other workloads' directories.
func (w *faultWorker) listPeers() {
	ents, err := os.ReadDir(w.root)
	if err != nil {
		return
	}
	w.peers = w.peers[:0]
	for _, e := range ents {
		if e.IsDir() && e.Name() != w.inst {
			for k := range faultPubs {
				w.peers = append(w.peers, fmt.Sprintf("%s/pub%d", e.Name(), k))
			}
		}
	}
}
