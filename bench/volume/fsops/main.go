// Command fsops runs the parts of bench/volume/run.sh that a shell loop
// would measure badly (a process per file would time fork, not the file
// system):
//
//	fsops md create|stat|list|remove N DIR
//	    one phase of mdtest's shape on N empty files DIR/f.000000...:
//	    create (open O_CREAT|O_EXCL, close), stat, list (readdir of DIR,
//	    stat of none), remove. One thread, as mdtest with one rank. The
//	    harness times each phase and drops kernel caches between them.
//
//	fsops two [-rounds R] [-timeout T] [-poll P] A B
//	    two clients: A and B are two mounts of the same store. Each round
//	    rewrites A/shared (open O_TRUNC, write, close) and creates
//	    A/new.R, then reads B/shared (a fresh open each time) and stats
//	    B/new.R every P until they show. It prints, as
//	    "row<TAB>value" lines: the median time from A's close to B's
//	    first read of the new bytes (and of the new name), the reads of B
//	    that began after A's close and still returned the old bytes (stale
//	    reads), the stats that did not find the new name, and the rounds
//	    whose change did not show within T.
package main

import (
	"bytes"
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"time"
)

func main() {
	if len(os.Args) < 2 {
		usage()
	}
	var err error
	switch os.Args[1] {
	case "md":
		err = md(os.Args[2:])
	case "two":
		err = two(os.Args[2:])
	default:
		usage()
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "fsops:", err)
		os.Exit(1)
	}
}

func usage() {
	fmt.Fprintln(os.Stderr, "usage: fsops md create|stat|list|remove N DIR | fsops two [-rounds R] [-timeout T] [-poll P] A B")
	os.Exit(2)
}

func md(args []string) error {
	if len(args) != 3 {
		usage()
	}
	n, err := strconv.Atoi(args[1])
	if err != nil || n <= 0 {
		return fmt.Errorf("md: N %q: want a positive number", args[1])
	}
	dir := args[2]
	name := func(i int) string { return filepath.Join(dir, fmt.Sprintf("f.%06d", i)) }
	switch args[0] {
	case "create":
		for i := range n {
			f, err := os.OpenFile(name(i), os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o644)
			if err != nil {
				return err
			}
			if err := f.Close(); err != nil {
				return err
			}
		}
	case "stat":
		for i := range n {
			if _, err := os.Stat(name(i)); err != nil {
				return err
			}
		}
	case "list":
		ents, err := os.ReadDir(dir)
		if err != nil {
			return err
		}
		if len(ents) != n {
			return fmt.Errorf("md list: %d entries in %s, want %d", len(ents), dir, n)
		}
	case "remove":
		for i := range n {
			if err := os.Remove(name(i)); err != nil {
				return err
			}
		}
	default:
		usage()
	}
	return nil
}

func two(args []string) error {
	fl := flag.NewFlagSet("two", flag.ExitOnError)
	rounds := fl.Int("rounds", 5, "changes made on A")
	timeout := fl.Duration("timeout", 10*time.Second, "how long B waits for each change to show")
	poll := fl.Duration("poll", 10*time.Millisecond, "pause between B's reads")
	fl.Parse(args)
	if fl.NArg() != 2 {
		usage()
	}
	a, b := fl.Arg(0), fl.Arg(1)
	content := func(r int) []byte { return fmt.Appendf(nil, "round %d of the shared file\n", r) }

	// B sees (and caches) round 0 before the rounds begin, if it ever
	// does: a B that does not counts every round as never shown.
	if err := os.WriteFile(filepath.Join(a, "shared"), content(0), 0o644); err != nil {
		return err
	}
	if _, _, ok := waitFor(*timeout, *poll, func() (bool, error) {
		got, err := os.ReadFile(filepath.Join(b, "shared"))
		return bytes.Equal(got, content(0)), ignoreNotExist(err)
	}); !ok {
		fmt.Fprintf(os.Stderr, "fsops: %s did not show the file %s made within %v\n", b, a, *timeout)
	}

	var dataTimes, nameTimes []time.Duration
	var staleReads, staleNames, dataLost, namesLost int
	for r := 1; r <= *rounds; r++ {
		want := content(r)
		if err := os.WriteFile(filepath.Join(a, "shared"), want, 0o644); err != nil {
			return err
		}
		d, stale, ok := waitFor(*timeout, *poll, func() (bool, error) {
			got, err := os.ReadFile(filepath.Join(b, "shared"))
			return bytes.Equal(got, want), ignoreNotExist(err)
		})
		staleReads += stale
		if ok {
			dataTimes = append(dataTimes, d)
		} else {
			dataLost++
		}

		nm := fmt.Sprintf("new.%d", r)
		if err := os.WriteFile(filepath.Join(a, nm), want, 0o644); err != nil {
			return err
		}
		d, stale, ok = waitFor(*timeout, *poll, func() (bool, error) {
			_, err := os.Stat(filepath.Join(b, nm))
			return err == nil, ignoreNotExist(err)
		})
		staleNames += stale
		if ok {
			nameTimes = append(nameTimes, d)
		} else {
			namesLost++
		}
	}
	fmt.Printf("data shows (s)\t%s\n", median(dataTimes, dataLost))
	fmt.Printf("stale reads\t%d\n", staleReads)
	fmt.Printf("data never shown\t%d\n", dataLost)
	fmt.Printf("name shows (s)\t%s\n", median(nameTimes, namesLost))
	fmt.Printf("stale lookups\t%d\n", staleNames)
	fmt.Printf("name never shown\t%d\n", namesLost)
	return nil
}

// waitFor calls cond every poll until it holds or timeout passes, and
// says how long that took and how many calls found it false.
func waitFor(timeout, poll time.Duration, cond func() (bool, error)) (time.Duration, int, bool) {
	start := time.Now()
	misses := 0
	for {
		ok, err := cond()
		if err != nil {
			fmt.Fprintln(os.Stderr, "fsops:", err)
		}
		if ok {
			return time.Since(start), misses, true
		}
		misses++
		if time.Since(start) > timeout {
			return 0, misses, false
		}
		time.Sleep(poll)
	}
}

func ignoreNotExist(err error) error {
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	return err
}

// median of ds, with lost more rounds that never showed: "inf" when they
// are half or more.
func median(ds []time.Duration, lost int) string {
	all := slices.Clone(ds)
	for range lost {
		all = append(all, time.Duration(1<<62))
	}
	if len(all) == 0 {
		return "nan"
	}
	slices.Sort(all)
	m := all[len(all)/2]
	if m == time.Duration(1<<62) {
		return "inf"
	}
	return fmt.Sprintf("%.4f", m.Seconds())
}
