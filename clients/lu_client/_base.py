"""What the sync and async clients share: URL, auth, retry policy, codec, splitting. Only I/O differs."""

from __future__ import annotations

import email.utils
import json
import math
import random
import re
import secrets
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import httpx
import numpy as np

from lu_client._codec import (
    Encoded,
    Outputs,
    decode_response,
    encode_binary,
    encode_json,
    from_json_tensor,
    loads,
    to_numpy,
)
from lu_client._errors import APIResponseValidationError, APIStatusError, SingularMatrixError, status_error
from lu_client._split import Limits, output_elements

__all__ = ["DEFAULT_TIMEOUT", "BaseClient", "Call", "RetryPolicy"]

# Large payloads: 128 MiB each way at loopback speed is well under a minute, over a
# slow network it is not; the connect timeout stays short so a dead host fails fast.
DEFAULT_TIMEOUT = httpx.Timeout(600.0, connect=10.0)
CHUNK = 1 << 20  # body chunks handed to httpx (it re-slices a buffer on each partial send)
RETRY_STATUSES = frozenset({429, 502, 503, 504})
DISCOVER_BYTES = 8 << 20  # look the server's limits up before the first request this big
NAME_HEADER = "x-lu-factorization"  # every request about a stored factorization carries its name
#: The most bytes an answer may have when the call cannot say what it needs (a stored factorization's
#: solve or unpack, metadata), unless ``max_answer_bytes`` says otherwise. The body is read into memory.
DEFAULT_MAX_ANSWER_BYTES = 4 << 30
#: An operation's answer may hold, beyond its outputs' numbers, this many bytes (the binary framing's
#: JSON header, the JSON form's names and shapes), and per number at most: raw bytes (complex128), or
#: JSON text (a complex pair of 24-character numbers with its brackets and commas).
ANSWER_SLACK = 1 << 20
ANSWER_BYTES_PER_ELEMENT = {"binary": 16, "json": 64}
#: The most bytes of a ``GET /v2`` answer read when looking the server's limits up.
DISCOVERY_ANSWER_BYTES = 1 << 20
#: Server limits below these are not believed (a split into one request per number helps no one).
MIN_LIMITS = Limits(max_request_bytes=64 << 10, max_elements=1024)

OPERATIONS: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "lu_factor": (("A",), ("LU", "pivots", "info")),
    "lu_unpack": (("LU", "pivots"), ("P", "L", "U")),
    "lu_solve": (("LU", "pivots", "B"), ("X",)),
    "lu": (("A",), ("P", "L", "U")),
    "solve": (("A", "B"), ("X",)),
    "solve_refined": (("A", "B"), ("X", "iterations", "backward_error")),
    "lu_rcond": (("LU", "pivots", "anorm"), ("rcond",)),
    "slogdet": (("A",), ("sign", "logabsdet")),
    "det": (("A",), ("det",)),
}


#: A stored factorization's name, as the service takes it (``service.store.NAME_PATTERN``; not "." or "..",
#: which URLs collapse into another route).
NAME_PATTERN = re.compile(r"[A-Za-z0-9._-]{1,128}")


def check_name(name: Any) -> str:
    """``name`` if the service would take it, else ``ValueError`` before any request (a name such as "." or
    "a/b" would otherwise reach another route, and "" the listing)."""
    if not isinstance(name, str) or NAME_PATTERN.fullmatch(name) is None or name in (".", ".."):
        shown = repr(name) if len(repr(name)) <= 42 else repr(name)[:40] + "..."
        raise ValueError(
            f"factorization name {shown} is invalid: use 1 to 128 characters of A-Z a-z 0-9 . _ - (not '.' or '..')"
        )
    return name


def check_timeout(timeout: Any) -> Any:
    """``timeout`` if httpx can take it (an ``httpx.Timeout`` or a tuple it is made of, None, or a positive
    finite number of seconds)."""
    if timeout is None or isinstance(timeout, httpx.Timeout):
        return timeout
    if isinstance(timeout, tuple):
        try:
            return httpx.Timeout(timeout)
        except (TypeError, ValueError) as exc:
            raise ValueError(f"timeout {timeout!r} is not one httpx takes: {exc}") from None
    if isinstance(timeout, bool) or not isinstance(timeout, int | float) or not 0 < timeout < math.inf:
        raise ValueError(f"timeout must be a positive number of seconds, an httpx.Timeout or None, not {timeout!r}")
    return timeout


@dataclass(frozen=True)
class RetryPolicy:
    """Capped, jittered exponential backoff; ``Retry-After`` wins when the server sends one."""

    max_retries: int = 2
    initial_delay: float = 0.5
    max_delay: float = 8.0
    max_retry_after: float = 60.0

    def __post_init__(self) -> None:
        if isinstance(self.max_retries, bool) or not isinstance(self.max_retries, int) or self.max_retries < 0:
            raise ValueError(f"max_retries must be an integer >= 0, not {self.max_retries!r}")
        for field_name in ("initial_delay", "max_delay", "max_retry_after"):
            value = getattr(self, field_name)
            if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value < math.inf:
                raise ValueError(f"{field_name} must be a finite number of seconds >= 0, not {value!r}")

    def delay(self, attempt: int, response: httpx.Response | None) -> float:
        if response is not None:
            after = _retry_after(response.headers.get("retry-after"))
            if after is not None:
                return min(after, self.max_retry_after)
        capped = min(self.max_delay, self.initial_delay * 2.0 ** min(attempt, 64))
        return capped * (0.5 + random.random() / 2)  # jitter: between half and all of it


def _retry_after(value: str | None) -> float | None:
    """``Retry-After`` in seconds from now, or None where it is absent or neither seconds nor an HTTP date
    (then the usual backoff applies)."""
    if not value:
        return None
    try:
        seconds = float(value)
    except ValueError:
        try:
            seconds = email.utils.parsedate_to_datetime(value).timestamp() - time.time()
        except (TypeError, ValueError, OverflowError, IndexError):
            return None
    return max(0.0, seconds) if not math.isnan(seconds) else None


@dataclass
class Call:
    """One request ready to send: where, what and how, and what its answer holds."""

    path: str
    encoded: Encoded | None  # None: no body
    timeout: httpx.Timeout | float | None
    method: str = "POST"
    answer: str = "tensors"  # "tensors", "json" (an object such as metadata) or "empty"
    extra_headers: dict[str, str] = field(default_factory=dict)
    max_answer: int | None = None  # the bytes its answer can need at most, where known (BaseClient._answer_limit)

    @property
    def headers(self) -> dict[str, str]:
        return {**({} if self.encoded is None else self.encoded.headers), **self.extra_headers}

    def content(self) -> Iterator[bytes | memoryview] | None:
        return None if self.encoded is None else self.chunks()

    def chunks(self) -> Iterator[bytes | memoryview]:
        assert self.encoded is not None
        for chunk in self.encoded.chunks:
            if isinstance(chunk, memoryview) and chunk.nbytes > CHUNK:
                for start in range(0, chunk.nbytes, CHUNK):
                    yield chunk[start : start + CHUNK]
            else:
                yield chunk


class BaseClient:
    def __init__(
        self,
        base_url: str,
        *,
        api_key: str | None = None,
        timeout: httpx.Timeout | float = DEFAULT_TIMEOUT,
        max_retries: int = 2,
        binary: bool = True,
        max_request_bytes: int | None = None,
        max_elements: int | None = None,
        retry_policy: RetryPolicy | None = None,
        on_progress: Callable[[int, int], None] | None = None,
        max_answer_bytes: int | None = None,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.on_progress = on_progress  # called with (requests done, requests in all) when a batch is split
        self.binary = binary
        self.retry = retry_policy or RetryPolicy(max_retries=max_retries)
        self.timeout = check_timeout(timeout)
        if max_answer_bytes is not None and (type(max_answer_bytes) is not int or max_answer_bytes < 1):
            raise ValueError(f"max_answer_bytes must be a positive integer or None, not {max_answer_bytes!r}")
        self.max_answer_bytes = max_answer_bytes
        self._headers = {"accept": "application/json, application/octet-stream", "user-agent": "lu-client/0.1"}
        if api_key:
            self._headers["authorization"] = f"Bearer {api_key}"
        self._limits: Limits | None = None
        self._limits_known = False
        if max_request_bytes is not None or max_elements is not None:
            self._limits = Limits(max_request_bytes or 1 << 62, max_elements or 1 << 62)
            self._limits_known = True

    # ------------------------------------------------------------------ building

    def _inputs(self, op: str, arrays: Mapping[str, Any]) -> dict[str, np.ndarray]:
        names, _ = OPERATIONS[op]
        return {n: to_numpy(arrays[n], n) for n in names}

    def _call(self, op: str, tensors: Mapping[str, np.ndarray], options: Mapping[str, Any], timeout: Any) -> Call:
        encoded = encode_binary(tensors, options) if self.binary else encode_json(tensors, options)
        call = Call(f"/{op}", encoded, self._timeout(timeout))
        try:  # what this operation's answer can hold at most, from the shapes sent
            elements = output_elements(op, tensors)
        except (ValueError, IndexError):
            elements = None  # shapes the server refuses (a B of one dimension for lu_solve): its error is small
        per = ANSWER_BYTES_PER_ELEMENT["binary" if self.binary else "json"]
        call.max_answer = ANSWER_SLACK + per * (elements or 0)
        return call

    def _answer_limit(self, need: int | None) -> int:
        """The most bytes an answer may have: what the call ``need``s at most, never more than
        ``max_answer_bytes``; where the call cannot say, ``max_answer_bytes`` (else the default)."""
        if need is None:
            return DEFAULT_MAX_ANSWER_BYTES if self.max_answer_bytes is None else self.max_answer_bytes
        return need if self.max_answer_bytes is None else min(need, self.max_answer_bytes)

    def _factorization_path(self, name: str, action: str = "") -> str:
        return f"/factorizations/{check_name(name)}{action}"  # the name's characters need no quoting

    def _named(self, call: Call, name: str) -> Call:
        # Load balancers that hash on a header (Envoy/Istio, ingress-nginx) keep a name on one replica.
        call.extra_headers[NAME_HEADER] = name
        return call

    def _put_call(self, name: str | None, A: Any, pivot: bool, timeout: Any) -> Call:
        name = new_name() if name is None else name
        tensors = {"A": to_numpy(A, "A")}
        options = {"pivot": pivot}
        encoded = encode_binary(tensors, options) if self.binary else encode_json(tensors, options)
        return self._named(Call(self._factorization_path(name), encoded, self._timeout(timeout), "PUT", "json"), name)

    def _stored_call(
        self, name: str, action: str, tensors: Mapping[str, Any], options: Mapping[str, Any], timeout: Any
    ) -> Call:
        arrays = {k: to_numpy(v, k) for k, v in tensors.items()}
        encoded = encode_binary(arrays, options) if self.binary else encode_json(arrays, options)
        return self._named(Call(self._factorization_path(name, action), encoded, self._timeout(timeout)), name)

    def _bodyless_call(self, method: str, name: str | None, answer: str, timeout: Any) -> Call:
        if name is None:
            return Call("/factorizations", None, self._timeout(timeout), method, answer)
        return self._named(Call(self._factorization_path(name), None, self._timeout(timeout), method, answer), name)

    def _timeout(self, timeout: Any) -> Any:
        return self.timeout if timeout is None else check_timeout(timeout)

    def _needs_limits(self, tensors: Mapping[str, np.ndarray]) -> bool:
        return not self._limits_known and sum(a.nbytes for a in tensors.values()) > DISCOVER_BYTES

    def _set_limits(self, metadata: Any) -> None:
        """The server's limits from its ``GET /v2`` answer; limits that are not integers at least
        :data:`MIN_LIMITS` are not believed (no splitting then: the server's 413, if any, is the answer)."""
        self._limits_known = True
        limits = metadata.get("limits") if isinstance(metadata, dict) else None
        if not isinstance(limits, dict):
            return
        size, elements = limits.get("max_request_bytes"), limits.get("max_elements")
        believed = type(size) is int and size >= MIN_LIMITS.max_request_bytes
        if believed and type(elements) is int and elements >= MIN_LIMITS.max_elements:
            self._limits = Limits(size, elements)

    # ------------------------------------------------------------------ answers

    @staticmethod
    def _too_big(exc: APIStatusError) -> bool:
        """A refusal that splitting can cure: the request, or the answer, is over a server limit."""
        return exc.status_code == 413 or exc.code == "output_too_large"

    @staticmethod
    def _should_retry(response: httpx.Response) -> bool:
        return response.status_code in RETRY_STATUSES

    @staticmethod
    def _error(response: httpx.Response, content: bytes | bytearray | memoryview) -> APIStatusError:
        try:
            body = json.loads(bytes(content))
            if not isinstance(body, dict):
                raise ValueError
        except (ValueError, RecursionError):
            text = bytes(content[:500]).decode("utf-8", "replace")
            body = {"error": text or response.reason_phrase, "code": f"http_{response.status_code}"}
        return status_error(response.status_code, body, response.headers.get("x-request-id"))

    @staticmethod
    def _decode(response: httpx.Response, content: bytes | bytearray | memoryview) -> Outputs:
        return decode_response(content, response.headers)

    def _answer(self, call: Call, response: httpx.Response, content: bytes | bytearray | memoryview) -> Any:
        """What a successful answer (2xx: 201 for a ``PUT``, 204 for a ``DELETE``) holds; a status below 400
        that is not one (a redirect, say) is an :class:`APIResponseValidationError`."""
        status = response.status_code
        if not 200 <= status < 300:
            where = response.headers.get("location")
            to = f" to {where[:200]!r}" if where else ""
            raise APIResponseValidationError(f"{call.path}: unexpected HTTP status {status}{to}")
        if call.answer == "tensors":
            return self._decode(response, content)
        if call.answer == "json":
            body = loads(content, "the answer")
            if not isinstance(body, dict):
                raise APIResponseValidationError(f"{call.path}: the answer is not a JSON object")
            return body
        return None

    @staticmethod
    def _raise_if_singular(info: np.ndarray, function: str) -> None:
        if info.dtype.kind not in "iu":
            raise APIResponseValidationError(f"{function}: info is {info.dtype}, not integers")
        bad = np.flatnonzero(info.reshape(-1))
        if bad.size:
            indices = [[int(x) for x in np.unravel_index(i, info.shape)] for i in bad] if info.ndim else [[]]
            values = info.reshape(-1)[bad].tolist()
            raise SingularMatrixError(
                422,
                "singular_matrix",
                f"{function}: the matrix at batch index {tuple(indices[0])} is singular (U[{values[0] - 1}, "
                f"{values[0] - 1}] is exactly zero); use lu_factor_ex to factor singular matrices",
                None,
                {"indices": indices, "info": values},
            )


class BodyBuffer:
    """An answer's body, filled chunk by chunk into one writable buffer, never past ``limit`` bytes.

    Writable, so results decoded over it are writable arrays; one copy, no join. With a
    ``Content-Length`` (and no content coding) the buffer has that length, allocated
    untouched, so a length the server declares but does not send costs no memory; a length
    over ``limit`` is refused before anything is read. Otherwise (chunked, or compressed:
    ``raw`` is False, the decoded bytes are fed) the buffer grows as bytes arrive, and the
    decoded bytes are counted against ``limit`` (a gzip bomb stops there).
    """

    def __init__(self, response: httpx.Response, limit: int) -> None:
        declared = response.headers.get("content-length")
        self.limit = limit
        self.ready: memoryview | None = None
        if response.is_stream_consumed:  # a transport that answered with the body already read (mocks)
            self._check(len(response.content))
            self.ready = memoryview(bytearray(response.content))
        self.raw = (
            self.ready is None
            and declared is not None
            and declared.isdigit()
            and not response.headers.get("content-encoding")
        )
        self._buffer: memoryview | bytearray
        if self.raw:
            self._check(int(declared))  # type: ignore[arg-type]
            self._buffer = memoryview(np.empty(int(declared), np.uint8))  # type: ignore[arg-type]
        else:
            self._buffer = bytearray()
        self._got = 0

    def _check(self, nbytes: int) -> None:
        if nbytes > self.limit:
            raise APIResponseValidationError(
                f"the answer has more than {self.limit} bytes, more than this call can need "
                "(or than max_answer_bytes allows)"
            )

    def feed(self, chunk: bytes) -> None:
        end = self._got + len(chunk)
        if isinstance(self._buffer, bytearray):
            self._check(end)
            self._buffer += chunk
        elif end > len(self._buffer):
            raise APIResponseValidationError(f"the answer is longer than its Content-Length {len(self._buffer)}")
        else:
            self._buffer[self._got : end] = chunk
        self._got = end

    def result(self) -> memoryview:
        if self.ready is not None:
            return self.ready
        return memoryview(self._buffer)[: self._got]


def new_name() -> str:
    """A random factorization name (96 bits: no collisions in practice)."""
    return f"lu-{secrets.token_hex(12)}"


def stored_name(metadata: Mapping[str, Any]) -> str:
    """The name in a stored factorization's metadata, as the server answered it (checked)."""
    name = metadata.get("name")
    if not isinstance(name, str) or NAME_PATTERN.fullmatch(name) is None or name in (".", ".."):
        raise APIResponseValidationError(f"the server's answer names the factorization {str(name)[:60]!r}")
    return name


def listed(answer: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The factorizations of a listing answer (a list of metadata objects)."""
    items = answer.get("factorizations")
    if not isinstance(items, list) or not all(isinstance(i, dict) for i in items):
        raise APIResponseValidationError("the server's listing of factorizations is not a list of objects")
    return items


def metadata_info(metadata: Mapping[str, Any]) -> np.ndarray | None:
    """The ``info`` tensor of a factorization's metadata."""
    info = metadata.get("info")
    return None if info is None else from_json_tensor(info, "the factorization's info")


def vector_rhs(A: np.ndarray, B: np.ndarray, left: bool) -> bool:
    """``torch.linalg.solve``'s rule: B is a (batch of) vector(s), which only ``left=True`` takes (a
    ``ValueError`` otherwise, before any request, as ``lu_core.solve`` and PyTorch refuse it)."""
    vector = B.ndim == 1 or (B.ndim == A.ndim - 1 and B.shape == A.shape[:-1])
    if vector and not left:
        raise ValueError(
            f"B: of shape {B.shape} is a batch of vectors beside A of shape {A.shape}, which left=False does not "
            "take (as in torch.linalg.solve): give B as (*batch, k, n) matrices"
        )
    return vector


def _refined_inputs(A: Any, B: Any, left: bool) -> tuple[np.ndarray, np.ndarray, bool]:
    """``solve_refined``'s inputs, a vector ``B`` sent as one column (so batches split like any other)."""
    a, b = to_numpy(A, "A"), to_numpy(B, "B")
    vector = vector_rhs(a, b, left)
    return a, (b[..., None] if vector else b), vector


def _refined_outputs(out: Outputs, vector: bool) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    X = out["X"]
    return (X[..., 0] if vector else X), out["iterations"], out["backward_error"]
