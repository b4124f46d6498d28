package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/dustin/go-humanize"
	"github.com/spf13/cobra"
	"golang.org/x/term"

	"github.com/shalefs/shale/compress"
	"github.com/shalefs/shale/p9net"
)

func init() {
	var layers []string
	cmd := &cobra.Command{
		Use:   "convert --layer compress LOWER",
		Short: "compress the plain files of a directory in place, for --layer compress",
		Long: `Convert compresses every plain file under the local directory LOWER in place,
so that a mount with --layer compress stores it compressed (docs/compress.md).
Each file is written compressed beside itself, synced, and renamed over it: an
interruption (^C, a crash) leaves every file whole, and running convert again
goes on where it stopped. Files already compressed, empty files and
hard-linked files (left plain: a rename would split their links) are skipped;
a mount with --layer compress reads plain files as they are.

Do not convert a LOWER that is mounted or in use: a file changed while it is
converted is left plain (and reported), not lost, but the mount's caches do not
know of the new files.

On a terminal it shows a progress bar (files, bytes, ratio so far, time left);
otherwise one line per file.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if len(layers) != 1 || layers[0] != "compress" {
				return errors.New("convert needs --layer compress: it is the only layer that converts a directory in place")
			}
			lower := args[0]
			if _, ok, _ := p9net.ParseRemote(lower); ok || strings.Contains(lower, "://") {
				return fmt.Errorf("convert %s: it converts a local directory; run it on the server's machine", lower)
			}
			if fi, err := os.Stat(lower); err != nil || !fi.IsDir() {
				return fmt.Errorf("convert %s: not a directory", lower)
			}
			return convert(lower, os.Stderr, term.IsTerminal(int(os.Stderr.Fd())))
		},
	}
	cmd.Flags().StringArrayVar(&layers, "layer", nil, "the layer to convert LOWER for: compress")
	cmd.RegisterFlagCompletionFunc("layer", cobra.FixedCompletions([]cobra.Completion{"compress"}, cobra.ShellCompDirectiveNoFileComp))
	rootCmd.AddCommand(cmd)
}

func convert(lower string, w io.Writer, tty bool) error {
	start := time.Now()
	var last compress.Progress
	var drawn time.Time
	err := compress.Convert(context.Background(), lower, func(p compress.Progress) {
		last = p
		if !tty {
			if p.SkipReason != "" {
				fmt.Fprintf(w, "shale: convert: %s: %s\n", p.Path, p.SkipReason)
			} else {
				fmt.Fprintf(w, "shale: convert: %s (%d of %d files, ratio %s)\n", p.Path, p.Files+p.Skipped, p.TotalFiles, ratio(p))
			}
			return
		}
		if time.Since(drawn) < 100*time.Millisecond && p.Files+p.Skipped < p.TotalFiles {
			return
		}
		drawn = time.Now()
		fmt.Fprintf(w, "\r%s", bar(p, time.Since(start)))
	})
	if tty && last.TotalFiles > 0 {
		fmt.Fprintln(w)
	}
	if err != nil {
		return err
	}
	fmt.Fprintf(w, "shale: converted %d files (%s to %s, ratio %s) in %s; %d left plain\n",
		last.Files, humanize.IBytes(uint64(last.Bytes)), humanize.IBytes(uint64(last.Stored)), ratio(last),
		time.Since(start).Round(time.Second), last.Skipped)
	return nil
}

// ratio is the stored size over the plain size, so far.
func ratio(p compress.Progress) string {
	if p.Bytes == 0 {
		return "-"
	}
	return fmt.Sprintf("%.2f", float64(p.Stored)/float64(p.Bytes))
}

// bar is one line of progress: files, bytes, ratio and time left (by
// bytes, as the time goes into them).
func bar(p compress.Progress, took time.Duration) string {
	const width = 30
	frac := 1.0
	if p.TotalBytes > 0 {
		frac = float64(p.Bytes) / float64(p.TotalBytes)
	}
	filled := int(frac * width)
	eta := "-"
	if p.Bytes > 0 {
		eta = (time.Duration(float64(took)/frac) - took).Round(time.Second).String()
	}
	return fmt.Sprintf("[%s%s] %d/%d files  %s/%s  ratio %s  ETA %s ", strings.Repeat("#", filled), strings.Repeat(".", width-filled),
		p.Files+p.Skipped, p.TotalFiles, humanize.IBytes(uint64(p.Bytes)), humanize.IBytes(uint64(p.TotalBytes)), ratio(p), eta)
}
