"""uvicorn's httptools protocol with the deadlines and header bound it lacks.

uvicorn closes a connection that stays idle *between* requests
(``timeout_keep_alive``), but nothing limits a connection that never sends a
first request, a request whose headers never end, or a body that trickles in;
and httptools accepts a header line of any length. Each of those holds a
connection (and a task, and buffers) for as long as the client likes. This
subclass adds:

* ``LU_KEEP_ALIVE_S`` from the moment a connection opens, not only after a response;
* ``LU_READ_TIMEOUT_S`` from the first byte of a request until its last, plus the
  time its body's bytes so far would take at ``LU_MIN_UPLOAD_RATE`` (a large body on
  a slow link keeps going, a trickle does not): when it passes, a 408 in the error
  model (while no answer has started) and the connection is closed. The app's own body reader (``transport.read_body``)
  enforces the same deadline and answers the 408 itself with its request id;
  this timer is the backstop for whatever the app is not reading;
* ``LU_MAX_HEADER_BYTES`` for the request line and headers, and :data:`MAX_HEADER_FIELDS` fields:
  431, then close;
* ``LU_MAX_CONNECTIONS`` open connections (:class:`ConnectionGate`): one beyond it is answered 503
  ``too_many_connections`` at once, unread, and closed;
* at most :data:`MAX_PIPELINED` requests parsed ahead of their answers on one connection: the
  answers owed are sent, then a 429, then close;
* the parser's own errors (bad request line, bad ``Content-Length``) answered in
  the error model instead of plain text.

The request start time is put in the ASGI scope (``READ_STARTED``) so that the
app measures the same deadline.

It also offers the app a :class:`BodySink` (``scope[BODY_SINK]``): a body of known
length is written by the parser straight into a buffer the app provides, instead
of going through ASGI ``receive()`` messages (uvicorn joins each chunk into a
``bytearray``, copies it out to ``bytes``, pauses and resumes reading, and wakes the
app's task per 256 KiB chunk: at 128 MiB that was most of the cost of receiving).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from typing import Any

import httptools
import orjson
from uvicorn.protocols.http.httptools_impl import STATUS_LINE, HttpToolsProtocol

from service.context import choose_request_id, new_request_id

__all__ = ["BODY_SINK", "READ_STARTED", "BodySink", "ConnectionGate", "bounded_protocol"]

log = logging.getLogger("service.access")
READ_STARTED = "lu.read_started"
BODY_SINK = "lu.body_sink"
# A body with at least this much left to arrive when the app opens its sink is read straight into the
# app's buffer (_DirectBody); a smaller one goes through the parser, which costs less than switching.
DIRECT_MIN = 256 << 10
# The app answers a slow body itself (with its request id); the protocol waits this much longer before it steps in.
_APP_GRACE_S = 0.5
#: Most header fields in one request (Apache's LimitRequestFields): 16,000 empty headers fit in
#: LU_MAX_HEADER_BYTES and became 1.7 MiB of Python objects per connection (found by a helper's audit).
MAX_HEADER_FIELDS = 100
#: Most requests parsed ahead of their answers on one connection (pipelined): one 256 KiB read of
#: "GET /healthz" requests was 7,700 queued requests, about 23 MB, and 100 such clients took 2.3 GB.
MAX_PIPELINED = 32


class _Overrun(Exception):
    """Raised in a parser callback to stop parsing this read: uvicorn hands it to send_400_response, which
    answers the refusal the callback recorded (after the answers owed before it, for a pipelined one)."""


class _ConnectionLog:
    """uvicorn's logger as one connection's protocol sees it (``self.logger``), without uvicorn's warning
    "Invalid HTTP request received." for a refusal the protocol made on purpose (an :class:`_Overrun`: 429,
    431), which :meth:`_BoundedProtocol._refuse` logs in its own words; the parser's real errors keep it.
    uvicorn logs that warning between the callback that raised and ``send_400_response``, which clears the
    refusal; everything else goes to the logger itself."""

    __slots__ = ("_log", "_protocol")

    def __init__(self, log: logging.Logger, protocol: _BoundedProtocol) -> None:
        self._log = log
        self._protocol = protocol

    def warning(self, msg: object, *args: Any, **kwargs: Any) -> None:
        if self._protocol._overrun is None:
            self._log.warning(msg, *args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._log, name)


def _error_bytes(status: int, code: str, message: str, request_id: str, extra_headers: bytes = b"") -> bytes:
    body = orjson.dumps({"error": message, "code": code, "request_id": request_id})
    return b"".join(
        [
            STATUS_LINE[status],
            b"content-type: application/json\r\n",
            b"content-length: " + str(len(body)).encode() + b"\r\n",
            b"x-request-id: " + request_id.encode() + b"\r\n",  # well-formed: choose_request_id's
            extra_headers,
            b"connection: close\r\n\r\n",
            body,
        ]
    )


def _client_request_id(headers: Any) -> str:
    """The id for a refusal: the client's ``X-Request-ID`` where its headers got that far, else a new one."""
    for name, value in headers or ():
        if name.lower() == b"x-request-id":
            return choose_request_id(value.decode("latin-1"))
    return new_request_id()


class BodySink:
    """Receives one request's body into the app's buffer, written by the parser as bytes arrive.

    The app calls :meth:`open` with a buffer of the declared length, waits until
    :attr:`finished` (:meth:`wait` returns when the body is complete or the client has
    gone), and calls :meth:`close` when it stops reading, for whatever reason: from
    then on nothing is written into its buffer (which may go back to a pool).
    Everything runs on the event loop's thread, the parser's callbacks included.
    """

    def __init__(self, cycle: Any, protocol: _BoundedProtocol | None = None) -> None:
        self.cycle = cycle
        self.protocol = protocol
        self.received = 0
        self.direct = 0  # of which read from the socket straight into the buffer (_DirectBody)
        self.overflow = False
        self._view: memoryview | None = None
        self._event: asyncio.Event | None = None
        self._on_lost: Callable[[], None] | None = None

    @property
    def active(self) -> bool:
        return self._view is not None

    @property
    def disconnected(self) -> bool:
        return bool(self.cycle.disconnected)

    @property
    def finished(self) -> bool:
        """The body has ended (complete, too long, or the client has gone)."""
        return not self.cycle.more_body or self.cycle.disconnected or self.overflow

    def open(self, view: memoryview, direct: bool = False) -> None:
        """From now on the body's bytes go into ``view``; those that arrived before are moved there first.

        ``direct``: the rest, when at least ``DIRECT_MIN`` bytes, may be read from the socket straight
        into ``view`` (:class:`_DirectBody`; for a buffer whose pages are resident).
        """
        if self._view is not None or self.received:
            raise RuntimeError("a body sink is opened once")
        self._view = view
        cycle = self.cycle
        if cycle.waiting_for_100_continue and not cycle.transport.is_closing():
            # What uvicorn's receive() does on the first read: the client waits for it to send the body.
            cycle.transport.write(b"HTTP/1.1 100 Continue\r\n\r\n")
            cycle.waiting_for_100_continue = False
        pending, self.cycle.body = self.cycle.body, bytearray()
        self.write(pending)
        if self.finished:  # the usual small body: it had arrived whole, nothing to wait for
            return
        self._event = asyncio.Event()
        if direct and self.protocol is not None and self.remaining >= DIRECT_MIN:
            self.protocol.receive_directly(self)
        self.cycle.flow.resume_reading()  # uvicorn pauses reading while a chunk waits for the app

    def write(self, data: bytes | bytearray) -> None:
        if self._view is None:
            return
        end = self.received + len(data)
        if end > len(self._view):
            self.overflow = True
            self.wake()
            return
        self._view[self.received : end] = data
        self.received = end

    def wake(self) -> None:
        if self._event is not None:
            self._event.set()

    async def wait(self) -> None:
        """Until the body has ended (at once when it had already; :meth:`open` first)."""
        if self._event is not None and not self.finished:
            await self._event.wait()

    @property
    def remaining(self) -> int:
        """Bytes of the body still to come into the buffer (0 once closed)."""
        return 0 if self._view is None else len(self._view) - self.received

    def rest(self) -> memoryview:
        """The part of the buffer the body's remaining bytes go to (the socket reads into it directly)."""
        assert self._view is not None
        return self._view[self.received :]

    def on_lost(self, callback: Callable[[], None] | None) -> None:
        """Call ``callback`` (on the loop, once) if the connection is lost while it is set, at once if it is
        lost already; ``None`` unsets it. The app learns so that its client has gone while it waits for
        something other than the body (a job on the worker), which ``receive()`` would only say when read."""
        protocol = self.protocol
        if protocol is None:
            return
        self._on_lost = callback
        if callback is None:
            protocol.watching.discard(self)
        elif protocol.lost:
            self.lost()
        else:
            protocol.watching.add(self)

    def lost(self) -> None:
        """The connection is lost: the callback, if one is set, is called (and unset)."""
        callback, self._on_lost = self._on_lost, None
        if callback is not None:
            callback()

    def close(self) -> None:
        """Stop writing into the buffer (the app no longer reads, or has let the buffer go)."""
        self._view = None
        if self.protocol is not None:
            self.protocol.sink_closed(self)


class _DirectBody(asyncio.BufferedProtocol):
    """The connection's protocol while the rest of a body of known length is received straight into
    the app's buffer (:meth:`_BoundedProtocol.receive_directly`).

    The event loop reads from the socket into :meth:`BodySink.rest` (``recv_into``): the bytes
    skip the loop's read buffer, the ``bytes`` object made of each read, the parser and the copy
    into the app's buffer. Never more than the body's remaining length is asked for, so the
    next request's bytes stay in the socket for the parser. After the app has let the buffer go
    (a timeout, an error), what still arrives is read into ``spill`` and dropped, and the
    connection closes after the answer.
    """

    def __init__(self, owner: _BoundedProtocol, sink: BodySink) -> None:
        self.owner = owner
        self.sink = sink
        self.spill: memoryview | None = None

    def get_buffer(self, sizehint: int) -> memoryview:
        if self.sink.active:
            return self.sink.rest()
        if self.spill is None:
            self.spill = memoryview(bytearray(64 << 10))
        return self.spill

    def buffer_updated(self, nbytes: int) -> None:
        if self.sink.active:
            self.owner.body_received_directly(self.sink, nbytes)

    def eof_received(self) -> bool | None:
        return self.owner.eof_received()

    def connection_lost(self, exc: Exception | None) -> None:
        self.owner.connection_lost(exc)

    def pause_writing(self) -> None:
        self.owner.pause_writing()

    def resume_writing(self) -> None:
        self.owner.resume_writing()


class _ResponseWriter:
    """A response's writes to its connection: the status line and headers go out with the body's first bytes.

    uvicorn writes a response's head and its body with two ``transport.write`` calls, each a ``send``
    system call and a TCP segment of its own (``TCP_NODELAY``), so each small answer cost the server
    two system calls and the client two reads. This stands in for the connection in the request's
    cycle (``RequestResponseCycle.transport``: ``write``, ``close`` and ``is_closing``): the head is held
    until the next write and both leave in one ``writelines`` (one ``writev`` with uvloop, no copy).
    uvicorn writes a body right after its head (an empty one too, and the service's answers send
    their first chunk at once; a streamed answer's head would wait for its first chunk), except for
    ``HEAD``, whose head is not held (``hold=False``). A head still held when its response completes
    (:meth:`response_complete`, which stands in for the cycle's ``on_response``: per request, so right
    with pipelined requests too) or when the connection is closed goes out then. An informational
    answer (``100 Continue``) is not a head: it goes out at once.
    """

    __slots__ = ("_held", "_on_response", "_started", "_transport")

    def __init__(
        self, transport: asyncio.Transport, hold: bool = True, on_response: Callable[[], None] | None = None
    ) -> None:
        self._transport = transport
        self._held: bytes | None = None
        self._started = not hold  # nothing held: every write goes out as it comes
        self._on_response = on_response

    def write(self, data: bytes) -> None:
        held = self._held
        if held is not None:
            self._held = None
            self._transport.writelines((held, data))
        elif self._started or data.startswith(b"HTTP/1.1 1"):
            self._transport.write(data)  # the body's later chunks; an informational answer
        else:
            self._started = True
            self._held = data

    def flush(self) -> None:
        """Send the head if it is still held."""
        held, self._held = self._held, None
        if held is not None and not self._transport.is_closing():
            self._transport.write(held)

    def close(self) -> None:
        self.flush()
        self._transport.close()

    def response_complete(self) -> None:
        """The cycle's ``on_response``: this request's answer is complete (a head no body followed goes out)."""
        self.flush()
        if self._on_response is not None:
            self._on_response()

    def is_closing(self) -> bool:
        return self._transport.is_closing()


class ConnectionGate:
    """The server's count of open HTTP connections, and the refusal of those beyond ``limit``.

    Every connection costs memory outside ``LU_MAX_INFLIGHT_BYTES`` until its deadlines close it: a few
    KiB idle, and up to about ``LU_MAX_HEADER_BYTES`` more while its headers arrive (74 KiB per
    connection measured with 57 KiB of unfinished headers). The count bounds what all of them take.
    uvicorn has no such bound (``limit_concurrency`` answers 503 only after reading a request's headers,
    and keeps the connection). A connection beyond the limit is turned away as it is accepted
    (:class:`_TurnedAway`): a 503 ``too_many_connections`` with ``Retry-After`` is written before
    anything is read, then the connection closes.
    """

    #: How long a turned-away connection may stay open while its answer leaves (what the client sends
    #: meanwhile is read and dropped: closing a socket with unread bytes resets the connection, and the
    #: client may lose the answer).
    LINGER_S = 1.0

    def __init__(self, limit: int, retry_after_s: int = 1, on_refusal: Any = None) -> None:
        if limit < 1:
            raise ValueError("a connection limit is at least 1")
        self.limit = limit
        self.retry_after_s = retry_after_s
        self.on_refusal = on_refusal
        self.open = 0  # connections served now
        self.lingering = 0  # turned-away connections not yet closed
        self.turned_away = 0  # since start
        self._logged_at = float("-inf")

    def admit(self, transport: asyncio.Transport, loop: asyncio.AbstractEventLoop) -> bool:
        """Count a new connection and say whether it may be served; if not, it is turned away now."""
        if self.open < self.limit:
            self.open += 1
            return True
        self.turned_away += 1
        if self.lingering >= self.limit:  # a flood: no answer, no linger, nothing kept
            transport.abort()
        else:
            transport.set_protocol(_TurnedAway(self, transport, loop))
        if self.on_refusal is not None:
            self.on_refusal(503, "too_many_connections")
        now = loop.time()
        if now - self._logged_at >= 10.0:  # one line per 10 s, not one per connection of a flood
            self._logged_at = now
            log.warning(
                "connections beyond LU_MAX_CONNECTIONS = %d are turned away (%d since start)",
                self.limit,
                self.turned_away,
                extra={"status": 503, "code": "too_many_connections", "turned_away": self.turned_away},
            )
        return False

    def release(self) -> None:
        """A served connection has closed."""
        self.open -= 1


class _TurnedAway(asyncio.Protocol):
    """A connection beyond ``LU_MAX_CONNECTIONS``: answered 503 at once, its write side shut, what it
    sends read and dropped, and closed when the client closes or after :attr:`ConnectionGate.LINGER_S`."""

    def __init__(self, gate: ConnectionGate, transport: asyncio.Transport, loop: asyncio.AbstractEventLoop) -> None:
        self.gate = gate
        self.transport = transport
        gate.lingering += 1
        self._timer = loop.call_later(gate.LINGER_S, transport.abort)
        message = (
            f"the server has LU_MAX_CONNECTIONS = {gate.limit} connections open; retry after "
            f"{gate.retry_after_s} s, or reuse a connection (keep-alive)"
        )
        retry = b"retry-after: " + str(gate.retry_after_s).encode() + b"\r\n"
        transport.write(_error_bytes(503, "too_many_connections", message, new_request_id(), retry))
        if transport.can_write_eof():
            transport.write_eof()  # the answer is complete: the client reads it and sees the end

    def data_received(self, data: bytes) -> None:
        pass  # dropped

    def eof_received(self) -> bool:
        return False  # the client is done: close

    def connection_lost(self, exc: Exception | None) -> None:
        self._timer.cancel()
        self.gate.lingering -= 1


class _BoundedProtocol(HttpToolsProtocol):
    read_timeout_s: float = 30.0
    min_upload_rate: int = 0
    keep_alive_s: float = 5.0
    max_header_bytes: int = 64 * 1024
    on_refusal: Any = None  # callable(status, code): counts protocol-level refusals in the app's metrics
    gate: ConnectionGate | None = None  # LU_MAX_CONNECTIONS

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._deadline: asyncio.TimerHandle | None = None
        self._started = 0.0
        self._body_bytes = 0
        self._header_bytes = 0
        self._header_tail = b""  # the last bytes of the headers so far: their end may span two reads
        self._deferred_refusal: tuple[int, str, str] | None = None  # a 400 owed after the answers before it
        self._message_open = False  # between a request's first byte and its end: self.headers are its own
        # True from the end of a request's body (or the connection's start) until the next request's
        # headers are complete: the bytes that arrive then are headers, bounded by max_header_bytes.
        self._in_headers = True
        self._sink: BodySink | None = None
        self._direct: _DirectBody | None = None
        self._header_fields = 0
        # A chunked body's framing (a chunk's size line, its extensions, the trailers) is bounded like headers:
        # the parser keeps an unfinished trailer line whole and grows it a read at a time, each copy longer.
        # Counted over the reads in which the parser reports no progress (no chunk begun or ended, no message
        # begun or ended): the bytes of such a read that are not body are framing, and may not pass
        # max_header_bytes in a row. (A read with progress starts the count afresh: at most one read's worth,
        # up to 256 KiB, of framing around each chunk goes uncounted.)
        self._framing_run = 0
        self._parser_events = 0
        self._overrun: tuple[int, str, str] | None = None  # the refusal a parser callback stopped parsing for
        self._served = False  # admitted by the gate (connection_made ran)
        self.lost = False  # connection_lost ran
        self.watching: set[BodySink] = set()  # requests that want to know if the connection is lost
        self.logger = _ConnectionLog(self.logger, self)  # type: ignore[assignment]

    # ------------------------------------------------------------------ connection

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        if self.gate is not None and not self.gate.admit(transport, self.loop):
            return  # turned away: another protocol answers it (or it is aborted); this one never starts
        self._served = True
        super().connection_made(transport)
        # An idle connection that never sends a request is closed like one idle between requests.
        self.timeout_keep_alive_task = self.loop.call_later(self.keep_alive_s, self.timeout_keep_alive_handler)

    def connection_lost(self, exc: Exception | None) -> None:
        if not self._served:
            return  # turned away by the gate: never started, never counted
        if self.gate is not None:
            self.gate.release()
        self._cancel_deadline()
        super().connection_lost(exc)
        self.lost = True
        if self._sink is not None:
            self._sink.wake()
        watching, self.watching = self.watching, set()
        for sink in watching:  # requests waiting for their answer (BodySink.on_lost)
            sink.lost()

    def data_received(self, data: bytes) -> None:
        if self._deferred_refusal is not None:
            return  # the stream is already unparsable: only the answers owed before it are still sent
        if self._in_headers:
            allowed = self.max_header_bytes - self._header_bytes  # header bytes this read may still bring
            self._header_bytes += len(data)
            if self._header_bytes > self.max_header_bytes and not self._headers_end_within(data, allowed):
                self._refuse_headers()
                return
            self._header_tail = (self._header_tail + data[-3:])[-3:]
            super().data_received(data)
            # Requests pipelined after another in one read are not counted from where they start (the parser
            # does not say where that is): their headers are bounded from their next read on, so a read's
            # worth (uvloop's up to 256 KiB) may go over. A request's own first headers are counted exactly.
            return
        body_before, events_before = self._body_bytes, self._parser_events
        super().data_received(data)
        if self._parser_events != events_before:
            self._framing_run = 0
        elif self._message_open and not self._in_headers:  # this request's body (or its trailers), no progress
            self._framing_run += len(data) - (self._body_bytes - body_before)
            if self._framing_run > self.max_header_bytes and not self.transport.is_closing():
                self._refuse(
                    431,
                    "headers_too_large",
                    f"a chunked body's framing (a chunk's size line and extensions, or its trailers) exceeds "
                    f"{self.max_header_bytes} bytes",
                )

    def _headers_end_within(self, data: bytes, allowed: int) -> bool:
        """Whether the blank line that ends the headers lies within the first ``allowed`` bytes of
        ``data`` (the rest of the read may be body): only reads that cross the bound ask."""
        if allowed <= 0:
            return False
        window = self._header_tail + data[:allowed]
        return b"\r\n\r\n" in window or b"\n\n" in window

    def _refuse_headers(self) -> None:
        if not self.transport.is_closing():
            self._refuse(431, "headers_too_large", f"the request line and headers exceed {self.max_header_bytes} bytes")

    def send_400_response(self, msg: str) -> None:
        refusal = self._overrun or (400, "malformed_request", f"not a valid HTTP/1.1 request: {msg}")
        self._overrun = None
        if self._in_headers and self._answers_owed():
            # A new request's line or headers, pipelined behind requests still being answered: they are
            # answered first, in order, then this refusal, then the connection closes; nothing more is
            # read or parsed meanwhile. (A request whose own body is unparsable is refused at once.)
            self._deferred_refusal = refusal
            self._cancel_deadline()
            return
        self._refuse(*refusal)

    def _answers_owed(self) -> bool:
        return bool(self.pipeline) or (self.cycle is not None and not self.cycle.response_complete)

    # ------------------------------------------------------------------ parser callbacks

    def on_message_begin(self) -> None:
        if len(self.pipeline) >= MAX_PIPELINED:
            self._overrun = (
                429,
                "too_many_pipelined_requests",
                f"more than {MAX_PIPELINED} requests were sent ahead of their answers on one connection: "
                "the ones before are answered, then the connection closes",
            )
            raise _Overrun
        super().on_message_begin()
        self._header_fields = 0
        self._message_open = True
        # A request has begun: the connection is not idle (its bytes may have come in the same read
        # that ended the previous request's body, after which on_message_complete armed the timer).
        self._unset_keepalive_if_required()
        self._in_headers = True
        self._cancel_deadline()
        self._started = self.loop.time()
        self._body_bytes = 0
        self._parser_events += 1
        self._deadline = self.loop.call_later(self.read_timeout_s + _APP_GRACE_S, self._read_timed_out)
        self.scope[READ_STARTED] = self._started  # type: ignore[literal-required]

    def on_header(self, name: bytes, value: bytes) -> None:
        self._header_fields += 1
        if self._header_fields > MAX_HEADER_FIELDS:
            self._overrun = (431, "headers_too_large", f"the request has more than {MAX_HEADER_FIELDS} header fields")
            raise _Overrun
        super().on_header(name, value)

    def on_headers_complete(self) -> None:
        self._header_fields = 0  # a chunked body's trailers are counted afresh
        self._in_headers = False
        self._header_bytes = 0
        self._header_tail = b""
        super().on_headers_complete()
        if self.cycle is not None and self.cycle.scope is self.scope:
            cycle = self.cycle
            writer = _ResponseWriter(self.transport, self.scope["method"] != "HEAD", cycle.on_response)
            cycle.transport, cycle.on_response = writer, writer.response_complete  # type: ignore[assignment]
            self._sink = BodySink(self.cycle, self)
            self.scope[BODY_SINK] = self._sink  # type: ignore[literal-required]

    def on_chunk_header(self) -> None:
        self._parser_events += 1

    def on_chunk_complete(self) -> None:
        self._parser_events += 1

    def on_body(self, body: bytes) -> None:
        self._body_bytes += len(body)
        sink = self._sink
        if sink is not None and sink.active and sink.cycle is self.cycle and not self.cycle.response_complete:
            sink.write(body)
            return
        super().on_body(body)

    def on_message_complete(self) -> None:
        self._parser_events += 1
        self._cancel_deadline()
        self._in_headers = True
        self._header_bytes = 0
        self._header_tail = b""
        self._message_open = False
        super().on_message_complete()
        if self._sink is not None:
            self._sink.wake()
        if self.cycle is not None and self.cycle.response_complete and not self.pipeline:
            # Answered early (413, 503) while the body still arrived: the connection is idle only now.
            self._unset_keepalive_if_required()
            self.timeout_keep_alive_task = self.loop.call_later(self.keep_alive_s, self.timeout_keep_alive_handler)

    def on_response_complete(self) -> None:
        super().on_response_complete()  # (starts the next pipelined request, if any)
        if self._deferred_refusal is not None and not self._answers_owed():
            refusal, self._deferred_refusal = self._deferred_refusal, None
            if not self.transport.is_closing():  # (an answer that closed the connection: nothing more to say)
                self._refuse(*refusal)
        elif not self._in_headers:
            # The request's body is still arriving (an early answer): it is not idle, and the read
            # deadline, not the keep-alive timer, bounds what remains.
            self._unset_keepalive_if_required()

    # ------------------------------------------------------------------ bodies read straight into the app's buffer

    def receive_directly(self, sink: BodySink) -> None:
        """The rest of ``sink``'s body is read from the socket into its buffer (:class:`_DirectBody`)."""
        if self._direct is None and sink is self._sink and not self.transport.is_closing():
            self._direct = _DirectBody(self, sink)
            self.transport.set_protocol(self._direct)

    def body_received_directly(self, sink: BodySink, nbytes: int) -> None:
        sink.received += nbytes
        sink.direct += nbytes
        self._body_bytes += nbytes
        if sink.remaining == 0:
            self._direct = None
            self.transport.set_protocol(self)
            # The parser never saw these bytes and still waits for them: a fresh one for the next
            # request (uvicorn's, with its options), and the message completed as it would have.
            self.parser = httptools.HttpRequestParser(self)
            with contextlib.suppress(AttributeError):  # httptools < 0.6.3, as uvicorn does
                self.parser.set_dangerous_leniencies(lenient_data_after_close=True)
            self.on_message_complete()

    def sink_closed(self, sink: BodySink) -> None:
        if self._direct is not None and self._direct.sink is sink and self.cycle is not None:
            # The app let the buffer go before the body's end: the parser cannot find the next
            # request in this stream any more, so the connection closes after the answer.
            self.cycle.keep_alive = False

    # ------------------------------------------------------------------ refusals

    def _cancel_deadline(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None

    def _read_timed_out(self) -> None:
        self._deadline = None
        if self.transport.is_closing():
            return
        # The same rule as transport.ReadDeadline: bytes received so far earn time at the minimum rate.
        allowed = self._started + self.read_timeout_s + _APP_GRACE_S
        if self.min_upload_rate:
            allowed += self._body_bytes / self.min_upload_rate
        if allowed > self.loop.time():
            self._deadline = self.loop.call_later(allowed - self.loop.time(), self._read_timed_out)
            return
        if self.cycle is None or not self.cycle.response_started:
            self._refuse(
                408, "request_timeout", f"the request did not arrive within LU_READ_TIMEOUT_S = {self.read_timeout_s} s"
            )
        else:  # answered already (e.g. refused early) while the client still sends: just hang up
            self.transport.close()

    def _refuse(self, status: int, code: str, message: str) -> None:
        """Answer in the error model and close (no request object exists, or it is beyond saving)."""
        if self.cycle is not None and not self.cycle.response_complete:
            self.cycle.disconnected = True  # the app's receive() now reports a disconnect
            self.cycle.message_event.set()
        self.transport.write(
            _error_bytes(status, code, message, _client_request_id(self.headers if self._message_open else None))
        )
        self.transport.close()
        self._in_headers = False
        log.info("%d %s", status, code, extra={"status": status, "code": code, "client": self.client})
        if self.on_refusal is not None:
            self.on_refusal(status, code)


def bounded_protocol(
    *,
    read_timeout_s: float,
    keep_alive_s: float,
    max_header_bytes: int,
    min_upload_rate: int = 0,
    on_refusal: Any = None,
    gate: ConnectionGate | None = None,
) -> type[HttpToolsProtocol]:
    """The protocol class to pass as ``uvicorn.Config(http=...)``, with this service's limits."""
    return type(
        "LUHttpToolsProtocol",
        (_BoundedProtocol,),
        {
            "read_timeout_s": read_timeout_s,
            "min_upload_rate": min_upload_rate,
            "keep_alive_s": keep_alive_s,
            "max_header_bytes": max_header_bytes,
            "on_refusal": staticmethod(on_refusal) if on_refusal is not None else None,
            "gate": gate,
        },
    )
