# -*- coding: utf-8 -*-
# Copyright: dflash.trainer maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The one waiter: every wait loop of the collection (the drain, the proof, the watch of the
restart job, the lock's wait and its guard, the log's long poll, ...) is ``poll_until`` with an
``observe`` that gathers a snapshot and a pure ``judge`` that says what it means - the
kubernetes.core ``waiter.py`` shape, with the clock and the sleep injected so that every loop is
tested on a fake clock.

- ``observe()`` -> snapshot (it may act: a lock taker's observation is an attempt to take it);
- ``judge(snapshot, elapsed)`` -> ``done(value, words)``, ``failed(words, value)`` or
  ``waiting(words, wake_at=None, deadline=None)``; ``elapsed`` is seconds since the wait began,
  read once per round after ``observe`` - the judge and the deadline see the same number;
- the waiter owns the deadline: a round that the judge leaves undecided at or after
  ``timeout_s`` ends the wait as TIMEOUT (with the judge's last words and snapshot); ``None``
  never times out by itself (the judge's own deadline ends it);
- it sleeps ``interval_s`` between rounds, never past the deadline, and never past the
  ``wake_at`` a judge asks for (elapsed seconds: e.g. its own deadline or the end of a
  measurement window); a judge may also move the deadline (``deadline``: elapsed seconds);
- ``first``: a snapshot the caller has just observed and judged itself: the first observation
  comes one interval later (the outcome of a wait whose deadline passed before is TIMEOUT with
  ``first`` as its snapshot);
- ``on_wait(verdict, elapsed)``: told before each sleep (what the wait still waits for).

Nothing here reads a clock other than ``clock`` or sleeps other than through ``sleep``.
"""

from __future__ import annotations

import collections
import time

DONE, FAILED, WAITING, TIMEOUT = "done", "failed", "waiting", "timeout"

Verdict = collections.namedtuple("Verdict", "state words value wake_at deadline")

_NOTHING = object()


def done(value=None, words=""):
    """The wait is over: what it waited for is there."""
    return Verdict(DONE, words, value, None, None)


def failed(words, value=None):
    """The wait is over: what it waited for cannot come (waiting longer cannot help)."""
    return Verdict(FAILED, words, value, None, None)


def waiting(words="", value=None, wake_at=None, deadline=None):
    """Not yet: ``words`` say what is still awaited; ``wake_at`` (elapsed seconds) asks for the
    next observation no later than then; ``deadline`` (elapsed seconds) replaces the deadline."""
    return Verdict(WAITING, words, value, wake_at, deadline)


class Outcome(collections.namedtuple("Outcome", "state words value snapshot elapsed polls")):
    """How a wait ended: ``state`` DONE, FAILED or TIMEOUT; ``words`` and ``value`` the last
    verdict's; ``snapshot`` the last one judged; ``elapsed`` seconds (the last round's);
    ``polls`` the number of observations made."""

    @property
    def ok(self):
        return self.state == DONE

    @property
    def timed_out(self):
        return self.state == TIMEOUT


def next_sleep(elapsed, interval_s, deadline=None, wake_at=None):
    """Seconds to sleep before the next round: ``interval_s``, shortened to land on the deadline
    and on the judge's ``wake_at`` (all in elapsed seconds); never negative."""
    pause = interval_s
    for limit in (deadline, wake_at):
        if limit is not None:
            pause = min(pause, limit - elapsed)
    return max(0.0, pause)


def poll_until(observe, judge, timeout_s, interval_s, clock=time.monotonic, sleep=time.sleep,
               on_wait=None, first=_NOTHING):
    """Observe and judge until the judge decides or the deadline passes -> Outcome."""
    start = clock()
    deadline = None if timeout_s is None else max(timeout_s, 0.0)
    if first is not _NOTHING:  # the caller just observed (and judged) it: look again one interval later
        elapsed = clock() - start
        if deadline is not None and elapsed >= deadline:
            return Outcome(TIMEOUT, "", None, first, elapsed, 0)
        sleep(next_sleep(elapsed, interval_s, deadline))
    snapshot = observe()
    polls = 1
    while True:
        elapsed = clock() - start
        verdict = judge(snapshot, elapsed)
        if verdict.state in (DONE, FAILED):
            return Outcome(verdict.state, verdict.words, verdict.value, snapshot, elapsed, polls)
        if verdict.deadline is not None:
            deadline = verdict.deadline
        if deadline is not None and elapsed >= deadline:
            return Outcome(TIMEOUT, verdict.words, verdict.value, snapshot, elapsed, polls)
        if on_wait is not None:
            on_wait(verdict, elapsed)
        sleep(next_sleep(clock() - start, interval_s, deadline, verdict.wake_at))
        snapshot = observe()
        polls += 1


class PausedClock(object):
    """A clock that stops while the waiter is not running. Between two of its readings the waiter either sleeps
    (as long as it asked) or works (a command, a read: a second or two); a gap more than ``late_s`` longer than
    the sleeps in it means the process did not run - its container frozen (a suspend-mode backup), the machine
    suspended - and that time (``paused_s`` in all) is taken out of every elapsed time read through ``clock``: a
    wait judges the time it ran (a trainer frozen with it made no progress either). A ``target.command.Runner`` on this
    clock reads it every second while a command runs: a freeze then is not counted against the command's bound,
    a hang is. ``clock`` and ``sleep`` go to ``poll_until`` (and to whatever shares its deadline)."""

    def __init__(self, clock=time.monotonic, sleep=time.sleep, late_s=10.0):
        self._clock, self._sleep, self.late_s = clock, sleep, late_s
        self.paused_s = 0.0
        self._last, self._slept = None, 0.0

    def clock(self):
        now = self._clock()
        if self._last is not None:
            gap = now - self._last - self._slept
            if gap > self.late_s:
                self.paused_s += gap
        self._last, self._slept = now, 0.0
        return now - self.paused_s

    def sleep(self, seconds):
        self._sleep(seconds)
        self._slept += max(seconds, 0.0)
