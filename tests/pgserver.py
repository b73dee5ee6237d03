"""A throwaway PostgreSQL server on 127.0.0.1, for the test suite and the import bench.

Standard library only (no sluicegate, no psycopg), so ``bench/import_rules.py``
can share it. Uses Debian's ``postgresql`` package (``/usr/lib/postgresql/*/bin``;
``make test`` installs it). PostgreSQL refuses to run as root, so as root the
server runs as the ``postgres`` system user (``runuser``) in a temp dir handed
to that user.

Example:
    >>> with PostgresServer() as server:  # doctest: +SKIP
    ...     print(server.dsn())
    host=127.0.0.1 port=40123 user=postgres dbname=postgres
"""

from __future__ import annotations

import atexit
import contextlib
import glob
import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

HOST = "127.0.0.1"
SUPERUSER = "postgres"
RUN_AS = "postgres"  # the system user Debian's package creates, for when we are root
#: Safe only for a throwaway cluster: a crash may lose it, which tests do not care about.
FAST_SETTINGS = {"fsync": "off", "synchronous_commit": "off", "full_page_writes": "off"}
TIMEOUT_S = 60

_running: set[PostgresServer] = set()


class PostgresNotInstalled(RuntimeError):
    """The PostgreSQL server binaries (initdb, pg_ctl) are not on this machine."""


def find_bin_dir() -> Path:
    """The newest ``/usr/lib/postgresql/<version>/bin`` with initdb and pg_ctl (or the ones on PATH)."""
    candidates = sorted(
        (Path(path).parent for path in glob.glob("/usr/lib/postgresql/*/bin/pg_ctl")),
        key=lambda path: int(path.parent.name) if path.parent.name.isdigit() else 0,
        reverse=True,
    )
    on_path = shutil.which("pg_ctl")
    if on_path:
        candidates.append(Path(on_path).parent)
    for directory in candidates:
        if (directory / "initdb").is_file() and (directory / "pg_ctl").is_file():
            return directory
    raise PostgresNotInstalled(
        "PostgreSQL server binaries (initdb, pg_ctl) not found under /usr/lib/postgresql/*/bin or on PATH: "
        "`make test` installs them (Debian package `postgresql`), or run `apt-get install postgresql`"
    )


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((HOST, 0))
        return int(sock.getsockname()[1])


class PostgresServer:
    """One cluster in a temp dir, on a free port of 127.0.0.1, with trust auth; ``close()`` removes it all.

    ``fast=True`` turns off fsync and friends (tests); ``fast=False`` keeps PostgreSQL's
    durable defaults (benchmarks that should reflect a real server's commit cost).
    ``stop()``/``start()`` may be called any number of times (outage tests); the
    port and the data survive a restart.
    """

    def __init__(self, *, fast: bool = True, settings: dict[str, str] | None = None) -> None:
        self.bin_dir = find_bin_dir()
        self.port = free_port()
        self._fast = fast
        self._settings = settings or {}
        self._prefix = self._run_as_prefix()
        # Not pytest's tmp_path: that lives under a root-only (0700) directory the postgres user cannot enter.
        self.root = Path(tempfile.mkdtemp(prefix="sluicegate-pg-"))
        self.data_dir = self.root / "data"
        self.socket_dir = self.root / "sock"
        self.log_file = self.root / "server.log"
        self._initialised = False

    def _run_as_prefix(self) -> list[str]:
        if os.geteuid() != 0:
            return []
        try:
            pwd.getpwnam(RUN_AS)
        except KeyError as exc:
            raise PostgresNotInstalled(
                f"running as root and there is no {RUN_AS!r} system user to run PostgreSQL as: "
                "install Debian's `postgresql` package (`make test` does)"
            ) from exc
        return ["runuser", "-u", RUN_AS, "--"]

    def dsn(self, dbname: str = "postgres", **params: str) -> str:
        """A libpq connection string for ``dbname`` (extra ``params`` appended as ``key='value'``)."""
        parts = {"host": HOST, "port": str(self.port), "user": SUPERUSER, "dbname": dbname, **params}
        return " ".join(f"{key}='{_quote(value)}'" for key, value in parts.items())

    @property
    def running(self) -> bool:
        return self.pid() is not None

    def pid(self) -> int | None:
        """The postmaster's PID while it runs (from postmaster.pid), else None."""
        try:
            pid = int((self.data_dir / "postmaster.pid").read_text().split("\n", 1)[0])
        except (OSError, ValueError):
            return None
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return None
        except PermissionError:
            pass  # alive, owned by another user
        return pid

    def _pg(self, tool: str, *args: str) -> None:
        command = [*self._prefix, str(self.bin_dir / tool), *args]
        done = subprocess.run(command, capture_output=True, text=True, timeout=TIMEOUT_S, check=False)
        if done.returncode != 0:
            log = self.log_file.read_text(errors="replace")[-2000:] if self.log_file.exists() else ""
            raise RuntimeError(f"{tool} failed ({done.returncode}): {done.stdout}{done.stderr}\n{log}")

    def _initdb(self) -> None:
        self.socket_dir.mkdir()
        if self._prefix:
            user = pwd.getpwnam(RUN_AS)
            for path in (self.root, self.socket_dir):
                os.chown(path, user.pw_uid, user.pw_gid)
        self._pg(
            "initdb",
            *("-D", str(self.data_dir), "-U", SUPERUSER, "-A", "trust", "-E", "UTF8", "--locale=C"),
            *("--no-sync", "--no-instructions"),
        )
        settings = {
            "listen_addresses": f"'{HOST}'",
            "port": str(self.port),
            "unix_socket_directories": f"'{self.socket_dir}'",
            "max_connections": "200",
            **(FAST_SETTINGS if self._fast else {}),
            **self._settings,
        }
        with (self.data_dir / "postgresql.conf").open("a") as conf:  # appending keeps the postgres owner
            conf.write("\n# sluicegate test server\n")
            conf.writelines(f"{name} = {value}\n" for name, value in settings.items())
        self._initialised = True

    def start(self) -> None:
        """Start the server (initialising the cluster the first time) and wait until it accepts connections."""
        if not self._initialised:
            self._initdb()
        if self.running:
            return
        _running.add(self)
        self._pg("pg_ctl", "start", "-D", str(self.data_dir), "-l", str(self.log_file), "-w", "-t", str(TIMEOUT_S))

    def stop(self) -> None:
        """Stop the server (fast shutdown: clients are disconnected); kill it if that does not work."""
        pid = self.pid()
        if pid is None:
            return
        try:
            self._pg("pg_ctl", "stop", "-D", str(self.data_dir), "-m", "fast", "-w", "-t", "30")
        except (RuntimeError, subprocess.TimeoutExpired):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
            deadline = time.monotonic() + 10
            while self.pid() is not None and time.monotonic() < deadline:
                time.sleep(0.05)

    @contextlib.contextmanager
    def outage(self) -> Iterator[None]:
        """The server is down inside the block and up again after it, even if the block fails."""
        self.stop()
        try:
            yield
        finally:
            self.start()

    def close(self) -> None:
        """Stop the server and delete its files."""
        try:
            self.stop()
        finally:
            _running.discard(self)
            shutil.rmtree(self.root, ignore_errors=True)

    def __enter__(self) -> PostgresServer:
        try:
            self.start()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def _quote(value: str) -> str:
    return value.replace("\\", "\\\\").replace("'", "\\'")


@atexit.register
def _close_leftovers() -> None:
    # Backstop for an interpreter exiting without the fixture/with-block teardown (e.g. an unhandled error).
    for server in list(_running):
        with contextlib.suppress(Exception):
            server.close()
