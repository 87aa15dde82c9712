"""A polite stop on SIGTERM or SIGINT: every stage ends at its next safe point and the process exits 128+signal.

```
with stop_on_signals(campaign=store, report=...) as stop:    an entry point arms it (a command, a flow's body)
    first SIGTERM/SIGINT  stop.signum is set; stopping() says so in every thread of the process
                          campaign given: request_stop(campaign) (rollout/STOP-<utc>.json), so the campaign's
                          stages in other processes (deployment runs) stop as well
                          a watchdog: still running GRACE_S later -> report(), exit 128+signal
    second signal         the resume line, exit 128+signal at once
stages ask should_stop(store, since=...) at their safe points:
    rollout workers       admit no new group, finish the groups in flight, commit their open shard
    trainer               between steps or while it waits for groups: drops its unfinished step, checkpoints
                          the steps since its last checkpoint, returns without its done marker
    campaign, recover     start no further stage and raise Stopped (the flows end Cancelled)
```
Everything a stage writes is create-only with its marker last, so a process the watchdog ends (a stage that had no
safe point within the grace period: a warm start, an evaluation) leaves nothing half-visible, and ``recover``
continues from the folder. A nested ``stop_on_signals`` (a flow's body inside a command) takes over the same stop:
Prefect's flow engine installs its own SIGTERM handler around a flow run (a ``TerminationSignal``, the run marked
Crashed, the stage threads left running), which the body's context replaces while it runs.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from pipelines_lib.records import StopRequest
from pipelines_lib.rollout.collect import stop_requested, utc_compact
from pipelines_lib.stages.campaign import campaign_status, render_status
from pipelines_lib.storage.store import Store
from pipelines_lib.terminal import printable

SIGNALS = (signal.SIGTERM, signal.SIGINT)
GRACE_S = 20.0
"""Seconds between the first signal and the watchdog's exit: schedulers wait 30 s between SIGTERM and SIGKILL."""


class Stopped(Exception):
    """The run was stopped by a signal before it finished; its stages kept what they had committed."""

    def __init__(self, signum: int) -> None:
        # A value that is no signal's number is named as given: a worker's error reaches its parent pickled, and
        # unpickling calls this again with the same argument (``__reduce__``).
        name = signal.Signals(signum).name if isinstance(signum, int) else str(signum)
        super().__init__(f"stopped by {name}; the stages kept what they had committed")
        self.signum = signum

    def __reduce__(self) -> tuple[type[Stopped], tuple[int]]:
        return type(self), (self.signum,)


def _say(line: str) -> None:
    """``line`` on stderr, ``printable``: the status and the campaign's URL are the campaign's content."""
    # os.write, not print: a signal handler may run while the main thread is inside a print to the same stream.
    with contextlib.suppress(OSError):
        os.write(sys.stderr.fileno(), f"{printable(line)}\n".encode(errors="replace"))


@dataclass
class SignalStop:
    """What one process does on a stop signal (see the module docstring). ``report`` returns the status and the
    commands that continue the run (printed by the watchdog), ``resume`` the one line a second signal prints."""

    grace_s: float = GRACE_S
    report: Callable[[], str] | None = None
    resume: str | None = None
    signum: int | None = None
    campaigns: list[Store] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def exit_code(self) -> int:
        if self.signum is None:
            raise ValueError("no stop signal was received")
        return 128 + self.signum

    def handle(self, signum: int, frame: object = None) -> None:
        name = signal.Signals(signum).name
        if self.signum is not None:
            _say(f"rollstream: second {name}: exiting now" + (f"; continue with: {self.resume}" if self.resume else ""))
            os._exit(128 + self.signum)
        self.signum = signum
        _say(f"rollstream: {name}: stopping every stage at its next safe point (at most {self.grace_s:.0f}s; "
             f"a second {name} exits at once)")
        threading.Thread(target=self._watch, name="stop-watchdog", daemon=True).start()

    def add_campaign(self, store: Store) -> None:
        """Ask ``store``'s stages to stop as well on a signal (at once when one came already)."""
        with self._lock:
            self.campaigns.append(store)
        if self.signum is not None:
            self._request(store)

    def _request(self, store: Store) -> None:
        try:
            request_stop(store, f"{signal.Signals(self.signum or 0).name} received by process {os.getpid()}")
        except Exception as e:  # noqa: BLE001 - the stages of this process stop on the signal alone
            _say(f"rollstream: could not write the stop request to {store.url} ({type(e).__name__}: {e}); "
                 "stages in other processes go on")

    def _watch(self) -> None:
        start = time.monotonic()
        with self._lock:
            campaigns = list(self.campaigns)
        for store in campaigns:
            self._request(store)
        time.sleep(max(0.0, self.grace_s - (time.monotonic() - start)))
        _say(f"rollstream: still running {self.grace_s:.0f}s after the signal: exiting; everything committed stays")
        if self.report is not None:
            try:
                _say(self.report())
            except Exception as e:  # noqa: BLE001 - the exit must not wait for an unreachable campaign
                _say(f"rollstream: no status ({type(e).__name__}: {e})")
        os._exit(self.exit_code)


_active: SignalStop | None = None


def stopping() -> int | None:
    """The signal that asked this process to stop, inside an armed ``stop_on_signals``; None otherwise."""
    return _active.signum if _active is not None else None


def request_stop(store: Store, reason: str) -> str:
    """Ask every rollout worker running now to stop (workers started later are not affected)."""
    return StopRequest(requested_at=utc_compact(), reason=reason).write(store)


def should_stop(store: Store, *, since: str) -> bool:
    """A stage's stop test: this process got a stop signal, or the campaign a stop request newer than ``since``
    (``rollout.collect.utc_compact``), or its trainer is done."""
    return stopping() is not None or stop_requested(store, since=since)


def check_stop() -> None:
    """Raise ``Stopped`` once this process got a stop signal: called between stages."""
    if (signum := stopping()) is not None:
        raise Stopped(signum)


@contextlib.contextmanager
def stop_on_signals(*, campaign: Store | None = None, report: Callable[[], str] | None = None,
                    resume: str | None = None, grace_s: float = GRACE_S) -> Iterator[SignalStop]:
    """Handle SIGTERM and SIGINT as a polite stop while the block runs (in the main thread; elsewhere the block
    runs unarmed). Nested inside another, it takes over the outer stop (its signal, watchdog and report) and adds
    ``campaign``. After a signal the handlers stay installed when the outermost block ends: the process is on its
    way out, and a second signal must still exit at once."""
    global _active
    outer = _active
    stop = outer or SignalStop(grace_s=grace_s, report=report, resume=resume)
    try:
        previous = {s: signal.signal(s, stop.handle) for s in SIGNALS}
    except ValueError:  # not the main thread: signals are the main thread's
        previous = {}
    if campaign is not None:
        stop.add_campaign(campaign)
    _active = stop
    try:
        yield stop
    finally:
        _active = outer
        if campaign is not None:
            with stop._lock:
                stop.campaigns.remove(campaign)
        if outer is not None or stop.signum is None:
            for s, handler in previous.items():
                signal.signal(s, handler)


@contextlib.contextmanager
def stoppable_command(store: Store, resume: str, *, campaign: bool = False) -> Iterator[SignalStop]:
    """A command's block under a polite stop. After a signal, ``Stopped`` from the block ends it quietly and the
    campaign's status (``render_status``, with ``resume``: the command line that continues) goes to stderr, here or
    by the watchdog; the command then returns ``stop.exit_code``. ``campaign``: the block runs the campaign's
    stages itself (no flow around them), so the stop request goes into the folder from here."""
    def report() -> str:
        return render_status(campaign_status(store), recover=resume)

    with stop_on_signals(campaign=store if campaign else None, report=report, resume=resume) as stop, \
            contextlib.suppress(Stopped):
        yield stop
    if stop.signum is not None:
        print(printable(f"stopped; {store.url}:\n{report()}"), file=sys.stderr, flush=True)


__all__ = ["GRACE_S", "SignalStop", "Stopped", "check_stop", "request_stop", "should_stop", "stop_on_signals", "stoppable_command",
           "stopping"]
