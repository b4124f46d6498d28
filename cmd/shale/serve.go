package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/signal"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/dustin/go-humanize"
	"github.com/spf13/cobra"

	"github.com/shalefs/shale/export"
	"github.com/shalefs/shale/layer"
	"github.com/shalefs/shale/metrics"
	"github.com/shalefs/shale/p9net"
	"github.com/shalefs/shale/stack"
)

type serveFlags struct {
	mountFlags   // the stack's layers, and how a --stack file's views mount
	listen       string
	keyFile      string
	authorized   string // --authorized-keys
	socketMode   string
	socketGroup  string
	noRootSquash bool
	maxConns     int
	maxFids      int
	// Bounds no client can break (export.Options, p9net.ListenConfig).
	perPeer          int
	idle             time.Duration
	handshakeTimeout time.Duration
	maxJournals      int
	journalBytes     string
	journalMemory    string
	upstream         string
	// The cache controller's bounds (export.Options).
	journalRecords  int
	journalAge      time.Duration
	journalInterest int
	// Sprite's rules (export.Options).
	recallTimeout time.Duration
	nameWait      time.Duration
	sprite        bool
	delegate      bool
	lease         time.Duration
	grace         time.Duration
	metricsAddr   string // --metrics
}

// DefaultListen is where shale serve listens unless told otherwise:
// loopback, since an export without a key must not be reachable from
// elsewhere.
const DefaultListen = "tcp:127.0.0.1:5640"

func init() {
	var f serveFlags
	cmd := &cobra.Command{
		Use:   "serve [flags] LOWER | serve --stack FILE",
		Short: "export LOWER, through layers, over 9P2000.L",
		Long: `Serve exports the directory LOWER (or a 9p:// tree) over 9P2000.L, with
--layer stacked as for mount, until SIGTERM or SIGINT:

  shale serve --listen tcp:127.0.0.1:5640 LOWER
  shale mount 9p://127.0.0.1:5640/ MNT          # on a client

Clients attach with the empty attach name, or "/". With --stack FILE it serves
the [[export]]s the file names under their attach names, and mounts its
[[view]]s too; all are views of one stack, kept coherent:

  lower = "/srv/vault"
  [[layer]]
  name = "crypt"
  passfile = "/etc/shale/vault.pass"
  [[export]]
  layer = 1
  name = "vault"                               # 9p://HOST:PORT/vault
  [[view]]
  layer = 1
  mountpoint = "/mnt/vault"

--listen takes unix:PATH or tcp:HOST:PORT (default ` + DefaultListen + `).
Who may act as whom (docs/security.md):

  - Without --keyfile it listens only on loopback or a unix socket, and the
    kernel tells who each client is: a program of uid N may attach only as
    uid N; a root program (a shale mount serving its users) as anyone. A
    unix socket is made mode 0660 (--socket-mode, --socket-group).
  - With --keyfile HOSTKEY (shale keygen HOSTKEY) it may listen anywhere,
    and every client must hold a key (mutual TLS): a holder of the host key
    is a trusted machine and may attach as any user, as NFS trusts a client
    host with sec=sys; a holder of a user key listed in --authorized-keys
    (shale keygen --user NAME) only as that user.

Each client acts as the uid it attaches as, and the lower file system checks
its permissions, as for a local program of that user; uid 0 acts as nobody
(65534) unless --no-root-squash.

Beside the exports, attach name "#journal" serves the cache controller: a
journal per caching client (named by its UUID) that tells it of changes to
what it may cache, made through other clients, through views of the stack,
or in LOWER beside shale; and a file "stats". With --upstream ADDR it serves
another 9P2000.L server (diod) through shale's client, and adds the journals:

  shale serve --upstream tcp:127.0.0.1:564//srv/export

Changes made on the upstream server other than through this one are not seen
(see docs/network.md, "Journal callbacks: the cache controller").

The server follows Sprite's consistency rules, so that its caching clients
(shale mount 9p://...) may delay their writes: it sees every open and close,
and before an open returns it makes the clients that may hold delayed writes
of the file write them back (a recall; --recall-timeout bounds the wait for a
connected client, --lease for one that lost its connection), and stops
caching of a file open on two clients with one writing. While serving it
keeps a marker file in /var/lib/shale (as root; else $XDG_STATE_HOME/shale or
~/.local/state/shale), removed when it ends on SIGTERM or SIGINT. Found at
start, the last server of the same address and LOWER did not end cleanly
(a crash, kill -9): for --grace, opens wait for clients to reclaim the
delayed writes they hold.

No client can hold the server: a connection has --handshake-timeout to
authenticate and send its first 9P message; past --max-conns a newcomer takes
the place of the session idle longest (--idle; a quiet mount reconnects when
it needs to); journals are bounded (--max-journals, --journal-bytes,
--journal-memory: overflow tells a client to drop its cache); and a client
that fails a recall loses its caching of that file (docs/network.md).

--metrics HOST:PORT serves the server's counters (the "stats" file, as
shale_server_* metrics; with a 9p:// lower, its client's as shale_client_*)
to Prometheus on http://HOST:PORT/metrics.`,
		Args: cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			f.defaults(cmd.Flags())
			return runServe(&f, args)
		},
	}
	fl := cmd.Flags()
	fl.StringVar(&f.listen, "listen", DefaultListen, "where to listen: unix:PATH or tcp:HOST:PORT")
	fl.StringVar(&f.keyFile, "keyfile", "", "the host key (shale keygen FILE): clients must hold it, or a user key of --authorized-keys; its holders may act as any user")
	fl.StringVar(&f.authorized, "authorized-keys", "", "with --keyfile: a file of user keys' public halves, one 'ed25519 PUBLIC USER' a line; each holder may act only as USER")
	fl.StringVar(&f.socketMode, "socket-mode", "0660", "with --listen unix:PATH: the socket's mode (connecting takes write permission)")
	fl.StringVar(&f.socketGroup, "socket-group", "", "with --listen unix:PATH: the socket's group, a name or gid (default: the server's)")
	fl.BoolVar(&f.noRootSquash, "no-root-squash", false, "let clients' uid 0 act as root instead of nobody")
	fl.IntVar(&f.maxConns, "max-conns", 64, "most clients connected at once; past it a new one takes the place of the one idle longest (--idle)")
	fl.IntVar(&f.perPeer, "max-conns-per-peer", 0, "most clients connected at once of one uid (over a unix socket, or loopback TCP without --keyfile) or from one address (over TCP, loopback otherwise excepted); 0 for half of --max-conns")
	fl.DurationVar(&f.idle, "idle", 2*time.Second, "how long a client may go without a request (a caching client's waiting journal read aside) before it may be disconnected to admit another when --max-conns are connected; it reconnects when it needs to")
	fl.DurationVar(&f.handshakeTimeout, "handshake-timeout", p9net.DefaultAcceptTimeout, "how long a new connection has to authenticate (--keyfile), and then to send its first 9P message")
	fl.IntVar(&f.maxJournals, "max-journals", 4096, "most journals of caching clients kept; past it those without a connection longest are deleted")
	fl.StringVar(&f.journalBytes, "journal-bytes", "16MiB", "most memory one client's journal holds (its records and the files it follows); past it the client is told to drop everything")
	fl.StringVar(&f.journalMemory, "journal-memory", "128MiB", "most memory all journals hold; past it the largest are told to drop everything, those of clients not connected first (past an eighth of it)")
	fl.IntVar(&f.maxFids, "max-fids", 16384, "most fids (open or walked files) one client holds")
	fl.StringVar(&f.upstream, "upstream", "", "serve the tree of this 9P2000.L server instead of LOWER: tcp:HOST:PORT[/ANAME], unix:PATH[?aname=ANAME] or a 9p:// URL")
	fl.IntVar(&f.journalRecords, "journal-records", 65536, "most records queued in one client's journal; past it the client is told to drop everything")
	fl.DurationVar(&f.journalAge, "journal-age", time.Hour, "how long a journal outlives its client's connection; a client back later drops everything")
	fl.IntVar(&f.journalInterest, "journal-interest", 1000000, "most files one client's journal follows; past it the client is told to drop everything")
	fl.BoolVar(&f.sprite, "sprite", true, "follow Sprite's consistency rules (docs/network.md): caching clients delay their writes, and the server recalls them, or turns caching off while a file is write-shared; with --sprite=false clients write through, kept coherent by the journal alone")
	fl.BoolVar(&f.delegate, "delegate", false, "with --sprite, grant caching clients read delegations: their opens for reading of a file no one writes need no request until the server takes it back (docs/network.md)")
	fl.DurationVar(&f.recallTimeout, "recall-timeout", 10*time.Second, "how long an open waits for a connected client to write back its delayed writes of the file; past it the open goes on without them")
	fl.DurationVar(&f.nameWait, "name-wait", time.Second, "how long a client's rename, unlink or create waits for the other clients that cache the directory to drop their old entry, so that a stat there after it returned is current (docs/network.md); 0 for no wait: a stat may then show the old name for one journal delivery")
	fl.DurationVar(&f.lease, "lease", 20*time.Second, "how long a client that lost its connection keeps its claim to its delayed writes: opens of its files wait that long for it to come back")
	fl.DurationVar(&f.grace, "grace", 10*time.Second, "after a server here ended uncleanly (a crash, kill -9): how long opens wait for clients to reclaim their delayed writes; 0 for not at all")
	fl.StringVar(&f.metricsAddr, "metrics", "", "serve the server's counters to Prometheus on http://HOST:PORT/metrics")
	fl.StringVar(&f.stack, "stack", "", "serve the [[export]]s (and mount the [[view]]s) of the stack this TOML file describes")
	fl.StringArrayVar(&f.layers, "layer", nil, "stack this layer (repeat to stack several, bottom-most first): "+stack.Names())
	cmd.RegisterFlagCompletionFunc("layer", completeLayers)
	cmd.ValidArgsFunction = completeDirs
	f.layerFlags.register(fl)
	f.registerLog(fl, "stderr")
	fl.DurationVar(&f.timeout, "timeout", 0, "with --stack views: how long the kernel may cache names and attributes (as for mount; default: an hour where LOWER is watched, 1s where it cannot be)")
	fl.BoolVar(&f.allowOther, "allow-other", false, "with --stack views: let all users use them (as for mount; default: on as root, off otherwise)")
	fl.BoolVar(&f.noPassthrough, "no-passthrough", false, "with --stack views: no FUSE passthrough (as for mount)")
	fl.BoolVar(&f.nonempty, "nonempty", false, "with --stack views: mount them even where their mountpoints have files (as for mount)")
	fl.StringVar(&f.coherence, "coherence", "on", "on, or off to run without the coherence manager (for tests and benchmarks only)")
	fl.StringVar(&f.watch, "watch", "auto", "how to notice changes made beside shale in LOWER: auto, fanotify or inotify (for tests)")
	fl.MarkHidden("watch")
	rootCmd.AddCommand(cmd)
}

// planServe reads the command line into a plan with exports.
func planServe(f *serveFlags, args []string) (*plan, error) {
	if f.stack != "" {
		if f.upstream != "" {
			return nil, errors.New("--upstream and --stack: say one; a stack file's lower may be a 9p:// URL")
		}
		if len(args) != 0 {
			return nil, errors.New("--stack FILE takes no LOWER: the file names it")
		}
		p, err := planMount(nil, &f.mountFlags, nil)
		if err != nil {
			return nil, err
		}
		if len(p.spec.Exports) == 0 {
			return nil, fmt.Errorf("stack file %s names no [[export]]: add one (layer = N, name = \"ANAME\") or mount it with shale mount --stack", f.stack)
		}
		return p, nil
	}
	if f.upstream != "" {
		if len(args) != 0 {
			return nil, errors.New("--upstream takes no LOWER: the upstream server's tree is what is served")
		}
		u, err := upstreamURL(f.upstream)
		if err != nil {
			return nil, err
		}
		args = []string{u}
	}
	if len(args) != 1 {
		return nil, errors.New("serve needs LOWER (or --stack FILE): see shale serve --help")
	}
	lower, err := checkLower(args[0])
	if err != nil {
		return nil, err
	}
	sp, err := f.layeredSpec(lower)
	if err != nil {
		return nil, err
	}
	sp.Exports = []stack.Export{{Layer: len(sp.Layers)}}
	switch f.coherence {
	case "on", "off":
		sp.CoherenceOff = f.coherence == "off"
	default:
		return nil, fmt.Errorf("--coherence %q: say on or off", f.coherence)
	}
	return &plan{spec: sp}, sp.Check()
}

// upstreamURL is the 9p:// lower of an --upstream address.
func upstreamURL(a string) (string, error) {
	if strings.HasPrefix(a, "9p://") {
		return a, nil
	}
	switch netw, rest, _ := strings.Cut(a, ":"); {
	case netw == "tcp" && rest != "":
		return "9p://" + rest, nil
	case netw == "unix" && strings.HasPrefix(rest, "/"):
		return "9p://" + rest, nil
	}
	return "", fmt.Errorf("--upstream %s: write tcp:HOST:PORT[/ANAME], unix:/PATH[?aname=ANAME] or a 9p:// URL", a)
}

func runServe(f *serveFlags, args []string) error {
	addr, err := p9net.ParseListen(f.listen)
	if err != nil {
		return err
	}
	if err := probeListen(addr); err != nil {
		return err
	}
	lc, err := listenConfig(f, addr)
	if err != nil {
		return err
	}
	if f.maxConns < 1 {
		return fmt.Errorf("--max-conns %d: say at least 1", f.maxConns)
	}
	if f.maxFids < 16 {
		return fmt.Errorf("--max-fids %d: say at least 16 (a client walks several fids at once)", f.maxFids)
	}
	if f.journalRecords < 1 || f.journalInterest < 1 || f.journalAge <= 0 {
		return fmt.Errorf("--journal-records %d, --journal-interest %d, --journal-age %v: say positive bounds", f.journalRecords, f.journalInterest, f.journalAge)
	}
	bounds, err := serveBounds(f)
	if err != nil {
		return err
	}
	switch {
	case f.recallTimeout <= 0:
		return fmt.Errorf("--recall-timeout %v: say a positive duration such as 10s", f.recallTimeout)
	case f.nameWait < 0:
		return fmt.Errorf("--name-wait %v: say a duration such as 1s, or 0 for none", f.nameWait)
	case f.lease <= 0:
		return fmt.Errorf("--lease %v: say a positive duration such as 20s", f.lease)
	case f.grace < 0:
		return fmt.Errorf("--grace %v: say a duration such as 10s, or 0 for none", f.grace)
	}
	p, err := planServe(f, args)
	if err != nil {
		return err
	}
	logger, err := openLog(&f.mountFlags, false)
	if err != nil {
		return err
	}
	// Listening before anything is served, so that a bad address fails
	// the command; the server's counters are there once it serves.
	// With a 9p:// lower (--upstream), its client's counters too.
	var srvp atomic.Pointer[export.Server]
	var client mountSource
	ms, err := serveMetrics(f.metricsAddr, func() []metrics.Sample {
		srv := srvp.Load()
		if srv == nil {
			return nil
		}
		return append(serverSamples(srv.Stats()), client.samples()...)
	})
	if err != nil {
		return err
	}
	defer ms.close(logger)
	what := p.spec.Lower
	if f.stack != "" {
		if what, err = filepath.Abs(f.stack); err != nil {
			return err
		}
	}
	mk, warn, err := openMarker(addr.String(), what)
	if err != nil {
		return err
	}
	if warn != nil {
		logger.Warn("no serving marker: an unclean end of this server will not be noticed at the next start", "err", warn)
	}
	// Only a stop by signal is clean: the server ended with everything it
	// was told. Failing before serving leaves the marker as it was.
	clean, served := false, false
	defer func() { mk.done(clean || !served && !mk.existed) }()
	// Passphrases are asked once the command line is known to be good.
	if err := p.prepare(); err != nil {
		return err
	}
	grace := time.Duration(0)
	if mk.existed {
		grace = f.grace
		if grace > 0 {
			logger.Info("the last server of this address and LOWER did not end cleanly: opens wait up to "+grace.String()+" for clients to reclaim their delayed writes", "marker", mk.path, "grace", grace)
		} else {
			logger.Warn("the last server of this address and LOWER did not end cleanly, and --grace is 0: opens do not wait for clients to reclaim their delayed writes", "marker", mk.path)
		}
	}
	if !f.noRootSquash {
		// Otherwise a root client's EACCES is a mystery.
		logger.Info("clients' uid 0 acts as nobody (65534) here: root's writes fail where nobody may not write; --no-root-squash lets it act as root")
	}
	raiseFileLimit()
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT)
	st, nodes, opts, err := p.build(&f.mountFlags, logger)
	if err != nil {
		return err
	}
	roots := map[string]layer.Node{}
	var names, anames []string
	for _, e := range p.spec.Exports {
		roots[e.Name] = nodes[e.Layer]
		names = append(names, fmt.Sprintf("%q (layer %d)", e.Name, e.Layer))
		anames = append(anames, e.Name)
	}
	srv := export.New(st, roots, export.Options{
		NoRootSquash:    f.noRootSquash,
		MaxConns:        f.maxConns,
		MaxConnsPerPeer: f.perPeer,
		Idle:            f.idle,
		FirstTimeout:    f.handshakeTimeout,
		MaxFids:         f.maxFids,
		Logger:          logger,

		MaxJournals:   f.maxJournals,
		JournalBytes:  bounds.journalBytes,
		JournalMemory: bounds.journalMemory,

		JournalRecords:  f.journalRecords,
		JournalAge:      f.journalAge,
		JournalInterest: f.journalInterest,

		Sprite:        f.sprite,
		Delegate:      f.delegate,
		RecallTimeout: f.recallTimeout,
		NameWait:      nameWait(f.nameWait),
		Lease:         f.lease,
		Grace:         grace,
		RightsFile:    rightsPath(addr.String(), what),
	})
	// Views first: once clients can connect, everything is served.
	mounts, err := p.mountViews(st, nodes, opts, logger)
	if err != nil {
		return err
	}
	l, err := lc.Listen(addr)
	if err != nil {
		unmountAll(mounts, logger)
		return err
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	serving := make(chan error, 1)
	go func() { serving <- srv.Serve(ctx, l) }()
	served = true
	client.set(p)
	srvp.Store(srv)
	defer serveViews(p, logger)()
	if l := answer(serverSocket(addr.String()), logger, func() any {
		return serverStatus{Pid: os.Getpid(), Started: started, Lower: showLower(p.spec.Lower), Layers: layerNames(p.spec),
			Listen: addr.String(), Exports: names, Anames: anames, Stats: string(srv.Stats())}
	}); l != nil {
		defer l.Close()
	}
	logger.Info("serving", "lower", p.spec.Lower, "listen", addr.String(), "exports", strings.Join(names, ", "), "key", lc.Key != nil, "authorized_keys", lc.AuthorizedKeys)
	if ms != nil {
		logger.Info("serving metrics", "url", "http://"+ms.Addr()+"/metrics")
	}
	notify(logger, "READY=1", "STATUS=serving "+p.spec.Lower+" on "+addr.String())
	select {
	case err = <-serving:
		if err != nil {
			err = fmt.Errorf("serving on %s: %v", addr, err)
		}
	case s := <-sig:
		logger.Info("ending", "why", "signal "+s.String())
		notify(logger, "STOPPING=1")
		cancel()
		<-serving
		clean = true
	}
	unmountAll(mounts, logger)
	for _, m := range mounts {
		m.server.Wait()
	}
	if addr.Network == "unix" {
		os.Remove(addr.Address)
	}
	return err
}

// probeListen tells, before anything is prepared, why addr cannot be
// listened on, in words: Go's are "bind: address already in use".
func probeListen(addr p9net.Addr) error {
	if addr.Network != "tcp" {
		return nil // p9net says what is wrong with a socket's path
	}
	l, err := net.Listen("tcp", addr.Address)
	switch {
	case errors.Is(err, syscall.EADDRINUSE):
		return fmt.Errorf("--listen %s: the address is in use (another shale serve? shale status lists them; ss -ltnp says who): stop it, or choose another port", addr)
	case errors.Is(err, syscall.EACCES):
		return fmt.Errorf("--listen %s: a port below 1024 needs root: choose a port above it (5640 is shale's)", addr)
	case errors.Is(err, syscall.EADDRNOTAVAIL):
		return fmt.Errorf("--listen %s: no interface of this machine has that address: choose one of its own (ip -brief address)", addr)
	case err != nil:
		return fmt.Errorf("--listen %s: %v", addr, err)
	}
	l.Close()
	return nil
}

// serveLimits are the sizes of serve's bounds, parsed.
type serveLimits struct{ journalBytes, journalMemory int64 }

// serveBounds checks the bounds no client can break.
func serveBounds(f *serveFlags) (serveLimits, error) {
	var b serveLimits
	switch {
	case f.perPeer < 0:
		return b, fmt.Errorf("--max-conns-per-peer %d: say at least 1, or 0 for half of --max-conns", f.perPeer)
	case f.idle <= 0:
		return b, fmt.Errorf("--idle %v: say a positive duration such as 2s", f.idle)
	case f.handshakeTimeout <= 0:
		return b, fmt.Errorf("--handshake-timeout %v: say a positive duration such as 5s", f.handshakeTimeout)
	case f.maxJournals < f.maxConns:
		return b, fmt.Errorf("--max-journals %d: say at least --max-conns (%d): every client may have one", f.maxJournals, f.maxConns)
	}
	for _, x := range []struct {
		flag, val string
		to        *int64
	}{{"--journal-bytes", f.journalBytes, &b.journalBytes}, {"--journal-memory", f.journalMemory, &b.journalMemory}} {
		n, err := humanize.ParseBytes(x.val)
		if err != nil || n < 64<<10 || n > 1<<50 {
			return b, fmt.Errorf("%s %s: say a size such as 16MiB (at least 64KiB)", x.flag, x.val)
		}
		*x.to = int64(n)
	}
	return b, nil
}

// listenConfig is who may connect to addr, from serve's flags.
func listenConfig(f *serveFlags, addr p9net.Addr) (p9net.ListenConfig, error) {
	lc := p9net.ListenConfig{HandshakeTimeout: f.handshakeTimeout}
	if f.keyFile != "" {
		key, err := p9net.LoadKey(f.keyFile)
		if err != nil {
			return lc, err
		}
		lc.Key = key
	} else if !addr.Loopback() {
		return lc, fmt.Errorf("listening on %s needs --keyfile: without a key the server cannot tell who a client is, and anyone who reaches it could act as any user; or listen on loopback (tcp:127.0.0.1:PORT) or a unix socket, where the kernel tells each client's uid", addr)
	}
	if f.authorized != "" {
		if lc.Key == nil {
			return lc, errors.New("--authorized-keys needs --keyfile: the host key is the server's identity, which user keys trust (shale keygen HOSTKEY)")
		}
		if err := p9net.CheckAuthorized(f.authorized); err != nil {
			return lc, err
		}
		lc.AuthorizedKeys = f.authorized
	}
	m, err := strconv.ParseUint(f.socketMode, 8, 32)
	if err != nil || m == 0 || m > 0o777 {
		return lc, fmt.Errorf("--socket-mode %q: say an octal mode such as 0660", f.socketMode)
	}
	lc.SocketMode = os.FileMode(m)
	if f.socketGroup != "" {
		gid, err := strconv.Atoi(f.socketGroup)
		if err != nil {
			g, lerr := user.LookupGroup(f.socketGroup)
			if lerr != nil {
				return lc, fmt.Errorf("--socket-group %s: %v", f.socketGroup, lerr)
			}
			gid, _ = strconv.Atoi(g.Gid)
		}
		lc.SocketGID = gid
	}
	return lc, nil
}

// nameWait is export.Options.NameWait of --name-wait: 0 is none.
func nameWait(d time.Duration) time.Duration {
	if d == 0 {
		return -1
	}
	return d
}
