package main

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"

	"github.com/spf13/cobra"
	"golang.org/x/term"

	"github.com/shalefs/shale/crypt"
	"github.com/shalefs/shale/layer"
	"github.com/shalefs/shale/stack"
)

func init() {
	var passfile, newPassfile string
	cmd := &cobra.Command{
		Use:   "passwd [--passfile F] [--new-passfile F] LOWER",
		Short: "change the passphrase of the crypt directory LOWER",
		Long: `passwd rewraps the master key in LOWER/shale.conf under a new passphrase.
The files in LOWER do not change, and the old shale.conf is replaced
atomically. LOWER is a directory or 9p://HOST:PORT/ANAME of a 9P server.

The current passphrase comes from the terminal, --passfile F (its first line)
or standard input when that is not a terminal; the new one from the terminal
(asked twice), --new-passfile F, or the next line of standard input:

  printf '%s\n%s\n' "$OLD" "$NEW" | shale passwd LOWER`,
		Args: argCount(1, 1),
		RunE: func(c *cobra.Command, args []string) error {
			lower := args[0]
			ctx := context.Background()
			return stack.UseLower(lower, func(root layer.Node) error {
				// Say that LOWER is no crypt directory before asking anything.
				if err := crypt.Check(ctx, root, lower); err != nil {
					return err
				}
				old, err := passphraseFrom(passfile, "current passphrase for "+lower)
				if err != nil {
					return err
				}
				defer clear(old)
				// Check the old passphrase before asking for a new one.
				if _, err := crypt.Open(ctx, root, lower, old); err != nil {
					return err
				}
				pass, err := newPassphraseFrom(newPassfile, "new passphrase for "+lower)
				if err != nil {
					return err
				}
				defer clear(pass)
				return crypt.ChangePassphrase(ctx, root, lower, old, pass)
			})
		},
	}
	cmd.Flags().StringVar(&passfile, "passfile", "", "read the current passphrase from the first line of this file")
	cmd.Flags().StringVar(&newPassfile, "new-passfile", "", "read the new passphrase from the first line of this file")
	rootCmd.AddCommand(cmd)
}

// stdin is read a line at a time by every passphrase that comes from it,
// so one pipe can carry the old and the new.
var stdin = bufio.NewReader(os.Stdin)

func stdinIsTerminal() bool { return term.IsTerminal(int(os.Stdin.Fd())) }

// passphraseFrom reads an existing passphrase: from file, else the
// terminal, else a line of standard input.
func passphraseFrom(file, what string) ([]byte, error) {
	switch {
	case file != "":
		return readPassfile(file)
	case stdinIsTerminal():
		return prompt("Enter " + what + ": ")
	}
	return readLine(what)
}

// newPassphraseFrom reads a passphrase being chosen: like passphraseFrom,
// but the terminal asks twice, so a typo does not lock the data away.
func newPassphraseFrom(file, what string) ([]byte, error) {
	if file != "" || !stdinIsTerminal() {
		return passphraseFrom(file, what)
	}
	p, err := prompt("Enter " + what + ": ")
	if err != nil {
		return nil, err
	}
	again, err := prompt("Repeat " + what + ": ")
	if err != nil {
		return nil, err
	}
	defer clear(again)
	if !bytes.Equal(p, again) {
		clear(p)
		return nil, errors.New("the two passphrases differ: nothing changed; run the command again")
	}
	return p, nil
}

// readPassfile returns the first line of file, without its line end. A
// file others may read is used, with a warning: refusing it would break
// mounts that worked.
func readPassfile(file string) ([]byte, error) {
	f, err := os.Open(file)
	if err != nil {
		return nil, fmt.Errorf("read passphrase file: %w", err)
	}
	defer f.Close()
	if fi, err := f.Stat(); err == nil && fi.Mode().Perm()&0o044 != 0 {
		fmt.Fprintf(os.Stderr, "shale: warning: passphrase file %s is readable by group or others (mode %04o): chmod 600 %s\n", file, fi.Mode().Perm(), file)
	}
	line, err := firstLine(bufio.NewReader(f))
	if err != nil {
		return nil, fmt.Errorf("read passphrase file %s: %w", file, err)
	}
	if len(line) == 0 {
		return nil, fmt.Errorf("passphrase file %s has an empty first line: write the passphrase on it", file)
	}
	return line, nil
}

// readLine reads a passphrase from the next line of standard input.
func readLine(what string) ([]byte, error) {
	line, err := firstLine(stdin)
	if err != nil {
		return nil, fmt.Errorf("read %s from standard input: %w", what, err)
	}
	if len(line) == 0 {
		return nil, fmt.Errorf("no %s on standard input: give it there, with a --passfile flag, or run from a terminal", what)
	}
	return line, nil
}

// firstLine reads up to a newline or the end, and drops "\n" or "\r\n".
func firstLine(r *bufio.Reader) ([]byte, error) {
	line, err := r.ReadBytes('\n')
	if err != nil && err != io.EOF {
		return nil, err
	}
	line = bytes.TrimSuffix(line, []byte("\n"))
	return bytes.TrimSuffix(line, []byte("\r")), nil
}

func prompt(text string) ([]byte, error) {
	fmt.Fprint(os.Stderr, text)
	p, err := term.ReadPassword(int(os.Stdin.Fd()))
	fmt.Fprintln(os.Stderr)
	if err != nil {
		return nil, fmt.Errorf("read passphrase from the terminal: %w", err)
	}
	if len(p) == 0 {
		return nil, errors.New("empty passphrase: nothing changed; run the command again and type one")
	}
	return p, nil
}
