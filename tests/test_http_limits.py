"""The service's HTTP limits (``api/httplimits.py``) against a real uvicorn server on 127.0.0.1, with both
parsers: a head over the size limit answers 431, an unfinished head is closed at its deadline (a trickle of
bytes does not extend it), idle keep-alive connections close, connections over the cap are closed at once and
a request at the cap answers 503, and the server serves normal clients again once the idle ones are gone.
Small limits keep each test to a few seconds; waits poll with deadlines far above the limits."""

from __future__ import annotations

import asyncio
import contextlib
import re
import socket
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import uvicorn
from uvicorn.server import ServerState

import frenzy_opt.api.server as server_module
from frenzy_opt.api.httplimits import (
    DEFAULT_LIMITS,
    HttpLimits,
    LimitedH11Protocol,
    LimitedHttpToolsProtocol,
    Parser,
    _Guard,
    head_bytes,
    uvicorn_options,
)
from frenzy_opt.api.server import background_server, build_config
from frenzy_opt.cli import main
from frenzy_opt.planning.scenario import load_cluster_ref

SMALL = {"model": "gpt3-125m", "training": {"seq_len": 1024, "global_batch_size": 32, "train_steps": 50}}
MARGIN_S = 15.0
"""How much later than a limit's time an effect may come before a test fails: far above any scheduling delay."""
TIMER_SLACK_S = 0.002
"""How much earlier than its time uvicorn's own keep-alive timer may fire under uvloop: libuv counts timers in
whole milliseconds from the loop time cached at the start of an iteration (libuv docs, uv_now). The head's
deadline is ours and re-arms until its time has really passed, so its tests allow no slack."""


@pytest.fixture(params=list(Parser))
def parser(request: pytest.FixtureRequest) -> Parser:
    return Parser(request.param)


@pytest.fixture
def serve(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, parser: Parser
) -> Callable[[HttpLimits], contextlib.AbstractContextManager[str]]:
    """``background_server`` of the service with the given limits and the test's parser."""
    chosen: list[type] = []

    def options(limits: HttpLimits) -> dict[str, Any]:
        kwargs = uvicorn_options(limits, parser)
        chosen.append(kwargs["http"])
        return kwargs

    monkeypatch.setattr(server_module, "uvicorn_options", options)

    @contextlib.contextmanager
    def start(limits: HttpLimits) -> Iterator[str]:
        db = f"sqlite:///{tmp_path / f'db{len(chosen)}.sqlite'}"
        config = build_config(load_cluster_ref("paper-3type"), db_url=db, time_scale=1e9)
        with background_server(config, limits=limits) as url:
            base = LimitedHttpToolsProtocol if parser is Parser.HTTPTOOLS else LimitedH11Protocol
            assert issubclass(chosen[-1], base) and chosen[-1].limits == limits
            yield url

    return start


def _connect(url: str) -> socket.socket:
    host, port = url.removeprefix("http://").split(":")
    return socket.create_connection((host, int(port)), timeout=MARGIN_S)


def _read_to_eof(sock: socket.socket) -> bytes:
    """Everything the server sends until it closes (a reset counts as the close); fails after MARGIN_S."""
    data = b""
    sock.settimeout(MARGIN_S)
    while True:
        try:
            chunk = sock.recv(65536)
        except ConnectionResetError:
            return data
        if not chunk:
            return data
        data += chunk


def _status(response: bytes) -> int:
    assert response.startswith(b"HTTP/1.1 "), response[:200]
    return int(response.split(b" ", 2)[1])


def _read_response(sock: socket.socket) -> bytes:
    """One response with a Content-Length, read whole."""
    sock.settimeout(MARGIN_S)
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        assert chunk, f"closed after {data!r}"
        data += chunk
    head = data.split(b"\r\n\r\n", 1)[0]
    match = re.search(rb"(?i)\r\ncontent-length: *(\d+)", head)
    assert match, head
    length = int(match.group(1))
    while len(data) < len(head) + 4 + length:
        data += sock.recv(65536)
    return data


def _get(path: str = "/healthz", extra: str = "") -> bytes:
    return f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n{extra}\r\n".encode()


def _healthy(url: str) -> bool:
    with httpx.Client(base_url=url, timeout=MARGIN_S) as client:
        return client.get("/healthz").status_code == 200


def _wait(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + MARGIN_S
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.05)


# --- the defaults and the flags -------------------------------------------------------------------------------


def test_the_defaults_are_on_and_bad_values_name_the_flag_and_range() -> None:
    options = uvicorn_options()
    assert issubclass(options["http"], LimitedHttpToolsProtocol)  # the fast parser is kept
    assert options["http"].limits == DEFAULT_LIMITS == HttpLimits()
    assert DEFAULT_LIMITS.max_header_bytes == 32768 and DEFAULT_LIMITS.max_connections == 512
    assert options["timeout_keep_alive"] == 30 and options["limit_concurrency"] == 512
    assert options["h11_max_incomplete_event_size"] == 32768
    with pytest.raises(ValueError, match=r"--max-header-bytes must be in \[1024, 1048576\], got 100"):
        HttpLimits(max_header_bytes=100)
    with pytest.raises(ValueError, match=r"--header-timeout-s must be in \[0.1, 3600\], got nan"):
        HttpLimits(header_timeout_s=float("nan"))
    with pytest.raises(ValueError, match=r"--keep-alive-s must be in \[1, 3600\], got 0"):
        HttpLimits(keep_alive_s=0)
    with pytest.raises(ValueError, match=r"--max-connections must be in \[2, 1048576\], got 1"):
        HttpLimits(max_connections=1)


def test_frenzy_serve_passes_its_flags_and_refuses_bad_ones(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    seen: list[HttpLimits] = []
    monkeypatch.setattr(server_module, "build_config", lambda cluster, **kw: None)
    monkeypatch.setattr(server_module, "serve", lambda config, host, port, limits: seen.append(limits))
    monkeypatch.chdir(tmp_path)
    assert main(["serve"]) == 0
    flags = ["--max-header-bytes", "4096", "--header-timeout-s", "2.5", "--keep-alive-s", "75"]
    assert main(["serve", *flags, "--max-connections", "64"]) == 0
    assert seen == [
        DEFAULT_LIMITS,
        HttpLimits(max_header_bytes=4096, header_timeout_s=2.5, keep_alive_s=75, max_connections=64),
    ]
    assert main(["serve", "--header-timeout-s", "0"]) == 2
    assert "--header-timeout-s must be in [0.1, 3600], got 0.0" in capsys.readouterr().err
    assert len(seen) == 2


def test_head_bytes_counts_the_request_line_and_fields() -> None:
    raw = _get("/v1/jobs?limit=5", "Authorization: Bearer abc\r\n")
    assert head_bytes(b"GET", b"/v1/jobs?limit=5", [(b"Host", b"127.0.0.1"), (b"Authorization", b"Bearer abc")]) == len(
        raw
    )


# --- the head's size ----------------------------------------------------------------------------------------


class _Transport(asyncio.Transport):
    """Records what a protocol writes; never sends anything anywhere."""

    def __init__(self) -> None:
        super().__init__()
        self.written, self.closed, self.eof = b"", False, False

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return {"sockname": ("127.0.0.1", 8000), "peername": ("127.0.0.1", 40000)}.get(name, default)

    def write(self, data: bytes | bytearray | memoryview) -> None:
        assert not self.eof
        self.written += bytes(data)

    def can_write_eof(self) -> bool:
        return True

    def write_eof(self) -> None:
        self.eof = True

    def close(self) -> None:
        self.closed = True

    def is_closing(self) -> bool:
        return self.closed

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass


async def _no_app(scope: Any, receive: Any, send: Any) -> None:
    raise AssertionError("a refused head must not reach the application")


class _CountingParser:
    """httptools' parser, counting the bytes fed to it."""

    def __init__(self, parser: Any, fed: list[int]) -> None:
        self.parser, self.fed = parser, fed

    def feed_data(self, data: bytes) -> None:
        self.fed.append(len(data))
        self.parser.feed_data(data)


def test_an_endless_header_is_refused_after_the_limit_plus_one_read(parser: Parser) -> None:
    """Consistency of the protocol with its own bound, without a socket: of 1,024 reads of 4 KiB (4 MiB of one
    header line), what reaches the parser stops at the limit plus one read, and the answer is 431."""
    limits, read = HttpLimits(max_header_bytes=16384), 4096
    loop = asyncio.new_event_loop()
    try:
        config = uvicorn.Config(_no_app, log_level="warning", **uvicorn_options(limits, parser))
        config.load()
        protocol = config.http_protocol_class(config=config, server_state=ServerState(), app_state={}, _loop=loop)
        transport = _Transport()
        protocol.connection_made(transport)
        fed: list[int] = []
        if parser is Parser.HTTPTOOLS:
            protocol.parser = _CountingParser(protocol.parser, fed)
        else:
            receive = protocol.conn.receive_data

            def counting(data: bytes) -> None:
                fed.append(len(data))
                receive(data)

            protocol.conn.receive_data = counting
        start = b"GET / HTTP/1.1\r\nX-Pad: "
        protocol.data_received(start + b"a" * (read - len(start)))
        for _ in range(3):
            protocol.data_received(b"a" * read)
        assert not transport.written  # 16384 bytes: at the limit, not over it
        for _ in range(1020):
            protocol.data_received(b"a" * read)
        assert sum(fed) == limits.max_header_bytes + read
        assert _status(transport.written) == 431 and b"connection: close" in transport.written
        assert transport.eof and not transport.closed  # half-closed, reading and dropping for LINGER_S
        protocol.connection_lost(None)
    finally:
        loop.close()


def test_a_head_over_the_limit_answers_431_and_the_server_stays_healthy(
    serve: Callable[[HttpLimits], contextlib.AbstractContextManager[str]],
) -> None:
    limits = HttpLimits(max_header_bytes=4096)
    with serve(limits) as url:
        with httpx.Client(base_url=url, timeout=MARGIN_S) as client:
            assert client.get("/healthz", headers={"X-Pad": "a" * 3000}).status_code == 200  # under the limit
            assert client.get("/v1/cluster").status_code == 200
            answer = client.get("/healthz", headers={"X-Pad": "a" * 5000})  # a whole head in one read
            assert answer.status_code == 431
            assert "over 4096 bytes" in answer.json()["detail"] and answer.headers["connection"] == "close"
            answer = client.get("/healthz", headers={f"X-{i}": "a" * 100 for i in range(50)})  # many small fields
            assert answer.status_code == 431
        with _connect(url) as sock:  # 8 MiB of one header that never ends: refused long before its end
            sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Pad: ")
            with contextlib.suppress(BrokenPipeError, ConnectionResetError):
                for _ in range(128):
                    sock.sendall(b"a" * 65536)
            assert _status(_read_to_eof(sock)) == 431
        assert _healthy(url)


@pytest.mark.slow
def test_normal_requests_pass_with_the_default_limits(
    serve: Callable[[HttpLimits], contextlib.AbstractContextManager[str]],
) -> None:
    with serve(DEFAULT_LIMITS) as url, httpx.Client(base_url=url, timeout=MARGIN_S) as client:
        headers = {"Idempotency-Key": "k1", "X-Pad": "a" * 30_000}  # near the 32 KiB limit
        job = client.post("/v1/jobs", json=SMALL, headers=headers)
        assert job.status_code == 202
        assert client.post("/v1/jobs", json=SMALL, headers=headers).json()["id"] == job.json()["id"]
        assert job.json()["id"] in {j["id"] for j in client.get("/v1/jobs").json()["items"]}


def test_pipelined_requests_under_the_limit_each_pass(
    serve: Callable[[HttpLimits], contextlib.AbstractContextManager[str]],
) -> None:
    """Heads are measured one by one: three heads and a 100 KiB body in one write are not one large head."""
    body = b'{"model": "' + b"m" * 100_000 + b'"}'
    post = b"POST /v1/jobs HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
    post += b"Content-Length: %d\r\n\r\n" % len(body) + body
    pad = "X-Pad: " + "a" * 3000 + "\r\n"
    with serve(HttpLimits(max_header_bytes=4096)) as url, _connect(url) as sock:
        sock.sendall(_get(extra=pad) + post + _get(extra=pad + "Connection: close\r\n"))
        data = _read_to_eof(sock)
        assert re.findall(rb"HTTP/1\.1 (\d{3}) ", data) == [b"200", b"422", b"200"]


# --- the head's deadline and the idle keep-alive ---------------------------------------------------------------


class _EarlyLoop:
    """A loop whose timers fire as soon as the test runs them, before their time, as uvloop's can by up to a
    millisecond."""

    def __init__(self) -> None:
        self.timers: list[tuple[float, Callable[[], None]]] = []

    def call_later(self, delay: float, callback: Callable[[], None]) -> object:
        self.timers.append((delay, callback))
        return object()


def test_a_head_deadline_fired_early_waits_for_what_is_left() -> None:
    loop, expired = _EarlyLoop(), []
    guard = _Guard(loop, 0.05, lambda: expired.append(time.monotonic()))  # type: ignore[arg-type]
    started = time.monotonic()
    guard.start()
    loop.timers.pop()[1]()  # fired at once, 50 ms early: re-armed for what is left, nothing expired
    assert not expired and len(loop.timers) == 1 and 0 < loop.timers[0][0] <= 0.05
    while not expired:
        time.sleep(0.01)
        loop.timers.pop()[1]()
    assert expired[0] - started >= 0.05 and guard.deadline is None


@pytest.mark.slow
def test_an_unfinished_head_is_closed_at_its_deadline_even_when_it_trickles(
    serve: Callable[[HttpLimits], contextlib.AbstractContextManager[str]],
) -> None:
    timeout_s = 1.0
    with serve(HttpLimits(header_timeout_s=timeout_s, keep_alive_s=60)) as url:
        started = time.monotonic()
        with _connect(url) as silent, _connect(url) as partial:
            partial.sendall(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ")
            response = _read_to_eof(partial)
            assert timeout_s <= time.monotonic() - started < timeout_s + MARGIN_S
            assert _status(response) == 408 and b"not complete within 1 s" in response
            assert _read_to_eof(silent) == b""  # nothing sent: closed without an answer
        with _connect(url) as trickle:  # one header byte every 0.1 s: the deadline is not extended by data
            started = time.monotonic()
            trickle.sendall(b"GET /healthz HTTP/1.1\r\n")
            with pytest.raises((BrokenPipeError, ConnectionResetError)):
                while time.monotonic() - started < 3 * timeout_s:
                    trickle.sendall(b"X")
                    time.sleep(0.1)
            assert timeout_s <= time.monotonic() - started
        with _connect(url) as sock:  # a complete head in time is served; idle between requests is keep-alive
            for _ in range(2):
                sock.sendall(_get())
                assert _status(_read_response(sock)) == 200
                time.sleep(1.5 * timeout_s)
        assert _healthy(url)


@pytest.mark.slow
def test_an_idle_keep_alive_connection_is_closed_after_keep_alive_s(
    serve: Callable[[HttpLimits], contextlib.AbstractContextManager[str]],
) -> None:
    with serve(HttpLimits(keep_alive_s=1, header_timeout_s=60)) as url, _connect(url) as sock:
        started = time.monotonic()
        sock.sendall(_get())
        response = _read_to_eof(sock)  # the answer, then the close once idle for keep_alive_s
        assert _status(response) == 200 and response.count(b"HTTP/1.1 ") == 1
        assert 1.0 - TIMER_SLACK_S <= time.monotonic() - started < 1.0 + MARGIN_S


# --- connections ------------------------------------------------------------------------------------------------


def _one_request(url: str) -> int | str:
    """The status of a GET /healthz on a new connection, or "closed" when the server closed it unanswered."""
    try:
        with httpx.Client(base_url=url, timeout=MARGIN_S) as client:
            return client.get("/healthz").status_code
    except httpx.TransportError:
        return "closed"


def test_a_request_at_the_connection_cap_answers_503_and_one_more_connection_is_closed(
    serve: Callable[[HttpLimits], contextlib.AbstractContextManager[str]],
) -> None:
    with serve(HttpLimits(max_connections=4, keep_alive_s=60, header_timeout_s=60)) as url:
        idle = [httpx.Client(base_url=url, timeout=MARGIN_S) for _ in range(3)]  # kept alive, idle
        try:
            assert all(c.get("/healthz").status_code == 200 for c in idle)
            assert _one_request(url) == 503  # the 4th connection counts itself: at the cap
            with _connect(url) as fourth:  # a 4th connection, silent
                _wait(lambda: _one_request(url) == "closed", "a 5th connection was not closed at once")
                fourth.sendall(_get())
                assert _status(_read_to_eof(fourth)) == 503
            idle.pop().close()
            idle.pop().close()
            _wait(lambda: _one_request(url) == 200, "no 200 after two idle connections closed")
        finally:
            for client in idle:
                client.close()


@pytest.mark.slow
def test_a_flood_of_half_open_connections_locks_no_one_out_once_they_time_out(
    serve: Callable[[HttpLimits], contextlib.AbstractContextManager[str]],
) -> None:
    timeout_s = 2.0
    with serve(HttpLimits(max_connections=8, header_timeout_s=timeout_s)) as url:
        flood = [_connect(url) for _ in range(100)]
        try:
            for sock in flood:
                with contextlib.suppress(OSError):
                    sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n")  # never finished
            assert _one_request(url) in (503, "closed")  # locked out while they hold the connections
            closed = sum(_read_to_eof(sock) == b"" for sock in flood)  # the 92 over the cap at once,
            assert closed >= 100 - 8  # the 8 after their deadline (with a 408)
            _wait(lambda: _one_request(url) == 200, "the service did not come back after the flood timed out")
        finally:
            for sock in flood:
                sock.close()
