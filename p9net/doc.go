// Package p9net is how shale's 9P server and client reach each other:
// addresses (unix sockets, TCP, 9p:// URLs) and authentication by a shared
// key file.
//
// Authentication is mutual TLS 1.3 in which both sides derive one Ed25519
// key pair from the shared key (HKDF-SHA256), present it as a self-signed
// certificate and accept only a peer that presents the same public key. So
// neither side sends the secret, each proves it holds it before a single 9P
// message is read, and what follows is encrypted and integrity-protected,
// which a 9P-level challenge and response (Tauth) would not give: an
// attacker on the path could take over an authenticated connection. The
// price is that clients must speak TLS: plain 9P clients (diod's tools,
// the Linux kernel) can use only an export without a key, which is why
// exports without a key listen on loopback or unix sockets only.
package p9net
