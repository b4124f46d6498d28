package main

import (
	"fmt"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/dustin/go-humanize"
	"github.com/spf13/cobra"

	"github.com/shalefs/shale/internal/netdelay"
)

func init() {
	var listen, to, rate string
	var rtt time.Duration
	cmd := &cobra.Command{
		Use:   "delay --listen HOST:PORT --to HOST:PORT --rtt DURATION [--rate BYTES]",
		Short: "relay TCP with added latency (for benchmarks)",
		Long: `Delay relays every TCP connection made to --listen on to --to, adding half
of --rtt in each direction and, with --rate, limiting each direction of a
connection to that many bytes per second (10MB, 1MiB). It stands in for a
network link where the kernel has no netem (bench/net/run.sh).

It runs until SIGINT or SIGTERM. On SIGUSR1 it prints "requests N": the
9P messages clients have sent through it so far.`,
		Hidden: true,
		Args:   cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			var bps uint64
			if rate != "" {
				var err error
				if bps, err = humanize.ParseBytes(rate); err != nil {
					return fmt.Errorf("--rate %q: %v: write bytes per second, as 10MB or 1MiB", rate, err)
				}
			}
			return delay(listen, to, rtt, int64(bps))
		},
	}
	fl := cmd.Flags()
	fl.StringVar(&listen, "listen", "", "address to listen on, HOST:PORT")
	fl.StringVar(&to, "to", "", "address to relay to, HOST:PORT")
	fl.DurationVar(&rtt, "rtt", 0, "round-trip time to add (half each way)")
	fl.StringVar(&rate, "rate", "", "bytes per second per direction (default: no limit)")
	cmd.MarkFlagRequired("listen")
	cmd.MarkFlagRequired("to")
	rootCmd.AddCommand(cmd)
}

func delay(listen, to string, rtt time.Duration, rate int64) error {
	if rtt < 0 {
		return fmt.Errorf("--rtt %v is negative", rtt)
	}
	// Signals first: a SIGUSR1 that comes as soon as the port answers
	// must not kill the process.
	sig := make(chan os.Signal, 4)
	signal.Notify(sig, syscall.SIGINT, syscall.SIGTERM, syscall.SIGUSR1)
	defer signal.Stop(sig)
	p, err := netdelay.Listen(listen, to, rtt, rate)
	if err != nil {
		return err
	}
	defer p.Close()
	for s := range sig {
		if s != syscall.SIGUSR1 {
			return nil
		}
		// Stdout is unbuffered in Go: each line reaches a reader whole
		// and at once.
		fmt.Printf("requests %d\n", p.Requests())
	}
	return nil
}
