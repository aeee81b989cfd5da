"""Runs ``neuron-monitor`` and keeps its latest report; restarts it with backoff when it dies.

One daemon thread owns the process: it starts it, reads its stdout line by line (one JSON report
per line), hands each report to ``on_report`` once, and keeps the latest for the sweeps, which
never wait for it. A line that is not a JSON object is skipped (debug log); a line longer than
``max_line_chars`` is dropped, so a runaway writer cannot exhaust memory.

When the process exits, the latest report is forgotten (its figures would go stale) and the
process is started again after a delay that doubles from ``backoff_initial_s`` up to
``backoff_max_s``, and starts over once a restarted process has delivered a report. Each
restart is logged once, at WARNING. The delay is measured on the injectable ``clock``.
"""

from __future__ import annotations

import contextlib
import json
import logging
import subprocess
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = ["MonitorProcess", "MonitorState"]

_log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class MonitorState:
    """What the sweeps need to know: the latest report and whether the process runs."""

    report: Mapping[str, Any] | None
    sequence: int
    received_at: float
    running: bool
    reason: str | None
    restart_at: float | None
    restarts: int


class MonitorProcess:
    """Supervises one ``neuron-monitor`` process (``command``) on a daemon thread."""

    def __init__(
        self,
        command: Sequence[str],
        *,
        on_report: Callable[[Mapping[str, Any]], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
        backoff_initial_s: float = 1.0,
        backoff_max_s: float = 60.0,
        poll_s: float = 0.05,
        max_line_chars: int = 16 << 20,
    ) -> None:
        self.command = list(command)
        self._on_report = on_report
        self._clock = clock
        self.backoff_initial_s = backoff_initial_s
        self.backoff_max_s = max(backoff_initial_s, backoff_max_s)
        self._poll_s = poll_s
        self._max_line = max_line_chars
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self.first_report = threading.Event()
        self._thread: threading.Thread | None = None
        self._proc: subprocess.Popen[str] | None = None
        self._report: Mapping[str, Any] | None = None
        self._sequence = 0
        self._received_at = 0.0
        self._running = False
        self._reason: str | None = None
        self._restart_at: float | None = None
        self.restarts = 0
        self.malformed = 0
        self.delays: list[float] = []

    def start(self) -> None:
        """Start the supervising thread (and with it the process)."""
        if self._thread is None:
            self._thread = threading.Thread(
                target=self._run, name="otel-gpu-neuron-monitor", daemon=True
            )
            self._thread.start()

    def state(self) -> MonitorState:
        """The latest report and the process state, without waiting."""
        with self._lock:
            return MonitorState(
                self._report,
                self._sequence,
                self._received_at,
                self._running,
                self._reason,
                self._restart_at,
                self.restarts,
            )

    def stop(self, timeout_s: float = 5.0) -> None:
        """Stop the process and the thread. Safe to call twice."""
        self._stop.set()
        with self._lock:
            proc = self._proc
        if proc is not None:
            _terminate(proc)
        if self._thread is not None:
            self._thread.join(timeout_s)

    # -- the supervising thread --------------------------------------------------------------

    def _run(self) -> None:
        delay = self.backoff_initial_s
        while not self._stop.is_set():
            before = self._sequence
            reason = self._run_once()
            if self._stop.is_set():
                break
            if self._sequence > before:  # it worked for a while: back off from the start
                delay = self.backoff_initial_s
            restart_at = self._clock() + delay
            with self._lock:
                self._running = False
                self._report = None
                self._reason = reason
                self._restart_at = restart_at
                self.restarts += 1
                self.delays.append(delay)
            _log.warning("%s; restarting it in %.1f s (restart %d)", reason, delay, self.restarts)
            while not self._stop.is_set() and self._clock() < restart_at:
                self._stop.wait(self._poll_s)
            delay = min(delay * 2, self.backoff_max_s)

    def _run_once(self) -> str:
        """Run the process until it exits; return why it ended."""
        try:
            proc = subprocess.Popen(
                self.command,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.DEVNULL,
                text=True,
                encoding="utf-8",
                errors="replace",
            )
        except OSError as err:
            return f"could not start {self.command[0]}: {err}"
        with self._lock:
            self._proc = proc
            self._running = True
            self._reason = None
            self._restart_at = None
        try:
            self._read(proc)
        except Exception:  # the reader must outlive anything a line can do
            _log.warning("reading neuron-monitor output failed", exc_info=True)
            _terminate(proc)
        try:
            code = proc.wait(timeout=5.0)
        except subprocess.TimeoutExpired:
            _terminate(proc)
            code = proc.returncode
        finally:
            if proc.stdout is not None:
                proc.stdout.close()
        with self._lock:
            self._proc = None
        return f"neuron-monitor exited with code {code}"

    def _read(self, proc: subprocess.Popen[str]) -> None:
        assert proc.stdout is not None
        discarding = False
        while True:
            line = proc.stdout.readline(self._max_line)
            if not line:
                return
            if discarding:
                discarding = not line.endswith("\n")
                continue
            if not line.endswith("\n") and len(line) >= self._max_line:
                _log.debug("neuron-monitor: dropping a line longer than %d chars", self._max_line)
                self.malformed += 1
                discarding = True
                continue
            text = line.strip()
            if not text:
                continue
            try:
                report = json.loads(text)
            except ValueError as err:
                report, why = None, str(err)
            else:
                why = "not a JSON object"
            if not isinstance(report, dict):
                self.malformed += 1
                _log.debug("neuron-monitor: skipping a malformed line (%s): %.80r", why, text)
                continue
            if self._on_report is not None:
                try:
                    self._on_report(report)
                except Exception:
                    _log.warning("handling a neuron-monitor report failed", exc_info=True)
            with self._lock:
                self._report = report
                self._sequence += 1
                self._received_at = self._clock()
            self.first_report.set()


def _terminate(proc: subprocess.Popen[str]) -> None:
    """SIGTERM, then SIGKILL after 2 s."""
    if proc.poll() is not None:
        return
    try:
        proc.terminate()
        proc.wait(timeout=2.0)
    except subprocess.TimeoutExpired:
        proc.kill()
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=2.0)
    except OSError:
        pass
