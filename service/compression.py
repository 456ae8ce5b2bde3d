"""``Content-Encoding: gzip`` and ``deflate`` request bodies, inflated as a stream under a byte bound.

The bound (``LU_MAX_REQUEST_BYTES``, or ``LU_MAX_JSON_BYTES`` for JSON) applies to the inflated bytes: each
received chunk is inflated at most up to what is left of the bound, so a small
body that would inflate past it (a "zip bomb") is refused with a 413 after at
most ``limit + 1`` bytes were produced, never inflated whole. ``deflate`` is the
zlib format (RFC 9110); a raw deflate stream, which some clients send under
that name, is accepted too. Concatenated gzip members are one body, as gzip says.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable

from service.errors import ServiceError, bad_request, brief, too_large

__all__ = ["ENCODINGS", "Inflater", "inflater_for"]

ENCODINGS = ("gzip", "deflate")
_ALIASES = {"gzip": "gzip", "x-gzip": "gzip", "deflate": "deflate"}
_GZIP_WBITS = 16 + zlib.MAX_WBITS
_ZLIB_WBITS = zlib.MAX_WBITS
_RAW_WBITS = -zlib.MAX_WBITS
#: Most bytes one decompress call produces: each step is reserved before the next is made. (One call
#: for all that was left of the bound made a 60 MiB bytes object out of a 61 KB chunk before anything
#: reserved it: 16 such bodies at once peaked 780 MiB past the process's start, over a 512 MiB budget.)
STEP = 1 << 20


def _is_zlib_header(first: bytes) -> bool:
    # RFC 1950: CM = 8 (deflate), window <= 32 KiB, and the two bytes are a multiple of 31.
    return len(first) == 2 and first[0] & 0x0F == 8 and first[0] >> 4 <= 7 and (first[0] << 8 | first[1]) % 31 == 0


class Inflater:
    """Inflates one body chunk by chunk into a single buffer, refusing it once it passes ``limit`` bytes.

    Parameters
    ----------
    encoding : {"gzip", "deflate"}
        The body's content coding.
    limit : int
        Most inflated bytes accepted (413 ``request_too_large`` beyond).
    reserve : callable, optional
        Called with each increment of the inflated size before it is kept, so that
        the bytes can be counted against a memory budget (it raises to refuse them).
    limit_name : str
        The setting the limit comes from, for the 413's message.
    """

    def __init__(
        self,
        encoding: str,
        limit: int,
        reserve: Callable[[int], object] | None = None,
        limit_name: str = "LU_MAX_REQUEST_BYTES",
    ) -> None:
        self.encoding = encoding
        self.limit = limit
        self.limit_name = limit_name
        self.produced = 0
        self._reserve = reserve
        self._out = bytearray()
        self._pending = b""  # deflate: the first bytes, until the wrapper can be told
        self._z = zlib.decompressobj(_GZIP_WBITS) if encoding == "gzip" else None

    def feed(self, data: bytes | bytearray | memoryview) -> None:
        """Inflate one received chunk (raises 400 on corrupt data, 413 past the bound)."""
        if self._z is None:
            self._pending += bytes(data)
            if len(self._pending) < 2:
                return
            data, self._pending = self._pending, b""
            self._z = zlib.decompressobj(_ZLIB_WBITS if _is_zlib_header(bytes(data[:2])) else _RAW_WBITS)
        while data:
            if self._z.eof:  # more bytes after the end: another gzip member, or junk
                if self.encoding != "gzip":
                    raise bad_request("malformed_body", f"bytes follow the end of the {self.encoding} stream")
                self._z = zlib.decompressobj(_GZIP_WBITS)
            room = self.limit - self.produced
            try:
                out = self._z.decompress(data, min(room + 1, STEP))
            except zlib.error as exc:
                raise bad_request("malformed_body", f"the {self.encoding} body is corrupt: {exc}") from None
            self._keep(out)
            data = self._z.unused_data if self._z.eof else self._z.unconsumed_tail

    def _keep(self, out: bytes) -> None:
        if self.produced + len(out) > self.limit:
            raise too_large(
                "request_too_large",
                f"the {self.encoding} body inflates past {self.limit_name} = {self.limit} bytes",
            )
        if out and self._reserve is not None:
            self._reserve(len(out))
        self.produced += len(out)
        self._out += out

    def finish(self) -> bytearray:
        """The whole inflated body (400 ``truncated_body`` if the stream did not end)."""
        if self._z is None:
            if not self._pending:
                return self._out  # an empty body
            raise bad_request("truncated_body", f"the {self.encoding} body ends after {len(self._pending)} byte")
        try:
            self._keep(self._z.flush())
        except zlib.error as exc:
            raise bad_request("malformed_body", f"the {self.encoding} body is corrupt: {exc}") from None
        if not self._z.eof:
            raise bad_request("truncated_body", f"the {self.encoding} body ends before its stream does")
        return self._out


def inflater_for(
    content_encoding: str | None,
    limit: int,
    reserve: Callable[[int], object] | None = None,
    limit_name: str = "LU_MAX_REQUEST_BYTES",
) -> Inflater | None:
    """An :class:`Inflater` for the header's coding, ``None`` for identity; 415 for any other coding."""
    codings = [c.strip().lower() for c in (content_encoding or "").split(",") if c.strip()]
    codings = [c for c in codings if c != "identity"]
    if not codings:
        return None
    if len(codings) == 1 and codings[0] in _ALIASES:
        return Inflater(_ALIASES[codings[0]], limit, reserve, limit_name)
    raise ServiceError(
        415,
        "unsupported_encoding",
        f"Content-Encoding {brief(content_encoding)} is not supported: send gzip, deflate or identity",
        headers={"Accept-Encoding": "gzip, deflate"},
    )
