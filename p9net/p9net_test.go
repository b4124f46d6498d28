package p9net

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
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

// echo serves l: every connection gets back what it sends.
func echo(t *testing.T, l net.Listener) {
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				io.Copy(c, c)
			}()
		}
	}()
	t.Cleanup(func() { l.Close() })
}

func TestKey(t *testing.T) {
	key := Key("0123456789abcdef0123")
	a := Addr{"unix", filepath.Join(t.TempDir(), "s.sock")}
	l, err := Listen(a, key)
	if err != nil {
		t.Fatal(err)
	}
	echo(t, l)

	ctx := context.Background()
	c, err := Dial(ctx, a, key)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	big := make([]byte, 200<<10)
	for i := range big {
		big[i] = byte(i)
	}
	go c.Write(big)
	got := make([]byte, len(big))
	if _, err := io.ReadFull(c, got); err != nil || !bytes.Equal(got, big) {
		t.Fatalf("echo through TLS: %v", err)
	}

	// Another key, and no key, get one error and no session.
	if _, err := Dial(ctx, a, Key("another key of 16+ bytes")); !errors.Is(err, ErrAuth) {
		t.Errorf("wrong key: %v", err)
	}
	c2, err := Dial(ctx, a, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer c2.Close()
	c2.SetDeadline(time.Now().Add(3 * time.Second))
	c2.Write([]byte("ping"))
	if _, err := io.ReadFull(c2, make([]byte, 4)); err == nil {
		t.Error("a client without the key got an answer")
	}
}

// TestAcceptOnlyAuthenticated: a keyed listener's Accept gives only clients
// that hold the key; silent ones and others never take a server's slot.
func TestAcceptOnlyAuthenticated(t *testing.T) {
	a, key, l := listenKeyed(t, ListenConfig{})
	accepted := make(chan net.Conn, 4)
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				close(accepted)
				return
			}
			accepted <- c
		}
	}()
	silent, err := net.Dial("unix", a.Address)
	if err != nil {
		t.Fatal(err)
	}
	defer silent.Close()
	if _, err := Dial(context.Background(), a, Key("another key of 16+ bytes")); !errors.Is(err, ErrAuth) {
		t.Errorf("wrong key: %v", err)
	}
	good, err := Dial(context.Background(), a, key)
	if err != nil {
		t.Fatal(err)
	}
	defer good.Close()
	select {
	case c := <-accepted:
		// The one accepted is the good client: it echoes what it sends.
		go c.Write([]byte("x"))
		b := make([]byte, 1)
		if _, err := io.ReadFull(good, b); err != nil || b[0] != 'x' {
			t.Errorf("the accepted connection is not the client with the key: %v", err)
		}
		c.Close()
	case <-time.After(HandshakeTimeout / 2):
		t.Fatal("the client with the key was not accepted")
	}
	select {
	case c, ok := <-accepted:
		if ok {
			t.Errorf("a second connection was accepted: %v", c.RemoteAddr())
		}
	case <-time.After(200 * time.Millisecond):
	}
	l.Close()
	if _, ok := <-accepted; ok {
		t.Error("Accept gave a connection after Close")
	}
}
