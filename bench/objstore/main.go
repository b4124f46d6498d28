// Command objstore-bench measures shale's object store (objstore, CFS) side
// by side with a file-per-object store laid out like nginx's proxy_cache,
// in one run, and prints medians over several repetitions and their ratios.
//
//	go run ./bench/objstore -dir /work/tmp/bench -reps 5
//
// It covers the CFS paper's micro-benchmarks (creates, reads and deletes of
// 1 KB objects), a web trace replay, large objects against the sequential
// bandwidth fio measures on the same file system, the hit ratio of SIEVE
// beside LRU, and the index memory per object.
package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"time"

	"github.com/shalefs/shale/objstore"
)

var (
	dir   = flag.String("dir", "/tmp/objstore-bench", "scratch directory on the file system to measure (not tmpfs)")
	reps  = flag.Int("reps", 5, "repetitions; medians are reported")
	n     = flag.Int("n", 50000, "objects in the micro-benchmarks")
	osize = flag.Int("size", 1000, "object size in the micro-benchmarks")
	trace = flag.String("trace", "../shared/traces/web-objects.trace.xz", "`time id size` trace to replay")
	large = flag.Int64("large", 1<<30, "bytes of large objects (1-64 MB each)")
	memN  = flag.Int("mem", 1<<20, "objects for the index memory measurement")
	only  = flag.String("only", "micro,replay,large,hit,mem", "comma-separated parts to run")
)

func want(part string) bool { return slices.Contains(strings.Split(*only, ","), part) }

// samples collects one metric's values over the repetitions.
type samples map[string][]float64

func (s samples) add(name string, v float64) { s[name] = append(s[name], v) }

func (s samples) median(name string) float64 { return median(s[name]) }

// ratio is the median over repetitions of a/b, each pair measured in the
// same repetition: on a shared machine, load drifts between repetitions
// more than within one.
func (s samples) ratio(a, b string) float64 {
	var r []float64
	for i := range min(len(s[a]), len(s[b])) {
		r = append(r, s[a][i]/s[b][i])
	}
	return median(r)
}

func median(v []float64) float64 {
	v = slices.Clone(v)
	if len(v) == 0 {
		return 0
	}
	slices.Sort(v)
	if len(v)%2 == 1 {
		return v[len(v)/2]
	}
	return (v[len(v)/2-1] + v[len(v)/2]) / 2
}

func main() {
	flag.Parse()
	if err := run(); err != nil {
		fmt.Fprintf(os.Stderr, "objstore-bench: %v\n", err)
		os.Exit(1)
	}
}

func run() error {
	if err := os.MkdirAll(*dir, 0o755); err != nil {
		return err
	}
	fs, _ := exec.Command("stat", "-f", "-c", "%T", *dir).Output()
	fmt.Printf("dir %s (%s), %d CPUs, %s, %d reps\n\n", *dir, bytes.TrimSpace(fs), runtime.NumCPU(), runtime.Version(), *reps)
	s := samples{}
	for rep := 0; rep < *reps; rep++ {
		fmt.Fprintf(os.Stderr, "rep %d/%d\n", rep+1, *reps)
		// Alternate which store goes first, so neither always meets a
		// page cache and journal the other left busy.
		order := []bool{rep%2 == 0, rep%2 == 1}
		for _, cfs := range order {
			if want("micro") {
				if err := micro(s, cfs); err != nil {
					return err
				}
			}
			if want("replay") && haveTrace() {
				if err := replay(s, cfs); err != nil {
					return err
				}
			}
		}
		if want("large") {
			// fio brackets the store's run: write before, read after.
			// It runs twice: with the 1 MiB requests, and with
			// 16 MiB ones, the size the store's large reads use.
			for _, bs := range []string{"1M", "16M"} {
				if err := fio(s, "write", bs); err != nil {
					return err
				}
			}
			if err := largeObjects(s); err != nil {
				return err
			}
			for _, bs := range []string{"1M", "16M"} {
				if err := fio(s, "read", bs); err != nil {
					return err
				}
			}
		}
	}
	report(s)
	if want("hit") && haveTrace() {
		if err := hitRatios(); err != nil {
			return err
		}
	}
	if !haveTrace() {
		fmt.Printf("\ntrace %s not found: replay and hit ratios skipped\n", *trace)
	}
	if want("mem") {
		return indexMemory()
	}
	return nil
}

func haveTrace() bool {
	_, err := os.Stat(*trace)
	return err == nil
}

// open makes a fresh store of the given kind and size in the scratch dir.
func open(cfs bool, size int64, policy string) (objstore.ObjectStore, func() error, error) {
	if cfs {
		path := filepath.Join(*dir, "store")
		os.Remove(path)
		st, err := objstore.Format(path, size, objstore.Options{Policy: policy})
		if err != nil {
			return nil, nil, err
		}
		return st, func() error { st.Close(); return os.Remove(path) }, nil
	}
	d := filepath.Join(*dir, "files")
	os.RemoveAll(d)
	st, err := newFileStore(d)
	if err != nil {
		return nil, nil, err
	}
	return st, func() error { return os.RemoveAll(d) }, nil
}

func name(cfs bool) string {
	if cfs {
		return "objstore"
	}
	return "files"
}

// micro is the paper's three micro-benchmarks: n creates, reads, deletes.
func micro(s samples, cfs bool) error {
	st, done, err := open(cfs, 512<<20, "")
	if err != nil {
		return err
	}
	defer done()
	keys := make([]string, *n)
	data := make([][]byte, *n)
	for i := range keys {
		keys[i] = fmt.Sprintf("http://example.com/object/%d", i)
		data[i] = objstore.Generate(keys[i], *osize)
	}
	t := time.Now()
	for i, k := range keys {
		if err := st.Create(k, data[i]); err != nil {
			return err
		}
	}
	if err := st.Sync(); err != nil {
		return err
	}
	s.add("create/"+name(cfs), float64(*n)/time.Since(t).Seconds())
	t = time.Now()
	for i, k := range keys {
		b, err := st.Read(k)
		if err != nil {
			return fmt.Errorf("%s: read %s: %w", name(cfs), k, err)
		}
		if len(b) != len(data[i]) {
			return fmt.Errorf("%s: read %s: %d bytes, want %d", name(cfs), k, len(b), len(data[i]))
		}
	}
	s.add("read/"+name(cfs), float64(*n)/time.Since(t).Seconds())
	t = time.Now()
	for _, k := range keys {
		if err := st.Remove(k); err != nil {
			return err
		}
	}
	s.add("delete/"+name(cfs), float64(*n)/time.Since(t).Seconds())
	return nil
}

// replay plays the trace into a store big enough to hold all of it, so
// both stores do the same work: misses create, hits read and verify.
func replay(s samples, cfs bool) error {
	st, done, err := open(cfs, 1<<30, "")
	if err != nil {
		return err
	}
	defer done()
	res, err := replayFile(st)
	if err != nil {
		return err
	}
	s.add("replay/"+name(cfs), res.OpsPerSec())
	s.add("replayhit/"+name(cfs), res.HitRatio())
	return nil
}

func replayFile(st objstore.ObjectStore) (objstore.ReplayResult, error) {
	f, err := os.Open(*trace)
	if err != nil {
		return objstore.ReplayResult{}, err
	}
	defer f.Close()
	tr, err := objstore.NewTraceReader(f)
	if err != nil {
		return objstore.ReplayResult{}, err
	}
	return objstore.Replay(st, tr, nil)
}

// largeObjects writes and reads back objects of 1-64 MB.
func largeObjects(s samples) error {
	st, done, err := open(true, *large+*large/2, "")
	if err != nil {
		return err
	}
	defer done()
	store := st.(*objstore.Store)
	rng := rand.New(rand.NewPCG(1, 2))
	var objs [][]byte
	for total := int64(0); total < *large; {
		size := 1<<20 + rng.IntN(63<<20)
		size = int(min(int64(size), *large-total))
		objs = append(objs, objstore.Generate(fmt.Sprint("large", len(objs)), size))
		total += int64(size)
	}
	t := time.Now()
	for i, b := range objs {
		if err := store.Create(fmt.Sprint("large", i), b); err != nil {
			return err
		}
	}
	if err := store.Sync(); err != nil {
		return err
	}
	s.add("largewrite", float64(*large)/time.Since(t).Seconds())
	// A server reuses its buffers, as fio does; Read's fresh buffer per
	// call is measured too.
	buf := make([]byte, 64<<20)
	t = time.Now()
	for i := range objs {
		n, err := store.ReadInto(fmt.Sprint("large", i), buf)
		if err != nil {
			return err
		}
		if n != len(objs[i]) {
			return fmt.Errorf("large object %d: %d bytes, want %d", i, n, len(objs[i]))
		}
	}
	s.add("largeread", float64(*large)/time.Since(t).Seconds())
	t = time.Now()
	for i := range objs {
		if _, err := store.Read(fmt.Sprint("large", i)); err != nil {
			return err
		}
	}
	s.add("largereadalloc", float64(*large)/time.Since(t).Seconds())
	return nil
}

// fio measures the file system's sequential bandwidth with direct I/O. The
// read pass reads the file the write pass left.
func fio(s samples, rw, bs string) error {
	file := filepath.Join(*dir, "fio"+bs+".dat")
	if rw == "read" {
		defer os.Remove(file)
	}
	{
		out, err := exec.Command("fio", "--name=seq", "--rw="+rw, "--bs="+bs, fmt.Sprintf("--size=%d", *large),
			"--direct=1", "--filename="+file, "--output-format=json").Output()
		if err != nil {
			return fmt.Errorf("fio (install it with apt-get install -y fio): %w", err)
		}
		var r struct {
			Jobs []struct {
				Read, Write struct {
					BW float64 `json:"bw_bytes"`
				}
			}
		}
		if err := json.Unmarshal(out, &r); err != nil || len(r.Jobs) == 0 {
			return fmt.Errorf("fio output: %v", err)
		}
		bw := r.Jobs[0].Write.BW
		if rw == "read" {
			bw = r.Jobs[0].Read.BW
		}
		s.add("fio"+rw+bs, bw)
	}
	return nil
}

func report(s samples) {
	fmt.Println("medians over the repetitions; ratios are medians of per-repetition ratios")
	fmt.Println()
	fmt.Println("| benchmark | objstore | files (nginx layout) | ratio | target |")
	fmt.Println("|---|---:|---:|---:|---|")
	for _, b := range []struct{ key, label, target string }{
		{"create", fmt.Sprintf("%d creates of %d B, ops/s", *n, *osize), ">= 5x"},
		{"read", fmt.Sprintf("%d reads of %d B, ops/s", *n, *osize), ""},
		{"delete", fmt.Sprintf("%d deletes, ops/s", *n), ">= 5x"},
		{"replay", "web trace replay, requests/s", ">= 2x"},
	} {
		c, f := s.median(b.key+"/objstore"), s.median(b.key+"/files")
		if c == 0 {
			continue
		}
		fmt.Printf("| %s | %.0f | %.0f | %.2fx | %s |\n", b.label, c, f, s.ratio(b.key+"/objstore", b.key+"/files"), b.target)
	}
	fmt.Println()
	fmt.Println("| large objects (1-64 MB) | objstore MB/s | fio bs=1M MB/s | ratio | fio bs=16M MB/s | ratio | target |")
	fmt.Println("|---|---:|---:|---:|---:|---:|---|")
	for _, m := range []struct{ key, fio, label string }{
		{"largewrite", "fiowrite", "write (Create)"},
		{"largeread", "fioread", "read (ReadInto, reused buffer)"},
		{"largereadalloc", "fioread", "read (Read, new buffer)"},
	} {
		c := s.median(m.key)
		if c == 0 {
			continue
		}
		f1, f16 := s.median(m.fio+"1M"), s.median(m.fio+"16M")
		fmt.Printf("| %s | %.0f | %.0f | %.0f%% | %.0f | %.0f%% | >= 80%% |\n", m.label, c/1e6,
			f1/1e6, 100*s.ratio(m.key, m.fio+"1M"), f16/1e6, 100*s.ratio(m.key, m.fio+"16M"))
	}
	fmt.Println()
	fmt.Println("all samples (ops/s or bytes/s):")
	keys := make([]string, 0, len(s))
	for k := range s {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, k := range keys {
		fmt.Printf("  %-18s", k)
		for _, v := range s[k] {
			fmt.Printf(" %.4g", v)
		}
		fmt.Println()
	}
}

// hitRatios replays the trace into stores smaller than its working set
// with each policy. The trace's distinct objects total about 300 MB.
func hitRatios() error {
	fmt.Println()
	fmt.Println("| store size | SIEVE hit ratio | LRU hit ratio |")
	fmt.Println("|---|---:|---:|")
	for _, size := range []int64{16 << 20, 32 << 20, 64 << 20, 128 << 20} {
		var r [2]float64
		for i, policy := range []string{"sieve", "lru"} {
			st, done, err := open(true, size, policy)
			if err != nil {
				return err
			}
			res, err := replayFile(st)
			done()
			if err != nil {
				return err
			}
			r[i] = res.HitRatio()
		}
		fmt.Printf("| %d MiB | %.2f%% | %.2f%% |\n", size>>20, 100*r[0], 100*r[1])
	}
	return nil
}

// indexMemory creates memN tiny objects and measures the heap they add:
// the index, the policy and everything else the store keeps per object.
func indexMemory() error {
	size := int64(*memN)*512 + 64<<20
	st, done, err := open(true, size, "")
	if err != nil {
		return err
	}
	defer done()
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	one := []byte{1}
	for i := 0; i < *memN; i++ {
		if err := st.Create(fmt.Sprint("k", i), one); err != nil {
			return err
		}
	}
	if err := st.Sync(); err != nil {
		return err
	}
	runtime.GC()
	runtime.ReadMemStats(&after)
	if _, err := st.Read("k1"); errors.Is(err, objstore.ErrNotFound) {
		return fmt.Errorf("memory run lost its objects")
	}
	fmt.Printf("\nindex memory: %.1f bytes per object (%d objects, heap growth after GC; target <= 32)\n",
		float64(after.HeapAlloc-before.HeapAlloc)/float64(*memN), *memN)
	return nil
}
