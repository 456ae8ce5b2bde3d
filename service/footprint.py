"""How much memory a request takes, from what is known before it is read: the numbers the budget reserves.

Two parts, each an upper bound measured with ``tracemalloc`` over every
operation, dtype and format (``tests/service/test_footprint.py`` re-measures
them on every run and fails if a request ever takes more than it reserved):

* :func:`body_bytes`, reserved from ``Content-Length`` before the body is read:
  the body itself plus what decoding makes of it. A binary body is decoded into
  views (no copy); ``lu_core`` then copies its inputs once into the
  column-major layout it computes in. JSON text becomes Python objects first:
  ``[0,`` is two bytes of text and a 32-byte float plus a list slot in memory,
  and a nested ``[[0]]`` costs a 56-byte list per level, so JSON is bounded
  separately (``LU_MAX_JSON_BYTES``) and reserved at its worst case.
* :func:`answer_bytes`, reserved once the shapes are known and before the job
  is queued: the outputs ``lu_core`` allocates, the row-major copies the
  encoder makes of them, and the text of a JSON answer.

Also here: :func:`work_elements`, the element count that ``LU_MAX_ELEMENTS``
bounds, in which a zero-size dimension counts as one, so that a tensor of
shape ``[2**27, 0, 0]`` (no data, but 2**27 matrices' worth of pivots, ``info``
and bookkeeping) cannot escape the bound.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

__all__ = ["ANSWER_FACTOR", "BODY_FACTOR", "answer_bytes", "body_bytes", "json_structure_bytes", "work_elements"]

# Bytes held per byte of body, at most (the measured worst case, rounded up).
BODY_FACTOR = {"binary": 3, "json": 24}
# Bytes held per byte of output, at most: binary answers (outputs + row-major copies); JSON text (orjson grows
# its buffer past the text: complex64 pairs of a binary request answered in JSON measured 13-15x; 16).
ANSWER_FACTOR = {"binary": 6, "json": 16}
# Fixed cost of any request (headers, Python objects, small temporaries).
REQUEST_OVERHEAD = 64 * 1024


def body_bytes(fmt: str, nbytes: int) -> int:
    """Memory a body of ``nbytes`` in format ``fmt`` ("binary" or "json") takes until its answer is sent."""
    return REQUEST_OVERHEAD + BODY_FACTOR[fmt] * nbytes


# What parsed JSON takes beyond BODY_FACTOR["json"] per byte of text, per list, object and string it opens:
# a nested "[[[0]]]" is a 56-byte list (and its slot in the parent) per level, 44 bytes per byte of
# text; "{}," a 64-byte dict, 36 per byte; '"a",' a 50-byte string, 27 per byte (measured with
# tracemalloc, tests/service/test_footprint.py). Flat lists of numbers stay under BODY_FACTOR alone.
LIST_BYTES, OBJECT_BYTES, STRING_BYTES = 80, 200, 30  # per "[", "{" and '"'
#: JSON whose structure takes at most this much is covered by REQUEST_OVERHEAD (a binary request's
#: header, a small body): nothing more is reserved for it.
JSON_SLACK = REQUEST_OVERHEAD // 4
_COUNT_CHUNK = 1 << 20


def json_structure_bytes(text: bytes | bytearray | memoryview) -> int:
    """Memory parsing ``text`` takes beyond ``BODY_FACTOR["json"]`` per byte: its lists, objects and strings,
    counted in one pass over the text (1 MiB at a time) before it is parsed."""
    if len(text) <= _COUNT_CHUNK:  # (a binary request's header: one copy and three counts, ~1 us)
        return _structure(bytes(text))
    view = memoryview(text).cast("B")
    return sum(_structure(bytes(view[i : i + _COUNT_CHUNK])) for i in range(0, len(view), _COUNT_CHUNK))


def _structure(chunk: bytes) -> int:
    return LIST_BYTES * chunk.count(b"[") + OBJECT_BYTES * chunk.count(b"{") + STRING_BYTES * chunk.count(b'"')


def answer_bytes(fmt: str, elements: int, itemsize: int) -> int:
    """Memory an answer of ``elements`` elements of ``itemsize`` bytes takes, computed and encoded."""
    return ANSWER_FACTOR[fmt] * elements * itemsize


def work_elements(shape: Sequence[int]) -> int:
    """Elements of a tensor of ``shape``, each zero-size dimension counted as one."""
    count = math.prod(shape)  # the common case: no zero-size dimension, one product in C
    return count if count else math.prod(max(int(d), 1) for d in shape)
