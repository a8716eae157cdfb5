"""API keys: each has a role; the server stores only their SHA-256 hashes.

A key is 32 random bytes (``rtk_`` + URL-safe base64), so a fast hash is the right one: there
is nothing to brute-force that a slow hash would protect. Keys live in
``<data>/_server/api_keys.json``; every process re-reads the file when it changes, so a key
made or revoked with ``rtindex keys`` (or the admin API) takes effect without a restart.

Roles are ordered: ``read`` queries and reads documents, ``write`` also writes documents,
``admin`` also creates and drops collections and manages keys. The role each route needs
is in the route table, server/routes.py.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import secrets
import tempfile
import time
from contextlib import contextmanager

import orjson

import rtindex

ROLES = ("read", "write", "admin")
KEYS_DIR = "_server"
KEYS_FILE = "api_keys.json"
RECHECK_SECONDS = 1.0  # how stale a process's view of the key file may be


def _hash(key: str) -> str:
    return hashlib.sha256(key.encode("utf-8", "surrogatepass")).hexdigest()


def role_allows(have: str, need: str) -> bool:
    return ROLES.index(have) >= ROLES.index(need)


class KeyStore:
    def __init__(self, data_dir: str):
        self.dir = os.path.join(data_dir, KEYS_DIR)
        self.path = os.path.join(self.dir, KEYS_FILE)
        self._by_hash: dict[str, dict] = {}
        self._stamp: tuple | None = None
        self._checked = 0.0

    # -- reading (every request) ------------------------------------------------
    def role_of(self, key: str) -> str | None:
        """The role of a presented key, or None when it is not a valid key. A key made in
        another process works at once (an unknown key re-reads a changed file); a revoked
        one stops working within ``RECHECK_SECONDS``."""
        now = time.monotonic()
        if now - self._checked >= RECHECK_SECONDS:
            self._checked = now
            self._reload()
        h = _hash(key)
        entry = self._by_hash.get(h)
        if entry is None:
            self._reload()
            entry = self._by_hash.get(h)
        return entry["role"] if entry else None

    def _reload(self) -> None:
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            self._by_hash, self._stamp = {}, None
            return
        stamp = (st.st_mtime_ns, st.st_size, st.st_ino)
        if stamp != self._stamp:
            self._by_hash = {k["hash"]: k for k in self._read()}
            self._stamp = stamp

    def _read(self) -> list[dict]:
        try:
            with open(self.path, "rb") as f:
                return orjson.loads(f.read())["keys"]
        except FileNotFoundError:
            return []

    # -- changing (CLI, admin API) ----------------------------------------------
    @contextmanager
    def _locked(self):
        os.makedirs(self.dir, mode=0o700, exist_ok=True)
        with open(os.path.join(self.dir, "api_keys.lock"), "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            yield self._read()

    def _write(self, keys: list[dict]) -> None:
        fd, tmp = tempfile.mkstemp(dir=self.dir, prefix=".keys-")
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(orjson.dumps({"keys": keys}, option=orjson.OPT_INDENT_2))
                f.flush()
                os.fsync(f.fileno())
            os.chmod(tmp, 0o600)
            os.replace(tmp, self.path)
        except BaseException:
            if os.path.exists(tmp):
                os.unlink(tmp)
            raise
        self._checked = 0.0  # this process sees it at once

    def create(self, role: str, name: str = "") -> tuple[str, dict]:
        """A new key of ``role``: (the key, shown once and never stored; its public entry)."""
        with self._locked() as keys:
            return self._add(keys, role, name)

    def _add(self, keys: list[dict], role: str, name: str) -> tuple[str, dict]:
        """Add a key to ``keys`` (read under the lock, which the caller holds) and write them."""
        if role not in ROLES:
            raise rtindex.InvalidArgumentError(f"role must be one of {', '.join(ROLES)}, not {role!r}")
        key = "rtk_" + secrets.token_urlsafe(32)
        entry = {"id": "k_" + secrets.token_hex(6), "name": str(name)[:200], "role": role,
                 "created": int(time.time()), "hash": _hash(key)}
        self._write(keys + [entry])
        return key, public(entry)

    def revoke(self, key_id: str) -> bool:
        with self._locked() as keys:
            kept = [k for k in keys if k["id"] != key_id]
            if len(kept) == len(keys):
                return False
            self._write(kept)
        return True

    def list(self) -> list[dict]:
        return [public(k) for k in self._read()]

    def ensure_admin(self) -> str | None:
        """On first start: make an admin key and return it (to print once); None when
        the store already has an admin key."""
        with self._locked() as keys:
            if any(k["role"] == "admin" for k in keys):
                return None
            return self._add(keys, "admin", "first admin key")[0]


def public(entry: dict) -> dict:
    """A key's entry without its hash."""
    return {k: v for k, v in entry.items() if k != "hash"}


def key_from_headers(headers: list[tuple[bytes, bytes]]) -> str | None:
    """The key of ``Authorization: ApiKey KEY`` (Rockset's form) or ``Bearer KEY``."""
    for name, value in headers:
        if name == b"authorization":
            scheme, _, key = value.decode("latin-1").partition(" ")
            if scheme.lower() in ("apikey", "bearer") and key.strip():
                return key.strip()
            return None
    return None
