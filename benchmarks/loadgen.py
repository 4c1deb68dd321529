"""The load generator of ``benchmarks/service_load.py``, run as a process of its own so that its CPU time is not
the server's: ``--jobs`` POST /v1/jobs with ``--concurrency`` requests in flight, each on a keep-alive HTTP/1.1
connection of its own, each with its own ``Idempotency-Key``. Prints one JSON object: the latencies (seconds,
from the request's first byte written to the answer's last byte read), the ids acknowledged, the error
statuses and the wall time.

The client is a minimal HTTP/1.1 writer and reader over asyncio streams (uvloop when installed): httpx's
pure-Python client costs about a millisecond of CPU per request, which on a 2-CPU machine is taken from the
server under test.

Usage: python benchmarks/loadgen.py --url http://127.0.0.1:PORT --bodies FILE.json --jobs N --concurrency C
[--prefix P] [--token T] [--wait S]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from pathlib import Path
from urllib.parse import urlsplit


async def _post(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, head: bytes, body: bytes
) -> tuple[int, bytes, bool]:
    """One request on an open connection: status, body, whether the server closes the connection."""
    writer.write(head + body)
    await writer.drain()
    raw = await reader.readuntil(b"\r\n\r\n")
    status = int(raw[9:12])
    length, close = 0, False
    for line in raw.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        name = name.strip().lower()
        if name == b"content-length":
            length = int(value)
        elif name == b"connection" and value.strip().lower() == b"close":
            close = True
    return status, await reader.readexactly(length), close


async def generate(
    url: str, bodies: list[bytes], jobs: int, concurrency: int, prefix: str, token: str | None, wait: float | None
) -> dict[str, object]:
    parts = urlsplit(url)
    host, port = parts.hostname or "127.0.0.1", parts.port or 80
    path = "/v1/jobs" + ("" if wait is None else f"?wait={wait:g}")
    auth = f"Authorization: Bearer {token}\r\n" if token else ""
    latencies: list[float] = []
    ids: list[str] = []
    errors: list[int] = []
    next_job = iter(range(jobs))

    def key(i: int) -> str:
        return "" if prefix == "" else f"Idempotency-Key: {prefix}-{i}\r\n"

    async def worker() -> None:
        reader, writer = await asyncio.open_connection(host, port)
        try:
            for i in next_job:
                body = bodies[i % len(bodies)]
                head = (
                    f"POST {path} HTTP/1.1\r\nHost: {host}:{port}\r\nContent-Type: application/json\r\n"
                    f"Content-Length: {len(body)}\r\n{key(i)}{auth}\r\n"
                ).encode()
                start = time.perf_counter()
                status, answer, close = await _post(reader, writer, head, body)
                latencies.append(time.perf_counter() - start)
                if status == 202:
                    ids.append(json.loads(answer)["id"])
                else:
                    errors.append(status)
                if close:
                    writer.close()
                    reader, writer = await asyncio.open_connection(host, port)
        finally:
            writer.close()

    started = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return {"latencies_s": latencies, "ids": ids, "errors": errors, "wall_s": time.perf_counter() - started}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--url", required=True)
    parser.add_argument("--bodies", required=True, help="a JSON file: a list of job specs, sent in rotation")
    parser.add_argument("--jobs", type=int, required=True)
    parser.add_argument("--concurrency", type=int, required=True)
    parser.add_argument("--prefix", default="load", help="Idempotency-Key prefix (unique per run; empty: no key)")
    parser.add_argument("--token")
    parser.add_argument("--wait", type=float, help="?wait=SECONDS on every POST (default: none)")
    args = parser.parse_args()
    bodies = [json.dumps(b).encode() for b in json.loads(Path(args.bodies).read_text(encoding="utf-8"))]
    try:
        import uvloop

        uvloop.install()
    except ImportError:
        pass
    result = asyncio.run(generate(args.url, bodies, args.jobs, args.concurrency, args.prefix, args.token, args.wait))
    json.dump(result, sys.stdout)


if __name__ == "__main__":
    main()
