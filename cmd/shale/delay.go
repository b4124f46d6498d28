package main

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/dustin/go-humanize"
	"github.com/spf13/cobra"

	"github.com/shalefs/shale/internal/netdelay"
)

func init() {
	var listen, to, rate string
	var rtt time.Duration
	var control bool
	cmd := &cobra.Command{
		Use:   "delay --listen HOST:PORT --to HOST:PORT [--rtt DURATION] [--rate BYTES] [--control]",
		Short: "relay TCP with added latency or faults (for benchmarks and tests)",
		Long: `Delay relays every TCP connection made to --listen on to --to, adding half
of --rtt in each direction and, with --rate, limiting each direction of a
connection to that many bytes per second (10MB, 1MiB). It stands in for a
network link where the kernel has no netem (bench/net/run.sh).

It runs until SIGINT or SIGTERM. On SIGUSR1 it prints "requests N": the
9P messages clients have sent through it so far.

With --control it also reads commands from standard input, one a line,
and fails the link for every connection, current and future: "reset"
ends each connection with a TCP reset both ways; "partition" drops every
byte and leaves new connections hanging, as a pulled cable would; "stall"
holds bytes back, queued; "heal" ends a partition or a stall (resetting
the connections a partition took bytes from); "requests" asks for the
count. Each command is answered by one line on standard output, "ok
COMMAND" or "requests N", or "error: ..." for one it does not know. The
end of standard input stops the relay.`,
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
			return delay(listen, to, rtt, int64(bps), control)
		},
	}
	fl := cmd.Flags()
	fl.StringVar(&listen, "listen", "", "address to listen on, HOST:PORT")
	fl.StringVar(&to, "to", "", "address to relay to, HOST:PORT")
	fl.DurationVar(&rtt, "rtt", 0, "round-trip time to add (half each way)")
	fl.StringVar(&rate, "rate", "", "bytes per second per direction (default: no limit)")
	fl.BoolVar(&control, "control", false, "read fault commands from standard input (reset, partition, stall, heal, requests)")
	cmd.MarkFlagRequired("listen")
	cmd.MarkFlagRequired("to")
	rootCmd.AddCommand(cmd)
}

func delay(listen, to string, rtt time.Duration, rate int64, control bool) error {
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
	var cmds <-chan string // nil, never ready, without --control
	var cmdErr <-chan error
	if control {
		cmds, cmdErr = readLines(os.Stdin)
	}
	// Stdout is unbuffered in Go: each line reaches a reader whole and at
	// once. Both kinds of line are printed here, so they never interleave.
	for {
		select {
		case s := <-sig:
			if s != syscall.SIGUSR1 {
				return nil
			}
			fmt.Printf("requests %d\n", p.Requests())
		case line, ok := <-cmds:
			if !ok {
				return <-cmdErr // EOF: as SIGTERM
			}
			fmt.Println(command(p, strings.TrimSpace(line)))
		}
	}
}

// readLines sends r's lines on the first channel until r ends, then its
// error (nil at EOF) on the second.
func readLines(r io.Reader) (<-chan string, <-chan error) {
	lines := make(chan string)
	errc := make(chan error, 1)
	go func() {
		sc := bufio.NewScanner(r)
		for sc.Scan() {
			lines <- sc.Text()
		}
		errc <- sc.Err()
		close(lines)
	}()
	return lines, errc
}

// command applies one --control command to p and returns its answer.
func command(p *netdelay.Proxy, cmd string) string {
	switch cmd {
	case "reset":
		p.Reset()
	case "partition":
		p.Partition()
	case "stall":
		p.Stall()
	case "heal":
		p.Heal()
	case "requests":
		return fmt.Sprintf("requests %d", p.Requests())
	default:
		return fmt.Sprintf("error: unknown command %q: want reset, partition, stall, heal or requests", cmd)
	}
	return "ok " + cmd
}
