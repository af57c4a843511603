# -*- coding: utf-8 -*-
# Copyright: dflash.trainer maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""A trainer group's members hold their deploy locks while the play waits for the slowest one (controller side).

A group runs each phase as one task on every member at once; Ansible runs each member's task in its own worker
process and goes on only once every member's task ended. A member whose task ends first - its restart job proved
it, its pre-flight passed, its lock was free - would leave its lock unrenewed until the slowest member's task
ends, and its lease (trainer_lock_lease_s) would run out meanwhile: another run could take it.

So a task given ``group_hold`` does not end when its own work ends: it says so (``arrive``) and, until every
member of the hold has said so, renews its member's lease (``trainer_lock`` O(state=renew), every quarter
lease) - the play's worker for that member is alive, so the lock is the play's. A killed controller kills its
workers: nothing renews any more and every lease runs out on its own, nothing is stranded.

The members meet through files in the run's local tmp (the workers are forks of one ``ansible-playbook``): one
file per member, one line per arrival. A member's n-th arrival at a hold waits for every member's n-th - the same
role run twice in one play (the same hold names) meets as twice.

``group_hold``: ``key`` (the same on every member: the members' lock tokens) and ``phase`` (which task), ``run``
(false: this member has nothing to do in the task, it only holds - a task with ``when`` false on a member would
never arrive), ``me`` (this member),
``members`` (every member that runs this task: ``ansible_play_hosts``), ``lock`` (the play's lock: path,
token, lease_s; none - nothing to renew, the member only arrives and waits).
"""
from __future__ import annotations

import hashlib
import os
import time

from ansible import constants as C
from ansible import context
from ansible.errors import AnsibleActionFail

DIR_NAME = "dflash-trainer-group-hold"
CHECK_S = 0.2  # how often the others' arrival is looked at between renewals
# A member that has not even begun its task this long after this one arrived never will (its task skipped, its
# host gone from the play): the wait ends, said - never a play that waits forever for a member that cannot come
START_GRACE_S = 120.0


def _name(text):
    return hashlib.sha256(str(text).encode("utf-8", "replace")).hexdigest()[:32]


def checked(spec):
    """``group_hold`` as given -> (key and phase, me, members, lock); ValueError saying what is wrong."""
    if not isinstance(spec, dict):
        raise ValueError("group_hold must be a dict (key, me, members, lock), got %r" % type(spec).__name__)
    key, me, members = spec.get("key"), spec.get("me"), spec.get("members")
    if key and spec.get("phase"):
        key = "%s-%s" % (key, spec["phase"])
    if not key or not me or not isinstance(members, (list, tuple)) or me not in members:
        raise ValueError("group_hold needs key, me and members (me among them)")
    lock = spec.get("lock") or None
    if lock is not None and not (isinstance(lock, dict) and lock.get("path") and lock.get("token")):
        raise ValueError("group_hold.lock needs path and token")
    return str(key), str(me), [str(m) for m in members], lock


class Hold(object):
    """One member's side of a hold: ``arrive()`` once its own work ended, then ``wait(renew)``."""

    def __init__(self, key, me, members, root=None):
        self.me, self.members = me, sorted(set(members))
        self.dir = os.path.join(root or C.DEFAULT_LOCAL_TMP, DIR_NAME, _name(key))
        self.arrival = None

    def _path(self, member):
        return os.path.join(self.dir, _name(member))

    def _count(self, member, suffix=""):
        try:
            with open(self._path(member) + suffix) as fh:
                return fh.read().count("\n")
        except (IOError, OSError):
            return 0

    def _last_pid(self, member):
        try:
            with open(self._path(member) + ".begun") as fh:
                lines = fh.read().split()
            return int(lines[-1]) if lines else None
        except (IOError, OSError, ValueError):
            return None

    def begin(self):
        """Say this member's task began (its worker's pid): a member that began and whose worker is gone
        without arriving never will."""
        os.makedirs(self.dir, mode=0o700, exist_ok=True)
        with open(self._path(self.me) + ".begun", "a") as fh:
            fh.write("%d\n" % os.getpid())

    def gone(self, waited_s, alive=None):
        """Why a pending member will never arrive, or None: it never began its task within START_GRACE_S of this
        member's arrival, or it began and its worker process is gone."""
        alive = alive or _alive
        for member in self.pending():
            if self._count(member, ".begun") < (self.arrival or 1):
                if waited_s >= START_GRACE_S:
                    return "%s never began this task within %d s: %s's lock is not held for it any longer" % (
                        member, START_GRACE_S, self.me)
                continue
            pid = self._last_pid(member)
            if pid is not None and not alive(pid):
                return "%s's worker (pid %d) ended without its task ending: %s's lock is not held for it any " \
                       "longer" % (member, pid, self.me)
        return None

    def arrive(self):
        """Say this member's work ended (its n-th arrival at this hold)."""
        if self.arrival is not None:
            return
        os.makedirs(self.dir, mode=0o700, exist_ok=True)
        with open(self._path(self.me), "a") as fh:
            fh.write("%d\n" % os.getpid())
        self.arrival = self._count(self.me)

    def pending(self):
        """The members that have not arrived yet as often as this one."""
        return [m for m in self.members if self._count(m) < (self.arrival or 1)]

    def wait(self, renew, every_s, clock=time.monotonic, sleep=time.sleep, alive=None):
        """Until every member arrived, call ``renew()`` at once and then every ``every_s`` -> None, or the words of
        the first renewal that failed (``renew`` returns them; the wait then ends: this member's lock is lost, its
        arrival already said), or why a member will never arrive (``gone``)."""
        began = due = clock()
        while self.pending():
            why = self.gone(clock() - began, alive)
            if why:
                return why
            if clock() >= due:
                why = renew()
                if why:
                    return why
                due = clock() + every_s
            sleep(CHECK_S)
        return None


def _alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True  # another user's: alive
    return True


def forks():
    try:
        return int(context.CLIARGS.get("forks") or C.DEFAULT_FORKS)
    except (TypeError, ValueError):
        return C.DEFAULT_FORKS


def hold_for(spec):
    """The Hold for ``group_hold`` (None: no hold asked) and a warning when the group cannot be held -> (hold,
    lock, warning). A group larger than the play's forks cannot run every member's task at once: a member
    waiting for one whose task has not started would wait forever; it is not held (its lease may lapse while
    the play waits; the lock taken back after the jobs says so)."""
    if not spec:
        return None, None, None
    key, me, members, lock = checked(spec)
    if len(set(members)) > forks():
        return None, None, ("trainer group of %d members with forks %d: a member's lock is not renewed while the "
                            "play waits for the others (set forks to at least %d)" % (len(set(members)), forks(),
                                                                                      len(set(members))))
    return Hold(key, me, members), lock, None


def lease_every(lock):
    lease = float((lock or {}).get("lease_s") or 30)
    return max(1.0, lease / 4.0)


def renewal(action, task_vars, lock, host):
    """``renew`` for Hold.wait: trainer_lock O(state=renew) of the play's lock on this member, through the
    task's connection -> None, or why it failed."""
    def renew():
        result = action._execute_module(  # pylint: disable=protected-access  # the action plugin's own call
            module_name="dflash.trainer.trainer_lock",
            module_args=dict(path=lock["path"], token=lock["token"], lease_s=int(lock.get("lease_s") or 30),
                             state="renew"),
            task_vars=task_vars)
        if result.get("failed") or result.get("unreachable"):
            return "%s: the deploy lock could not be renewed while the group waited: %s" % (
                host, result.get("msg") or "unreachable")
        return None
    return renew


def run_held(action, run, tmp, task_vars, display):
    """An action plugin's run with its ``group_hold`` (popped from the task's args): ``run(tmp, task_vars)``, then
    held until every member's task ended -> the result; ``group_hold`` in it when the hold ended early (why). With
    ``group_hold.run`` false, this member has nothing to do in this task (it is skipped) but it holds. A member whose
    task left the lock to nobody (a refused lock) or was unreachable only arrives."""
    spec = action._task.args.pop("group_hold", None)  # pylint: disable=protected-access  # the task's own args
    try:
        hold, lock, warning = hold_for(spec)
    except ValueError as exc:
        raise AnsibleActionFail(str(exc)) from None
    if warning:
        display.warning(warning)
    if hold is None:
        return run(tmp, task_vars)
    result = {}
    hold.begin()
    try:
        if spec.get("run", True):
            result = run(tmp, task_vars)
        else:
            result = dict(skipped=True, changed=False, skip_reason="nothing to do on this member")
    finally:
        if action._play_context.check_mode or result.get("unreachable") or result.get("lock_holder") == "nobody":  # pylint: disable=protected-access
            lock = None
        why = held(action, task_vars, hold, lock, display)
    if why:
        result["group_hold"] = why
    return result


def held(action, task_vars, hold, lock, display=None):
    """Arrive, then hold this member's lock until every member arrived -> None, or why the hold ended early."""
    hold.arrive()
    if lock is None:
        return hold.wait(lambda: None, 3600.0)
    host = (task_vars or {}).get("inventory_hostname", "?")
    why = hold.wait(renewal(action, task_vars, lock, host), lease_every(lock))
    if why and display is not None:
        display.warning(why)
    return why
