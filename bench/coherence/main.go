// Command coherence runs the UCLA paper's coherence benchmarks on shale
// (seeds/000, Tables 2-4 and Figure 11), printing medians and ratios:
//
//   - overhead: one stack, with the coherence manager on and off, on the
//     core's metadata workload and sequential I/O (paper: Table 3);
//   - caching: a stack of three null layers with the kernel caching names
//     and attributes (hour-long timeouts) and without (timeouts 0) (Table 2);
//   - interference: random- and sequential-update of a 1,024,000-byte file,
//     scale 4, through one null layer and through two, by mmap and by
//     pread/pwrite, counting lost updates (Table 4, Figure 11).
//
// Run as root from the module root: go run ./bench/coherence [-n 3].
package main

import (
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

var (
	reps    = flag.Int("n", 3, "repetitions (medians are reported)")
	workDir = flag.String("dir", "/var/tmp/shale-coherence-bench", "work directory, on the file system to measure")
	tree    = flag.String("tree", "/usr/local/go/src", "source tree for the metadata workload")
	scale   = flag.Int("scale", 4, "interference scale (the paper's is 4)")
	only    = flag.String("only", "", "run only this part: overhead, caching or interference")
	shale   string
)

func main() {
	flag.Parse()
	if os.Geteuid() != 0 {
		fail("run as root: it mounts FUSE file systems and drops caches")
	}
	os.RemoveAll(*workDir)
	must(os.MkdirAll(*workDir, 0o755))
	shale = filepath.Join(*workDir, "shale")
	build := exec.Command("go", "build", "-o", shale, "./cmd/shale")
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		fail(fmt.Sprintf("building shale (run from the module root): %v\n%s", err, out))
	}
	fmt.Printf("Command: `go run ./bench/coherence %s`, %s\n\n", strings.Join(os.Args[1:], " "), time.Now().UTC().Format("2006-01-02 15:04 UTC"))
	for _, part := range []struct {
		name string
		run  func()
	}{{"overhead", overhead}, {"caching", caching}, {"interference", interference}} {
		if *only == "" || *only == part.name {
			part.run()
		}
	}
}

// stack mounts views (layer indexes) of a stack of layers over a fresh
// lower directory and returns their mountpoints and an unmount function.
func stack(name string, layers []string, views []int, args ...string) ([]string, func()) {
	base := filepath.Join(*workDir, name)
	os.RemoveAll(base)
	lower := filepath.Join(base, "lower")
	must(os.MkdirAll(lower, 0o755))
	var b strings.Builder
	fmt.Fprintf(&b, "lower = %q\n", lower)
	for _, l := range layers {
		fmt.Fprintf(&b, "[[layer]]\nname = %q\n", l)
	}
	var mnts []string
	for i, v := range views {
		m := filepath.Join(base, fmt.Sprintf("view%d", i))
		must(os.MkdirAll(m, 0o755))
		mnts = append(mnts, m)
		fmt.Fprintf(&b, "[[view]]\nlayer = %d\nmountpoint = %q\n", v, m)
	}
	file := filepath.Join(base, "stack.toml")
	must(os.WriteFile(file, []byte(b.String()), 0o644))
	run(shale, append([]string{"mount", "--stack", file}, args...)...)
	return mnts, func() {
		for _, m := range mnts { // each view ends on its own unmount
			run(shale, "umount", m)
		}
	}
}

func run(name string, args ...string) {
	if out, err := exec.Command(name, args...).CombinedOutput(); err != nil {
		fail(fmt.Sprintf("%s %s: %v\n%s", name, strings.Join(args, " "), err, out))
	}
}

func dropCaches() {
	unix.Sync()
	must(os.WriteFile("/proc/sys/vm/drop_caches", []byte("3"), 0))
}

// timed runs a shell command in dir and returns its seconds.
func timed(dir, cmd string) float64 {
	c := exec.Command("sh", "-c", cmd)
	c.Dir = dir
	start := time.Now()
	if out, err := c.CombinedOutput(); err != nil {
		fail(fmt.Sprintf("%s in %s: %v\n%s", cmd, dir, err, out))
	}
	return time.Since(start).Seconds()
}

// metadata is the core's workload on mnt; cold rows drop caches first.
func metadata(mnt string, res map[string][]float64) {
	rows := []struct{ name, cmd string }{
		{"cp -a", "cp -a " + *tree + " src"},
		{"find", "find src > /dev/null"},
		{"grep -r", "grep -r -l 'func main' src > /dev/null"},
		{"rm -r", "rm -r src"},
		{"seq write 512 MiB", "dd if=/dev/zero of=big bs=1M count=512 conv=fsync status=none"},
		{"seq read 512 MiB", "dd if=big of=/dev/null bs=1M status=none"},
	}
	for _, r := range rows {
		dropCaches()
		res[r.name] = append(res[r.name], timed(mnt, r.cmd))
	}
	os.Remove(filepath.Join(mnt, "big"))
}

var metadataRows = []string{"cp -a", "find", "grep -r", "rm -r", "seq write 512 MiB", "seq read 512 MiB"}

func median(xs []float64) float64 {
	s := slices.Clone(xs)
	slices.Sort(s)
	return s[len(s)/2]
}

// compare runs the metadata workload on two setups, interleaved, and
// prints medians and the ratio b/a.
func compare(title, intro, aName, bName string, a, b func() (string, func())) {
	ra, rb := map[string][]float64{}, map[string][]float64{}
	for i := 0; i < *reps; i++ {
		for _, c := range []struct {
			setup func() (string, func())
			res   map[string][]float64
		}{{a, ra}, {b, rb}} {
			mnt, done := c.setup()
			metadata(mnt, c.res)
			done()
		}
	}
	fmt.Printf("## %s\n\n%s; seconds, medians of %d runs.\n\n", title, intro, *reps)
	fmt.Printf("| workload | %s | %s | %s/%s |\n| --- | --- | --- | --- |\n", aName, bName, bName, aName)
	for _, r := range metadataRows {
		x, y := median(ra[r]), median(rb[r])
		fmt.Printf("| %s | %.2f | %.2f | %.3f |\n", r, x, y, y/x)
	}
	fmt.Println()
}

func overhead() {
	setup := func(mode string) func() (string, func()) {
		return func() (string, func()) {
			mnts, done := stack("overhead", []string{"null"}, []int{0, 1}, "--coherence="+mode)
			return mnts[1], done
		}
	}
	compare("Framework overhead: coherence on and off (paper: Table 3, 3-5%)",
		"A stack of one null layer with views of the lower directory and of the layer; the workload runs on the layer's view",
		"coherence off", "coherence on", setup("off"), setup("on"))
}

func caching() {
	setup := func(args ...string) func() (string, func()) {
		return func() (string, func()) {
			mnts, done := stack("caching", []string{"null", "null", "null"}, []int{3}, args...)
			return mnts[0], done
		}
	}
	compare("What caching buys: three null layers (paper: Table 2)",
		"The top view of a stack of three null layers, the kernel caching names and attributes for an hour (coherence on) or not at all (--timeout 0)",
		"cached", "uncached", setup(), setup("--timeout", "0"))
}

const fileLen = 1024000

// updater increments bytes of the file through one of its views.
type updater interface {
	inc(view, off int)
	sync()
	close()
}

type pio struct{ fds []int }

func (p *pio) inc(v, off int) {
	b := []byte{0}
	unix.Pread(p.fds[v], b, int64(off))
	b[0]++
	unix.Pwrite(p.fds[v], b, int64(off))
}
func (p *pio) sync() {}
func (p *pio) close() {
	for _, fd := range p.fds {
		unix.Close(fd)
	}
}

// mm updates through shared mappings; a page written through one view is
// pushed (msync) before another view touches the file, as a page moves
// between layers in the paper.
type mm struct {
	maps [][]byte
	last int
}

func (m *mm) inc(v, off int) {
	if v != m.last {
		m.sync()
		m.last = v
	}
	m.maps[v][off]++
}
func (m *mm) sync() { unix.Msync(m.maps[m.last], unix.MS_SYNC) }
func (m *mm) close() {
	for _, b := range m.maps {
		unix.Munmap(b)
	}
}

func open(mnts []string, mode string) updater {
	var fds []int
	for _, m := range mnts {
		fd, err := unix.Open(filepath.Join(m, "f"), unix.O_RDWR, 0)
		must(err)
		fds = append(fds, fd)
	}
	if mode == "pread/pwrite" {
		return &pio{fds}
	}
	u := &mm{}
	for _, fd := range fds {
		b, err := unix.Mmap(fd, 0, fileLen, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
		must(err)
		u.maps = append(u.maps, b)
		unix.Close(fd)
	}
	return u
}

// update runs one benchmark of Figure 11 and returns seconds and the
// number of lost updates.
func update(mnts []string, mode, bench string) (float64, int) {
	must(os.WriteFile(filepath.Join(mnts[0], "f"), make([]byte, fileLen), 0o644))
	want := make([]byte, fileLen)
	u := open(mnts, mode)
	r := rand.New(rand.NewPCG(1, 2))
	start := time.Now()
	if bench == "random-update" {
		for i := 0; i < fileLen/10**scale; i++ {
			v, off := r.IntN(len(mnts)), r.IntN(fileLen)
			u.inc(v, off)
			want[off]++
		}
	} else {
		for i := 0; i < fileLen*8**scale; i++ {
			v, off := (i/fileLen)%len(mnts), i%fileLen
			u.inc(v, off)
			want[off]++
		}
	}
	u.sync()
	secs := time.Since(start).Seconds()
	u.close()
	got, err := os.ReadFile(filepath.Join(mnts[0], "f"))
	must(err)
	lost := 0
	for i := range want {
		if got[i] != want[i] {
			lost++
		}
	}
	return secs, lost
}

func interference() {
	type key struct{ mode, bench, layers string }
	times, lost := map[key][]float64{}, map[key]int{}
	cases := []struct{ mode, bench string }{
		{"mmap", "random-update"}, {"mmap", "sequential-update"}, {"pread/pwrite", "random-update"},
	}
	for i := 0; i < *reps; i++ {
		for _, layers := range []string{"one", "two"} {
			var mnts []string
			var done func()
			if layers == "one" {
				mnts, done = stack("interference", []string{"null"}, []int{1})
			} else {
				mnts, done = stack("interference", []string{"null", "null"}, []int{1, 2})
			}
			for _, c := range cases {
				s, l := update(mnts, c.mode, c.bench)
				k := key{c.mode, c.bench, layers}
				times[k] = append(times[k], s)
				lost[k] += l
			}
			done()
		}
	}
	fmt.Println("## Interference: updates through one null layer and through two (paper: Table 4, Figure 11)")
	fmt.Println()
	fmt.Printf("A %d-byte file, scale %d: random-update makes %d increments at random offsets through a random view, sequential-update %d in passes over the file, each pass through the next view. Seconds, medians of %d runs; lost updates summed over all runs.\n\n", fileLen, *scale, fileLen/10**scale, fileLen*8**scale, *reps)
	fmt.Println("| access | benchmark | one layer (s) | two layers (s) | two/one | lost updates | paper one | paper two | paper two/one |")
	fmt.Println("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
	paper := map[string][2]float64{"random-update": {14.67, 350.53}, "sequential-update": {441.04, 443.49}}
	for _, c := range cases {
		one, two := median(times[key{c.mode, c.bench, "one"}]), median(times[key{c.mode, c.bench, "two"}])
		p := paper[c.bench]
		fmt.Printf("| %s | %s | %.2f | %.2f | %.2f | %d | %.2f | %.2f | %.1f |\n", c.mode, c.bench, one, two, two/one,
			lost[key{c.mode, c.bench, "one"}]+lost[key{c.mode, c.bench, "two"}], p[0], p[1], p[1]/p[0])
	}
	fmt.Println()
}

func must(err error) {
	if err != nil {
		fail(err.Error())
	}
}

func fail(msg string) {
	fmt.Fprintln(os.Stderr, "coherence bench:", msg)
	os.Exit(1)
}
