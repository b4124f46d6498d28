package main

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"strings"

	"github.com/spf13/cobra"

	"github.com/shalefs/shale/crypt"
	"github.com/shalefs/shale/layer"
	_ "github.com/shalefs/shale/remote" // 9p:// LOWERs, for this and every command
	"github.com/shalefs/shale/stack"
)

func init() {
	var layerName, passfile string
	var force, noHoles bool
	var logN int
	cmd := &cobra.Command{
		Use:   "init --layer crypt [--passfile F] [--force] [--no-holes] LOWER",
		Short: "prepare LOWER for a layer that keeps state (crypt: an encrypted directory)",
		Long: `init prepares LOWER for a layer. Only crypt needs it: init makes a random
master key, wraps it under a passphrase (scrypt, then AES-256-GCM) and writes
it to LOWER/shale.conf. Keep a copy of shale.conf: without it nothing in LOWER
can be read, whatever the passphrase.

The passphrase is asked twice on the terminal, or read from the first line of
--passfile F, or from the first line of standard input when that is not a
terminal. LOWER is a directory, created if missing, or 9p://HOST:PORT/ANAME
of a 9P server; it must be empty unless --force.

--no-holes stores every block of every file encrypted, so that someone who
can write LOWER cannot make a file read zeros (by zeroing its blocks, or
growing it with zeros). It costs space: a sparse file (truncate -s 1G) takes
its full size, and growing it writes that many encrypted zeros. It is fixed
at init. See docs/crypt-format.md, "Threat model".`,
		Args: argCount(1, 1),
		RunE: func(c *cobra.Command, args []string) error {
			lower := args[0]
			switch layerName {
			case "crypt":
			case "":
				return fmt.Errorf("init %s: which layer? pass --layer crypt (the only layer that needs init)", lower)
			default:
				return fmt.Errorf("init %s: --layer %q needs no init: only --layer crypt does", lower, layerName)
			}
			pass, err := newPassphraseFrom(passfile, "passphrase for "+lower)
			if err != nil {
				return err
			}
			defer clear(pass)
			// Only a local LOWER can be made here; a remote one is the
			// server's to make.
			if !strings.Contains(lower, "://") {
				if err := os.Mkdir(lower, 0o700); err != nil && !errors.Is(err, fs.ErrExist) {
					return fmt.Errorf("create %s: %w", lower, err)
				}
			}
			return stack.UseLower(lower, func(root layer.Node) error {
				return crypt.Init(context.Background(), root, lower, pass, crypt.Options{ScryptLogN: logN, Force: force, FillHoles: noHoles})
			})
		},
	}
	cmd.Flags().StringVar(&layerName, "layer", "", "the layer to prepare LOWER for: crypt")
	cmd.RegisterFlagCompletionFunc("layer", cobra.FixedCompletions([]cobra.Completion{"crypt"}, cobra.ShellCompDirectiveNoFileComp))
	cmd.Flags().StringVar(&passfile, "passfile", "", "read the passphrase from the first line of this file")
	cmd.Flags().BoolVar(&force, "force", false, "initialise a LOWER that is not empty (its files stay as they are, hidden)")
	cmd.Flags().BoolVar(&noHoles, "no-holes", false, "store every block encrypted: no all-zero block reads as a hole (sparse files take their full size)")
	// Tests use a cheap scrypt; the default suits people.
	cmd.Flags().IntVar(&logN, "scrypt-logn", 0, "log2 of scrypt's cost N (default 16)")
	cmd.Flags().MarkHidden("scrypt-logn")
	rootCmd.AddCommand(cmd)
}
