package main

import (
	"errors"
	"fmt"
	"os"

	"github.com/spf13/cobra"

	"github.com/shalefs/shale/p9net"
)

func init() {
	var userName, server string
	var public bool
	cmd := &cobra.Command{
		Use:   "keygen [--user NAME --server PUBLIC] FILE | keygen --public FILE",
		Short: "make a host key or a user key for shale serve and its clients",
		Long: `Keygen writes a new key to FILE (mode 600; an existing FILE is kept).

A host key is the server's identity, shared with client machines trusted to
say which of their users acts, as NFS trusts a client host with sec=sys:

  shale keygen /etc/shale/host.key
  shale serve --keyfile /etc/shale/host.key --listen tcp:0.0.0.0:5640 LOWER

A user key lets one user mount as that user alone. It trusts the one server
whose public key it names (print it on the server with --public):

  shale keygen --public /etc/shale/host.key           # on the server
  shale keygen --user alice --server PUBLIC ~/.config/shale/alice.key
  shale keygen --public ~/.config/shale/alice.key     # "ed25519 ... alice"

The server lists that line in its --authorized-keys file; alice then mounts
9p://HOST:5640/?keyfile=~/.config/shale/alice.key, and may act only as alice.
See docs/security.md.`,
		Args: argCount(1, 1),
		RunE: func(_ *cobra.Command, args []string) error {
			path := args[0]
			if public {
				if userName != "" || server != "" {
					return errors.New("--public prints a key's public half: it takes no --user or --server")
				}
				k, err := p9net.LoadKey(path)
				if err != nil {
					return err
				}
				pub, err := k.Public()
				if err != nil {
					return fmt.Errorf("key file %s: %v", path, err)
				}
				fmt.Println(pub)
				return nil
			}
			b := p9net.NewHostKey()
			if userName != "" || server != "" {
				if userName == "" || server == "" {
					return errors.New("a user key needs --user NAME and --server PUBLIC (shale keygen --public HOSTKEY on the server prints it)")
				}
				var err error
				if b, err = p9net.NewUserKey(userName, server); err != nil {
					return err
				}
			}
			f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
			if err != nil {
				return fmt.Errorf("key file: %v (an existing key is never overwritten)", err)
			}
			_, err = f.Write(b)
			if cerr := f.Close(); err == nil {
				err = cerr
			}
			if err != nil {
				os.Remove(path)
				return fmt.Errorf("key file %s: %v", path, err)
			}
			if userName != "" {
				k, _ := p9net.LoadKey(path)
				pub, _ := k.Public()
				fmt.Fprintf(os.Stderr, "add this line to the server's --authorized-keys file:\n")
				fmt.Println(pub)
			}
			return nil
		},
	}
	fl := cmd.Flags()
	fl.StringVar(&userName, "user", "", "make a user key for this user (a name or uid of the server's)")
	fl.StringVar(&server, "server", "", "with --user: the public key of the server the user key trusts")
	fl.BoolVar(&public, "public", false, "print the public half of the key in FILE")
	rootCmd.AddCommand(cmd)
}
