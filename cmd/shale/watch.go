package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/spf13/cobra"

	"github.com/shalefs/shale/p9net"
	"github.com/shalefs/shale/remote"
)

func init() {
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "watch [--json] 9p://HOST:PORT/ANAME [PATH]",
		Short: "print the changes made under PATH of a 9P tree as they happen",
		Long: `Watch prints each change made under PATH (default /) of a tree that shale
serve exports, as it happens, one line each: inotifywait over the network.
It reads a journal of its own from the server's journal controller (see
docs/network.md) and walks and lists PATH recursively so that the controller
tells it of everything there.

  create PATH    a name was added          delete PATH    a name was removed
  rename OLD NEW a file or directory was renamed (moved) from OLD to NEW
  modify PATH    data changed              attrib PATH    attributes changed
  change PATH    an entry changed in a way the watch cannot name
  reset PATH     changes were lost (the watch was too far behind, or the
                 server restarted): everything under PATH may have changed

--json prints one JSON object a line: {"event":"modify","path":"/a","off":0,"len":5},
{"event":"rename","path":"/new","old":"/old"}. A delete is printed a tenth of a
second late: the time the watch waits for the file to show up under a new
name, which makes it a rename.
It runs until SIGINT or SIGTERM, and then exits with status 0.`,
		Args:              cobra.RangeArgs(1, 2),
		ValidArgsFunction: completeURLs,
		RunE: func(cmd *cobra.Command, args []string) error {
			r, ok, err := p9net.ParseRemote(args[0])
			if err != nil {
				return err
			}
			if !ok {
				return fmt.Errorf("%s: watch takes a 9p:// URL, such as 9p://127.0.0.1:5640/", args[0])
			}
			opts, err := remote.OptionsFromQuery(r.Query)
			if err != nil {
				return fmt.Errorf("%s: %w", args[0], err)
			}
			dir := "/"
			if len(args) == 2 {
				dir = args[1]
			}
			ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
			defer stop()
			enc := json.NewEncoder(os.Stdout)
			err = remote.Watch(ctx, r, opts, dir, func(c remote.Change) {
				if asJSON {
					enc.Encode(c)
				} else {
					if c.Event == "rename" {
						fmt.Printf("%s %s %s\n", c.Event, c.Old, c.Path)
					} else {
						fmt.Printf("%s %s\n", c.Event, c.Path)
					}
				}
			})
			if err != nil && errors.Is(ctx.Err(), context.Canceled) {
				return nil // ended by a signal while starting
			}
			return err
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print one JSON object a line")
	rootCmd.AddCommand(cmd)
}
