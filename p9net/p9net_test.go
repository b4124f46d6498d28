package p9net

import (
	"context"
	"errors"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/hugelgupf/p9/fsimpl/templatefs"
	"github.com/hugelgupf/p9/p9"
)

func TestParse(t *testing.T) {
	for _, c := range []struct{ in, want string }{
		{"unix:/run/shale/x.sock", "unix:/run/shale/x.sock"},
		{"tcp:127.0.0.1:5640", "tcp:127.0.0.1:5640"},
		{"tcp:[::1]:5640", "tcp:[::1]:5640"},
	} {
		a, err := ParseListen(c.in)
		if err != nil || a.String() != c.want {
			t.Errorf("ParseListen(%q) = %v, %v", c.in, a, err)
		}
	}
	for _, bad := range []string{"", "unix:", "tcp:5640", "udp:1.2.3.4:5", "/run/x.sock"} {
		if _, err := ParseListen(bad); err == nil {
			t.Errorf("ParseListen(%q) took it", bad)
		}
	}
	loop := map[string]bool{"unix:/x": true, "tcp:127.0.0.1:1": true, "tcp:localhost:1": true, "tcp:[::1]:1": true, "tcp::1": false, "tcp:0.0.0.0:1": false, "tcp:10.0.0.1:1": false}
	for in, want := range loop {
		a, err := ParseListen(in)
		if err != nil || a.Loopback() != want {
			t.Errorf("%q: Loopback %v, err %v; want %v", in, a.Loopback(), err, want)
		}
	}
	for _, c := range []struct{ in, addr, aname, again string }{
		{"9p://127.0.0.1:5640/", "tcp:127.0.0.1:5640", "", "9p://127.0.0.1:5640/"},
		{"9p://127.0.0.1:5640/docs/sub?keyfile=/k", "tcp:127.0.0.1:5640", "docs/sub", "9p://127.0.0.1:5640/docs/sub?keyfile=%2Fk"},
		{"9p://host/", "tcp:host:564", "", "9p://host:564/"},
		{"9p:///run/shale/x.sock?aname=docs", "unix:/run/shale/x.sock", "docs", "9p:///run/shale/x.sock?aname=docs"},
	} {
		r, ok, err := ParseRemote(c.in)
		if !ok || err != nil || r.Addr.String() != c.addr || r.Aname != c.aname || r.String() != c.again {
			t.Errorf("ParseRemote(%q) = %+v %q, %v, %v", c.in, r, r.String(), ok, err)
		}
	}
	if _, ok, _ := ParseRemote("/srv/data"); ok {
		t.Error("a path is a 9p URL")
	}
	if _, ok, err := ParseRemote("9p://"); !ok || err == nil {
		t.Error("9p:// without a server accepted")
	}
}

func writeKey(t *testing.T, s string, mode os.FileMode) string {
	p := filepath.Join(t.TempDir(), "key")
	if err := os.WriteFile(p, []byte(s), mode); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestLoadKey(t *testing.T) {
	if _, err := LoadKey(writeKey(t, "0123456789abcdef\n", 0o600)); err != nil {
		t.Error(err)
	}
	if _, err := LoadKey(writeKey(t, "short\n", 0o600)); err == nil || !strings.Contains(err.Error(), "fewer than") {
		t.Errorf("short key: %v", err)
	}
	if _, err := LoadKey(writeKey(t, "0123456789abcdef", 0o644)); err == nil || !strings.Contains(err.Error(), "chmod 600") {
		t.Errorf("readable key: %v", err)
	}
	if _, err := LoadKey("/nonexistent/key"); err == nil {
		t.Error("missing key file accepted")
	}
}

// names records the attach names a server's file system is walked by.
type names struct {
	mu  sync.Mutex
	got [][]string
}

type rootFile struct {
	templatefs.NoopFile
	n *names
}

func (n *names) Attach() (p9.File, error) { return &rootFile{n: n}, nil }

func (f *rootFile) GetAttr(p9.AttrMask) (p9.QID, p9.AttrMask, p9.Attr, error) {
	return p9.QID{Type: p9.TypeDir}, p9.AttrMask{Mode: true}, p9.Attr{Mode: p9.ModeDirectory | 0o755}, nil
}

func (f *rootFile) Walk(ns []string) ([]p9.QID, p9.File, error) {
	f.n.mu.Lock()
	f.n.got = append(f.n.got, ns)
	f.n.mu.Unlock()
	qids := make([]p9.QID, len(ns))
	return qids, &rootFile{n: f.n}, nil
}

// serve runs a 9P server with ServerStream on l.
func serve(t *testing.T, l net.Listener, n *names) {
	srv := p9.NewServer(n)
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			go srv.Handle(ServerStream(c), c)
		}
	}()
	t.Cleanup(func() { l.Close() })
}

func TestIdentityAndKey(t *testing.T) {
	key := Key("0123456789abcdef0123")
	a := Addr{"unix", filepath.Join(t.TempDir(), "s.sock")}
	l, err := Listen(a, key)
	if err != nil {
		t.Fatal(err)
	}
	n := &names{}
	serve(t, l, n)

	ctx := context.Background()
	c, err := Dial(ctx, a, key)
	if err != nil {
		t.Fatal(err)
	}
	cl, err := p9.NewClient(ClientStream(c))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	for _, an := range []string{ClientAname(1000, ""), ClientAname(0, "docs/sub"), "plain", "/"} {
		f, err := cl.Attach(an)
		if err != nil {
			t.Fatalf("attach %q: %v", an, err)
		}
		f.Close()
	}
	// A large write passes unchanged through both rewriters.
	f, err := cl.Attach(ClientAname(7, ""))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteAt(make([]byte, 200<<10), 0); err == nil {
		t.Error("the no-op file took a write")
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	// The library walks one name at a time.
	var got []string
	for _, w := range n.got {
		got = append(got, w...)
	}
	want := []string{IdentityName(1000), IdentityName(0), "docs", "sub", IdentityName(Nobody), "plain", IdentityName(Nobody), IdentityName(7)}
	if strings.Join(got, "|") != strings.Join(want, "|") {
		t.Errorf("walked %q, want %q", got, want)
	}
	if uid, ok := ParseIdentity(IdentityName(1000)); !ok || uid != 1000 {
		t.Error("ParseIdentity")
	}
	if _, ok := ParseIdentity("uid:1000"); ok {
		t.Error("a file name parsed as an identity")
	}

	// Another key, and no key, get one error and no session.
	if _, err := Dial(ctx, a, Key("another key of 16+ bytes")); !errors.Is(err, ErrAuth) {
		t.Errorf("wrong key: %v", err)
	}
	c2, err := Dial(ctx, a, nil)
	if err != nil {
		t.Fatal(err)
	}
	if cl, err := p9.NewClient(ClientStream(c2)); err == nil {
		cl.Close()
		t.Error("a client without the key got a session")
	}
}
