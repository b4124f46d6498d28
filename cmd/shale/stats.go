package main

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/shalefs/shale/p9net"
	"github.com/shalefs/shale/remote"
)

func init() {
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "stats MOUNTPOINT | stats 9p://HOST:PORT/",
		Short: "print the counters of a mount of a 9P tree, or of a server",
		Long: `Stats prints the counters of the 9P client serving MOUNTPOINT: requests by
9P type, cache hits and misses by kind (stat, directory, data, readlink,
xattr), journal records applied, bytes sent and received. The mount process
answers on a unix socket in /run/shale/ (as root; $XDG_RUNTIME_DIR/shale
otherwise) named after a hash of the mount point.

With a 9p:// URL it prints the statistics file of the server's journal
controller (shale serve) as the server gives it. --json prints a mount's
counters as one JSON object.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if r, ok, err := p9net.ParseRemote(args[0]); ok {
				if err != nil {
					return err
				}
				opts, err := remote.OptionsFromQuery(r.Query)
				if err != nil {
					return fmt.Errorf("%s: %w", args[0], err)
				}
				b, err := remote.ServerStats(context.Background(), r, opts)
				if err != nil {
					return err
				}
				os.Stdout.Write(b)
				return nil
			}
			mnt, err := filepath.Abs(args[0])
			if err != nil {
				return err
			}
			s, err := readStats(mnt)
			if err != nil {
				return err
			}
			if asJSON {
				return json.NewEncoder(os.Stdout).Encode(s)
			}
			printStats(os.Stdout, s)
			return nil
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print a mount's counters as JSON")
	rootCmd.AddCommand(cmd)
}

// statsDir holds the mount processes' statistics sockets and serving
// locks.
func statsDir() string {
	if os.Geteuid() == 0 {
		return "/run/shale"
	}
	if d := os.Getenv("XDG_RUNTIME_DIR"); d != "" {
		return filepath.Join(d, "shale")
	}
	return filepath.Join(os.TempDir(), fmt.Sprintf("shale-%d", os.Geteuid()))
}

// statsSocket is where the process serving mnt answers.
func statsSocket(mnt string) string {
	return filepath.Join(statsDir(), "stats-"+mountHash(mnt)+".sock")
}

// mountHash names the files of mount point mnt: a hash, as a mount point
// may be longer than a socket's name can be.
func mountHash(mnt string) string {
	h := sha256.Sum256([]byte(mnt))
	return hex.EncodeToString(h[:8])
}

// serveStats answers shale stats for each view of a stack whose lower is
// a 9P tree, until the returned stop.
func serveStats(p *plan, logger *slog.Logger) (stop func()) {
	if _, ok := remote.StatsOf(p.bottom); !ok {
		return func() {}
	}
	var ls []net.Listener
	for _, v := range p.spec.Views {
		sock := statsSocket(v.Mountpoint)
		os.MkdirAll(filepath.Dir(sock), 0o755)
		if c, err := net.DialTimeout("unix", sock, time.Second); err == nil {
			c.Close()
			logger.Warn("another process answers the statistics of this mount point", "socket", sock)
			continue
		}
		os.Remove(sock)
		l, err := net.Listen("unix", sock)
		if err != nil {
			logger.Warn("no statistics socket", "socket", sock, "err", err)
			continue
		}
		ls = append(ls, l)
		go func() {
			for {
				c, err := l.Accept()
				if err != nil {
					return
				}
				s, _ := remote.StatsOf(p.bottom)
				json.NewEncoder(c).Encode(s)
				c.Close()
			}
		}()
	}
	return func() {
		for _, l := range ls {
			l.Close() // removes the socket file
		}
	}
}

// readStats asks the process serving mnt for its counters.
func readStats(mnt string) (remote.Stats, error) {
	var s remote.Stats
	sock := statsSocket(mnt)
	c, err := net.DialTimeout("unix", sock, 5*time.Second)
	if err != nil {
		return s, fmt.Errorf("no statistics for %s (%v): is it a shale mount of a 9p:// tree, mounted by this user?", mnt, err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(10 * time.Second))
	b, err := io.ReadAll(c)
	if err == nil {
		err = json.Unmarshal(b, &s)
	}
	if err != nil {
		return s, fmt.Errorf("statistics of %s from %s: %v", mnt, sock, err)
	}
	return s, nil
}

func printStats(w io.Writer, s remote.Stats) {
	caching := "off (the server has no journal controller: close-to-open)"
	if s.Caching {
		caching = "on, journal " + s.Journal
	}
	fmt.Fprintf(w, "server     %s\ncaching    %s\n", s.Server, caching)
	fmt.Fprintf(w, "cached     %d files, %d bytes of data\n", s.CachedFiles, s.CachedBytes)
	fmt.Fprintf(w, "journal    %d records applied, %d resets, %d reads, %d QIDs dropped\n", s.Records, s.Resets, s.JournalReads, s.Dropped)
	fmt.Fprintf(w, "bytes      %d sent, %d received\n", s.BytesSent, s.BytesReceived)
	fmt.Fprintf(w, "%-10s %10s %10s\n", "cache", "hits", "misses")
	for _, k := range slices.Sorted(maps.Keys(s.Hits)) {
		fmt.Fprintf(w, "%-10s %10d %10d\n", k, s.Hits[k], s.Misses[k])
	}
	var total uint64
	var parts []string
	for _, k := range slices.Sorted(maps.Keys(s.Requests)) {
		total += s.Requests[k]
		parts = append(parts, fmt.Sprintf("%s %d", k, s.Requests[k]))
	}
	fmt.Fprintf(w, "requests   %d: %s\n", total, strings.Join(parts, ", "))
}
