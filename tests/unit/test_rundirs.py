"""The directories a server makes for its processes: swept by the next server once their own is gone, never
while it lives, whatever its PID namespace (the lock is the file system's, not a PID)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from fnserve.server import rundirs
from fnserve.server.rundirs import OWNER, RunDirs, sweep

MAKER = """
import sys
from fnserve.server.rundirs import RunDirs
made = RunDirs()
print(made.make("fnserve-stats-", sys.argv[1]), flush=True)
sys.stdin.read()  # until the test kills it
"""


def _maker(parent: Path) -> subprocess.Popen[str]:
    command = [sys.executable, "-c", MAKER, str(parent)]
    return subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)


def _made(process: subprocess.Popen[str]) -> Path:
    assert process.stdout is not None
    return Path(process.stdout.readline().strip())


def test_a_killed_servers_directory_is_swept_and_a_living_ones_is_kept(tmp_path: Path) -> None:
    with _maker(tmp_path) as killed, _maker(tmp_path) as living:
        left, kept = _made(killed), _made(living)
        (left / "stats-1.json").write_text("{}")
        killed.send_signal(signal.SIGKILL)
        killed.wait()
        assert left.is_dir()  # nothing removed it: its server could not

        assert sweep([str(tmp_path)]) == [str(left)]

        assert not left.exists()
        assert kept.is_dir() and (kept / OWNER).is_file()
        assert sweep([str(tmp_path)]) == []
        living.kill()
    assert sweep([str(tmp_path)]) == [str(kept)]  # its server gone too


def test_directories_of_this_process_are_locked_until_removed(tmp_path: Path) -> None:
    made = RunDirs()
    stats = made.publish("FNSERVE_TEST_RUNDIR", "fnserve-stats-", str(tmp_path))
    assert os.environ["FNSERVE_TEST_RUNDIR"] == stats  # named to the processes the server starts
    metrics = made.make("fnserve-metrics-", str(tmp_path))
    assert Path(stats).name.startswith("fnserve-stats-") and Path(metrics).name.startswith("fnserve-metrics-")
    assert sweep([str(tmp_path)]) == []  # flock: another open of the owner file cannot take it
    made.remove()
    assert os.listdir(tmp_path) == []
    assert "FNSERVE_TEST_RUNDIR" not in os.environ


def test_what_is_not_a_locked_servers_directory_is_left_alone(tmp_path: Path) -> None:
    older = tmp_path / "fnserve-stats-older"  # an older fnserve's (no owner file): nothing says it is gone
    older.mkdir()
    other = tmp_path / "someone-else"
    other.mkdir()
    (other / OWNER).touch()
    file = tmp_path / "fnserve-metrics-file"
    file.touch()
    staging = tmp_path / f"{rundirs.STAGING}abc"  # one being made
    staging.mkdir()
    (staging / OWNER).touch()

    assert sweep([str(tmp_path)]) == []
    assert older.is_dir() and other.is_dir() and file.is_file() and staging.is_dir()


def test_a_staging_directory_left_long_ago_is_swept(tmp_path: Path) -> None:
    """A server killed between making a directory and naming it (microseconds) leaves it under its staging name."""
    abandoned = tmp_path / f"{rundirs.STAGING}old"
    abandoned.mkdir()
    (abandoned / OWNER).touch()
    long_ago = time.time() - 2 * rundirs.ABANDONED_SECONDS
    os.utime(abandoned, (long_ago, long_ago))
    fresh = tmp_path / f"{rundirs.STAGING}new"
    fresh.mkdir()

    assert sweep([str(tmp_path)]) == [str(abandoned)]
    assert fresh.is_dir()
