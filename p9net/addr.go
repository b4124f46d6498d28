package p9net

import (
	"fmt"
	"net"
	"net/url"
	"strings"
)

// DefaultPort is the port of 9P over TCP when a URL names none.
const DefaultPort = "564"

// Addr is where a 9P server listens or a client dials.
type Addr struct {
	Network string // "unix" or "tcp"
	Address string // the socket's path, or host:port
}

// ParseListen parses "unix:/run/shale/x.sock" or "tcp:127.0.0.1:5640".
func ParseListen(s string) (Addr, error) {
	network, address, ok := strings.Cut(s, ":")
	switch {
	case !ok || address == "":
	case network == "unix":
		return Addr{"unix", address}, nil
	case network == "tcp":
		if _, _, err := net.SplitHostPort(address); err != nil {
			return Addr{}, fmt.Errorf("listen address %q: %v: write tcp:HOST:PORT", s, err)
		}
		return Addr{"tcp", address}, nil
	}
	return Addr{}, fmt.Errorf("listen address %q: write unix:PATH or tcp:HOST:PORT", s)
}

func (a Addr) String() string { return a.Network + ":" + a.Address }

// Loopback tells whether only this machine can reach a: a unix socket, or
// TCP on a loopback address.
func (a Addr) Loopback() bool {
	if a.Network == "unix" {
		return true
	}
	host, _, err := net.SplitHostPort(a.Address)
	if err != nil {
		return false
	}
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// Remote is a tree on a 9P server: 9p://HOST[:PORT]/ANAME over TCP, or
// 9p:///path/to.sock?aname=ANAME over a unix socket. Query holds the rest
// of the URL's query, for the client's options.
type Remote struct {
	Addr  Addr
	Aname string
	Query url.Values
}

// ParseRemote parses a 9p:// URL; ok is false when s is not one, so that
// callers can tell it from a local path.
func ParseRemote(s string) (r Remote, ok bool, err error) {
	rest, ok := strings.CutPrefix(s, "9p://")
	if !ok {
		return Remote{}, false, nil
	}
	// url.Parse takes no scheme that starts with a digit.
	u, err := url.Parse("x://" + rest)
	if err != nil {
		return Remote{}, true, fmt.Errorf("%s: %v", s, err)
	}
	q := u.Query()
	r.Query = q
	if u.Host == "" {
		if u.Path == "" {
			return Remote{}, true, fmt.Errorf("%s: no server: write 9p://HOST:PORT/ANAME or 9p:///path/to.sock?aname=ANAME", s)
		}
		r.Addr = Addr{"unix", u.Path}
		r.Aname = q.Get("aname")
		q.Del("aname")
		return r, true, nil
	}
	host, port := u.Hostname(), u.Port()
	if port == "" {
		port = DefaultPort
	}
	r.Addr = Addr{"tcp", net.JoinHostPort(host, port)}
	r.Aname = strings.TrimPrefix(u.Path, "/")
	return r, true, nil
}

func (r Remote) String() string {
	q := url.Values{}
	for k, v := range r.Query {
		q[k] = v
	}
	u := url.URL{Scheme: "x"}
	if r.Addr.Network == "unix" {
		u.Path = r.Addr.Address
		if r.Aname != "" {
			q.Set("aname", r.Aname)
		}
	} else {
		u.Host = r.Addr.Address
		u.Path = "/" + r.Aname
	}
	u.RawQuery = q.Encode()
	return "9p" + strings.TrimPrefix(u.String(), "x")
}
