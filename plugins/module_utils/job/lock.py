# -*- coding: utf-8 -*-
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The deploy lock: pure decisions (who may take it, given its owner record) and the few
filesystem steps that make taking, taking over and releasing it atomic.

A deploy is many tasks; nothing in Ansible holds a lock across them. The lock is a directory
(``/run/dflash-trainer.deploy.lock``) holding an owner record (``owner.json``):

- **taken** by renaming a complete directory (record already inside) onto the path: there is
  never a lock without its record, and a second taker's rename fails on the non-empty directory;
- **taken over** (stale) and **released** by renaming the lock aside first -- an atomic step only
  one contender can make -- then checking that what was moved is still the record that was read
  (else it is put back and nothing is done);
- every decision is made holding ``flock`` on a sidecar file (``<path>.guard``, kept forever,
  never removed): read, decide and rename happen as one step, so two contenders cannot both
  judge the same stale record and both believe they hold the lock. The flock dies with its
  process; it is held for milliseconds.

The record says who holds it and since when (``since``, epoch seconds, and ``taken_at``); the
``heartbeat`` (last sign of life) and ``expires`` (epoch seconds) fields are written by every
renewal of the lease (``heartbeat``): a holder that stops renewing is taken over once ``expires``
has passed, long before ``stale_s``.
Nothing here raises on a race: a lock vanishing, garbage in the record, a file where the
directory should be -- each becomes an outcome with words.
"""
from __future__ import absolute_import, division, print_function

__metaclass__ = type

import contextlib
import errno
import fcntl
import json
import os
import shutil
import threading
import time

# imported here, never inside a function: the detached restart job runs after Ansible removed the
# module's payload, so a late import fails
from ansible_collections.dflash.trainer.plugins.module_utils.target.private_file import replace_private
from ansible_collections.dflash.trainer.plugins.module_utils.job.wait import done, poll_until, waiting

TAKE, KEEP, REFUSE, STALE = "take", "keep", "refuse", "stale"
RELEASE, NONE, NOT_OURS, ERROR = "release", "none", "not_ours", "error"

RECORD = "owner.json"
# An unreadable record this young may be an older version of this module between its mkdir and
# its record write: refuse rather than take it over.
JUST_STARTING_S = 5.0
GUARD_WAIT_S = 10.0
ATTEMPTS = 3


# ---------------------------------------------------------------------------------------------
# pure

def owner_record(token, owner, now, heartbeat=None, expires=None, mono_end=None, boot=None):
    rec = {"token": token, "owner": owner, "since": now,
           "taken_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(now))}
    if heartbeat is not None:
        rec["heartbeat"] = heartbeat
    if expires is not None:
        rec["expires"] = expires
    if mono_end is not None and boot:
        rec.update(mono_end=mono_end, boot=boot)
    return json.dumps(rec, sort_keys=True)


def boot_id():
    """This boot's id: CLOCK_MONOTONIC readings compare only within one boot."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as fh:
            return fh.read().strip()
    except (IOError, OSError):
        return None


def _number(value):
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def parse_record(text):
    """The owner record, or None when it is unreadable (garbage, a truncated write). Optional
    ``heartbeat``/``expires`` that are not numbers are dropped."""
    try:
        rec = json.loads(text)
    except (TypeError, ValueError):
        return None
    if not isinstance(rec, dict) or not _number(rec.get("since")):
        return None
    for key in ("heartbeat", "expires", "mono_end"):
        if key in rec and not _number(rec[key]):
            del rec[key]
    return rec


def lease_over(record, now, mono=None, boot=None):
    """Whether the record's lease has ended. Judged on CLOCK_MONOTONIC when the record was
    written in this boot (a wall-clock step - NTP, a VM resumed - neither ends nor extends a
    lease), else on the wall clock; None when the record has no lease."""
    if mono is not None and boot and record.get("boot") == boot and _number(record.get("mono_end")):
        return mono > record["mono_end"]
    if "expires" in record:
        return now > record["expires"]
    return None


def last_alive(record):
    """When the holder last showed life: its heartbeat, else when it took the lock."""
    return max(record["since"], record.get("heartbeat") or record["since"])


def decide(record, token, now, stale_s, mono=None, boot=None):
    """What to do when the lock already exists.

    KEEP: it is ours (same token: the role ran again in the same play);
    STALE: no sign of life for stale_s, past its ``expires``, or unreadable: take it over;
    REFUSE: someone else's, alive.
    """
    if record is None:
        return STALE
    if record.get("token") == token:
        return KEEP
    if lease_over(record, now, mono, boot):
        return STALE
    if now - last_alive(record) > stale_s:
        return STALE
    return REFUSE


def refusal_message(path, record, now, mono=None, boot=None):
    if mono is not None and boot and record.get("boot") == boot and _number(record.get("mono_end")):
        record = dict(record, expires=now + (record["mono_end"] - mono))  # the lease's end in this boot's time
    if _number(record.get("expires")):
        return ("another deploy holds %s: %s since %d s ago%s; its lease ends in %d s unless it renews it "
                "(a dead holder's lock is then taken over; trainer_lock_wait_s waits for it)"
                % (path, record.get("owner", "unknown"), int(now - record["since"]),
                   " (restart job %s)" % record["job"] if record.get("job") else "",
                   max(0, int(record["expires"] - now + 0.999))))
    return ("another deploy holds %s: %s since %d s ago; wait for it, or remove the lock if that "
            "deploy is dead (it is taken over by itself after trainer_lock_stale_s)"
            % (path, record.get("owner", "unknown"), int(now - record["since"])))


def not_ours_message(path, record, now):
    if record is None:
        return ("lock %s has an unreadable owner record: it is not this play's to release; "
                "left in place" % path)
    return ("lock %s is held by %s since %d s ago, not by this play (was it taken over as "
            "stale?); left in place: this play's changes were not exclusive"
            % (path, record.get("owner", "unknown"), int(now - record["since"])))


class Outcome(object):
    """What acquire/release did: ``action`` (take, keep, stale, refuse, release, none,
    not_ours, error), ``ok``, ``msg``, the ``record`` that decided it, ``changed``."""

    def __init__(self, action, ok, msg="", record=None, changed=False):
        self.action, self.ok, self.msg, self.record, self.changed = action, ok, msg, record, changed

    def owner(self):
        return (self.record or {}).get("owner", "unknown")

    def __repr__(self):
        return "Outcome(%s, ok=%s, %r)" % (self.action, self.ok, self.msg)


# ---------------------------------------------------------------------------------------------
# filesystem steps (each safe against the lock changing under it)

def read_lock(path):
    """(record or None, raw text or None, exists, mtime). Never raises: a lock that vanishes
    reads as absent; an unreadable one (garbage, no record, a file instead of the directory)
    as (None, …, True, mtime)."""
    try:
        mtime = os.lstat(path).st_mtime
    except OSError:
        return None, None, False, None
    try:
        with open(os.path.join(path, RECORD), "rb") as fh:
            text = fh.read().decode("utf-8", "replace")
    except FileNotFoundError:
        if not os.path.lexists(path):
            return None, None, False, None  # vanished between the two looks
        return None, None, True, mtime
    except OSError:  # not a directory, unreadable
        return None, None, True, mtime
    return parse_record(text), text, True, mtime


def _side(path, what):
    return "%s.%s-%d-%d" % (path, what, os.getpid(), time.monotonic_ns())


def _remove(path):
    """Remove a directory tree or a file; an error is left for the next sweep."""
    if os.path.isdir(path) and not os.path.islink(path):
        shutil.rmtree(path, ignore_errors=True)
    else:
        with contextlib.suppress(OSError):
            os.unlink(path)


def _sweep(path):
    """Under the guard nobody is between steps: leftovers of a killed contender are junk."""
    parent, base = os.path.split(path)
    try:
        names = os.listdir(parent or ".")
    except OSError:
        return
    for name in names:
        if name.startswith(base + ".") and name.split(".")[-1].split("-")[0] in ("new", "aside"):
            _remove(os.path.join(parent, name))


def _create(path, text):
    """Put a lock holding ``text`` at path in one rename. False when a lock is already there."""
    tmp = _side(path, "new")
    os.mkdir(tmp, 0o700)
    try:
        with open(os.path.join(tmp, RECORD), "w") as fh:
            fh.write(text)
        try:
            os.rename(tmp, path)  # onto a non-empty directory or a file: refused
        except OSError as exc:
            if exc.errno in (errno.EEXIST, errno.ENOTEMPTY, errno.ENOTDIR, errno.EISDIR):
                return False
            raise
        return True
    finally:
        if os.path.lexists(tmp):
            _remove(tmp)


def _move_aside_if(path, expected_text):
    """Rename the lock aside if it still holds ``expected_text``: (True, aside path), or
    (False, reason) when it vanished or changed (then it is left, or put back, in place)."""
    aside = _side(path, "aside")
    try:
        os.rename(path, aside)
    except FileNotFoundError:
        return False, "vanished"
    _record, text, _exists, _mtime = read_lock(aside)
    if text != expected_text:
        with contextlib.suppress(OSError):
            os.rename(aside, path)  # someone else's fresh lock: put it back
        if os.path.lexists(aside):
            _remove(aside)
        return False, "changed"
    return True, aside


def _try_flock(fd):
    """One attempt at flock(LOCK_EX) without blocking -> whether we hold it now."""
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return True
    except BlockingIOError:
        return False


def _flocked(held, _elapsed):
    """Judge of a flock attempt."""
    return done() if held else waiting("the lock guard")


@contextlib.contextmanager
def guard(path, wait_s=None, clock=time.monotonic, sleep=time.sleep):
    """Hold flock on ``<path>.guard`` (polled every 5 ms, at most wait_s). Raises OSError (EAGAIN)
    when it stays busy. The file is never removed; if someone removes it anyway, a holder notices
    that its file is no longer the one at the path and takes the new one."""
    name = path + ".guard"
    wait_s = GUARD_WAIT_S if wait_s is None else wait_s
    deadline = clock() + wait_s
    while True:
        fd = os.open(name, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)  # a planted symlink: refused (ELOOP)
        try:
            # one deadline for every attempt (a guard file replaced meanwhile is opened again)
            if not poll_until(lambda: _try_flock(fd), _flocked, deadline - clock(), 0.005, clock=clock, sleep=sleep).ok:
                raise OSError(errno.EAGAIN, "lock guard %s still busy after %g s" % (name, wait_s))
            try:
                same = os.fstat(fd).st_ino == os.stat(name).st_ino
            except FileNotFoundError:
                same = False
            if same:
                yield
                return
        finally:
            os.close(fd)


def _rewrite(path, record):
    """Replace the record inside our lock atomically (under the guard)."""
    replace_private(os.path.join(path, RECORD), json.dumps(record, sort_keys=True),
                    tmp=os.path.join(path, RECORD + ".tmp"))


def heartbeat(path, token, lease_s, owner=None, clock=time.time, mono_clock=time.monotonic, **extra):
    """Renew our lock: heartbeat now, expires now + lease_s (owner and extra fields updated when
    given) -> Outcome KEEP, or NOT_OURS / ERROR (not ok) when it is no longer ours."""
    try:
        with guard(path):
            now = clock()
            record, _text, exists, _mtime = read_lock(path)
            if not exists or record is None or record.get("token") != token:
                return Outcome(NOT_OURS, False, not_ours_message(path, record, now) if exists else
                               "lock %s is no longer held (released or removed)" % path, record)
            record = dict(record, heartbeat=now, expires=now + lease_s, **extra)
            boot = boot_id()
            if boot:
                record.update(mono_end=mono_clock() + lease_s, boot=boot)
            if owner:
                record["owner"] = owner
            _rewrite(path, record)
            return Outcome(KEEP, True, "renewed %s until %d" % (path, record["expires"]), record)
    except OSError as exc:
        return Outcome(ERROR, False, "Unable to renew lock %s: %s" % (path, exc))


def acquire(path, token, owner, stale_s, clock=time.time, lease_s=None, mono_clock=time.monotonic):
    """Take the lock, keep our own, take over a stale one, or refuse -> Outcome. With
    ``lease_s``, the record expires that long after it is taken or renewed (a holder that
    stops renewing - a killed play - is stale then, not after stale_s)."""
    if lease_s is not None:
        out = _acquire(path, token, owner, stale_s, clock, lease_s, mono_clock)
        if out.ok and out.action == KEEP:
            renewed = heartbeat(path, token, lease_s, clock=clock, mono_clock=mono_clock)
            return Outcome(KEEP, renewed.ok, renewed.msg, renewed.record)
        return out
    return _acquire(path, token, owner, stale_s, clock, None, mono_clock)


def acquire_waiting(path, token, owner, stale_s, lease_s=None, wait_s=0, clock=time.time,
                    monotonic=time.monotonic, sleep=time.sleep):
    """acquire(), tried again every second while a live holder refuses us, for up to ``wait_s`` seconds."""
    out = poll_until(lambda: acquire(path, token, owner, stale_s, clock=clock, lease_s=lease_s, mono_clock=monotonic),
                     _not_refused, wait_s or 0, 1.0, clock=monotonic, sleep=sleep)
    return out.snapshot


def _not_refused(out, _elapsed):
    """Judge of an acquire() Outcome: anything but a refusal ends the wait."""
    return waiting(out.msg) if not out.ok and out.action == REFUSE else done(out)


def _acquire(path, token, owner, stale_s, clock, lease_s, mono_clock=time.monotonic):
    boot = boot_id()
    try:
        with guard(path):
            _sweep(path)
            for _attempt in range(ATTEMPTS):
                now = clock()
                mono = mono_clock()
                lease = dict(expires=None if lease_s is None else now + lease_s,
                             mono_end=None if lease_s is None else mono + lease_s, boot=boot)
                record, text, exists, mtime = read_lock(path)
                if not exists:
                    if _create(path, owner_record(token, owner, now, **lease)):
                        return Outcome(TAKE, True, "took %s" % path, changed=True)
                    continue  # created under us by someone outside the guard: look again
                if record is None and now - mtime < JUST_STARTING_S:
                    record = {"owner": "a deploy that is just starting", "since": mtime}
                    return Outcome(REFUSE, False, refusal_message(path, record, now), record)
                verdict = decide(record, token, now, stale_s, mono, boot)
                if verdict == KEEP:
                    return Outcome(KEEP, True, "%s is already ours" % path, record)
                if verdict == REFUSE:
                    return Outcome(REFUSE, False, refusal_message(path, record, now, mono, boot), record)
                moved, aside = _move_aside_if(path, text)
                if not moved:
                    continue  # it vanished or changed under us: look again
                _remove(aside)
                if _create(path, owner_record(token, owner, now, **lease)):
                    return Outcome(STALE, True, "took over %s from %s" % (
                        path, (record or {}).get("owner", "an unreadable record")), record, changed=True)
            return Outcome(ERROR, False, "Unable to take lock %s: it kept changing under us (%d tries)"
                           % (path, ATTEMPTS))
    except OSError as exc:
        return Outcome(ERROR, False, "Unable to take lock %s: %s" % (path, exc))


def release(path, token, clock=time.time):
    """Release the lock if it is ours -> Outcome: RELEASE; NONE (there was no lock: ok, but
    worth a warning); NOT_OURS or ERROR (not ok: left in place / could not remove)."""
    try:
        with guard(path):
            now = clock()
            record, text, exists, _mtime = read_lock(path)
            if not exists:
                return Outcome(NONE, True, "lock %s was not held (already released or removed)" % path)
            if record is None or record.get("token") != token:
                return Outcome(NOT_OURS, False, not_ours_message(path, record, now), record)
            moved, aside = _move_aside_if(path, text)
            if not moved:
                if aside == "vanished":
                    return Outcome(NONE, True, "lock %s was removed by someone else" % path, record)
                record, _text, _exists, _mtime = read_lock(path)
                return Outcome(NOT_OURS, False, not_ours_message(path, record, now), record)
            _remove(aside)
            return Outcome(RELEASE, True, "released %s" % path, record, changed=True)
    except OSError as exc:
        return Outcome(ERROR, False, "Unable to release lock %s: %s" % (path, exc))


def peek(path, token, stale_s, clock=time.time):
    """What acquire would do, changing nothing (check mode) -> Outcome (changed: would change)."""
    now = clock()
    record, _text, exists, mtime = read_lock(path)
    if not exists:
        return Outcome(TAKE, True, "would take %s" % path, changed=True)
    if record is None and now - mtime < JUST_STARTING_S:
        record = {"owner": "a deploy that is just starting", "since": mtime}
        return Outcome(REFUSE, False, refusal_message(path, record, now), record)
    verdict = decide(record, token, now, stale_s)
    if verdict == REFUSE:
        return Outcome(REFUSE, False, refusal_message(path, record, now), record)
    if verdict == KEEP:
        return Outcome(KEEP, True, "%s is already ours" % path, record)
    return Outcome(STALE, True, "would take over %s" % path, record, changed=True)


ATTACHED_CHECK_S = 1.0


def output_read(fd=1):
    """Whether the play still reads this module's output: a newline written to it (stdout; blank
    lines before a module's JSON are ignored by Ansible) fails with EPIPE once the connection is
    gone - `pct exec` ends with the ssh session of a killed ``ansible-playbook``, while the shell
    that runs the module in the container, its parent, lives on. A module's result must be printed
    after its keeper stopped (no newline inside the JSON)."""
    try:
        os.write(fd, b"\n")
    except OSError:
        return False
    return True


class LeaseKeeper(object):
    """Renews our lease from a thread every ``every_s`` while a long step runs (a pre-flight, a
    ``systemctl stop`` as long as TimeoutStopSec, a proof): the lease never lapses under work in
    progress, whatever one step costs. ``lost`` says why the lock is no longer ours (taken over,
    removed) once a renewal found so; ``check()`` raises LeaseLost then, so the holder never
    stops, switches or starts anything for a lock it lost. Renewals are also done on demand
    (``renew()``) with extra record fields (the restart job's id and pid).

    ``while_attached``: a module of the play (not the detached restart job) renews only while the
    play's connection still reads its output - ``attached()`` before each renewal - so a killed
    ``ansible-playbook``'s lock lapses within one lease, however long the module would go on."""

    def __init__(self, path, token, lease_s, every_s=None, renew_fn=heartbeat, while_attached=False,
                 attached=None, **extra):
        self.path, self.token, self.lease_s = path, token, lease_s
        self.attached = (attached or output_read) if while_attached else None
        self.detached = False
        self.every_s = every_s if every_s is not None else max(1.0, min(5.0, lease_s / 4.0))
        self.extra = extra
        self.renew_fn = renew_fn
        self.lost = None
        self.last = None
        self._stop = threading.Event()
        self._mutex = threading.Lock()
        self._thread = threading.Thread(target=self._loop, name="dflash-lease", daemon=True)

    def renew(self, **extra):
        if not self.path or not self.token:
            return None
        self.extra.update(extra)
        with self._mutex:
            if self.lost:
                return self.last
            out = self.renew_fn(self.path, self.token, self.lease_s, **self.extra)
            self.last = out
            if out.action == NOT_OURS:
                self.lost = out.msg
            return out

    def check(self):
        if self.lost:
            raise LeaseLost(self.lost)

    def _loop(self):
        # a play's module looks for its reader every second (at most every_s), renews every_s
        tick = self.every_s if self.attached is None else min(self.every_s, ATTACHED_CHECK_S)
        due = time.monotonic() + self.every_s
        while not self._stop.wait(tick):
            if self.attached is not None and not self.attached():
                self.detached = True
                return
            if time.monotonic() >= due:
                self.renew()
                due = time.monotonic() + self.every_s

    def __enter__(self):
        self.renew()
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join(timeout=self.every_s + 1)
        return False


# The O(lock) option of the modules that work under the play's lock (doc fragment play_lock)
PLAY_LOCK_SPEC = dict(type="dict", options=dict(path=dict(type="path", required=True),
                                                token=dict(type="str", required=True, no_log=False),
                                                lease_s=dict(type="int", required=True)))


def play_lease(lock):
    """The keeper of the play's lease while a module of the play works (``lock``: the O(lock)
    option, or None: renews nothing)."""
    lock = lock or {}
    return LeaseKeeper(lock.get("path"), lock.get("token"), lock.get("lease_s") or 30, while_attached=True)


class LeaseLost(Exception):
    """The deploy lock is no longer ours: nothing more may be stopped, switched or started."""

    def __init__(self, msg):
        super(LeaseLost, self).__init__(msg)
        self.msg = msg
