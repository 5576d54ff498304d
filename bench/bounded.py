"""Deadlines that hold: a worker process that cannot outlive one (``Bounded``), and a watchdog
that acts at one whatever the process is doing (``Watchdog``).

``Bounded``: the worker is started in a session of its own, its output going to a file, and
stopped (the whole process group, SIGKILL) when the deadline comes.

A worker that compiles (inductor, AOTInductor) starts processes of its own; killing the worker
alone leaves them holding its stdout pipe, and a parent reading that pipe to its end waits for
them (``bench.cuda`` on torch 2.11 sat 20 s past its budget so). Here nothing is read from a
pipe: the output is a temporary file, read after the group is gone.

    worker = Bounded.start([sys.executable, "-m", "bench.cuda", ...], cwd=root)
    text, status, stopped = worker.finish(until)   # by ``until`` (time.time()) at the latest

``process_started()``: when this process started, so that a budget counts its imports too.

``Watchdog``: a daemon timer that runs an action at a deadline (``bench.cuda`` writes what is
done and exits), unless cancelled first; cancelling while the action runs waits for it.
"""

from __future__ import annotations

import os
import signal
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from typing import IO


def process_started() -> float:
    """The ``time.time()`` at which this process started (Linux: ``/proc/self/stat``'s start
    time after boot plus ``/proc/stat``'s boot time), so that a budget given on the command
    line also counts the seconds spent importing torch; the present moment where that cannot
    be read, or reads later than now. O(1)."""
    now = time.time()
    try:
        with open("/proc/self/stat") as f:
            ticks = int(f.read().rsplit(") ", 1)[1].split()[19])  # field 22, starttime
        with open("/proc/stat") as f:
            boot = next(int(line.split()[1]) for line in f if line.startswith("btime "))
        started = boot + ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError, StopIteration):
        return now
    return min(started, now)


class Bounded:
    """A started worker process; ``finish`` ends it by a deadline. Not thread-safe."""

    def __init__(self, process: subprocess.Popen, out: IO[bytes]) -> None:
        self.process = process
        self._out = out
        self._text: str | None = None
        self._stopped = False

    @classmethod
    def start(cls, cmd: Sequence[str], cwd: str | None = None,
              env: dict[str, str] | None = None) -> Bounded:
        """Start ``cmd`` in a new session (its own process group), stdout to a temporary file,
        stderr inherited. O(1) besides the start."""
        out = tempfile.TemporaryFile()  # noqa: SIM115 - the worker's; finish closes it
        process = subprocess.Popen(list(cmd), cwd=cwd, env=env, stdout=out,
                                   start_new_session=True)
        return cls(process, out)

    def finish(self, until: float, poll: float = 0.05) -> tuple[str, int, bool]:
        """Wait for the worker until ``until`` (``time.time()`` seconds), then stop its process
        group; return ``(stdout text, return code, stopped)``, ``stopped`` true when the
        deadline ended it (its return code is then the kill's, negative). Returns by
        ``until`` plus the kill's own time (milliseconds). Idempotent: a second call returns
        what the worker printed and how it ended."""
        if self._text is None:
            while self.process.poll() is None:
                left = until - time.time()
                if left <= 0:
                    self._stopped = True
                    break
                time.sleep(min(poll, left))
            self.kill()
            self.process.wait()
            self._out.seek(0)
            self._text = self._out.read().decode(errors="replace")
            self._out.close()
        return self._text, self.process.returncode, self._stopped

    def kill(self) -> None:
        """SIGKILL the worker's process group (itself and whatever it started that is still
        in it); nothing when it is already gone. O(1)."""
        try:
            os.killpg(self.process.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass

    @property
    def returncode(self) -> int | None:
        """The worker's return code, ``None`` while it runs."""
        return self.process.poll()


class Watchdog:
    """Runs ``action()`` once at ``until`` (``time.time()``) in a daemon thread, unless
    ``cancel`` came first."""

    def __init__(self, until: float, action: Callable[[], None]) -> None:
        self._lock = threading.Lock()
        self._cancelled = False
        self._action = action
        self._timer = threading.Timer(max(0.0, until - time.time()), self._fire)
        self._timer.daemon = True

    @classmethod
    def start(cls, until: float, action: Callable[[], None]) -> Watchdog:
        """A started watchdog. O(1)."""
        dog = cls(until, action)
        dog._timer.start()
        return dog

    def _fire(self) -> None:
        with self._lock:
            if not self._cancelled:
                self._cancelled = True
                self._action()

    def cancel(self) -> bool:
        """Stop the watchdog; ``True`` when its action had not run (and now never will). Waits
        while the action runs (an action that exits the process never lets it return)."""
        self._timer.cancel()
        with self._lock:
            ran = self._cancelled
            self._cancelled = True
        return not ran
