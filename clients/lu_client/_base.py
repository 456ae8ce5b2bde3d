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

from lu_client._codec import Encoded, decode_response, encode_binary, encode_json, from_json_tensor, to_numpy
from lu_client._errors import APIStatusError, SingularMatrixError, status_error
from lu_client._split import Limits

__all__ = ["DEFAULT_TIMEOUT", "BaseClient", "Call", "RetryPolicy"]

# Large payloads: 128 MiB each way at loopback speed is well under a minute, over a
# slow network it is not; the connect timeout stays short so a dead host fails fast.
DEFAULT_TIMEOUT = httpx.Timeout(600.0, connect=10.0)
CHUNK = 1 << 20  # body chunks handed to httpx (it re-slices a buffer on each partial send)
RETRY_STATUSES = frozenset({429, 502, 503, 504})
DISCOVER_BYTES = 8 << 20  # look the server's limits up before the first request this big
NAME_HEADER = "x-lu-factorization"  # every request about a stored factorization carries its name

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
        capped = min(self.max_delay, self.initial_delay * 2**attempt)
        return capped * (0.5 + random.random() / 2)  # jitter: between half and all of it


def _retry_after(value: str | None) -> float | None:
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        parsed = email.utils.parsedate_to_datetime(value) if value else None
        return None if parsed is None else max(0.0, parsed.timestamp() - time.time())


@dataclass
class Call:
    """One request ready to send: where, what and how, and what its answer holds."""

    path: str
    encoded: Encoded | None  # None: no body
    timeout: httpx.Timeout | float | None
    method: str = "POST"
    answer: str = "tensors"  # "tensors", "json" (an object such as metadata) or "empty"
    extra_headers: dict[str, str] = field(default_factory=dict)

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
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.on_progress = on_progress  # called with (requests done, requests in all) when a batch is split
        self.binary = binary
        self.retry = retry_policy or RetryPolicy(max_retries=max_retries)
        self.timeout = check_timeout(timeout)
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
        return Call(f"/{op}", encoded, self._timeout(timeout))

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

    def _set_limits(self, metadata: dict[str, Any] | None) -> None:
        self._limits_known = True
        limits = (metadata or {}).get("limits")
        if isinstance(limits, dict) and {"max_request_bytes", "max_elements"} <= set(limits):
            self._limits = Limits(int(limits["max_request_bytes"]), int(limits["max_elements"]))

    # ------------------------------------------------------------------ answers

    @staticmethod
    def _too_big(exc: APIStatusError) -> bool:
        """A refusal that splitting can cure: the request, or the answer, is over a server limit."""
        return exc.status_code == 413 or exc.code == "output_too_large"

    @staticmethod
    def _should_retry(response: httpx.Response) -> bool:
        return response.status_code in RETRY_STATUSES

    @staticmethod
    def _error(response: httpx.Response, content: bytes | bytearray) -> APIStatusError:
        try:
            body = json.loads(content)
            if not isinstance(body, dict):
                raise ValueError
        except ValueError:
            text = bytes(content[:500]).decode("utf-8", "replace")
            body = {"error": text or response.reason_phrase, "code": f"http_{response.status_code}"}
        return status_error(response.status_code, body, response.headers.get("x-request-id"))

    @staticmethod
    def _decode(response: httpx.Response, content: bytes | bytearray) -> dict[str, np.ndarray | None]:
        return decode_response(content, response.headers)

    def _answer(self, call: Call, response: httpx.Response, content: bytes | bytearray) -> Any:
        if call.answer == "tensors":
            return self._decode(response, content)
        if call.answer == "json":
            return json.loads(content)
        return None

    @staticmethod
    def _raise_if_singular(info: np.ndarray, function: str) -> None:
        bad = np.flatnonzero(info.reshape(-1))
        if bad.size:
            indices = [list(np.unravel_index(i, info.shape)) for i in bad] if info.ndim else [[]]
            values = info.reshape(-1)[bad].tolist()
            raise SingularMatrixError(
                422,
                "singular_matrix",
                f"{function}: the matrix at batch index {tuple(indices[0])} is singular (U[{values[0] - 1}, "
                f"{values[0] - 1}] is exactly zero); use lu_factor_ex to factor singular matrices",
                None,
                {"indices": [[int(x) for x in i] for i in indices], "info": values},
            )


class BodyBuffer:
    """An answer's body, filled chunk by chunk into one writable buffer of its declared length.

    Writable, so results decoded over it are writable arrays; one copy, no join.
    """

    def __init__(self, response: httpx.Response) -> None:
        declared = response.headers.get("content-length")
        self.ready: bytes | bytearray | None = None
        if response.is_stream_consumed:  # a transport that answered with the body already read (mocks)
            self.ready = bytearray(response.content)
        self.streamed = self.ready is None and declared is not None and not response.headers.get("content-encoding")
        self._buffer = bytearray(int(declared)) if self.streamed else bytearray()
        self._got = 0

    def feed(self, chunk: bytes) -> None:
        end = self._got + len(chunk)
        self._buffer[self._got : end] = chunk
        self._got = end

    def result(self) -> bytes | bytearray:
        return self._buffer if self._got == len(self._buffer) else bytes(self._buffer[: self._got])


def new_name() -> str:
    """A random factorization name (96 bits: no collisions in practice)."""
    return f"lu-{secrets.token_hex(12)}"


def metadata_info(metadata: Mapping[str, Any]) -> np.ndarray | None:
    """The ``info`` tensor of a factorization's metadata."""
    info = metadata.get("info")
    return None if info is None else from_json_tensor(info)


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


def _refined_outputs(out: Mapping[str, np.ndarray | None], vector: bool) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    X = out["X"]
    assert X is not None
    if vector:
        X = X[..., 0]
    return X, out["iterations"], out["backward_error"]  # type: ignore[return-value]
