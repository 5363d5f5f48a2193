"""Compressed inference bodies, as Triton's HTTP endpoint takes and gives them (tritonclient's
``request_compression_algorithm`` and ``response_compression_algorithm``).

A request with ``Content-Encoding: gzip`` or ``deflate`` is decompressed before it is decoded, so
the binary extension's ``Inference-Header-Content-Length`` counts the decompressed body, as
Triton counts it; the size limit applies to what it decompresses to (a small body cannot unpack
into gigabytes). Another encoding is a 415. An answer is compressed when ``Accept-Encoding``
asks for gzip or deflate (the client's first when both weigh the same).
"""

from __future__ import annotations

import zlib

from fnserve.core.errors import BadRequest, PayloadTooLarge, UnsupportedMediaType

# zlib's window bits: gzip's header and trailer, or zlib's (HTTP's "deflate"); raw deflate as some clients send it.
_GZIP, _ZLIB, _RAW = 16 + zlib.MAX_WBITS, zlib.MAX_WBITS, -zlib.MAX_WBITS
CODINGS = ("gzip", "deflate")


def decompress(body: bytes, encoding: str, limit: int) -> bytes:
    """``body`` as sent before its ``Content-Encoding`` (``identity`` for none); at most ``limit`` bytes."""
    coding = encoding.strip().lower()
    if coding in ("", "identity"):
        return body
    if coding == "gzip":
        return _inflate(body, _GZIP, coding, limit)
    if coding == "deflate":
        try:
            return _inflate(body, _ZLIB, coding, limit)
        except BadRequest:
            return _inflate(body, _RAW, coding, limit)  # deflate without zlib's wrapper
    raise UnsupportedMediaType(f"Content-Encoding {encoding!r} is not supported; send gzip, deflate or identity")


def _inflate(body: bytes, wbits: int, coding: str, limit: int) -> bytes:
    inflater = zlib.decompressobj(wbits)
    try:
        out = inflater.decompress(body, limit + 1)
    except zlib.error as exc:
        raise BadRequest(f"the request body is not valid {coding}: {exc}") from None
    if len(out) > limit:
        raise PayloadTooLarge(f"request body decompresses to over the {limit}-byte limit")
    if not inflater.eof:
        raise BadRequest(f"the request body is not valid {coding}: it ends before its compressed stream does")
    return out


def accepted(accept_encoding: str | None) -> str | None:
    """The coding to answer in, of those ``Accept-Encoding`` allows (None: identity)."""
    if not accept_encoding:
        return None
    best, weight = None, 0.0
    for part in accept_encoding.split(","):
        coding, _, params = part.partition(";")
        coding = coding.strip().lower()
        q = 1.0
        name, _, value = params.strip().partition("=")
        if name.strip() == "q":
            try:
                q = float(value)
            except ValueError:
                q = 0.0
        if coding in CODINGS and q > weight:  # a tie keeps the one the client listed first
            best, weight = coding, q
    return best


def compress(payload: bytes, coding: str) -> bytes:
    """``payload`` in ``coding`` (gzip, or deflate with zlib's wrapper as HTTP defines it)."""
    compressor = zlib.compressobj(wbits=_GZIP if coding == "gzip" else _ZLIB)
    return compressor.compress(payload) + compressor.flush()
