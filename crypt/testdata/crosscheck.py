#!/usr/bin/env python3
"""An independent reader of the shale crypt format (docs/crypt-format.md),
written with the Python 'cryptography' package rather than shale's code.
It recomputes the known-answer vectors and prints them as 'name value'
lines; crypt/kat_test.go compares them with its own.
"""
import base64
import hashlib
import struct

from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.ciphers.aead import AESGCM, AESSIV
from cryptography.hazmat.primitives.kdf.hkdf import HKDF
from cryptography.hazmat.primitives.kdf.scrypt import Scrypt


def seq(start, n):
    return bytes((start + i) % 256 for i in range(n))


def hkdf(master, info, n):
    return HKDF(algorithm=hashes.SHA256(), length=n, salt=None, info=info.encode()).derive(master)


def b64url(b):
    return base64.urlsafe_b64encode(b).rstrip(b"=").decode()


master = seq(0, 32)
ck = hkdf(master, "shale-crypt v1 content", 32)
nk = hkdf(master, "shale-crypt v1 names", 64)
lk = hkdf(master, "shale-crypt v1 links", 32)
print("content_key", ck.hex())
print("name_key", nk.hex())
print("link_key", lk.hex())

# A block: nonce || AES-256-GCM(content key, nonce, plain, AD = file ID || block number).
hdr = b"\x00\x01" + seq(0x10, 16)
file_id = hdr[2:]
nonce = seq(0xA0, 16)
block = nonce + AESGCM(ck).encrypt(nonce, b"shale crypt known-answer block.", file_id + struct.pack(">Q", 5))
print("block", block.hex())
full = bytes(i % 251 for i in range(4096))
nonce = seq(0xB0, 16)
stored = nonce + AESGCM(ck).encrypt(nonce, full, file_id + struct.pack(">Q", 0))
print("full_block_sha256", hashlib.sha256(stored).hexdigest())
# Reading it back, as a reader would.
assert AESGCM(ck).decrypt(stored[:16], stored[16:], file_id + struct.pack(">Q", 0)) == full

# A name: base64url(AES-SIV(name key, [directory ID], name)).
name = b64url(AESSIV(nk).encrypt("Hello, shale ☃.txt".encode(), [seq(0x20, 16)]))
print("name", name)
# Format 2 pads the name to a multiple of 16 bytes first (PKCS#7).
plain = "Hello, shale ☃.txt".encode()
k = 16 - len(plain) % 16
print("name_v2", b64url(AESSIV(nk).encrypt(plain + bytes([k]) * k, [seq(0x20, 16)])))

# A symlink target: base64url(nonce || AES-256-GCM(link key, nonce, target, no AD)).
nonce = seq(0xC0, 12)
print("link", b64url(nonce + AESGCM(lk).encrypt(nonce, "../ünï/target".encode(), None)))
# A long one (3100 bytes): stored the same way, in a sidecar named by its hash.
stored = b64url(nonce + AESGCM(lk).encrypt(nonce, b"t/" * 1550, None))
print("long_link", ".shale.T." + b64url(hashlib.sha256(stored.encode()).digest()))

# The config: the master key wrapped under scrypt(passphrase). Format 2
# binds its flags (bit 0: fill_holes) after the salt.
salt, log_n, r, p = seq(0x40, 32), 10, 8, 1
kek = Scrypt(salt=salt, length=32, n=1 << log_n, r=r, p=p).derive(b"correct horse battery staple")
nonce = seq(0x60, 12)
for version, suffix, flags in ((1, "", b""), (2, "_v2", b"\x01")):
    ad = b"shale-crypt v%d scrypt\x00" % version + bytes([log_n]) + struct.pack(">II", r, p) + salt + flags
    wrapped = AESGCM(kek).encrypt(nonce, master, ad)
    print("config_ad" + suffix, ad.hex())
    print("wrapped_key" + suffix, wrapped.hex())
    print("checksum" + suffix, hashlib.sha256(ad + nonce + wrapped).hexdigest())
