package main

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"runtime/pprof"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"golang.org/x/sys/unix"

	"github.com/shalefs/shale/metrics"
	"github.com/shalefs/shale/p9net"
	"github.com/shalefs/shale/stack"
	"github.com/shalefs/shale/volume"
)

type mountFlags struct {
	foreground    bool
	timeout       time.Duration
	allowOther    bool
	noPassthrough bool
	debug         bool
	logFile       string // --log
	logLevel      string // --log-level
	cpuProfile    string
	nonempty      bool // mount over a mountpoint that has files
	layers        []string
	layerFlags
	stack      string
	coherence  string
	watch      string
	cacheDir   string   // with a 9p:// LOWER: the disk cache (remote.Options.CacheDir)
	cacheSize  string   // with a 9p:// LOWER: its bound
	timeoutSet bool     // --timeout was given
	options    []string // -o, as mount(8) gives them (mountopts.go)
	vfs        vfsFlags // the generic ones of options
	// With a 9p:// LOWER, Sprite's delayed write (remote.Options
	// WriteDelay and DirtyMax); and the mount's metrics endpoint. client
	// says the command has these flags (shale mount; not shale serve).
	client        bool
	writeDelay    time.Duration
	dirtyMax      string
	writeDelaySet bool // --write-delay was given
	dirtyMaxSet   bool // --dirty-max was given
	metrics       string
}

// readyFdEnv names the descriptor on which a background child reports
// that its mount is ready ("ok") or why it failed (one line); secretFdEnv
// the one from which it reads what the layers' prepare steps obtained.
const (
	readyFdEnv  = "SHALE_READY_FD"
	secretFdEnv = "SHALE_SECRET_FD"
)

func init() {
	var f mountFlags
	cmd := &cobra.Command{
		Use:   "mount [flags] LOWER MOUNTPOINT | mount --stack FILE",
		Short: "mount the directory LOWER, through layers, at MOUNTPOINT",
		Long: `Mount serves the directory LOWER at MOUNTPOINT through FUSE. Without --layer it
mirrors LOWER (the loop view); each --layer stacks a layer, bottom-most first.
LOWER may also be a tree on a 9P2000.L server (shale serve, diod):
9p://HOST:PORT/ANAME or 9p:///path/to.sock?aname=ANAME, with ?keyfile=FILE
and ?timeout=30s (docs/network.md).

  shale mount --layer shard --layer crypt --passfile F LOWER MNT

Order matters: compress goes above crypt (--layer crypt --layer compress:
ciphertext does not compress, so the other order is refused).

With --stack FILE it mounts several views of one stack in one process, all
kept coherent (docs/coherence.md):

  lower = "/srv/vault"
  [[layer]]                 # bottom-most first; names and flags as --layer
  name = "crypt"
  passfile = "/etc/shale/vault.pass"
  [[view]]
  layer = 0                 # the lower directory itself (a loop view)
  mountpoint = "/mnt/vault-raw"
  [[view]]
  layer = 1                 # the first layer above it, and so on
  mountpoint = "/mnt/vault"
` + "\n" + `Layers:
` + layerHelp() + `
It returns once the mount is ready and keeps serving in the background; with -f
it stays in the foreground (for systemd: it tells a unit of Type=notify when it
is ready). -o takes the flags in mount(8)'s form, as "mount -t fuse.shale" and
/etc/fstab give them (docs/admin.md):

  shale mount -o layer=crypt,passfile=F,ro LOWER MNT

In the background it logs to the system's log, tagged shale (journalctl -t
shale, or /var/log/syslog), or where --log says; with no journal or syslog
socket on the machine, to shale.log in /var/lib/shale (as root; else
$XDG_STATE_HOME/shale or ~/.local/state/shale).

End it with "shale umount MOUNTPOINT", plain umount, or SIGTERM/SIGINT to the
serving process. With --stack each view is unmounted on its own, and the
process ends with the last; views of one layer share one mount (bind mounts),
so shared mappings are coherent between them.

As root the mount is open to every user (allow_other), and the kernel checks
each user's permissions against those of LOWER (default_permissions). File data
goes through FUSE passthrough when the kernel offers it.

Changes made through the mount, through other views of its stack, and directly
in LOWER by other programs are pushed to the kernel's caches (LOWER is watched
with fanotify as root, inotify otherwise), so the kernel keeps names,
attributes, pages and listings for an hour. Where LOWER cannot be watched,
changes made in it show within --timeout (default 1s).

A 9p:// LOWER whose server has a journal controller (shale serve) is cached:
attributes, names, listings and file data, kept current by the server's
callbacks, so the kernel keeps them for an hour too; --cache-size bounds the
data, and --cache-dir DIR keeps it on disk, where a restarted mount finds it
again. Other servers (diod) get close-to-open consistency, as with a LOWER
that cannot be watched. "shale stats MOUNTPOINT" prints its counters.

A volume (etcd://HOSTS/NAME, docs/volume.md) keeps its data blocks in memory,
and with --cache-dir DIR on disk too, up to --cache-size (give it room, such as
--cache-size 20GiB): blocks never change, so what is cached there is never
stale, and a restarted mount reads it without asking S3.

With a server that follows Sprite's consistency rules (shale serve), writes
are delayed: data programs write stays on the client, in memory, for up to
--write-delay (default 30s) and is written back to the server then, at fsync,
when the server recalls it (another client opens the file), when more than
--dirty-max (default 64MiB) is waiting, and at unmount. Data deleted,
truncated or overwritten before then never reaches the server. Every open
asks the server for the file's version, so a client that opens a file after
another closed it reads what was written; a file open on two clients with one
of them writing is not cached at all. Data still delayed is lost if the
serving process is killed (kill -9) or the machine crashes, as unflushed
pages of a local file system are; programs that need it on the server call
fsync. --write-delay 0 writes through: every write goes to the server before
it returns.

--metrics HOST:PORT serves the mount's counters to Prometheus on
http://HOST:PORT/metrics: FUSE requests and coherence callbacks
(shale_fuse_*, shale_coherence_*) and, with a 9p:// LOWER, the 9P client's
requests, cache hits and misses and delayed writes (shale_client_*).`,
		Args: cobra.MaximumNArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			args, err := f.applyOptions(cmd.Flags(), args)
			if err != nil {
				return withCode(exitUsage, err) // a bad -o, unless it says otherwise
			}
			f.defaults(cmd.Flags())
			f.writeDelaySet = cmd.Flags().Changed("write-delay")
			f.dirtyMaxSet = cmd.Flags().Changed("dirty-max")
			return runMount(cmd, &f, args)
		},
	}
	fl := cmd.Flags()
	fl.StringVar(&f.stack, "stack", "", "mount every view of the stack this TOML file describes, in one process (see docs/coherence.md)")
	fl.StringVar(&f.coherence, "coherence", "on", "with --stack: on, or off to run without the coherence manager (for tests and benchmarks only)")
	fl.StringArrayVar(&f.layers, "layer", nil, "stack this layer (repeat to stack several, bottom-most first): "+stack.Names())
	cmd.RegisterFlagCompletionFunc("layer", completeLayers)
	cmd.ValidArgsFunction = completeDirs
	f.layerFlags.register(fl)
	fl.BoolVar(&f.nonempty, "nonempty", false, "mount even where MOUNTPOINT has files, hiding them while mounted")
	fl.BoolVarP(&f.foreground, "foreground", "f", false, "serve in the foreground instead of returning once mounted")
	fl.DurationVar(&f.timeout, "timeout", 0, "how long the kernel may cache names and attributes (default: an hour where LOWER is watched, 1s where it cannot be)")
	fl.BoolVar(&f.allowOther, "allow-other", false, "let all users use the mount, with the kernel checking their permissions (needs root; default: on as root, off otherwise)")
	fl.BoolVar(&f.noPassthrough, "no-passthrough", false, "serve file data through shale even where the kernel offers FUSE passthrough")
	fl.BoolVar(&f.debug, "debug", false, "log every FUSE request (implies -f unless --log is given)")
	f.registerLog(fl, "stderr with -f, else the system's log (journal or syslog)")
	fl.StringVar(&f.cpuProfile, "cpuprofile", "", "write a CPU profile of the serving process to this file (for developers)")
	fl.MarkHidden("cpuprofile")
	fl.StringVar(&f.cacheDir, "cache-dir", "", "with a 9p:// LOWER whose server has a journal controller, or a volume (etcd://): keep the cache on disk in this directory, so that it survives a restart (one mount at a time)")
	fl.StringVar(&f.cacheSize, "cache-size", "256MiB", "with a 9p:// LOWER or a volume: the file data cached, in memory or on disk with --cache-dir; off for none")
	f.client = true
	fl.DurationVar(&f.writeDelay, "write-delay", 30*time.Second, "with a 9p:// LOWER whose server follows Sprite's rules (shale serve): how long written data may stay on the client before it is written back; 0 writes through")
	fl.StringVar(&f.dirtyMax, "dirty-max", "64MiB", "with a 9p:// LOWER: the most delayed data kept on the client; past it the files dirty longest are written back")
	fl.StringVar(&f.metrics, "metrics", "", "serve the mount's counters to Prometheus on http://HOST:PORT/metrics")
	fl.StringVar(&f.watch, "watch", "auto", "how to notice changes made beside shale in LOWER: auto, fanotify or inotify (for tests)")
	fl.MarkHidden("watch")
	fl.StringArrayVarP(&f.options, "options", "o", nil, "mount options as mount(8) gives them, comma-separated: layer=NAME, passfile=FILE, ro, nosuid ... (docs/admin.md)")
	rootCmd.AddCommand(cmd)
	shortMountHelp(cmd)
}

// defaults sets the flags whose defaults depend on the case, as their
// help says: pflag would print a single value as the default too.
func (f *mountFlags) defaults(fl *pflag.FlagSet) {
	f.timeoutSet = fl.Changed("timeout")
	if !f.timeoutSet {
		f.timeout = time.Second // where LOWER cannot be watched; plan.build
	}
	if !fl.Changed("allow-other") {
		f.allowOther = os.Geteuid() == 0
	}
}

func runMount(cmd *cobra.Command, f *mountFlags, args []string) error {
	p, err := planMount(cmd, f, args)
	if err != nil {
		return err
	}
	if len(p.spec.Views) == 0 {
		return fmt.Errorf("stack file %s names no [[view]]: add one, or serve its [[export]]s with shale serve --stack", f.stack)
	}
	if f.debug && f.logFile == "" {
		f.foreground = true
	}
	if f.metrics != "" && os.Getenv(readyFdEnv) == "" {
		// The serving process listens; a bad address is better told
		// before a passphrase is asked for nothing.
		probe, err := metrics.Serve(f.metrics, nil)
		if err != nil {
			return err
		}
		probe.Close()
	}
	if os.Getenv(secretFdEnv) != "" {
		err = p.receiveSecrets(os.NewFile(4, "secrets"))
		os.Unsetenv(secretFdEnv)
	} else {
		err = p.prepare()
	}
	if err != nil {
		return err
	}
	if !f.foreground && os.Getenv(readyFdEnv) == "" {
		return daemonize(p.secrets())
	}
	return serve(f, p)
}

// checkMountArgs checks LOWER and MOUNTPOINT and returns their absolute,
// symlink-free forms. A 9p:// LOWER is left as it is. A mountpoint with
// files in it is refused unless nonempty: the mount would hide them.
func checkMountArgs(lower, mnt string, nonempty bool) (string, string, error) {
	if _, err := os.Stat("/dev/fuse"); err != nil {
		return "", "", withCode(exitMount, errors.New("/dev/fuse is missing: install fuse3 (apt-get install fuse3) and load the module (modprobe fuse)"))
	}
	lower, err := checkLower(lower)
	if err != nil {
		return "", "", err
	}
	mnt, err = checkDir("mountpoint", mnt)
	if err != nil {
		return "", "", withCode(exitMountpoint, err)
	}
	if mnt == lower || strings.HasPrefix(mnt, lower+"/") {
		return "", "", withCode(exitMountpoint, fmt.Errorf("mountpoint %s is inside lower directory %s: choose a mountpoint outside it", mnt, lower))
	}
	if src, fstype, ok := mountedAt(mnt); ok {
		return "", "", withCode(exitMountpoint, fmt.Errorf("%s is already a mount point (%s from %s): unmount it first (shale umount %s)", mnt, fstype, src, mnt))
	}
	if !nonempty {
		if d, err := os.Open(mnt); err == nil {
			names, _ := d.Readdirnames(1)
			d.Close()
			if len(names) > 0 {
				return "", "", withCode(exitMountpoint, fmt.Errorf("mountpoint %s is not empty (it has %s): the mount would hide its files; empty it, choose another, or give --nonempty (-o nonempty)", mnt, names[0]))
			}
		}
	}
	return lower, mnt, nil
}

// checkLower checks a LOWER: a readable directory, returned absolute and
// symlink-free, or a well-formed 9p:// URL.
func checkLower(lower string) (string, error) {
	if _, ok, err := p9net.ParseRemote(lower); ok {
		return lower, withCode(exitUsage, err)
	}
	if volume.IsURL(lower) {
		_, err := volume.ParseURL(lower)
		return lower, withCode(exitUsage, err)
	}
	lower, err := checkDir("lower directory", lower)
	if err != nil {
		return "", withCode(exitLower, err)
	}
	if err := unix.Access(lower, unix.R_OK|unix.X_OK); err != nil {
		return "", withCode(exitLower, fmt.Errorf("lower directory %s is not readable: %v; fix its permissions or run as its owner", lower, err))
	}
	return lower, nil
}

func checkDir(what, p string) (string, error) {
	abs, err := filepath.Abs(p)
	if err != nil {
		return "", fmt.Errorf("%s %s: %v", what, p, err)
	}
	real, err := filepath.EvalSymlinks(abs)
	switch {
	case errors.Is(err, syscall.ENOTCONN):
		return "", fmt.Errorf("%s %s is a dead FUSE mount: clear it with shale umount %s", what, abs, abs)
	case errors.Is(err, os.ErrNotExist):
		return "", fmt.Errorf("%s %s does not exist: create it (mkdir -p %s) or fix the path", what, abs, abs)
	case err != nil:
		return "", fmt.Errorf("%s %s: %v", what, abs, err)
	}
	st, err := os.Stat(real)
	if err != nil {
		return "", fmt.Errorf("%s %s: %v", what, real, err)
	}
	if !st.IsDir() {
		return "", fmt.Errorf("%s %s is not a directory", what, real)
	}
	return real, nil
}

// mountedAt reports whether dir is a mount point, and of what.
func mountedAt(dir string) (source, fstype string, ok bool) {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return "", "", false
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		// id parent major:minor root mountpoint opts... - fstype source superopts
		fields := strings.Fields(sc.Text())
		if len(fields) < 5 || unescapeMountinfo(fields[4]) != dir {
			continue
		}
		for i, w := range fields {
			if w == "-" && i+2 < len(fields) {
				source, fstype, ok = fields[i+2], fields[i+1], true
			}
		}
	}
	return source, fstype, ok
}

// unescapeMountinfo undoes the octal escapes (\040 for space) of mountinfo.
func unescapeMountinfo(s string) string {
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			var c byte
			if _, err := fmt.Sscanf(s[i+1:i+4], "%03o", &c); err == nil {
				b.WriteByte(c)
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// daemonize runs this command again in the background and waits until the
// child reports that its mount is ready or why it is not.
func daemonize(secret []byte) error {
	r, w, err := os.Pipe()
	if err != nil {
		return err
	}
	sr, sw, err := os.Pipe()
	if err != nil {
		return err
	}
	self, err := os.Executable()
	if err != nil {
		return err
	}
	child := exec.Command(self, os.Args[1:]...)
	child.Env = append(os.Environ(), readyFdEnv+"=3", secretFdEnv+"=4")
	child.ExtraFiles = []*os.File{w, sr}
	child.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := child.Start(); err != nil {
		return fmt.Errorf("starting the serving process: %v", err)
	}
	w.Close()
	sr.Close()
	sw.Write(secret) // a pipe holds far more than a passphrase
	sw.Close()
	clear(secret)
	msg, _ := io.ReadAll(r)
	if s := strings.TrimSpace(string(msg)); s != "ok" {
		if s == "" {
			state, _ := child.Process.Wait()
			s = fmt.Sprintf("the serving process ended before the mount was ready (%v)", state)
		}
		return decodeFailure(s)
	}
	child.Process.Release()
	return nil
}

// serve mounts every view of the plan and serves until they go away.
func serve(f *mountFlags, p *plan) error {
	var ready *os.File
	if os.Getenv(readyFdEnv) != "" {
		ready = os.NewFile(3, "ready")
		os.Unsetenv(readyFdEnv)
		// A unit's main process is the parent, gone once the mount is
		// ready: systemd would ignore, or misread, what a child tells it.
		os.Unsetenv("NOTIFY_SOCKET")
	}
	logger, err := openLog(f, ready != nil)
	if err != nil {
		return report(ready, err)
	}
	if _, ok, _ := p9net.ParseRemote(p.spec.Lower); ok {
		// The 9P session's state, for shale status (session.go).
		p.session = newSessionWatch()
		logger = p.session.wrap(logger)
	}
	raiseFileLimit()
	// Caught before any view is mounted, so that a stop signal, however
	// early (systemd may send one right after READY=1), unmounts them.
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT)
	// The metrics endpoint listens before anything is mounted, so that a
	// bad address fails the mount; it has the client's counters once the
	// views are mounted.
	var client mountSource
	ms, err := serveMetrics(f.metrics, client.samples)
	if err != nil {
		return report(ready, err)
	}
	mounts, err := p.mount(f, logger)
	if err != nil {
		ms.close(logger)
		return report(ready, err)
	}
	// Locks shale umount waits for, held until the process ends: after
	// the lower is closed.
	held := holdServing(mounts, logger)
	defer held.end()
	// Saves a disk cache; after the views, which may use the lower to the end.
	defer p.closeLower(logger)
	defer serveViews(p, logger)()
	defer ms.close(logger)
	client.set(p)
	if ms != nil {
		logger.Info("serving metrics", "url", "http://"+ms.Addr()+"/metrics")
	}
	for _, v := range p.spec.Views {
		logger.Info("mounted", "lower", p.spec.Lower, "layer", v.Layer, "mountpoint", v.Mountpoint)
	}
	if ready != nil {
		ready.WriteString("ok\n")
		ready.Close()
		// Nothing else may write to the terminal of the caller; --debug's
		// request log, on stderr, goes to the --log file (openLog).
		if null, err := os.OpenFile(os.DevNull, os.O_RDWR, 0); err == nil {
			for _, fd := range []int{0, 1, 2} {
				if fd != 2 || !f.debug || f.logFile == "" {
					unix.Dup2(int(null.Fd()), fd)
				}
			}
		}
	}
	notify(logger, "READY=1", servingStatus(p))
	if f.cpuProfile != "" {
		pf, err := os.Create(f.cpuProfile)
		if err != nil {
			return err
		}
		pprof.StartCPUProfile(pf)
		defer pprof.StopCPUProfile()
	}
	// Each view ends when it is unmounted (refused while busy, as for any
	// mount), and the process when the last has gone; a signal ends all.
	done := make(chan struct{})
	var left atomic.Int32
	left.Store(int32(len(mounts)))
	for i, m := range mounts {
		go func() {
			m.server.Wait()
			if left.Add(-1) == 0 {
				close(done)
			} else {
				held.release(i)
			}
		}()
	}
	ending := func(why string) {
		logger.Info("ending", "why", why)
		notify(logger, "STOPPING=1", "STATUS=ending: "+why)
	}
	select {
	case <-done:
		ending("every view was unmounted")
	case s := <-sig:
		ending("signal " + s.String())
		unmountAll(mounts, logger)
		<-done
	}
	return nil
}

// report sends err to a waiting parent, if any, and returns it.
func report(ready *os.File, err error) error {
	if ready != nil {
		fmt.Fprintf(ready, "%s\n", encodeFailure(err))
		ready.Close()
	}
	return err
}

// unmountAll ends every view. A busy one is detached: new accesses fail,
// open files keep working, and its server ends when the last of them is
// closed.
func unmountAll(mounts []*mounted, logger *slog.Logger) {
	for _, m := range mounts {
		// Bind mounts first: the server's own unmount is of its first
		// mountpoint, and needs root for the others anyway.
		for i := len(m.mnts) - 1; i >= 0; i-- {
			mnt := m.mnts[i]
			if _, _, ok := mountedAt(mnt); !ok {
				continue
			}
			var err error
			if i == 0 {
				err = m.server.Unmount()
			} else {
				err = unix.Unmount(mnt, 0)
			}
			if err != nil {
				logger.Warn("mount busy; detaching it", "mountpoint", mnt, "err", err)
				if err := unix.Unmount(mnt, unix.MNT_DETACH); err != nil {
					logger.Error("detach failed", "mountpoint", mnt, "err", err)
				}
			}
		}
	}
}

// raiseFileLimit lifts the descriptor limit: every file the kernel keeps
// in its caches holds one descriptor of the lower directory.
func raiseFileLimit() {
	var l unix.Rlimit
	if unix.Getrlimit(unix.RLIMIT_NOFILE, &l) != nil {
		return
	}
	want := l
	if os.Geteuid() == 0 {
		if b, err := os.ReadFile("/proc/sys/fs/nr_open"); err == nil {
			var n uint64
			if _, err := fmt.Sscan(string(b), &n); err == nil && n > want.Max {
				want.Max = n
			}
		}
	}
	want.Cur = want.Max
	if unix.Setrlimit(unix.RLIMIT_NOFILE, &want) != nil {
		l.Cur = l.Max
		unix.Setrlimit(unix.RLIMIT_NOFILE, &l)
	}
}
