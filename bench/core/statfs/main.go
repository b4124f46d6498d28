// Command statfs times statfs(2) on a path: on a FUSE mount every call is
// one STATFS request (the kernel caches none), so it measures what one
// round trip to a FUSE server costs (bench/core/roundtrip.sh).
//
//	statfs [-n CALLS] [-r ROUNDS] PATH
//
// It prints the median and the fastest round's microseconds per call.
package main

import (
	"flag"
	"fmt"
	"os"
	"slices"
	"syscall"
	"time"
)

func main() {
	calls := flag.Int("n", 20000, "calls per round")
	rounds := flag.Int("r", 7, "rounds")
	flag.Parse()
	if flag.NArg() != 1 || *calls < 1 || *rounds < 1 {
		fmt.Fprintln(os.Stderr, "usage: statfs [-n CALLS] [-r ROUNDS] PATH")
		os.Exit(2)
	}
	path := flag.Arg(0)
	var s syscall.Statfs_t
	per := make([]float64, 0, *rounds)
	for range *rounds {
		t := time.Now()
		for range *calls {
			if err := syscall.Statfs(path, &s); err != nil {
				fmt.Fprintf(os.Stderr, "statfs %s: %v\n", path, err)
				os.Exit(1)
			}
		}
		per = append(per, float64(time.Since(t).Nanoseconds())/float64(*calls)/1000)
	}
	slices.Sort(per)
	fmt.Printf("%.2f\t%.2f\n", per[len(per)/2], per[0])
}
