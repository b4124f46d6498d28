package main

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/spf13/cobra"

	"github.com/shalefs/shale/export"
	"github.com/shalefs/shale/p9net"
	"github.com/shalefs/shale/remote"
)

func init() {
	var asJSON bool
	var server, keyFile, format string
	cmd := &cobra.Command{
		Use:   "stats MOUNTPOINT | stats 9p://HOST:PORT/ | stats --server ADDR",
		Short: "print the counters of a mount, or of a server",
		Long: `Stats prints what shale status says of MOUNTPOINT (its process, stack and
LOWER); the FUSE requests its kernel sent, by type, with how many failed and
the mean time to answer them; the lookups that found nothing, and those of
them the kernel keeps as missing (negative entries) and a change dropped; the
coherence callbacks: changes the stack made or noticed (those beside the
stack are other programs' in LOWER, or other clients' of a 9P server), and
what they dropped from this kernel's caches. With a 9p:// LOWER, the
counters of the 9P client serving it follow:
requests by 9P type, cache hits and misses by kind (stat, directory, data,
readlink, xattr), journal records applied, bytes sent and received. The
mount process answers on a unix socket in /run/shale/ (as root;
$XDG_RUNTIME_DIR/shale otherwise) named after a hash of the mount point.

With a server that follows Sprite's rules (shale serve), a "Sprite" part
follows: bytes programs read and wrote against those that went to and from
the server (the traffic ratios), written bytes that never reached the server
(discarded: overwritten, truncated or deleted while delayed; lost: refused
by the server), what is dirty now, write-backs by reason (age, fsync,
recall, uncache, memory, setattr, unmount, reset), and the opens with the
consistency actions they took (a stale version whose cache was dropped, a
write-shared file not cached, recalls and uncaches answered, reclaims
refused).

With a 9p:// URL, or --server ADDR (tcp:HOST:PORT, HOST:PORT or
unix:/path; --keyfile for a server that wants a key), it prints the
statistics of the server's journal controller (shale serve): connections,
bytes in and out, journals and their records, requests by 9P type, and
Sprite's part (files followed, opens, those that recalled or were shared,
those that waited after a restart, recall timeouts, write-backs), as
tables. For scripts, --format raw prints the statistics file as the server
gives it, "name value" a line: requests.TYPE, bytes.in and .out,
connections, journals, records.*, sprite.* (docs/network.md).

--json prints the counters as one JSON object: a mount's, or a server's
statistics file as {"name": value, ...}.`,
		Args: func(cmd *cobra.Command, args []string) error {
			if server != "" {
				if len(args) != 0 {
					return fmt.Errorf("--server %s takes no MOUNTPOINT or URL: say one", server)
				}
				return nil
			}
			if keyFile != "" {
				return errors.New("--keyfile goes with --server; a 9p:// URL takes ?keyfile=FILE")
			}
			switch {
			case format != "table" && format != "raw":
				return fmt.Errorf("--format %s: say table or raw", format)
			case format == "raw" && asJSON:
				return errors.New("--format raw and --json: say one")
			}
			return cobra.ExactArgs(1)(cmd, args)
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			if server != "" {
				u, err := serverURL(server, keyFile)
				if err != nil {
					return err
				}
				args = []string{u}
			}
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
				switch {
				case asJSON:
					v, _ := export.ParseStats(b)
					return json.NewEncoder(os.Stdout).Encode(v)
				case format == "raw":
					os.Stdout.Write(b)
				default:
					printServerStats(os.Stdout, b)
				}
				return nil
			}
			mnt, err := filepath.Abs(args[0])
			if err != nil {
				return err
			}
			r, err := readStatus(mnt)
			if err != nil {
				return err
			}
			if asJSON {
				return json.NewEncoder(os.Stdout).Encode(r)
			}
			printView(os.Stdout, r.Mount)
			if r.Fuse != nil {
				fmt.Println()
				printFuse(os.Stdout, r.Fuse, r.Coherence)
			}
			if r.Stats != nil {
				fmt.Println()
				printStats(os.Stdout, *r.Stats)
			}
			return nil
		},
	}
	cmd.ValidArgsFunction = completeStats
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the counters as JSON, a mount's or a server's")
	cmd.Flags().StringVar(&format, "format", "table", "a server's statistics as tables (table), or as its file gives them, name value a line (raw)")
	cmd.Flags().StringVar(&server, "server", "", "print the statistics of the server at ADDR: tcp:HOST:PORT, HOST:PORT or unix:/path (as shale stats 9p://ADDR/)")
	cmd.Flags().StringVar(&keyFile, "keyfile", "", "with --server: the key the server wants")
	rootCmd.AddCommand(cmd)
}

// serverURL is the 9p:// URL of a server's address as --server gives it:
// tcp:HOST:PORT, HOST:PORT or unix:/path (or a 9p:// URL).
func serverURL(addr, keyFile string) (string, error) {
	const how = "write tcp:HOST:PORT, HOST:PORT or unix:/path"
	if strings.HasPrefix(addr, "9p://") {
		if keyFile != "" {
			return "", fmt.Errorf("--server %s --keyfile %s: give the key in the URL (?keyfile=FILE), or the server's address", addr, keyFile)
		}
		return addr, nil
	}
	r := p9net.Remote{Query: url.Values{}}
	if path, ok := strings.CutPrefix(addr, "unix:"); ok {
		if !strings.HasPrefix(path, "/") {
			return "", fmt.Errorf("--server %s: the socket's path must be absolute: %s", addr, how)
		}
		r.Addr = p9net.Addr{Network: "unix", Address: path}
	} else {
		hostPort := strings.TrimPrefix(addr, "tcp:")
		host, port, err := net.SplitHostPort(hostPort)
		if err != nil {
			var ae *net.AddrError
			if errors.As(err, &ae) {
				err = errors.New(ae.Err)
			}
			return "", fmt.Errorf("--server %s: %v: %s", addr, err, how)
		}
		if host == "" || port == "" {
			return "", fmt.Errorf("--server %s: no host or port: %s", addr, how)
		}
		r.Addr = p9net.Addr{Network: "tcp", Address: hostPort}
	}
	if keyFile != "" {
		r.Query.Set("keyfile", keyFile)
	}
	return r.String(), nil
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

func printStats(w io.Writer, s remote.Stats) {
	caching := "off (the server has no journal controller: close-to-open)"
	switch {
	case s.Caching:
		caching = "on, journal " + s.Journal
	case s.Journal != "":
		// A journal was read: the controller is there, the server not.
		caching = "off until the server answers again (journal " + s.Journal + ")"
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
	if s.DirOpensUnsent > 0 {
		// Each a walk, a Tlopen and a clunk.
		fmt.Fprintf(w, "           %d directory opens never sent (%d requests saved)\n", s.DirOpensUnsent, 3*s.DirOpensUnsent)
	}
	if s.Sprite != nil {
		printSprite(w, s.Sprite)
	}
}

// printSprite prints the tables of Sprite's rules (after seeds/001's).
func printSprite(w io.Writer, sp *remote.SpriteStats) {
	delay := "write delay " + sp.WriteDelay
	if sp.WriteDelay == "off" || sp.WriteDelay == "" {
		delay = "write-through"
	}
	fmt.Fprintf(w, "\nSprite (%s)\n", delay)
	fmt.Fprintf(w, "%-12s %14s %14s %8s\n", "bytes", "programs", "server", "ratio")
	fmt.Fprintf(w, "%-12s %14d %14d %8s\n", "read", sp.ReadBytes, sp.ReadServerBytes, percent(sp.ReadServerBytes, sp.ReadBytes))
	fmt.Fprintf(w, "%-12s %14d %14d %8s\n", "written", sp.WriteBytes, sp.WriteServerBytes, percent(sp.WriteServerBytes, sp.WriteBytes))
	fmt.Fprintf(w, "never sent   %d bytes discarded (%s of written: overwritten, truncated or deleted first), %d lost (refused by the server)\n",
		sp.Discarded, percent(sp.Discarded, sp.WriteBytes), sp.Lost)
	fmt.Fprintf(w, "dirty now    %d bytes in %d files\n", sp.DirtyBytes, sp.DirtyFiles)
	var total uint64
	var parts []string
	for _, r := range slices.Sorted(maps.Keys(sp.WriteBacks)) {
		total += sp.WriteBacks[r]
		if sp.WriteBacks[r] > 0 {
			parts = append(parts, fmt.Sprintf("%s %d", r, sp.WriteBacks[r]))
		}
	}
	fmt.Fprintf(w, "write-backs  %d", total)
	if len(parts) > 0 {
		fmt.Fprintf(w, ": %s", strings.Join(parts, ", "))
	}
	fmt.Fprintln(w)
	fmt.Fprintf(w, "opens        %d\n", sp.Opens)
	for _, a := range []struct {
		what string
		n    uint64
	}{
		{"stale version (cache dropped)", sp.OpensStale},
		{"write-shared (not cached)", sp.OpensNoCache},
		{"recalls answered", sp.Recalls},
		{"uncaches answered", sp.Uncaches},
		{"reclaims refused", sp.ReclaimsRefused},
		{"cleans sent unasked", sp.Cleans},
	} {
		fmt.Fprintf(w, "  %-30s %10d %8s of opens\n", a.what, a.n, percent(a.n, sp.Opens))
	}
	// A delegated open skips the fid's walk, its Tlopen and, at the close,
	// its clunk.
	fmt.Fprintf(w, "delegations  %d granted, %d returned; %d opens without a request (%d requests saved)\n",
		sp.Delegations, sp.Returns, sp.OpensDelegated, 3*sp.OpensDelegated)
	// A lock call kept under a delegation skips its Tlock or Tgetlock.
	fmt.Fprintf(w, "locks kept   %d lock calls answered under delegations (%d requests saved); %d locks pushed to the server since\n",
		sp.LocksKept, sp.LocksKept, sp.LocksPushed)
	// A kept setting of times skips its Tsetattr and Tgetattr, and the
	// write-back it would have made first.
	fmt.Fprintf(w, "times kept   %d settings of times kept with delayed writes (%d requests saved, and their write-backs)\n",
		sp.TimesKept, 2*sp.TimesKept)
	if len(sp.Size) > 0 {
		fmt.Fprintf(w, "%-12s %14s %14s\n", "cache size", "data", "dirty")
		for _, z := range sp.Size {
			fmt.Fprintf(w, "  %-10s %14d %14d\n", z.At.Local().Format("15:04:05"), z.CachedData, z.Dirty)
		}
	}
}

// percent is n as a share of of, or "-" if of is 0.
func percent(n, of uint64) string {
	if of == 0 {
		return "-"
	}
	return fmt.Sprintf("%.1f%%", 100*float64(n)/float64(of))
}
