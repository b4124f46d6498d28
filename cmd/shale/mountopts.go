package main

// Mount options in -o form, as mount(8) gives them: for a file system of
// type fuse.shale, mount.fuse3 runs "shale LOWER MOUNTPOINT -o OPT,..."
// through /bin/sh. Options are translated into the flags of shale mount,
// so both take one path. docs/admin.md lists them all.

import (
	"errors"
	"fmt"
	"maps"
	"os"
	"slices"
	"strings"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"golang.org/x/sys/unix"

	"github.com/shalefs/shale/stack"
)

// flagOptions are the flags of shale mount that -o takes, by option
// name; an option's flag is its name with "-" for "_". Layers' options
// (stack.Kind.Options) are added by mountOptionFlags.
var flagOptions = []string{"layer", "timeout", "allow_other", "no_passthrough", "nonempty", "debug", "log", "log_level", "stack", "cache_dir", "cache_size", "write_delay", "dirty_max", "metrics"}

// vfsOptions are the generic mount options the kernel applies to the
// mount itself; their zero vfsFlags is how fuseview mounts.
var vfsOptions = map[string]func(*vfsFlags){
	"ro":     func(v *vfsFlags) { v.readOnly = true },
	"rw":     func(v *vfsFlags) { v.readOnly = false },
	"suid":   func(v *vfsFlags) { v.suid = true },
	"nosuid": func(v *vfsFlags) { v.suid = false },
	"dev":    func(v *vfsFlags) { v.dev = true },
	"nodev":  func(v *vfsFlags) { v.dev = false },
	"exec":   func(v *vfsFlags) { v.noExec = false },
	"noexec": func(v *vfsFlags) { v.noExec = true },
}

// ignoredOptions mean something to mount(8), systemd or the kernel's
// generic code but nothing to shale: when and by whom a line of fstab is
// mounted, and access times, which FUSE leaves to the file system (shale's
// lower files keep theirs as LOWER's own mount says).
var ignoredOptions = []string{
	"defaults", "auto", "noauto", "user", "nouser", "users", "owner", "group",
	"_netdev", "nofail", "async",
	"atime", "noatime", "relatime", "norelatime", "strictatime", "nostrictatime",
	"diratime", "nodiratime", "lazytime", "nolazytime", "silent", "loud",
}

// refusedOptions are well-known options shale does not offer, with why.
var refusedOptions = map[string]string{
	"sync":            "shale mounts are not synchronous; programs that need it call fsync or open with O_SYNC",
	"dirsync":         "shale mounts are not synchronous; programs that need it call fsync on the directory",
	"remount":         "unmount and mount again to change options",
	"drop_privileges": "shale serves other users' files as them, which needs root",
}

// vfsFlags are the generic options -o gave that the kernel applies to a
// mount. The zero value is rw, nosuid, nodev, exec: how fuseview mounts,
// and what shale mount gives without -o.
type vfsFlags struct {
	readOnly, suid, dev, noExec bool
}

func (v vfsFlags) String() string {
	var s []string
	for _, o := range []struct {
		on   bool
		name string
	}{{v.readOnly, "ro"}, {v.suid, "suid"}, {v.dev, "dev"}, {v.noExec, "noexec"}} {
		if o.on {
			s = append(s, o.name)
		}
	}
	return strings.Join(s, ",")
}

// flags are the mount(2) flags for v. MS_MGC_VAL, which the kernel
// ignores, keeps them from being zero: to go-fuse, zero means its
// defaults, nosuid and nodev.
func (v vfsFlags) flags() uintptr {
	flags := uintptr(unix.MS_MGC_VAL)
	if v.readOnly {
		flags |= unix.MS_RDONLY
	}
	if !v.suid {
		flags |= unix.MS_NOSUID
	}
	if !v.dev {
		flags |= unix.MS_NODEV
	}
	if v.noExec {
		flags |= unix.MS_NOEXEC
	}
	return flags
}

// mountOptionFlags maps every option -o takes from flags to its flag, and
// names the layers that take each layer option.
func mountOptionFlags() (flags map[string]string, takers map[string][]string) {
	flags, takers = map[string]string{}, map[string][]string{}
	for _, o := range flagOptions {
		flags[o] = strings.ReplaceAll(o, "_", "-")
	}
	for _, k := range stack.Kinds() {
		for o := range k.Options {
			flags[o] = strings.ReplaceAll(o, "_", "-")
			takers[o] = append(takers[o], k.Name)
		}
	}
	return flags, takers
}

// applyOptions sets the flags that -o names on fl, the flags of shale
// mount, and returns the arguments left for planMount: none when stack=
// names them.
func (f *mountFlags) applyOptions(fl *pflag.FlagSet, args []string) ([]string, error) {
	if len(f.options) == 0 {
		return args, nil
	}
	flags, takers := mountOptionFlags()
	debug := false
	for _, list := range f.options {
		for _, opt := range strings.Split(list, ",") {
			name, val, hasVal := strings.Cut(opt, "=")
			switch why, refused := refusedOptions[name]; {
			case opt == "" || slices.Contains(ignoredOptions, opt) ||
				strings.HasPrefix(name, "x-") || name == "comment":
				continue
			case refused:
				return nil, fmt.Errorf("mount option %s is not supported: %s", name, why)
			case vfsOptions[name] != nil:
				if hasVal {
					return nil, fmt.Errorf("mount option %s takes no value: write %s", opt, name)
				}
				vfsOptions[name](&f.vfs)
				continue
			case flags[name] == "":
				return nil, fmt.Errorf("unknown mount option %q: shale takes %s, and mount(8)'s own (docs/admin.md)", opt, optionList(fl, flags, takers))
			}
			pf := fl.Lookup(flags[name])
			switch {
			case pf == nil:
				return nil, fmt.Errorf("mount option %s of layer %s has no mount flag: give it in a stack file (stack=FILE)", name, strings.Join(takers[name], ", "))
			case pf.Value.Type() == "bool" && !hasVal:
				val = "true"
			case val == "":
				return nil, fmt.Errorf("mount option %s needs a value: %s=%s", name, name, placeholder(name))
			}
			if err := fl.Set(pf.Name, val); err != nil {
				return nil, fmt.Errorf("mount option %s: %v", opt, err)
			}
			debug = debug || name == "debug"
		}
	}
	if debug && f.debug && f.logFile == "" && !f.foreground {
		// --debug alone implies -f, which would leave mount(8) waiting.
		return nil, errors.New("mount option debug needs log=FILE (or shale mount -f): mount(8) waits until shale goes to the background")
	}
	if f.vfs != (vfsFlags{}) && os.Geteuid() != 0 {
		return nil, fmt.Errorf("mount options %s need root: without it shale mounts rw,nosuid,nodev,exec only", f.vfs)
	}
	if len(args) == 2 && strings.HasPrefix(args[1], "/dev/fd/") {
		return nil, fmt.Errorf("mountpoint %s is a descriptor of /dev/fuse (mount.fuse3's drop_privileges): %s", args[1], refusedOptions["drop_privileges"])
	}
	if err := f.checkPassfiles(); err != nil {
		return nil, err
	}
	if f.stack != "" && len(args) == 2 {
		return nil, checkStackArgs(f.stack, args[0], args[1])
	}
	return args, nil
}

// optionList names every option -o takes, for the unknown-option error.
func optionList(fl *pflag.FlagSet, flags map[string]string, takers map[string][]string) string {
	var s []string
	for _, o := range slices.Concat(flagOptions, slices.Sorted(maps.Keys(takers))) {
		desc := o
		if pf := fl.Lookup(flags[o]); pf == nil || pf.Value.Type() != "bool" {
			desc += "=" + placeholder(o)
		}
		if len(takers[o]) > 0 {
			desc += " (" + strings.Join(takers[o], ", ") + ")"
		}
		s = append(s, desc)
	}
	return strings.Join(append(s, slices.Sorted(maps.Keys(vfsOptions))...), ", ")
}

// placeholder says what value option o takes.
func placeholder(o string) string {
	switch o {
	case "layer":
		return "NAME"
	case "timeout", "write_delay":
		return "DURATION"
	case "cache_size", "dirty_max":
		return "SIZE"
	case "cache_dir":
		return "DIR"
	case "metrics":
		return "HOST:PORT"
	case "log_level":
		return "LEVEL"
	case "log", "stack", "passfile":
		return "FILE"
	}
	return "VALUE"
}

// checkPassfiles fails, in words for mount(8), when a layer would ask for
// its passphrase and nobody can answer: at boot mount(8) runs shale with
// /dev/null on standard input, and the plain error would speak of
// --passfile. A terminal is asked, and a pipe read, as by shale mount.
func (f *mountFlags) checkPassfiles() error {
	if f.option("passfile") != "" || os.Getenv(secretFdEnv) != "" {
		return nil // or the parent read them already
	}
	if st, err := os.Stdin.Stat(); stdinIsTerminal() || err == nil && (st.Mode()&os.ModeNamedPipe != 0 || st.Mode().IsRegular()) {
		return nil
	}
	for _, name := range f.layers {
		k, err := stack.Find(name)
		if err != nil {
			continue // planMount says so
		}
		if _, takes := k.Options["passfile"]; takes && k.Prepare != nil {
			return withCode(exitPassphrase, fmt.Errorf("layer %s needs its passphrase and there is no terminal to ask it on: add passfile=FILE to the mount options", name))
		}
	}
	return nil
}

// checkStackArgs checks that the LOWER and MOUNTPOINT mount(8) gives with
// stack=FILE are the file's lower directory and one of its views: the file
// names them, and an fstab line that says otherwise is a mistake.
func checkStackArgs(file, lower, mnt string) error {
	sp, err := stack.ParseFile(file)
	if err != nil {
		return err
	}
	if !sameFile(lower, sp.Lower) {
		return fmt.Errorf("stack file %s: its lower directory is %s, not %s", file, sp.Lower, lower)
	}
	for _, v := range sp.Views {
		if sameFile(mnt, v.Mountpoint) {
			return nil
		}
	}
	return fmt.Errorf("stack file %s: no view of it is mounted at %s", file, mnt)
}

func sameFile(a, b string) bool {
	sa, err := os.Stat(a)
	if err != nil {
		return false
	}
	sb, err := os.Stat(b)
	return err == nil && os.SameFile(sa, sb)
}

// rootOptions is -o of the root command: "shale LOWER MOUNTPOINT -o ...",
// the form in which mount.fuse3 runs a file system's command.
var rootOptions []string

func init() {
	rootCmd.Flags().StringArrayVarP(&rootOptions, "options", "o", nil, "mount LOWER at MOUNTPOINT with these options, as mount(8) does: the same as shale mount -o (docs/admin.md)")
}

// runRoot runs "shale LOWER MOUNTPOINT -o OPTIONS" as shale mount. Without
// -o, arguments are a mistyped command.
func runRoot(cmd *cobra.Command, args []string) error {
	if !cmd.Flags().Changed("options") {
		if len(args) == 0 {
			return cmd.Help()
		}
		if s := cmd.SuggestionsFor(args[0]); len(s) > 0 {
			return withCode(exitUsage, fmt.Errorf("unknown command %q: did you mean %s?", args[0], strings.Join(s, " or ")))
		}
		return withCode(exitUsage, fmt.Errorf("unknown command %q: see shale --help", args[0]))
	}
	mount, _, err := cmd.Find([]string{"mount"})
	if err != nil {
		return err
	}
	for _, o := range rootOptions {
		mount.Flags().Set("options", o)
	}
	return mount.RunE(mount, args)
}
