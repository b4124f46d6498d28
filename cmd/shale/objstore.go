package main

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"strings"
	"time"

	"github.com/dustin/go-humanize"
	"github.com/spf13/cobra"
	"golang.org/x/term"

	"github.com/shalefs/shale/objstore"
)

func init() {
	cmd := &cobra.Command{
		Use:   "objstore",
		Short: "a cache file system for immutable objects (CFS) in one file or device",
		Long: `objstore keeps immutable objects in one preallocated file or block device,
with the whole index in memory. A crash costs only misses, never wrong bytes.
See docs/objstore.md.`,
	}
	var size, policy string
	create := &cobra.Command{
		Use:   "create STORE --size SIZE",
		Short: "create a store in a new file, or on a block device",
		Args:  argCount(1, 1),
		RunE: func(c *cobra.Command, args []string) error {
			var n uint64
			if size != "" {
				var err error
				if n, err = humanize.ParseBytes(size); err != nil {
					return fmt.Errorf("--size %q is not a size: write it like 2GiB, 512MiB or 1G", size)
				}
			}
			if n == 0 && !isBlockDevice(args[0]) {
				return fmt.Errorf("creating %s: a file store needs --size, e.g. --size 2GiB", args[0])
			}
			s, err := objstore.Format(args[0], int64(n), objstore.Options{})
			if err != nil {
				return fmt.Errorf("create %s: %w", args[0], err)
			}
			return s.Close()
		},
	}
	create.Flags().StringVar(&size, "size", "", "store size, e.g. 2GiB (a block device defaults to all of it)")

	put := &cobra.Command{
		Use:   "put STORE KEY FILE",
		Short: "store the contents of FILE under KEY",
		Args:  argCount(3, 3),
		RunE: func(c *cobra.Command, args []string) error {
			data, err := os.ReadFile(args[2])
			if err != nil {
				return fmt.Errorf("put: %w", err)
			}
			if err := checkKey("put", args[1]); err != nil {
				return err
			}
			return withStore(args[0], "", false, func(s *objstore.Store) error {
				if err := s.Create(args[1], data); err != nil {
					return fmt.Errorf("put %s into %s: %w", showKey(args[1]), args[0], err)
				}
				return s.Sync()
			})
		},
	}
	get := &cobra.Command{
		Use:   "get STORE KEY [FILE]",
		Short: "write the object KEY to FILE, or to standard output",
		Args:  argCount(2, 3),
		RunE: func(c *cobra.Command, args []string) error {
			if err := checkKey("get", args[1]); err != nil {
				return err
			}
			return withStore(args[0], "", true, func(s *objstore.Store) error {
				data, err := s.Read(args[1])
				if errors.Is(err, objstore.ErrNotFound) {
					return fmt.Errorf("get: no object %s in %s: check the key (the store does not list its keys; 'shale objstore stat %s' counts its objects)", showKey(args[1]), args[0], args[0])
				}
				if err != nil {
					return fmt.Errorf("get %s from %s: %w", showKey(args[1]), args[0], err)
				}
				if len(args) == 3 {
					return writeOut(args[2], data)
				}
				_, err = os.Stdout.Write(data)
				return err
			})
		},
	}
	rm := &cobra.Command{
		Use:   "rm STORE KEY",
		Short: "remove the object KEY",
		Args:  argCount(2, 2),
		RunE: func(c *cobra.Command, args []string) error {
			if err := checkKey("rm", args[1]); err != nil {
				return err
			}
			return withStore(args[0], "", false, func(s *objstore.Store) error {
				if err := s.Remove(args[1]); errors.Is(err, objstore.ErrNotFound) {
					return fmt.Errorf("rm: no object %s in %s", showKey(args[1]), args[0])
				} else if err != nil {
					return err
				}
				return nil
			})
		},
	}
	stat := &cobra.Command{
		Use:   "stat STORE",
		Short: "print objects, bytes used and free, fragmentation and hit ratio",
		Args:  argCount(1, 1),
		RunE: func(c *cobra.Command, args []string) error {
			return withStore(args[0], "", true, func(s *objstore.Store) error {
				st := s.Stats()
				fmt.Printf("objects        %d\n", st.Objects)
				fmt.Printf("capacity       %s\n", humanize.IBytes(uint64(st.Capacity)))
				fmt.Printf("used           %s (%.1f%%)\n", humanize.IBytes(uint64(st.Used)), 100*float64(st.Used)/float64(st.Capacity))
				fmt.Printf("free           %s\n", humanize.IBytes(uint64(st.Free)))
				fmt.Printf("largest free   %s\n", humanize.IBytes(uint64(st.Largest)))
				fmt.Printf("fragmentation  %.1f%%\n", 100*st.Fragmentation)
				fmt.Printf("hit ratio      %.1f%% (%d hits, %d misses)\n", 100*st.HitRatio(), st.Hits, st.Misses)
				if !st.CleanOpen && st.Objects == 0 {
					fmt.Println("note           the last session did not close cleanly: its index was dropped")
				}
				return nil
			})
		},
	}
	replay := &cobra.Command{
		Use:   "replay STORE TRACE",
		Short: "replay a `time id size` trace (plain, xz or gzip) against the store",
		Args:  argCount(2, 2),
		RunE: func(c *cobra.Command, args []string) error {
			return withStore(args[0], policy, false, func(s *objstore.Store) error {
				return runReplay(s, args[1])
			})
		},
	}
	replay.Flags().StringVar(&policy, "policy", objstore.DefaultPolicy, "replacement policy: sieve or lru")
	cmd.AddCommand(create, put, get, rm, stat, replay)
	rootCmd.AddCommand(cmd)
}

// argCount is cobra's RangeArgs with an error that says what to do.
func argCount(lo, hi int) cobra.PositionalArgs {
	return func(c *cobra.Command, args []string) error {
		if len(args) < lo || len(args) > hi {
			return fmt.Errorf("usage: %s (got %d arguments): see '%s --help'", c.UseLine(), len(args), c.CommandPath())
		}
		return nil
	}
}

func isBlockDevice(path string) bool {
	st, err := os.Stat(path)
	return err == nil && st.Mode()&os.ModeDevice != 0
}

// withStore opens a store, runs fn and closes the store, saving its index.
// A readOnly store is opened without writing to it (get, stat), so it may
// be a file the user can only read; it shares the store with other readers
// but not with an owner.
func withStore(path, policy string, readOnly bool, fn func(*objstore.Store) error) error {
	if fi, err := os.Stat(path); err == nil && fi.Mode().IsRegular() && fi.Size() == 0 {
		// Nothing was lost: it never was a store.
		return fmt.Errorf("%s is an empty file, not a store: make one with 'shale objstore create %s --size SIZE'", path, path)
	}
	s, err := objstore.Open(path, objstore.Options{Policy: policy, ReadOnly: readOnly})
	if errors.Is(err, objstore.ErrInUse) {
		return err // "store PATH is in use by process PID (CMD): stop it, or wait"
	}
	if errors.Is(err, objstore.ErrCorrupt) {
		return fmt.Errorf("open %w: its objects are lost: recreate it with 'shale objstore create' (remove a file first)", err)
	}
	if err != nil {
		return fmt.Errorf("open store: %w", err)
	}
	err = fn(s)
	if cerr := s.Close(); err == nil && cerr != nil {
		err = fmt.Errorf("close %s: %w", path, cerr)
	}
	return err
}

// checkKey refuses a key the store cannot hold, saying its length rather
// than printing it: a mistaken key can be a whole file.
func checkKey(op, key string) error {
	if key == "" {
		return fmt.Errorf("%s: the key is empty: give a key of 1 to %d bytes", op, objstore.MaxKeyLen)
	}
	if len(key) > objstore.MaxKeyLen {
		return fmt.Errorf("%s: the key is %d bytes long, more than the limit of %d: use a shorter key", op, len(key), objstore.MaxKeyLen)
	}
	return nil
}

// showKey quotes a key for a message, cut short if it is long.
func showKey(key string) string {
	const limit = 64
	if len(key) <= limit {
		return fmt.Sprintf("%q", key)
	}
	return fmt.Sprintf("%q... (%d bytes)", key[:limit], len(key))
}

// writeOut writes a got object to path. If it fails, say on a full file
// system, a file it created is removed rather than left empty or short; a
// file that was there before has been overwritten in part, and says so.
func writeOut(path string, data []byte) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o644)
	made := err == nil
	if errors.Is(err, fs.ErrExist) {
		f, err = os.OpenFile(path, os.O_WRONLY|os.O_TRUNC, 0)
	}
	if err != nil {
		return fmt.Errorf("get: %w", err)
	}
	_, err = f.Write(data)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		return nil
	}
	if made {
		os.Remove(path)
		return fmt.Errorf("get: %v (%d bytes): removed %s: free space there, or write it elsewhere", err, len(data), path)
	}
	return fmt.Errorf("get: %v (%d bytes): %s is incomplete: free space there, or write it elsewhere", err, len(data), path)
}

func runReplay(s *objstore.Store, path string) error {
	f, err := os.Open(path)
	if err != nil {
		return fmt.Errorf("replay: %w", err)
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return err
	}
	cr := &countingReader{r: f}
	tr, err := objstore.NewTraceReader(cr)
	if err != nil {
		return fmt.Errorf("replay %s: %w", path, err)
	}
	var progress func(objstore.ReplayResult)
	if term.IsTerminal(int(os.Stdout.Fd())) {
		var last time.Time
		progress = func(r objstore.ReplayResult) {
			if now := time.Now(); now.Sub(last) > 100*time.Millisecond {
				last = now
				drawBar(float64(cr.n)/float64(max(fi.Size(), 1)), r)
			}
		}
	}
	res, err := objstore.Replay(s, tr, progress)
	if progress != nil {
		fmt.Print("\r\033[K")
	}
	if err != nil {
		return fmt.Errorf("replay %s: %w", path, err)
	}
	fmt.Printf("requests       %d\n", res.Requests)
	fmt.Printf("hit ratio      %.2f%% (%d hits)\n", 100*res.HitRatio(), res.Hits)
	fmt.Printf("bytes read     %s\n", humanize.IBytes(uint64(res.BytesRead)))
	fmt.Printf("bytes written  %s\n", humanize.IBytes(uint64(res.BytesWritten)))
	fmt.Printf("ops/s          %.0f (%.2fs)\n", res.OpsPerSec(), res.Elapsed.Seconds())
	return nil
}

func drawBar(frac float64, r objstore.ReplayResult) {
	const width = 30
	frac = min(max(frac, 0), 1)
	n := int(frac * width)
	fmt.Printf("\r[%s%s] %3.0f%%  %d requests  hit %.1f%%", strings.Repeat("=", n), strings.Repeat(" ", width-n), 100*frac, r.Requests, 100*r.HitRatio())
}

// countingReader counts the compressed bytes consumed, for the progress bar.
type countingReader struct {
	r io.Reader
	n int64
}

func (c *countingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n += int64(n)
	return n, err
}
