"""A response's head and body leave in one write (service.protocol._ResponseWriter).

uvicorn writes the status line and headers, then the body, with two ``transport.write`` calls:
two ``send`` system calls and two TCP segments per small answer. The protocol gives each request's
cycle a writer that holds the head until the body's first bytes and writes both with one
``writelines``. Checked on a recording transport (every path: head + body, informational answers,
chunks, a close in between) and on the real server, where a small answer must arrive whole in one
read (two segments: the first read would often see the head alone).
"""

from __future__ import annotations

import socket
from collections.abc import Iterator

import numpy as np
import pytest

from service.protocol import _ResponseWriter
from tests.service.test_e2e import Server, serving
from tests.service.wire import binary_request


class Recorder:
    def __init__(self) -> None:
        self.calls: list[tuple[str, tuple[bytes, ...]]] = []
        self.closing = False

    def write(self, data: bytes) -> None:
        self.calls.append(("write", (bytes(data),)))

    def writelines(self, lines) -> None:
        self.calls.append(("writelines", tuple(bytes(x) for x in lines)))

    def close(self) -> None:
        self.calls.append(("close", ()))
        self.closing = True

    def is_closing(self) -> bool:
        return self.closing


HEAD = b"HTTP/1.1 200 OK\r\ncontent-length: 4\r\n\r\n"


def test_the_head_waits_for_the_body_and_both_leave_in_one_call():
    t = Recorder()
    w = _ResponseWriter(t)
    w.write(HEAD)
    assert t.calls == []  # held
    w.write(b"body")
    assert t.calls == [("writelines", (HEAD, b"body"))]


def test_an_empty_body_still_sends_the_head():
    t = Recorder()
    w = _ResponseWriter(t)
    w.write(HEAD)
    w.write(b"")  # uvicorn writes the body even when it is empty (204, an empty answer)
    assert t.calls == [("writelines", (HEAD, b""))]


def test_a_head_request_s_head_is_not_held():
    t = Recorder()
    w = _ResponseWriter(t, hold=False)  # HEAD: uvicorn writes no body at all
    w.write(HEAD)
    assert t.calls == [("write", (HEAD,))]


def test_a_head_still_held_when_its_response_completes_goes_out_first():
    t = Recorder()
    done: list[int] = []
    w = _ResponseWriter(t, on_response=lambda: done.append(len(t.calls)))
    w.write(HEAD)
    w.response_complete()  # the cycle's on_response: this request's answer is complete
    assert t.calls == [("write", (HEAD,))] and done == [1]  # sent, then the protocol told
    w.flush()
    assert len(t.calls) == 1


def test_later_chunks_go_out_as_they_come():
    t = Recorder()
    w = _ResponseWriter(t)
    w.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n")
    w.write(b"4\r\nabcd\r\n")
    w.write(b"0\r\n\r\n")
    assert [c[0] for c in t.calls] == ["writelines", "write"]
    assert t.calls[1] == ("write", (b"0\r\n\r\n",))


def test_an_informational_answer_is_not_held():
    t = Recorder()
    w = _ResponseWriter(t)
    w.write(b"HTTP/1.1 100 Continue\r\n\r\n")  # the client waits for it before it sends the body
    assert t.calls == [("write", (b"HTTP/1.1 100 Continue\r\n\r\n",))]
    w.write(HEAD)  # the real head, after it, is held as usual
    w.write(b"body")
    assert t.calls[1:] == [("writelines", (HEAD, b"body"))]


def test_a_close_after_the_head_sends_the_head_first():
    t = Recorder()
    w = _ResponseWriter(t)
    w.write(HEAD)
    w.close()
    assert t.calls == [("write", (HEAD,)), ("close", ())]
    assert w.is_closing()


def test_a_close_with_nothing_held_only_closes():
    t = Recorder()
    w = _ResponseWriter(t)
    w.write(HEAD)
    w.write(b"body")
    w.close()
    assert t.calls[-1] == ("close", ())
    assert len(t.calls) == 2


@pytest.fixture(scope="module")
def server() -> Iterator[Server]:
    yield from serving(LU_WARMUP="false")


def test_a_small_answer_arrives_whole_in_one_read(server):
    """The real server (uvicorn, uvloop, our protocol): head and body in one segment, so the client's
    first read returns the whole answer, every time, on a kept-alive connection."""
    rng = np.random.default_rng(3)
    body, headers = binary_request({"A": rng.standard_normal((8, 8)) + 8 * np.eye(8), "B": rng.standard_normal((8, 1))})
    request = (
        "POST /solve HTTP/1.1\r\nHost: t\r\n"
        + "".join(f"{k}: {v}\r\n" for k, v in headers.items())
        + f"Content-Length: {len(body)}\r\n\r\n"
    ).encode() + body
    with socket.create_connection(("127.0.0.1", server.port), timeout=30) as sock:
        for _ in range(30):
            sock.sendall(request)
            raw = sock.recv(1 << 20)  # one read
            head, sep, content = raw.partition(b"\r\n\r\n")
            assert sep, raw
            assert head.startswith(b"HTTP/1.1 200"), head
            length = next(
                int(line.split(b":")[1]) for line in head.split(b"\r\n") if line.lower().startswith(b"content-length")
            )
            assert len(content) == length  # the body came with the head


@pytest.mark.parametrize("path", ["/healthz", "/readyz", "/metrics", "/solve"])
def test_head_requests_are_answered_at_once_and_the_connection_stays_in_step(server, path):
    """HEAD (a load balancer's probe, ``curl -I``): uvicorn writes no body, so the head must not wait for
    one; the next request on the connection gets its own answer, not the HEAD's."""
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as sock:
        sock.sendall(f"HEAD {path} HTTP/1.1\r\nHost: t\r\n\r\n".encode())
        raw = b""
        while b"\r\n\r\n" not in raw:
            chunk = sock.recv(65536)  # within the timeout: a held head would never come
            assert chunk, raw
            raw += chunk
        head, _, rest = raw.partition(b"\r\n\r\n")
        expected = (b"200",) if path in ("/healthz", "/readyz") else (b"200", b"405")
        assert head.split()[1] in expected and rest == b""  # answered (or refused), no body for HEAD
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: t\r\n\r\n")
        raw = b""
        while b"\r\n\r\n" not in raw:
            raw += sock.recv(65536)
        assert raw.startswith(b"HTTP/1.1 200")
        assert b'"status"' in raw or b"ok" in raw.lower()


def test_pipelined_requests_get_their_answers_in_order(server):
    """A HEAD and a GET sent together (pipelined): the HEAD's head, then the GET's whole answer."""
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as sock:
        sock.sendall(b"HEAD /metrics HTTP/1.1\r\nHost: t\r\n\r\nGET /healthz HTTP/1.1\r\nHost: t\r\n\r\n")
        raw = b""
        while raw.count(b"\r\n\r\n") < 2 or not raw.rstrip().endswith(b"}"):
            chunk = sock.recv(65536)
            assert chunk, raw
            raw += chunk
        first, _, rest = raw.partition(b"\r\n\r\n")
        assert first.split()[1] in (b"200", b"405")
        assert rest.startswith(b"HTTP/1.1 200"), rest  # the GET's answer right after the HEAD's head


@pytest.mark.anyio
async def test_each_request_s_cycle_writes_through_a_writer_that_completes_it():
    """The protocol (uvicorn's, bounded) gives each request's cycle its own writer, as its transport and as
    its ``on_response``, so that a head still held when that request's answer completes goes out then; a small
    answer leaves in one write. In-process, with a recording transport."""
    import asyncio

    from uvicorn.config import Config
    from uvicorn.server import ServerState

    from service.protocol import bounded_protocol

    sent: list[bytes] = []

    class Transport(asyncio.Transport):
        def __init__(self) -> None:
            super().__init__()
            self.closing = False

        def get_extra_info(self, name, default=None):
            return {"sockname": ("127.0.0.1", 8000), "peername": ("127.0.0.1", 40000)}.get(name, default)

        def write(self, data) -> None:
            sent.append(bytes(data))

        def writelines(self, lines) -> None:
            sent.append(b"".join(bytes(x) for x in lines))

        def is_closing(self) -> bool:
            return self.closing

        def close(self) -> None:
            self.closing = True

        def pause_reading(self) -> None:
            pass

        def resume_reading(self) -> None:
            pass

    async def app(scope, receive, send):
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"2")]})
        await send({"type": "http.response.body", "body": b"ok"})

    cls = bounded_protocol(read_timeout_s=5, keep_alive_s=5, max_header_bytes=8192)
    config = Config(app=app, http=cls, lifespan="off", log_config=None, access_log=False)
    config.load()
    protocol = cls(config=config, server_state=ServerState(), app_state={})
    protocol.connection_made(Transport())
    completed: list[bool] = []
    for _ in range(2):  # two requests on the connection, each with its own writer
        protocol.data_received(b"GET / HTTP/1.1\r\nHost: t\r\n\r\n")
        cycle = protocol.cycle
        writer = cycle.transport
        assert isinstance(writer, _ResponseWriter) and cycle.on_response == writer.response_complete
        original = writer._on_response
        writer._on_response = lambda original=original: (completed.append(True), original())
        for _ in range(50):
            if cycle.response_complete:
                break
            await asyncio.sleep(0.01)
    assert completed == [True, True]
    assert len(sent) == 2 and all(x.startswith(b"HTTP/1.1 200") and x.endswith(b"\r\n\r\nok") for x in sent)
    protocol.connection_lost(None)
