"""A private PostgreSQL server for tests: ``initdb`` in a temporary directory, a free port on 127.0.0.1, no
password (trust on loopback only), fsync off (a test server: durability across power loss is not under test;
a ``kill -9`` of the service, which is, does not need it). Started once per test session by the
``postgres_server`` fixture (tests/conftest.py); each test gets a database of its own.

Debian's ``postgresql`` package puts its binaries under ``/usr/lib/postgresql/<major>/bin``. PostgreSQL refuses
to run as root (https://www.postgresql.org/docs/15/app-initdb.html), so as root the server runs as the
package's ``postgres`` user.
"""

from __future__ import annotations

import glob
import itertools
import os
import pwd
import shutil
import subprocess
import tempfile
from dataclasses import dataclass

from frenzy_opt.core.machine import free_port

_COUNTER = itertools.count()


def binaries() -> str | None:
    """The folder of ``initdb`` and ``pg_ctl``, or None when PostgreSQL is not installed."""
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"))
    if found:
        return os.path.dirname(found[-1])
    initdb = shutil.which("initdb")
    return None if initdb is None else os.path.dirname(os.path.realpath(initdb))


def missing() -> str | None:
    """Why a PostgreSQL test cannot run here (None when it can)."""
    try:
        import psycopg  # noqa: F401
    except ImportError:
        return "the psycopg driver is not installed (pip install 'psycopg[binary]==3.3.9')"
    if binaries() is None:
        return "PostgreSQL is not installed (Debian: apt-get install postgresql; .ci/run does it)"
    if os.geteuid() == 0:
        try:
            pwd.getpwnam("postgres")
        except KeyError:
            return "running as root and there is no postgres user to run the server as"
    return None


@dataclass
class PostgresServer:
    root: str
    port: int
    as_user: list[str]
    """The command prefix that runs a server binary (``runuser -u postgres --`` as root)."""
    bindir: str
    data: str
    user: str = "frenzy"

    @staticmethod
    def start() -> PostgresServer:
        bindir = binaries()
        assert bindir is not None
        root = tempfile.mkdtemp(prefix="frenzy-pg-")
        as_user: list[str] = []
        if os.geteuid() == 0:
            entry = pwd.getpwnam("postgres")
            os.chown(root, entry.pw_uid, entry.pw_gid)
            as_user = ["runuser", "-u", "postgres", "--"]
        data = os.path.join(root, "data")
        server = PostgresServer(root=root, port=free_port(), as_user=as_user, bindir=bindir, data=data)
        initdb = [f"{bindir}/initdb", "-D", data, "-U", server.user, "--auth=trust", "-E", "UTF8", "--no-sync"]
        subprocess.run([*as_user, *initdb], check=True, capture_output=True, timeout=120)
        server._start()
        return server

    def _start(self) -> None:
        """pg_ctl start, its output to a log file (a pipe would be held open by the server)."""
        options = f"-p {self.port} -k {self.root} -c listen_addresses=127.0.0.1 -c fsync=off -c max_connections=200"
        log = os.path.join(self.root, "log")
        start = [f"{self.bindir}/pg_ctl", "-D", self.data, "-o", options, "-l", log, "-w", "start"]
        subprocess.run([*self.as_user, *start], check=True, capture_output=True, timeout=120)

    def restart(self) -> None:
        """Stop the server at once (every session dropped, as in a crash or a failover) and start it again
        with the same options."""
        stop = [f"{self.bindir}/pg_ctl", "-D", self.data, "-m", "immediate", "-w", "stop"]
        subprocess.run([*self.as_user, *stop], check=True, capture_output=True, timeout=120)
        self._start()

    def stop(self) -> None:
        stop = [f"{self.bindir}/pg_ctl", "-D", self.data, "-m", "immediate", "-w", "stop"]
        subprocess.run([*self.as_user, *stop], capture_output=True, timeout=60)
        shutil.rmtree(self.root, ignore_errors=True)

    def url(self, database: str) -> str:
        return f"postgresql+psycopg://{self.user}@127.0.0.1:{self.port}/{database}"

    def new_database(self) -> str:
        """A fresh database; its SQLAlchemy URL."""
        import psycopg

        name = f"t{os.getpid()}_{next(_COUNTER)}"
        with psycopg.connect(f"host=127.0.0.1 port={self.port} user={self.user} dbname=postgres", autocommit=True) as c:
            c.execute(f'CREATE DATABASE "{name}"')
        return self.url(name)
