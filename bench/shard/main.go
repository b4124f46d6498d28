// Command shard-bench measures lookup, create and delete times in one flat
// directory as it grows, on plain ext4, through a FUSE mount of shale's
// shard layer (the directory marked with chmod u+s), and, for reference,
// through the loop view (shale without layers), and prints medians over
// repetitions and ratios.
//
//	go run ./bench/shard -n 250000
//
// Every entry is made through the file system measured (through the mount
// for the FUSE cases), by several goroutines. At each checkpoint it times,
// one operation at a time relative to an open directory descriptor:
// lookup (fstatat of a random existing name, after dropping the kernel's
// dentry and inode caches, so that the file system below really looks the
// name up), create (open O_CREAT|O_EXCL of a new name, close) and delete
// (unlink of those names). Mounts use --timeout 0, so that every lookup
// reaches shale rather than the kernel's dentry cache. Needs root.
package main

import (
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"
)

var (
	dir     = flag.String("dir", "/var/tmp/shard-bench", "scratch directory on the ext4 file system to measure")
	n       = flag.Int("n", 250000, "entries in the directory at the last checkpoint")
	points  = flag.String("points", "1000,10000,50000,100000,250000", "checkpoints (entries), at most -n")
	reps    = flag.Int("reps", 3, "repetitions; medians are reported")
	samples = flag.Int("samples", 2000, "operations timed per kind and checkpoint")
	workers = flag.Int("workers", 4, "goroutines making the bulk entries")
	shale   = flag.String("shale", "", "shale binary (default: build cmd/shale)")
)

// A setup is one way of serving the directory.
type setup struct {
	name   string
	layers []string // nil: plain ext4, no mount
	fuse   bool
}

var setups = []setup{
	{name: "ext4"},
	{name: "shard", layers: []string{"shard"}, fuse: true},
	{name: "loop", fuse: true},
}

var kinds = []string{"lookup", "create", "delete"}

func main() {
	flag.Parse()
	if os.Geteuid() != 0 {
		fail("must run as root: it mounts shale and drops the kernel's caches")
	}
	var cps []int
	for _, p := range strings.Split(*points, ",") {
		v, err := strconv.Atoi(strings.TrimSpace(p))
		if err != nil || v <= 0 {
			fail("bad -points entry %q", p)
		}
		if v <= *n {
			cps = append(cps, v)
		}
	}
	if !slices.Contains(cps, *n) {
		cps = append(cps, *n)
	}
	slices.Sort(cps)
	if err := os.MkdirAll(*dir, 0o755); err != nil {
		fail("%v", err)
	}
	bin := *shale
	if bin == "" {
		bin = filepath.Join(*dir, "shale")
		cmd := exec.Command("go", "build", "-o", bin, "github.com/shalefs/shale/cmd/shale")
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
		if out, err := cmd.CombinedOutput(); err != nil {
			fail("building shale: %v\n%s", err, out)
		}
	}
	// res[setup][kind][checkpoint] holds one mean (µs/op) per repetition.
	res := map[string]map[string]map[int][]float64{}
	start := time.Now()
	for rep := range *reps {
		for _, s := range setups {
			t0 := time.Now()
			r, err := runOne(bin, s, cps, rep)
			if err != nil {
				fail("%s: %v", s.name, err)
			}
			if res[s.name] == nil {
				res[s.name] = map[string]map[int][]float64{}
			}
			for k, byCp := range r {
				if res[s.name][k] == nil {
					res[s.name][k] = map[int][]float64{}
				}
				for cp, v := range byCp {
					res[s.name][k][cp] = append(res[s.name][k][cp], v)
				}
			}
			fmt.Fprintf(os.Stderr, "rep %d %s: %.1fs\n", rep+1, s.name, time.Since(t0).Seconds())
		}
	}
	report(res, cps)
	fmt.Printf("\n%d repetitions, %d samples per operation and checkpoint, %s in all\n", *reps, *samples, time.Since(start).Round(time.Second))
}

// runOne grows a fresh directory served by s to each checkpoint and
// measures there. It returns µs per operation by kind and checkpoint.
func runOne(bin string, s setup, cps []int, rep int) (map[string]map[int]float64, error) {
	base := filepath.Join(*dir, s.name)
	os.RemoveAll(base)
	lower, mnt := filepath.Join(base, "lower"), filepath.Join(base, "mnt")
	for _, d := range []string{lower, mnt} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return nil, err
		}
	}
	defer os.RemoveAll(base) // directly beneath: cleaning up is not measured
	top := lower
	if s.fuse {
		args := []string{"mount", "--timeout", "0"}
		for _, l := range s.layers {
			args = append(args, "--layer", l)
		}
		if out, err := exec.Command(bin, append(args, lower, mnt)...).CombinedOutput(); err != nil {
			return nil, fmt.Errorf("shale %s: %v\n%s", strings.Join(args, " "), err, out)
		}
		defer func() {
			if out, err := exec.Command(bin, "umount", mnt).CombinedOutput(); err != nil {
				fmt.Fprintf(os.Stderr, "umount %s: %v\n%s", mnt, err, out)
				exec.Command("umount", "-l", mnt).Run()
			}
		}()
		top = mnt
	}
	flat := filepath.Join(top, "flat")
	if err := os.Mkdir(flat, 0o755); err != nil {
		return nil, err
	}
	if slices.Contains(s.layers, "shard") {
		// The user's way to mark a directory: chmod u+s.
		if err := os.Chmod(flat, 0o755|os.ModeSetuid); err != nil {
			return nil, err
		}
	}
	dfd, err := unix.Open(flat, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, err
	}
	defer unix.Close(dfd)
	out := map[string]map[int]float64{}
	for _, k := range kinds {
		out[k] = map[int]float64{}
	}
	r := rand.New(rand.NewPCG(uint64(rep), 7))
	have := 0
	for _, cp := range cps {
		if err := fill(dfd, have, cp); err != nil {
			return nil, err
		}
		have = cp
		dropCaches()
		t := time.Now()
		for range *samples {
			var st unix.Stat_t
			if err := unix.Fstatat(dfd, entry(r.IntN(have)), &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
				return nil, fmt.Errorf("lookup: %v", err)
			}
		}
		out["lookup"][cp] = perOp(t)
		t = time.Now()
		for i := range *samples {
			fd, err := unix.Openat(dfd, "new"+strconv.Itoa(i), unix.O_CREAT|unix.O_EXCL|unix.O_WRONLY|unix.O_CLOEXEC, 0o644)
			if err != nil {
				return nil, fmt.Errorf("create: %v", err)
			}
			unix.Close(fd)
		}
		out["create"][cp] = perOp(t)
		t = time.Now()
		for i := range *samples {
			if err := unix.Unlinkat(dfd, "new"+strconv.Itoa(i), 0); err != nil {
				return nil, fmt.Errorf("delete: %v", err)
			}
		}
		out["delete"][cp] = perOp(t)
	}
	return out, nil
}

func entry(i int) string { return fmt.Sprintf("entry-%07d", i) }

func perOp(t time.Time) float64 {
	return float64(time.Since(t).Microseconds()) / float64(*samples)
}

// fill makes entries from..to-1 in the directory, with several goroutines.
func fill(dfd, from, to int) error {
	var next atomic.Int64
	next.Store(int64(from))
	var wg sync.WaitGroup
	var first atomic.Value
	for range *workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := int(next.Add(1) - 1)
				if i >= to {
					return
				}
				if err := unix.Mknodat(dfd, entry(i), unix.S_IFREG|0o644, 0); err != nil {
					first.CompareAndSwap(nil, err)
					return
				}
			}
		}()
	}
	wg.Wait()
	if err, ok := first.Load().(error); ok {
		return fmt.Errorf("making entries: %v", err)
	}
	return nil
}

// dropCaches drops the kernel's dentries and inodes (not the page cache:
// directory blocks stay in memory, so lookups measure the file systems'
// work, not the disk).
func dropCaches() {
	unix.Sync()
	if err := os.WriteFile("/proc/sys/vm/drop_caches", []byte("2"), 0); err != nil {
		fmt.Fprintf(os.Stderr, "drop_caches: %v (lookups may be served from the dentry cache)\n", err)
	}
	// The kernel now sends FUSE FORGETs for the dropped inodes; let the
	// servers work through them before timing.
	time.Sleep(time.Second)
}

func report(res map[string]map[string]map[int][]float64, cps []int) {
	med := func(s, k string, cp int) float64 { return median(res[s][k][cp]) }
	fmt.Printf("mean µs per operation in one flat directory (median of %d repetitions)\n\n", *reps)
	fmt.Printf("| entries |")
	for _, k := range kinds {
		for _, s := range setups {
			fmt.Printf(" %s %s |", k, s.name)
		}
	}
	fmt.Printf("\n|---:|")
	for range len(kinds) * len(setups) {
		fmt.Printf("---:|")
	}
	fmt.Println()
	for _, cp := range cps {
		fmt.Printf("| %d |", cp)
		for _, k := range kinds {
			for _, s := range setups {
				fmt.Printf(" %.1f |", med(s.name, k, cp))
			}
		}
		fmt.Println()
	}
	fmt.Printf("\nratios (median µs)\n\n| entries |")
	for _, k := range kinds {
		fmt.Printf(" %s shard/ext4 | %s shard/loop |", k, k)
	}
	fmt.Printf("\n|---:|")
	for range 2 * len(kinds) {
		fmt.Printf("---:|")
	}
	fmt.Println()
	for _, cp := range cps {
		fmt.Printf("| %d |", cp)
		for _, k := range kinds {
			fmt.Printf(" %.2f | %.2f |", med("shard", k, cp)/med("ext4", k, cp), med("shard", k, cp)/med("loop", k, cp))
		}
		fmt.Println()
	}
	lo, hi := cps[0], cps[len(cps)-1]
	fmt.Printf("\ngrowth from %d to %d entries (µs at %d / µs at %d)\n\n| setup |", lo, hi, hi, lo)
	for _, k := range kinds {
		fmt.Printf(" %s |", k)
	}
	fmt.Printf("\n|---|")
	for range kinds {
		fmt.Printf("---:|")
	}
	fmt.Println()
	for _, s := range setups {
		fmt.Printf("| %s |", s.name)
		for _, k := range kinds {
			fmt.Printf(" %.2f |", med(s.name, k, hi)/med(s.name, k, lo))
		}
		fmt.Println()
	}
}

func median(v []float64) float64 {
	if len(v) == 0 {
		return 0
	}
	s := slices.Clone(v)
	slices.Sort(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

func fail(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "shard-bench: "+format+"\n", args...)
	os.Exit(1)
}
