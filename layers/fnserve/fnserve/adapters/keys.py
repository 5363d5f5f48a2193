"""API keys: which callers a server fnserve starts answers, whatever the transport asks with.

Keys come from a setting, a file (a mounted Kubernetes or Cloud Run secret) or a Secrets Manager secret, several
at once so that clients move to a new key before the old one goes. Only their SHA-256 digests are kept; a caller's
key is hashed and compared with each in constant time, and named everywhere by its id (the first 8 hex digits of
the digest), never by itself.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import os
import re
import threading
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from fnserve.core.errors import ConfigError
from fnserve.observability.logs import request_keys
from fnserve.observability.request_meta import CALLER

if TYPE_CHECKING:
    from fnserve.settings import HttpSettings

logger = logging.getLogger(__name__)

NOT_HELD = "the API key sent is not one this server holds"  # every transport's refusal of a wrong key
MIN_KEY_CHARS = 16  # a key's id is part of its hash: a key short enough to guess from it is refused at start
RECHECK_SECONDS = 1.0  # how soon a key file's or secret's new keys are seen (a secret's cache has its own age)


def key_id(key: str | bytes) -> str:
    """What logs and traces name a key by: the first 8 hex digits of its SHA-256."""
    return hashlib.sha256(key if isinstance(key, bytes) else key.encode()).hexdigest()[:8]


def split_keys(text: str) -> list[str]:
    """The keys in a setting's, a file's or a secret's text: one per line, or separated by commas."""
    return [key.strip() for key in re.split(r"[,\r\n]", text) if key.strip()]


def bearer(authorization: str | bytes | None) -> bytes | None:
    """The token of an ``Authorization: Bearer TOKEN`` value (the scheme in any case), else None."""
    if not authorization:
        return None
    value = authorization if isinstance(authorization, bytes) else authorization.encode("latin-1", "replace")
    scheme, _, token = value.strip().partition(b" ")
    token = token.strip()
    return token if scheme.lower() == b"bearer" and token else None


def name_caller(caller: str | None) -> None:
    """The request in this task came with the key of id ``caller`` (None: with none): its span says so, and, with a
    key, every log line it writes."""
    CALLER.set(caller)
    if caller is not None:
        request_keys(api_key_id=caller)


class ApiKeys:
    """The keys a server holds, read again by ``read`` at most every :data:`RECHECK_SECONDS`; ``source`` says where
    they come from (the start log names it). A read that fails later keeps the keys it had: a secret store's outage
    or a file being replaced must not lock every caller out."""

    def __init__(self, read: Callable[[], Sequence[str]], source: str) -> None:
        self.source = source
        self._read = read
        self._lock = threading.Lock()
        self._raw: tuple[str, ...] = ()
        self._digests: tuple[tuple[bytes, str], ...] = ()
        self._next = 0.0
        self._load(first=True)

    @property
    def ids(self) -> list[str]:
        return [name for _, name in self._digests]

    def caller(self, authorization: str | bytes | None) -> str | None:
        """The id of the key ``authorization`` carries ("Bearer KEY"), or None: no key, or one not held."""
        token = bearer(authorization)
        if token is None:
            return None
        if time.monotonic() >= self._next:
            self._load()
        digest = hashlib.sha256(token).digest()
        found = None
        for known, name in self._digests:  # every one compared: how long it takes says nothing of which matched
            if hmac.compare_digest(digest, known):
                found = name
        return found

    def _load(self, first: bool = False) -> None:
        with self._lock:
            if not first and time.monotonic() < self._next:
                return
            self._next = time.monotonic() + RECHECK_SECONDS
            try:
                raw = tuple(self._read())
                _check(raw, self.source)
            except ConfigError as exc:
                if first:
                    raise
                logger.warning("API keys: %s; keeping the %d read before", exc.message, len(self._digests))
                return
            if raw != self._raw:
                self._raw = raw
                self._digests = tuple((hashlib.sha256(key.encode()).digest(), key_id(key)) for key in raw)


def _check(keys: Sequence[str], source: str) -> None:
    if not keys:
        raise ConfigError(f"{source} holds no API key")
    short = [key_id(key) for key in keys if len(key) < MIN_KEY_CHARS]
    if short:
        raise ConfigError(
            f"{source}: API key(s) {', '.join(short)} have fewer than {MIN_KEY_CHARS} characters; make keys with "
            "`python -c 'import secrets; print(secrets.token_urlsafe(32))'`"
        )


def api_keys(settings: HttpSettings) -> ApiKeys | None:
    """The keys the settings name (``api_keys``, ``api_keys_file``, ``api_keys_secret``; all of them, when several
    are set), or None: no key set, every caller answered."""
    readers: list[Callable[[], list[str]]] = []
    sources: list[str] = []
    if settings.api_keys is not None:
        fixed = split_keys(settings.api_keys.get_secret_value())
        readers.append(lambda: fixed)
        sources.append("FNSERVE_API_KEYS")
    if settings.api_keys_file:
        readers.append(_file_reader(settings.api_keys_file))
        sources.append(f"FNSERVE_API_KEYS_FILE ({settings.api_keys_file})")
    if settings.api_keys_secret:
        readers.append(_secret_reader(settings.api_keys_secret))
        sources.append(f"FNSERVE_API_KEYS_SECRET ({settings.api_keys_secret})")
    if not readers:
        return None
    return ApiKeys(lambda: [key for read in readers for key in read()], " and ".join(sources))


def _file_reader(path: str) -> Callable[[], list[str]]:
    """A key file's keys, read again when it changes (a mounted secret is replaced whole, through a symlink)."""
    seen: tuple[float, int, int] | None = None
    keys: list[str] = []

    def read() -> list[str]:
        nonlocal seen, keys
        try:
            stat = os.stat(path)
            if (stat.st_mtime, stat.st_size, stat.st_ino) != seen:
                with open(path, encoding="utf-8") as file:
                    keys = split_keys(file.read())
                seen = (stat.st_mtime, stat.st_size, stat.st_ino)
        except OSError as exc:
            raise ConfigError(f"cannot read the API key file {path}: {exc.strerror}") from None
        return keys

    return read


def _secret_reader(secret: str) -> Callable[[], list[str]]:
    """A Secrets Manager secret's keys: its current version's and, after a rotation, its previous version's."""
    from fnserve.aws.secrets import rotating_keys

    values = rotating_keys(secret, what="the API keys")
    return lambda: [key for value in values() for key in split_keys(value.decode())]
