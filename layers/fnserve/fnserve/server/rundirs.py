"""The directories a server makes for its processes, and the sweep of those that a killed server left behind.

``fnserve serve`` shares files between its processes through directories of its own: the statistics (in
``/dev/shm``, memory that stays taken until the directory goes), the metrics files prometheus-client mmaps, the
CPU slot locks. A server that stops removes them; one killed outright (SIGKILL, the OOM killer, a container's
hard stop) cannot. So each directory holds an owner file that its server keeps an exclusive ``flock`` on for
its whole life, and the next server to start removes every directory whose lock it can take: the kernel drops
a lock when the process holding it dies, however it dies, and a lock is seen from any PID namespace on the same
file system, so a server in another container is never taken for dead (a PID could be).

A directory is made under a staging name, locked, then renamed to its own name in one step, so a sweep never
finds one of its names without a lock held on it; a staging directory lives for microseconds, and one older than
a minute is one whose server died making it. Directories without an owner file (an older fnserve's) are left
alone: nothing says whether their server lives.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import tempfile
import time

from fnserve.observability.logs import logger

OWNER = ".owner"
STAGING = ".fnserve-new-"  # a directory being made: not yet locked, swept only once abandoned
ABANDONED_SECONDS = 60.0  # a staging directory this old was left by a server that died making it
PREFIXES = ("fnserve-stats-", "fnserve-metrics-", "fnserve-cpus-")
MEMORY = "/dev/shm"
ATTEMPTS = 10  # random names tried before making a directory gives up


class RunDirs:
    """The directories one server made, each locked for as long as the server lives, and the environment variables
    that name them to its processes; :meth:`remove` at its end."""

    def __init__(self) -> None:
        self._owned: dict[str, int] = {}  # path -> the fd of its locked owner file
        self._variables: list[str] = []

    def publish(self, variable: str, prefix: str, parent: str | None = None) -> str:
        """:meth:`make`, and the directory named in ``variable`` (for the processes the server starts) until
        :meth:`remove`."""
        os.environ[variable] = path = self.make(prefix, parent)
        self._variables.append(variable)
        return path

    def make(self, prefix: str, parent: str | None = None) -> str:
        """A new directory named ``prefix`` + a random part under ``parent`` (the system's temporary directory by
        default), locked as this process's."""
        assert prefix.startswith(PREFIXES), prefix
        attempts = 0
        while True:
            attempts += 1
            staging = tempfile.mkdtemp(prefix=STAGING, dir=parent)
            fd = os.open(os.path.join(staging, OWNER), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
            fcntl.flock(fd, fcntl.LOCK_EX)
            path = os.path.join(os.path.dirname(staging), prefix + os.path.basename(staging)[len(STAGING) :])
            try:
                os.rename(staging, path)  # one step: the name appears with its lock held
            except OSError:  # that name is taken (a directory with files in it): another random name
                os.close(fd)
                shutil.rmtree(staging, ignore_errors=True)
                if attempts == ATTEMPTS:
                    raise
                continue
            self._owned[path] = fd
            return path

    def remove(self) -> None:
        """Remove every directory made here (the lock goes with it), and unset the variables that named them (none
        left naming a removed directory, or a later server's)."""
        for path, fd in self._owned.items():
            shutil.rmtree(path, ignore_errors=True)
            os.close(fd)
        self._owned.clear()
        for variable in self._variables:
            os.environ.pop(variable, None)
        self._variables.clear()


def memory_parent() -> str | None:
    """``/dev/shm`` where this system has it and it can be written, else None (the temporary directory)."""
    return MEMORY if os.path.isdir(MEMORY) and os.access(MEMORY, os.W_OK | os.X_OK) else None


def sweep(parents: list[str | None] | None = None) -> list[str]:
    """Remove the directories of servers that are gone (their owner lock free) from ``parents`` (by default the
    temporary directory and ``/dev/shm``); returns the paths removed."""
    if parents is None:
        parents = [None, memory_parent()]
    removed = []
    for parent in {parent or tempfile.gettempdir() for parent in parents}:
        try:
            entries = [e for e in os.scandir(parent) if e.name.startswith((*PREFIXES, STAGING))]
        except OSError:
            continue
        for entry in entries:
            if not entry.is_dir(follow_symlinks=False):
                continue
            if _abandoned(entry) if entry.name.startswith(STAGING) else _gone(entry.path):
                removed.append(entry.path)
    if removed:
        logger.info(f"removed {len(removed)} directories of servers that were killed", extra={"removed": removed})
    return removed


def _abandoned(entry: os.DirEntry[str]) -> bool:
    """Remove a staging directory left long ago (by a server killed between making and naming it)."""
    try:
        old = time.time() - entry.stat(follow_symlinks=False).st_mtime > ABANDONED_SECONDS
    except OSError:
        return False
    if old:
        shutil.rmtree(entry.path, ignore_errors=True)
    return old


def _gone(path: str) -> bool:
    """Remove ``path`` if its server is gone (its lock taken here, and held while the directory goes)."""
    try:
        fd = os.open(os.path.join(path, OWNER), os.O_RDONLY | os.O_CLOEXEC)
    except OSError:  # no owner file: an older fnserve's, or another user's
        return False
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:  # held: its server lives
            return False
        shutil.rmtree(path, ignore_errors=True)
        return True
    finally:
        os.close(fd)
