package main

import (
	"context"
	"fmt"
	"os"
	"time"

	"github.com/dustin/go-humanize"
	"github.com/spf13/cobra"

	"github.com/shalefs/shale/volume"
)

func init() {
	var data, blockSize, compression string
	format := &cobra.Command{
		Use:   "format --data s3://ENDPOINT/BUCKET/PREFIX etcd://HOST:2379[,HOST...]/NAME",
		Short: "make a volume: metadata in etcd, file data in an S3 bucket",
		Long: `format makes the volume NAME: its namespace and metadata in the etcd cluster
whose members are listed, its file data as immutable blocks in the S3 bucket
--data names, under PREFIX. Mount it with "shale mount etcd://.../NAME MNT" on
as many machines as like; each sees the others' changes (docs/volume.md).

--data s3://ENDPOINT/BUCKET/PREFIX speaks HTTPS; http://ENDPOINT/BUCKET/PREFIX
plain HTTP. The bucket must exist. S3 credentials are the AWS variables
(AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_REGION), then
~/.aws/credentials (AWS_PROFILE). For an etcd with TLS add
?cacert=FILE&cert=FILE&key=FILE to the etcd:// address.

The block size and compression are recorded in the volume and fixed.`,
		Args: argCount(1, 1),
		RunE: func(c *cobra.Command, args []string) error {
			u, err := volume.ParseURL(args[0])
			if err != nil {
				return withCode(exitUsage, err)
			}
			if data == "" {
				return withCode(exitUsage, fmt.Errorf("format %s: where does the data go? pass --data s3://ENDPOINT/BUCKET/PREFIX", args[0]))
			}
			d, err := volume.ParseDataURL(data)
			if err != nil {
				return withCode(exitUsage, err)
			}
			bs, err := humanize.ParseBytes(blockSize)
			if err != nil {
				return withCode(exitUsage, fmt.Errorf("--block-size %s: want a size such as 4MiB", blockSize))
			}
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			f, err := volume.Create(ctx, u, volume.FormatOptions{Data: d, BlockSize: int(bs), Compression: compression,
				Uid: uint32(os.Geteuid()), Gid: uint32(os.Getegid())})
			if err != nil {
				return fmt.Errorf("format %s: %w", args[0], err)
			}
			fmt.Printf("volume %s made: data in %s, blocks of %s, compression %s\n", f.Name, f.Data, humanize.IBytes(uint64(f.BlockSize)), f.Compression)
			return nil
		},
	}
	format.Flags().StringVar(&data, "data", "", "where file data goes: s3://ENDPOINT/BUCKET/PREFIX (http:// for a server without TLS)")
	format.Flags().StringVar(&blockSize, "block-size", "4MiB", "the size of a data block (a power of two, 4KiB to 64MiB)")
	format.Flags().StringVar(&compression, "compression", "none", "compress blocks: none or zstd")
	rootCmd.AddCommand(format)

	vol := &cobra.Command{
		Use:   "volume status|gc|fsck etcd://HOST:2379[,HOST...]/NAME",
		Short: "inspect a volume (docs/volume.md)",
		Args:  argCount(1, 1),
		RunE: func(c *cobra.Command, args []string) error {
			return withCode(exitUsage, fmt.Errorf("volume %s: which? say shale volume status, gc or fsck", args[0]))
		},
	}
	status := &cobra.Command{
		Use:   "status etcd://HOST:2379[,HOST...]/NAME",
		Short: "print a volume's format, files, bytes and blocks",
		Args:  argCount(1, 1),
		RunE: func(c *cobra.Command, args []string) error {
			u, err := volume.ParseURL(args[0])
			if err != nil {
				return withCode(exitUsage, err)
			}
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			r, err := volume.Status(ctx, u)
			if err != nil {
				return fmt.Errorf("volume status %s: %w", args[0], err)
			}
			f := r.Format
			fmt.Printf("volume      %s (%s), format %d, made %s\n", f.Name, f.UUID, f.Version, f.Created)
			fmt.Printf("metadata    etcd %v, revision %d\n", r.Members, r.Revision)
			fmt.Printf("data        %s, blocks of %s, compression %s\n", f.Data, humanize.IBytes(uint64(f.BlockSize)), f.Compression)
			fmt.Printf("inodes      %d (%d files, %s)\n", r.Inodes, r.Files, humanize.IBytes(r.Bytes))
			fmt.Printf("blocks      %d in use, %d waiting for gc\n", r.Blocks, r.Garbage)
			return nil
		},
	}
	var delay time.Duration
	gc := &cobra.Command{
		Use:   "gc [--delay 1h] etcd://HOST:2379[,HOST...]/NAME",
		Short: "delete the blocks no file uses any more, once they are old enough",
		Long: `gc deletes from the bucket the blocks that no file of the volume uses any more:
those that overwrites, truncations and removals dropped, and those a client
wrote but never swapped in (it died during a write-back). A block is deleted
only once it has been unused for --delay, so that a client that read a file's
block list before the change still finds its blocks. One gc runs at a time
per volume; a second one says so and exits.`,
		Args: argCount(1, 1),
		RunE: func(c *cobra.Command, args []string) error {
			u, err := volume.ParseURL(args[0])
			if err != nil {
				return withCode(exitUsage, err)
			}
			r, err := volume.GC(context.Background(), u, delay)
			if err != nil {
				return fmt.Errorf("volume gc %s: %w", args[0], err)
			}
			fmt.Printf("freed %d blocks (%s), %d of them never used; %d blocks wait for their delay; %d unlinked files of dead clients removed\n",
				r.Objects, humanize.IBytes(uint64(r.Bytes)), r.Orphans, r.Waiting, r.Inodes)
			return nil
		},
	}
	gc.Flags().DurationVar(&delay, "delay", time.Hour, "how long a block stays unused before it is deleted")
	fsck := &cobra.Command{
		Use:   "fsck etcd://HOST:2379[,HOST...]/NAME",
		Short: "check a volume's namespace: entries, link counts, parents",
		Long: `fsck reads the volume's namespace at one revision and checks it: every entry
names an inode that exists, each directory counts its entries and links 2 plus
its subdirectories and is named once, in its parent, and each file links as
many entries as name it. It prints what is wrong, one line each, and exits
non-zero if anything is; it changes nothing.`,
		Args: argCount(1, 1),
		RunE: func(c *cobra.Command, args []string) error {
			u, err := volume.ParseURL(args[0])
			if err != nil {
				return withCode(exitUsage, err)
			}
			bad, err := volume.Fsck(context.Background(), u)
			if err != nil {
				return fmt.Errorf("volume fsck %s: %w", args[0], err)
			}
			for _, b := range bad {
				fmt.Println(b)
			}
			if len(bad) > 0 {
				return fmt.Errorf("volume fsck %s: %d problems", args[0], len(bad))
			}
			fmt.Println("volume", u.Name, "is whole")
			return nil
		},
	}
	vol.AddCommand(status, gc, fsck)
	rootCmd.AddCommand(vol)
}
