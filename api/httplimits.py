"""HTTP limits of the service's uvicorn server: the request head's size and read deadline, the idle keep-alive
and the number of connections.

uvicorn with httptools has neither a head size limit nor a head read timeout (issue 23's fault probe: a
256 MiB header answered 200, the server buffering all of it; thousands of unfinished heads kept open until
the process ran out of file descriptors). :func:`uvicorn_options` gives ``uvicorn.Config``/``uvicorn.run`` a
protocol class, a subclass of uvicorn's own ``HttpToolsProtocol`` (or ``H11Protocol`` where httptools is not
installed), that adds per connection:

- a **head size limit**: a request line plus header fields over ``max_header_bytes`` is answered 431 Request
  Header Fields Too Large (RFC 6585 §5) and the connection closed; an unfinished head is refused as soon as the
  bytes read for it pass the limit, so the server holds at most the limit plus one socket read per connection;
- a **head read deadline**: a connection whose request line and headers are not complete ``header_timeout_s``
  after it opened (or after the first byte of a later request on it) is closed, with 408 Request Timeout
  (RFC 9110 §15.5.9) when part of a head had arrived;
- a **connection cap**: a connection opened while ``max_connections`` are open is closed at once, so the
  process never holds more client sockets than that.

uvicorn's own settings do the rest: ``timeout_keep_alive`` closes a connection idle between requests and
``limit_concurrency`` answers 503 to a request that arrives while ``max_connections`` connections are open or
requests are in progress.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from enum import StrEnum
from http import HTTPStatus
from typing import Any, ClassVar

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol
from uvicorn.server import ServerState

try:
    import httptools
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

    HAVE_HTTPTOOLS = True
except ImportError:  # pragma: no cover - httptools is a dependency; h11 is uvicorn's own fallback
    HAVE_HTTPTOOLS = False

logger = logging.getLogger("uvicorn.error")

DEFAULT_MAX_HEADER_BYTES = 32 * 1024
"""The request line and all header fields together. nginx's default ``large_client_header_buffers 4 8k``
accepts at most 4 x 8 KiB of head (nginx docs, ngx_http_core_module), so a request nginx passes with its
defaults passes here; twice h11's and Node.js's 16 KiB (``DEFAULT_MAX_INCOMPLETE_EVENT_SIZE``,
``--max-http-header-size``). The service's own requests send a bearer token and an Idempotency-Key: < 1 KiB."""

MIN_HEADER_BYTES, MAX_HEADER_BYTES = 1024, 1 << 20
"""The range of ``--max-header-bytes``: 1 KiB holds any client's ordinary head (nginx's
``client_header_buffer_size 1k`` default: "for most requests, a buffer of 1K bytes is enough"); 1 MiB is Go's
``http.DefaultMaxHeaderBytes``, the most any common server accepts by default."""

DEFAULT_HEADER_TIMEOUT_S = 10.0
"""Request line and headers must be complete this long after the connection opened or the request's first
byte. The CIS NGINX Benchmark (5.2.1) recommends ``client_header_timeout 10`` (nginx's default is 60 s,
Apache's mod_reqtimeout ``header=20-40``): a 32 KiB head needs 4.7 s even at 56 kbit/s."""

MAX_TIMEOUT_S = 3600.0
"""Upper bound of ``--header-timeout-s`` and ``--keep-alive-s``: an hour; longer is a connection leak."""

MIN_HEADER_TIMEOUT_S = 0.1
"""Lower bound of ``--header-timeout-s``: one loopback round trip and a scheduling delay fit many times over."""

DEFAULT_KEEP_ALIVE_S = 30
"""Idle keep-alive between requests (uvicorn's ``timeout_keep_alive``, whose default is 5 s). Longer than
clients' own idle expiry (httpx: 5 s, uvicorn's default too): the client then closes an idle connection
first, and never sends a request on one the server is closing. Behind a proxy see docs/service.md."""

DEFAULT_MAX_CONNECTIONS = 512
"""Open connections (and requests in progress). Half of Linux's default soft ``RLIMIT_NOFILE`` of 1,024
(``ulimit -n``; systemd's ``DefaultLimitNOFILE``): the rest is left to the database, the plan-search workers'
pipes and the runs' log files, so a flood of idle sockets can no longer exhaust the descriptors and stop
``accept``. 16 x the 32 concurrent clients of the load benchmark (benchmarks/service_load.py)."""

MAX_CONNECTIONS = 1 << 20
"""Upper bound of ``--max-connections``: Linux's default ``fs.nr_open``, the most descriptors a process can
be allowed."""

LINGER_S = 5.0
"""After a 431 the server stops parsing, half-closes and reads and drops what the client still sends for at most
this long before it closes (nginx's ``lingering_timeout`` default, 5 s): closing a socket with unread data
makes the kernel send a reset, which can destroy the 431 before the client reads it."""


@dataclass(frozen=True, slots=True, kw_only=True)
class HttpLimits:
    """The service's HTTP limits; ``frenzy serve`` flags in brackets. ``ValueError`` names the flag and the
    allowed range."""

    max_header_bytes: int = DEFAULT_MAX_HEADER_BYTES
    """[--max-header-bytes] request line plus header fields, bytes; over it: 431 and the connection closed."""
    header_timeout_s: float = DEFAULT_HEADER_TIMEOUT_S
    """[--header-timeout-s] seconds from a connection's opening (or a request's first byte) until its head must
    be complete; else the connection is closed (408 if part of a head came)."""
    keep_alive_s: int = DEFAULT_KEEP_ALIVE_S
    """[--keep-alive-s] seconds an idle connection is kept open between requests."""
    max_connections: int = DEFAULT_MAX_CONNECTIONS
    """[--max-connections] open connections; one more is closed at once, and a request that arrives while this
    many are open (its own included) or in progress is answered 503."""

    def __post_init__(self) -> None:
        _check("--max-header-bytes", self.max_header_bytes, MIN_HEADER_BYTES, MAX_HEADER_BYTES)
        _check("--header-timeout-s", self.header_timeout_s, MIN_HEADER_TIMEOUT_S, MAX_TIMEOUT_S)
        _check("--keep-alive-s", self.keep_alive_s, 1, int(MAX_TIMEOUT_S))
        # 2: a connection counts itself against uvicorn's limit_concurrency, so 1 would answer every request 503.
        _check("--max-connections", self.max_connections, 2, MAX_CONNECTIONS)


def _check(flag: str, value: float, low: float, high: float) -> None:
    if isinstance(value, bool) or not low <= value <= high:  # NaN fails the comparison too
        low_text, high_text = (str(int(x)) if float(x).is_integer() else str(x) for x in (low, high))
        raise ValueError(f"{flag} must be in [{low_text}, {high_text}], got {value!r}")


DEFAULT_LIMITS = HttpLimits()


class Parser(StrEnum):
    """uvicorn's HTTP/1.1 parser: httptools (llhttp in C, the default where installed) or h11 (pure Python)."""

    HTTPTOOLS = "httptools"
    H11 = "h11"


def uvicorn_options(limits: HttpLimits = DEFAULT_LIMITS, parser: Parser | None = None) -> dict[str, Any]:
    """Keyword arguments for ``uvicorn.Config`` or ``uvicorn.run`` that enforce ``limits``: the protocol class
    (``parser``, default httptools when installed) and uvicorn's keep-alive, concurrency and h11 buffer limits."""
    parser = parser or (Parser.HTTPTOOLS if HAVE_HTTPTOOLS else Parser.H11)
    if parser is Parser.HTTPTOOLS and not HAVE_HTTPTOOLS:
        raise ValueError("parser httptools: the httptools package is not installed; use h11")
    base: type[asyncio.Protocol] = LimitedHttpToolsProtocol if parser is Parser.HTTPTOOLS else LimitedH11Protocol
    protocol = type(base.__name__, (base,), {"limits": limits})
    return {
        "http": protocol,
        "timeout_keep_alive": limits.keep_alive_s,
        "limit_concurrency": limits.max_connections,
        "h11_max_incomplete_event_size": limits.max_header_bytes,
    }


def head_bytes(method: bytes, target: bytes, headers: Sequence[tuple[bytes, bytes]]) -> int:
    """Size of a request head as sent without optional whitespace: ``METHOD SP target SP HTTP/1.1 CRLF``, one
    ``name: value CRLF`` per field, the final CRLF."""
    return len(method) + len(target) + 12 + sum(len(name) + len(value) + 4 for name, value in headers) + 2


class _Guard:
    """One connection's limits state: the head's deadline, whether it was refused, the lingering close."""

    __slots__ = ("_due", "_linger", "_loop", "_on_expiry", "_timeout_s", "deadline", "refused")

    def __init__(self, loop: asyncio.AbstractEventLoop, timeout_s: float, on_expiry: Callable[[], None]) -> None:
        self._loop, self._timeout_s, self._on_expiry = loop, timeout_s, on_expiry
        self.deadline: asyncio.TimerHandle | None = None
        self._due = 0.0
        self._linger: asyncio.TimerHandle | None = None
        self.refused = False

    def start(self) -> None:
        """Start the head's deadline unless it runs already."""
        if self.deadline is None:
            self._due = time.monotonic() + self._timeout_s
            self.deadline = self._loop.call_later(self._timeout_s, self._expire)

    def stop(self) -> None:
        if self.deadline is not None:
            self.deadline.cancel()
            self.deadline = None

    def _expire(self) -> None:
        # uvloop's timers count from libuv's loop time, cached at the start of the loop's iteration
        # (libuv docs, uv_now), and in whole milliseconds, so a timer can fire up to about a millisecond before
        # ``timeout_s`` has passed since ``start``: re-arm for what is left, so the head is never cut early.
        left = self._due - time.monotonic()
        if left > 0:
            self.deadline = self._loop.call_later(left, self._expire)
            return
        self.deadline = None
        self._on_expiry()

    def refuse(
        self, transport: asyncio.Transport, server_state: ServerState, status: int, detail: str, *, linger: bool
    ) -> None:
        """Answer ``status`` with a JSON ``detail`` and ``Connection: close``, then close: at once, or with
        ``linger`` after a half-close and at most :data:`LINGER_S` of reading and dropping the client's data."""
        self.stop()
        self.refused = True
        if transport.is_closing():
            return
        body = json.dumps({"detail": detail}).encode()
        lines = [f"HTTP/1.1 {status} {HTTPStatus(status).phrase}".encode()]
        lines += [name + b": " + value for name, value in server_state.default_headers]
        lines += [b"content-type: application/json", b"content-length: %d" % len(body), b"connection: close"]
        transport.write(b"\r\n".join(lines) + b"\r\n\r\n" + body)
        if linger and transport.can_write_eof():
            transport.write_eof()
            self._linger = self._loop.call_later(LINGER_S, transport.close)
        else:
            transport.close()

    def close(self) -> None:
        """The connection is gone: cancel the timers."""
        self.stop()
        if self._linger is not None:
            self._linger.cancel()
            self._linger = None


def _over_cap(protocol: LimitedH11Protocol | LimitedHttpToolsProtocol) -> bool:
    """Close a new connection at once when it makes more than ``max_connections``."""
    if len(protocol.connections) <= protocol.limits.max_connections:
        return False
    logger.warning("Over %d open connections: new connection closed.", protocol.limits.max_connections)
    protocol.transport.close()
    return True


class _HeadTooLarge(Exception):
    """Raised from a parser callback to stop parsing a head over the limit."""


if HAVE_HTTPTOOLS:

    class LimitedHttpToolsProtocol(HttpToolsProtocol):
        """uvicorn's httptools protocol with the head size limit, the head deadline and the connection cap.

        Head bytes are counted per socket read: a read that starts and ends inside the same unfinished head
        counts whole; the head that finishes is measured as parsed (:func:`head_bytes`)."""

        limits: ClassVar[HttpLimits] = DEFAULT_LIMITS

        def __init__(
            self,
            config: Any,
            server_state: ServerState,
            app_state: dict[str, Any],
            _loop: asyncio.AbstractEventLoop | None = None,
        ) -> None:
            super().__init__(config, server_state, app_state, _loop)
            self._guard = _Guard(self.loop, self.limits.header_timeout_s, self._head_expired)
            self._head_done = False  # the current request's head was parsed; False again at its end
            self._heads = 0  # heads parsed on this connection
            self._head_read_bytes = 0  # bytes of whole reads into the current unfinished head
            self._head_begun = False  # some of the current head arrived

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            if not _over_cap(self):
                self._guard.start()

        def connection_lost(self, exc: Exception | None) -> None:
            self._guard.close()
            super().connection_lost(exc)

        def data_received(self, data: bytes) -> None:
            if self._guard.refused:  # lingering after a 431: drop what still comes
                return
            pending, heads = not self._head_done, self._heads
            self._unset_keepalive_if_required()
            try:
                self.parser.feed_data(data)
            except httptools.HttpParserError as err:
                if isinstance(err.__context__, _HeadTooLarge):  # raised by on_headers_complete below
                    self._refuse_too_large()
                    return
                msg = "Invalid HTTP request received."
                self.logger.warning(msg)
                self.send_400_response(msg)
                return
            except httptools.HttpParserUpgrade:
                if self._should_upgrade():
                    self.handle_websocket_upgrade()
                else:
                    self._unsupported_upgrade_warning()
                return
            if self._head_done:
                return
            # The whole read belongs to the unfinished head only if it started and ended in that head; when a
            # head finished inside this read and the next began, the new head's share is unknown: not counted.
            self._head_read_bytes = self._head_read_bytes + len(data) if pending and heads == self._heads else 0
            if self._head_read_bytes > self.limits.max_header_bytes:
                self._refuse_too_large()

        def on_message_begin(self) -> None:
            self._head_begun = True
            self._guard.start()
            super().on_message_begin()

        def on_headers_complete(self) -> None:
            self._guard.stop()
            self._head_done, self._heads, self._head_read_bytes, self._head_begun = True, self._heads + 1, 0, False
            if head_bytes(self.parser.get_method(), self.url, self.headers) > self.limits.max_header_bytes:
                raise _HeadTooLarge
            super().on_headers_complete()

        def on_message_complete(self) -> None:
            self._head_done = False
            super().on_message_complete()

        def _responding(self) -> bool:
            return self.cycle is not None and not self.cycle.response_complete

        def _refuse_too_large(self) -> None:
            if self._responding():  # a pipelined head while a response is written: no room for a 431
                self._guard.refused = True
                self.transport.close()
                return
            detail = f"request line and headers over {self.limits.max_header_bytes} bytes"
            self.logger.warning("Request header fields too large: %s.", detail)
            self._guard.refuse(self.transport, self.server_state, 431, detail, linger=True)

        def _head_expired(self) -> None:
            if self.transport.is_closing():
                return
            if self._head_begun and not self._responding():
                detail = f"request line and headers not complete within {self.limits.header_timeout_s:g} s"
                self._guard.refuse(self.transport, self.server_state, 408, detail, linger=False)
            else:
                self.transport.close()


class _H11Connection(h11.Connection):
    """h11's server connection that also refuses a complete head over the limit (h11 bounds only an
    incomplete one, with ``max_incomplete_event_size``) and keeps the status its last error calls for."""

    def __init__(self, max_header_bytes: int) -> None:
        super().__init__(h11.SERVER, max_incomplete_event_size=max_header_bytes)
        self.max_header_bytes = max_header_bytes
        self.error_status = 400

    def next_event(self) -> Any:
        try:
            event = super().next_event()
        except h11.RemoteProtocolError as err:
            self.error_status = err.error_status_hint
            raise
        if isinstance(event, h11.Request):
            size = head_bytes(event.method, event.target, event.headers.raw_items())
            if size > self.max_header_bytes:
                self.error_status = 431
                raise h11.RemoteProtocolError("request head too large", error_status_hint=431)
        return event


class LimitedH11Protocol(H11Protocol):
    """uvicorn's h11 protocol with the head size limit (431), the head deadline and the connection cap."""

    limits: ClassVar[HttpLimits] = DEFAULT_LIMITS

    def __init__(
        self,
        config: Any,
        server_state: ServerState,
        app_state: dict[str, Any],
        _loop: asyncio.AbstractEventLoop | None = None,
    ) -> None:
        super().__init__(config, server_state, app_state, _loop)
        self.conn = self._conn = _H11Connection(self.limits.max_header_bytes)
        self._guard = _Guard(self.loop, self.limits.header_timeout_s, self._head_expired)

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        if not _over_cap(self):
            self._guard.start()

    def connection_lost(self, exc: Exception | None) -> None:
        self._guard.close()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self._guard.refused:  # lingering after a 431: drop what still comes
            return
        if self.conn.their_state is h11.IDLE:
            self._guard.start()
        super().data_received(data)
        if self.conn.their_state is not h11.IDLE:
            self._guard.stop()

    def send_400_response(self, msg: str) -> None:
        if self._conn.error_status != 431:
            super().send_400_response(msg)
            return
        detail = f"request line and headers over {self.limits.max_header_bytes} bytes"
        self._guard.refuse(self.transport, self.server_state, 431, detail, linger=True)

    def _head_expired(self) -> None:
        if self.transport.is_closing():
            return
        if self.conn.their_state is h11.IDLE and self.conn.trailing_data[0]:
            detail = f"request line and headers not complete within {self.limits.header_timeout_s:g} s"
            self._guard.refuse(self.transport, self.server_state, 408, detail, linger=False)
        else:
            self.transport.close()
