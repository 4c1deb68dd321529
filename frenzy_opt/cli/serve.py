"""``frenzy serve`` and ``demo``: the HTTP service, and the serverless flow over it."""

from __future__ import annotations

import argparse
import json
import re
import shutil
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from rich.console import Console

from frenzy_opt.planning.scenario import load_cluster_ref, load_scenario

if TYPE_CHECKING:  # the report pulls in matplotlib: imported when compare runs
    pass

# --- serve and demo ------------------------------------------------------------------------------------


def db_url(text: str) -> str:
    """``--db`` as a SQLAlchemy URL: a plain path (no ``scheme://``) is a SQLite file (``myjobs.db`` ->
    ``sqlite:///myjobs.db``); a URL must parse and name a dialect SQLAlchemy has. ``ValueError`` says what a
    URL looks like."""
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError, NoSuchModuleError

    shape = "a path to a SQLite file (myjobs.db) or a SQLAlchemy URL such as sqlite:///myjobs.db or "
    shape += "postgresql+psycopg://user:password@host/dbname"
    text = text.strip()
    if not text:
        raise ValueError(f"--db: give {shape}")
    if "://" not in text:
        folder = Path(text).expanduser().parent
        if not folder.is_dir():
            raise ValueError(f"--db: folder {folder} of SQLite file {text!r} does not exist")
        return f"sqlite:///{Path(text).expanduser()}"
    try:
        make_url(text).get_dialect()
    except (ArgumentError, NoSuchModuleError, ValueError) as err:
        raise ValueError(f"--db: {text!r} is not a database URL SQLAlchemy can use ({err}); give {shape}") from None
    return text


def cmd_serve(args: argparse.Namespace) -> int:
    from frenzy_opt.api.httplimits import HttpLimits
    from frenzy_opt.api.server import build_config, serve
    from frenzy_opt.api.workers import MAX_WORKERS, WorkerSettings

    if not 0 <= args.port <= 65535:
        raise ValueError(f"--port must be in [0, 65535], got {args.port}")
    if not 1 <= args.workers <= MAX_WORKERS:
        raise ValueError(f"--workers must be in [1, {MAX_WORKERS}], got {args.workers}")
    limits = HttpLimits(  # checked first: a bad flag fails before the store is opened
        max_header_bytes=args.max_header_bytes,
        header_timeout_s=args.header_timeout_s,
        keep_alive_s=args.keep_alive_s,
        max_connections=args.max_connections,
    )
    config = build_config(
        load_cluster_ref(args.cluster),
        db_url=db_url(args.db),
        executor=args.executor,
        tokens=args.tokens,
        time_scale=args.time_scale,
        fail_rate=args.fail_rate,
        decision_wait_s=args.decision_wait_s,
        workdir=args.workdir,
        calibration=args.calibration,
        create=args.create,
    )
    if args.workers == 1:
        serve(config, args.host, args.port, limits)
        return 0
    workers = WorkerSettings(
        db_url=db_url(args.db),
        cluster=args.cluster,
        executor=args.executor,
        tokens=args.tokens,
        scheduler_url="",  # the scheduler process's private port, set when it listens
        parent_pid=0,
    )
    serve(config, args.host, args.port, limits, workers, args.workers)
    return 0


def wrap_clauses(line: str, width: int, indent: int = 11) -> str:
    """A long line broken between its clauses (after ``; `` or ``, ``), never inside one, continuation lines
    indented past the demo's time stamp; a clause longer than the width stays whole on its own line."""
    if len(line) <= width:
        return line
    pieces = re.split(r"(?<=[;,]) ", line)
    lines = [pieces[0]]
    for piece in pieces[1:]:
        if len(lines[-1]) + 1 + len(piece) <= width:
            lines[-1] += " " + piece
        else:
            lines.append(" " * indent + piece)
    return "\n".join(lines)


def cmd_demo(args: argparse.Namespace) -> int:
    from frenzy_opt.api.server import demo

    scenario = load_scenario(args.scenario)
    console = Console(soft_wrap=True)
    width = shutil.get_terminal_size((120, 24)).columns

    def say(line: str) -> None:
        console.print(wrap_clauses(line, width), highlight=False)

    result = demo(scenario, time_scale=args.time_scale, say=say)
    if args.json:
        sys.stdout.write(json.dumps(result, indent=2) + "\n")
    return 0 if all(state == "succeeded" for state in result["jobs"].values()) else 1
