package main

import (
	"bytes"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/shalefs/shale/export"
	"github.com/shalefs/shale/layer"
	"github.com/shalefs/shale/metrics"
	"github.com/shalefs/shale/p9net"
	"github.com/shalefs/shale/remote"
	"github.com/shalefs/shale/stack"
	"github.com/shalefs/shale/volume"
)

// TestClientFlagErrors: the 9P client's flags fail in one line, mounting
// nothing, when wrong or given for a LOWER without a client.
func TestClientFlagErrors(t *testing.T) {
	_, lower, mnt := lowerAndMnt(t)
	const url = "9p://127.0.0.1:1/"
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"mount", "--write-delay", "5s", lower, mnt}, "--write-delay 5s: only writes to a 9p:// LOWER"},
		{[]string{"mount", "--write-delay", "0", lower, mnt}, "--write-delay 0s: only writes to a 9p:// LOWER"},
		{[]string{"mount", "--dirty-max", "128MiB", lower, mnt}, "--dirty-max 128MiB: only writes"},
		{[]string{"mount", "-o", "write_delay=5s", lower, mnt}, "--write-delay 5s"},
		{[]string{lower, mnt, "-o", "dirty_max=128MiB"}, "--dirty-max 128MiB"},
		{[]string{lower, mnt, "-o", "write_delay"}, "write_delay=DURATION"},
		{[]string{"mount", "--write-delay", "-1s", url, mnt}, "--write-delay -1s: say a positive duration"},
		{[]string{"mount", "--write-delay", "soon", url, mnt}, `"soon"`},
		{[]string{"mount", "--dirty-max", "1KiB", url, mnt}, "--dirty-max 1KiB: want a size such as 64MiB (at least 1MiB)"},
		{[]string{"mount", "--dirty-max", "lots", url, mnt}, "--dirty-max lots"},
		{[]string{"mount", "-o", "dirty_max=1KiB", url, mnt}, "--dirty-max 1KiB"},
		// Found by the serving process, before it mounts, and told by
		// the one that started it.
		{[]string{"mount", "--metrics", "nope", url, mnt}, "metrics address nope"},
		{[]string{"mount", "--metrics", "127.0.0.1:http", url, mnt}, "metrics address 127.0.0.1:http"},
	} {
		code, out := run(t, c.args...)
		wantOneLineError(t, code, out, c.want)
		if _, _, ok := mountedAt(mnt); ok {
			t.Fatalf("%q: mounted", c.args)
		}
	}
}

// TestServeFlagErrors: shale serve's Sprite and metrics flags fail in one
// line naming the flag, serving nothing.
func TestServeFlagErrors(t *testing.T) {
	_, lower, _ := lowerAndMnt(t)
	sock := "unix:" + filepath.Join(t.TempDir(), "sock")
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--recall-timeout", "0", lower}, "--recall-timeout 0s"},
		{[]string{"--recall-timeout", "-5s", lower}, "--recall-timeout -5s"},
		{[]string{"--lease", "0", lower}, "--lease 0s"},
		{[]string{"--name-wait", "-1s", lower}, "--name-wait -1s"},
		{[]string{"--grace", "-1s", lower}, "--grace -1s"},
		{[]string{"--grace", "later", lower}, `"later"`},
		{[]string{"--metrics", "bogus", lower}, "metrics address bogus"},
		{[]string{"--metrics", "127.0.0.1:99999", lower}, "metrics address 127.0.0.1:99999"},
	} {
		args := append([]string{"serve", "--listen", sock}, c.args...)
		done := make(chan struct{})
		var code int
		var out string
		go func() {
			defer close(done)
			cmd := exec.Command(shaleBin, args...)
			b, err := cmd.CombinedOutput()
			code, out = 0, string(b)
			if ee, ok := err.(*exec.ExitError); ok {
				code = ee.ExitCode()
			}
		}()
		select {
		case <-done:
		case <-time.After(30 * time.Second):
			t.Fatalf("%q: still serving", args)
		}
		wantOneLineError(t, code, out, c.want)
	}
}

func TestStatsServerFlag(t *testing.T) {
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"stats", "--server", "127.0.0.1:1", "/mnt"}, "takes no MOUNTPOINT"},
		{[]string{"stats", "--server", "nohost"}, "--server nohost"},
		{[]string{"stats", "--server", "unix:rel.sock"}, "must be absolute"},
		{[]string{"stats", "--keyfile", "k", "/mnt"}, "--keyfile goes with --server"},
		{[]string{"stats", "--server", "127.0.0.1:1"}, "127.0.0.1:1"}, // nobody listens
	} {
		code, out := run(t, c.args...)
		wantOneLineError(t, code, out, c.want)
	}
	for _, c := range []struct{ addr, key, want string }{
		{"tcp:127.0.0.1:5640", "", "9p://127.0.0.1:5640/"},
		{"127.0.0.1:5640", "", "9p://127.0.0.1:5640/"},
		{"[::1]:5640", "", "9p://[::1]:5640/"},
		{"unix:/run/s.sock", "", "9p:///run/s.sock"},
		{"127.0.0.1:5640", "/etc/k", "9p://127.0.0.1:5640/?keyfile=%2Fetc%2Fk"},
		{"9p://h:1/", "", "9p://h:1/"},
	} {
		got, err := serverURL(c.addr, c.key)
		if err != nil || got != c.want {
			t.Errorf("serverURL(%q, %q) = %q, %v; want %q", c.addr, c.key, got, err, c.want)
		}
	}
}

// TestCachedLowerQuery: --write-delay and --dirty-max go into a 9p://
// LOWER's query as writedelay and dirtymax, which remote reads back.
func TestCachedLowerQuery(t *testing.T) {
	mountDefaults := func() *mountFlags {
		return &mountFlags{client: true, writeDelay: 30 * time.Second, dirtyMax: "64MiB", cacheSize: "256MiB"}
	}
	opts := func(t *testing.T, lower string) remote.Options {
		t.Helper()
		r, ok, err := p9net.ParseRemote(lower)
		if !ok || err != nil {
			t.Fatalf("%s: %v", lower, err)
		}
		o, err := remote.OptionsFromQuery(r.Query)
		if err != nil {
			t.Fatalf("%s: %v", lower, err)
		}
		return o
	}

	f := mountDefaults()
	got, err := f.cachedLower("9p://127.0.0.1:5640/")
	if err != nil {
		t.Fatal(err)
	}
	if want := "9p://127.0.0.1:5640/?cachesize=256MiB&dirtymax=64MiB&writedelay=30s"; got != want {
		t.Errorf("defaults: %s, want %s", got, want)
	}
	if o := opts(t, got); o.WriteDelay != 30*time.Second || o.DirtyMax != 64<<20 {
		t.Errorf("defaults: WriteDelay %v, DirtyMax %d", o.WriteDelay, o.DirtyMax)
	}

	f.writeDelay, f.writeDelaySet = 0, true
	f.dirtyMax, f.dirtyMaxSet = "1GiB", true
	got, _ = f.cachedLower("9p:///run/s.sock?aname=x")
	if !strings.HasPrefix(got, "9p:///run/s.sock?aname=x&") || !strings.Contains(got, "writedelay=0") || !strings.Contains(got, "dirtymax=1GiB") {
		t.Errorf("write-through: %s", got)
	}
	if o := opts(t, got); o.WriteDelay >= 0 || o.DirtyMax != 1<<30 {
		t.Errorf("write-through: WriteDelay %v (want negative), DirtyMax %d", o.WriteDelay, o.DirtyMax)
	}

	f.writeDelay = 2 * time.Minute
	got, _ = f.cachedLower("9p://h:1/?writedelay=5s&dirtymax=2MiB")
	if o := opts(t, got); o.WriteDelay != 5*time.Second || o.DirtyMax != 2<<20 {
		t.Errorf("the URL's own: %s: WriteDelay %v, DirtyMax %d", got, o.WriteDelay, o.DirtyMax)
	}
	f.writeDelay = 90 * time.Second
	got, _ = f.cachedLower("9p://h:1/")
	if o := opts(t, got); o.WriteDelay != 90*time.Second {
		t.Errorf("%s: WriteDelay %v", got, o.WriteDelay)
	}

	// shale serve has none of these flags: a --stack file's 9p:// lower
	// gets remote's defaults.
	got, _ = (&mountFlags{}).cachedLower("9p://h:1/")
	if got != "9p://h:1/" {
		t.Errorf("serve: %s", got)
	}

	// A local LOWER: the defaults are no mistake.
	if got, err := mountDefaults().cachedLower("/srv/x"); err != nil || got != "/srv/x" {
		t.Errorf("local lower: %q, %v", got, err)
	}
}

// TestMountOptionFlags: every option -o takes has its flag.
func TestMountOptionFlags(t *testing.T) {
	m, _, err := rootCmd.Find([]string{"mount"})
	if err != nil {
		t.Fatal(err)
	}
	flags, _ := mountOptionFlags()
	for o, name := range flags {
		if m.Flags().Lookup(name) == nil {
			t.Errorf("-o %s: shale mount has no flag --%s", o, name)
		}
	}
	for _, o := range []string{"write_delay", "dirty_max", "metrics"} {
		if flags[o] == "" {
			t.Errorf("-o takes no %s", o)
		}
	}
}

func TestPrintStatsSprite(t *testing.T) {
	var b bytes.Buffer
	printStats(&b, remote.Stats{Sprite: &remote.SpriteStats{WriteDelay: "off"}}) // all zeros
	out := b.String()
	for _, want := range []string{"Sprite (write-through)", "opens        0", "stale version (cache dropped)"} {
		if !strings.Contains(out, want) {
			t.Errorf("zeros: no %q in\n%s", want, out)
		}
	}
	if strings.Contains(out, "NaN") || strings.Contains(out, "Inf") {
		t.Errorf("zeros: a ratio divided by zero:\n%s", out)
	}
	b.Reset()
	printStats(&b, remote.Stats{}) // a server without Sprite's rules
	if strings.Contains(b.String(), "Sprite") {
		t.Errorf("no Sprite part, yet:\n%s", b.String())
	}

	b.Reset()
	printStats(&b, remote.Stats{Sprite: &remote.SpriteStats{
		WriteDelay: "30s", ReadBytes: 1000, ReadServerBytes: 250, WriteBytes: 4000, WriteServerBytes: 1000,
		Discarded: 3000, Lost: 7, DirtyBytes: 4096, DirtyFiles: 2,
		WriteBacks: map[string]uint64{"age": 3, "fsync": 1, "recall": 0},
		Opens:      200, OpensStale: 10, OpensNoCache: 1, Recalls: 4, Uncaches: 2, ReclaimsRefused: 0,
		Delegations: 5, Returns: 2, OpensDelegated: 40, TimesKept: 6, LocksKept: 9, LocksPushed: 1,
	}})
	out = b.String()
	for _, want := range []string{
		"Sprite (write delay 30s)",
		"25.0%", // read from the server
		"3000 bytes discarded (75.0% of written", "7 lost",
		"dirty now    4096 bytes in 2 files",
		"write-backs  4: age 3, fsync 1",
		"opens        200",
		"5.0% of opens", // stale
		"delegations  5 granted, 2 returned; 40 opens without a request (120 requests saved)",
		"locks kept   9 lock calls answered under delegations (9 requests saved); 1 locks pushed",
		"times kept   6 settings of times kept with delayed writes (12 requests saved",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("no %q in\n%s", want, out)
		}
	}
}

// scrape serves samples on a metrics endpoint and returns what a
// Prometheus scrape reads, checking that none was left out.
func scrape(t *testing.T, samples []metrics.Sample) string {
	t.Helper()
	s, err := metrics.Serve("127.0.0.1:0", func() []metrics.Sample { return samples })
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	return get(t, "http://"+s.Addr()+"/metrics")
}

func get(t *testing.T, url string) string {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	out := string(b)
	if !strings.Contains(out, "\nshale_metrics_bad_samples_total 0\n") {
		t.Errorf("samples were left out of the scrape:\n%s", grep(out, "shale_"))
	}
	return out
}

// grep is the lines of s that contain sub.
func grep(s, sub string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, sub) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

func TestServerSamples(t *testing.T) {
	text := []byte("requests.Tread 5\nrequests.Twrite 2\nrequests.other 1\nrequests 8\nbytes.in 100\n" +
		"connections 3\njournals.connected 2\nepoch 1234567\nsprite.files 4\nsprite.opens.grace 1\nsprite.writebacks.refused 0\n" +
		"garbage\nbad value\n")
	byName := map[string]metrics.Sample{}
	for _, s := range serverSamples(text) {
		key := s.Name
		if s.Labels != nil {
			key += "{" + s.Labels["type"] + "}"
		}
		byName[key] = s
	}
	for _, c := range []struct {
		key   string
		gauge bool
		v     float64
	}{
		{"shale_server_requests_total{Tread}", false, 5},
		{"shale_server_requests_total{other}", false, 1},
		{"shale_server_bytes_in_total", false, 100},
		{"shale_server_connections", true, 3},
		{"shale_server_journals_connected", true, 2},
		{"shale_server_sprite_files", true, 4},
		{"shale_server_sprite_opens_grace_total", false, 1},
		{"shale_server_sprite_writebacks_refused_total", false, 0},
	} {
		s, ok := byName[c.key]
		if !ok || s.Gauge != c.gauge || s.Value != c.v {
			t.Errorf("%s: %+v (found %v), want gauge %v value %v", c.key, s, ok, c.gauge, c.v)
		}
	}
	if len(byName) != 9 {
		t.Errorf("%d samples, want 9 (epoch, the requests total and bad lines left out): %v", len(byName), byName)
	}

	// Every line of a real server's stats file makes a good sample.
	srv := export.New(stack.New(stack.Options{}), map[string]layer.Node{}, export.Options{})
	out := scrape(t, serverSamples(srv.Stats()))
	for _, want := range []string{
		`shale_server_requests_total{type="Tread"} 0`,
		"# TYPE shale_server_connections gauge",
		"shale_server_sprite_opens_total 0",
		"shale_server_records_made_total 0",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("scrape has no %q:\n%s", want, grep(out, "shale_server"))
		}
	}
}

func TestClientSamples(t *testing.T) {
	s := remote.Stats{
		Caching: true, Requests: map[string]uint64{"read": 3, "lopen": 2},
		Hits: map[string]uint64{"data": 5, "stat": 1}, Misses: map[string]uint64{"data": 1, "stat": 0},
		CachedFiles: 2, CachedBytes: 1 << 17,
	}
	out := scrape(t, clientSamples(s))
	if strings.Contains(out, "shale_client_dirty_bytes") {
		t.Errorf("Sprite's samples without Sprite")
	}
	s.Sprite = &remote.SpriteStats{WriteDelay: "30s", WriteBytes: 10, DirtyBytes: 10, DirtyFiles: 1,
		WriteBacks: map[string]uint64{"age": 1, "fsync": 2}}
	out = scrape(t, clientSamples(s))
	for _, want := range []string{
		`shale_client_requests_total{type="read"} 3`,
		`shale_client_cache_hits_total{kind="data"} 5`,
		`shale_client_cache_misses_total{kind="data"} 1`,
		"shale_client_cached_bytes 131072",
		"# TYPE shale_client_cached_files gauge",
		"shale_client_written_bytes_total 10",
		"shale_client_dirty_bytes 10",
		"# TYPE shale_client_dirty_bytes gauge",
		`shale_client_writebacks_total{reason="fsync"} 2`,
		"shale_client_write_delay_seconds 30",
		"shale_client_opens_total 0",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("scrape has no %q:\n%s", want, grep(out, "shale_client"))
		}
	}
	s.Sprite.WriteDelay = "off"
	if out := scrape(t, clientSamples(s)); !strings.Contains(out, "shale_client_write_delay_seconds 0") {
		t.Errorf("write-through: %s", grep(out, "write_delay"))
	}
}

// startServe starts shale serve, logging to log, and waits until it
// serves; it ends with the test.
func startServe(t *testing.T, log string, args ...string) *exec.Cmd {
	t.Helper()
	before, _ := os.ReadFile(log)
	cmd := exec.Command(shaleBin, append([]string{"serve", "--sprite", "--log", log}, args...)...)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	s := &served{done: make(chan struct{})}
	go func() { s.err = cmd.Wait(); close(s.done) }()
	servedBy.Store(cmd, s)
	t.Cleanup(func() {
		cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-s.done:
		case <-time.After(30 * time.Second):
			cmd.Process.Kill()
		}
	})
	for deadline := time.Now().Add(30 * time.Second); ; {
		b, _ := os.ReadFile(log)
		if len(b) >= len(before) && bytes.Contains(b[len(before):], []byte("msg=serving ")) {
			return cmd
		}
		select {
		case <-s.done:
			t.Fatalf("shale serve ended: %v: %s", s.err, b)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("shale serve does not serve: %s", b)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// served is a shale serve that startServe started: done is closed once
// it has been reaped, with err its Wait's.
type served struct {
	done chan struct{}
	err  error
}

var servedBy sync.Map // *exec.Cmd → *served

// stopServe ends cmd with sig and waits until it has been reaped: not
// only its first thread, as a zombie's, but all of them, which hold its
// files (the marker's lock) until they have gone.
func stopServe(t *testing.T, cmd *exec.Cmd, sig syscall.Signal) {
	t.Helper()
	cmd.Process.Signal(sig)
	v, _ := servedBy.Load(cmd)
	select {
	case <-v.(*served).done:
	case <-time.After(30 * time.Second):
		t.Fatalf("shale serve (pid %d) does not end", cmd.Process.Pid)
	}
}

// TestServeMarker: shale serve keeps a marker while serving, removed on
// SIGTERM; after kill -9 it stays, and the next start waits --grace.
func TestServeMarker(t *testing.T) {
	dir, lower, _ := lowerAndMnt(t)
	sockPath := filepath.Join(dir, "sock")
	listen := "unix:" + sockPath
	log := filepath.Join(dir, "log")
	marker := markerPath(listen, lower)
	if !strings.HasPrefix(marker, "/var/lib/shale/serving-") {
		t.Fatalf("marker %s: want it in /var/lib/shale as root", marker)
	}
	t.Cleanup(func() { os.Remove(marker) })
	os.Remove(marker)

	start := func(args ...string) *exec.Cmd {
		return startServe(t, log, append([]string{"--listen", listen}, append(args, lower)...)...)
	}
	graceLine := "did not end cleanly"

	srv := start()
	if _, err := os.Stat(marker); err != nil {
		t.Fatalf("no marker while serving: %v", err)
	}
	// A second server of the same address and LOWER is refused.
	code, out := run(t, "serve", "--listen", listen, lower)
	wantOneLineError(t, code, out, "serves "+lower+" on "+listen+" already")
	stopServe(t, srv, syscall.SIGTERM)
	if _, err := os.Stat(marker); !os.IsNotExist(err) {
		t.Fatalf("marker after a clean end: %v", err)
	}

	srv = start()
	if b, _ := os.ReadFile(log); bytes.Contains(b, []byte(graceLine)) {
		t.Fatalf("grace after a clean end:\n%s", b)
	}
	stopServe(t, srv, syscall.SIGKILL)
	if _, err := os.Stat(marker); err != nil {
		t.Fatalf("no marker after kill -9: %v", err)
	}
	os.Remove(sockPath)

	before, _ := os.ReadFile(log)
	srv = start("--grace", "3s")
	b, _ := os.ReadFile(log)
	if !bytes.Contains(b[len(before):], []byte(graceLine)) || !bytes.Contains(b[len(before):], []byte("up to 3s")) {
		t.Fatalf("no grace line after kill -9:\n%s", b)
	}
	stopServe(t, srv, syscall.SIGTERM)
	if _, err := os.Stat(marker); !os.IsNotExist(err) {
		t.Fatalf("marker after a clean end: %v", err)
	}
}

// freePort is a TCP port of 127.0.0.1 nobody listens on just now.
func freePort(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

// TestSpriteMount: a mount of shale serve delays writes, and shale stats,
// shale stats --server and both metrics endpoints show it.
func TestSpriteMount(t *testing.T) {
	dir, lower, mnt := lowerAndMnt(t)
	sock := filepath.Join(dir, "sock")
	log := filepath.Join(dir, "serve.log")
	serverMetrics, clientMetrics := freePort(t), freePort(t)
	t.Cleanup(func() { os.Remove(markerPath("unix:"+sock, lower)) })
	startServe(t, log, "--listen", "unix:"+sock, "--no-root-squash", "--metrics", serverMetrics, lower)

	if code, out := run(t, "mount", "--metrics", clientMetrics, "--write-delay", "1m", "9p://"+sock, mnt); code != 0 {
		t.Fatalf("shale mount: exit %d: %s", code, out)
	}
	t.Cleanup(func() {
		if _, _, ok := mountedAt(mnt); ok {
			syscall.Unmount(mnt, syscall.MNT_DETACH)
		}
	})
	data := bytes.Repeat([]byte("x"), 10000)
	if err := os.WriteFile(filepath.Join(mnt, "f"), data, 0o644); err != nil {
		t.Fatal(err)
	}

	code, out := run(t, "stats", mnt)
	if code != 0 || !strings.Contains(out, "Sprite (write delay 1m0s)") {
		t.Fatalf("shale stats: exit %d:\n%s", code, out)
	}
	t.Logf("shale stats:\n%s", out)
	// The data is delayed: not in LOWER yet.
	if b, _ := os.ReadFile(filepath.Join(lower, "f")); len(b) == len(data) {
		t.Errorf("the write reached LOWER at once, with --write-delay 1m")
	}
	m := get(t, "http://"+clientMetrics+"/metrics")
	for _, want := range []string{"shale_client_written_bytes_total", "shale_client_dirty_bytes", `shale_client_requests_total{type="lcreate"}`, "shale_client_opens_total 1", "shale_client_write_delay_seconds 60"} {
		if !strings.Contains(m, want) {
			t.Errorf("client metrics have no %s:\n%s", want, grep(m, "shale_client"))
		}
	}

	code, out = run(t, "stats", "--server", "unix:"+sock)
	if code != 0 || !strings.Contains(out, "\nopens        1\n") || !strings.Contains(out, "\n  Tlcreate ") {
		t.Errorf("shale stats --server: exit %d:\n%s", code, out)
	}
	m = get(t, "http://"+serverMetrics+"/metrics")
	for _, want := range []string{`shale_server_requests_total{type="Tlcreate"}`, "shale_server_sprite_opens_write_total 1", "shale_server_connections"} {
		if !strings.Contains(m, want) {
			t.Errorf("server metrics have no %s:\n%s", want, grep(m, "shale_server"))
		}
	}

	// At unmount the delayed data is written back.
	if code, out := run(t, "umount", mnt); code != 0 {
		t.Fatalf("shale umount: exit %d: %s", code, out)
	}
	if b, err := os.ReadFile(filepath.Join(lower, "f")); !bytes.Equal(b, data) {
		t.Errorf("after unmount LOWER has %d bytes (%v), want %d", len(b), err, len(data))
	}
	// The client's endpoint ended with its process.
	if c, err := net.DialTimeout("tcp", clientMetrics, time.Second); err == nil {
		c.Close()
		t.Errorf("the client's metrics endpoint outlived the mount")
	}

	// --write-delay 0 writes through.
	if code, out := run(t, "mount", "--write-delay", "0", "9p://"+sock, mnt); code != 0 {
		t.Fatalf("shale mount --write-delay 0: exit %d: %s", code, out)
	}
	if err := os.WriteFile(filepath.Join(mnt, "g"), data, 0o644); err != nil {
		t.Fatal(err)
	}
	if b, err := os.ReadFile(filepath.Join(lower, "g")); !bytes.Equal(b, data) {
		t.Errorf("written through: LOWER has %d bytes (%v), want %d", len(b), err, len(data))
	}
	if code, out := run(t, "stats", mnt); code != 0 || !strings.Contains(out, "Sprite (write-through)") {
		t.Errorf("shale stats: exit %d:\n%s", code, out)
	}
	if code, out := run(t, "umount", mnt); code != 0 {
		t.Fatalf("shale umount: exit %d: %s", code, out)
	}
}

// TestCachedVolume: --cache-dir and --cache-size reach a volume's URL as
// cachedir (absolute) and cachesize, which volume.ParseURL reads; the
// URL's own win; the delay flags, which a volume has no use for, are an
// error.
func TestCachedVolume(t *testing.T) {
	mountDefaults := func() *mountFlags { return &mountFlags{client: true, cacheSize: "256MiB"} }
	f := mountDefaults()
	f.cacheDir, f.cacheSize = "rel/cache", "4GiB"
	got, err := f.cachedLower("etcd://h:1/vol?cacert=/c")
	if err != nil {
		t.Fatal(err)
	}
	u, err := volume.ParseURL(got)
	if err != nil {
		t.Fatalf("%s: %v", got, err)
	}
	abs, _ := filepath.Abs("rel/cache")
	if u.CacheDir != abs || u.CacheSize != 4<<30 || u.Etcd.CACert != "/c" {
		t.Errorf("%s: cache %q of %d, cacert %q", got, u.CacheDir, u.CacheSize, u.Etcd.CACert)
	}
	if got, _ := f.cachedLower("etcd://h:1/vol?cachesize=1GiB"); !strings.Contains(got, "cachesize=1GiB") || strings.Contains(got, "4GiB") {
		t.Errorf("the URL's own size: %s", got)
	}
	if got, err := mountDefaults().cachedLower("etcd://h:1/vol"); err != nil || got != "etcd://h:1/vol?cachesize=256MiB" {
		t.Errorf("defaults: %q, %v", got, err)
	}
	f.writeDelaySet = true
	if _, err := f.cachedLower("etcd://h:1/vol"); err == nil || !strings.Contains(err.Error(), "--write-delay") {
		t.Errorf("--write-delay with a volume: %v", err)
	}
}
