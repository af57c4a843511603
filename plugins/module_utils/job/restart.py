# -*- coding: utf-8 -*-
# Copyright: dflash.trainer maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The restart job: the whole cycle and its rollback, run on the target.

Once the trainer is stopped, nothing may depend on the controller staying connected: a lost
ssh link or a killed ansible-playbook makes Ansible skip ``rescue`` and ``always``, which used to
strand a stopped trainer and a held lock. So the role starts this job (``trainer_restart``
operation=start, detached in the container: a new session, no standard streams) and only watches it. The job

  switch current to the release -> stop -> drain -> purge -> start -> prove -> mark good
  on failure: current back to the last good release -> stop -> drain -> purge -> start -> re-prove
  (no good release to go back to: stop the failed trainer)

A release brought back with the configuration it was proved with (the ledger says so: ``proved_before``)
is re-proved, not proved again from scratch: the same conditions - the unit active on this start, its GPUs
held, the step counter rising - held for the stall window instead of the whole hold, and no throughput
window after it (``Steps.prove``'s ``reproof``). Anything else brought back gets the full proof.

renews the deploy lock while it runs (a lease: a job that dies stops renewing), releases it at
the end, and keeps its phase and its outcome in a state file that the next run reads: an
interrupted run's outcome is reported, never lost.

``RestartJob`` takes its steps and the release layout as callables, so tests drive it with fakes.
"""

from __future__ import annotations

import time

from ansible_collections.dflash.trainer.plugins.module_utils.job.cycle import StepFailed
from ansible_collections.dflash.trainer.plugins.module_utils.target.install import config_words
from ansible_collections.dflash.trainer.plugins.module_utils.job.result import JobResult
from ansible_collections.dflash.trainer.plugins.module_utils.job.lock import LeaseLost
from ansible_collections.dflash.trainer.plugins.module_utils.proof.throughput import PROVED, compare, entry, gate


def proved_before(ledger, release, config):
    """Whether the ledger holds a proof of ``release`` with the configuration ``config`` (an id): bringing it
    back is then a re-proof. An unknown configuration (None) was never proved."""
    return bool(release) and config is not None and any(
        e.get("release") == release and e.get("verdict") == PROVED and e.get("config") == config for e in ledger)


def _words(exc):
    if isinstance(exc, OSError) and exc.strerror:
        return "%s%s" % (exc.strerror, " (%s)" % exc.filename if exc.filename else "")
    return "%s: %s" % (type(exc).__name__, exc)


class RestartJob(object):
    """One restart (and its rollback). ``steps`` provides stop(), drain(), purge(), start(),
    prove(invocation_id, n_restarts), unit_state(); ``layout`` provides current(), last_good(),
    switch(rid), mark_good(rid); ``tick()`` is called often (renews the lock, records the
    phase); ``clock`` gives wall time."""

    def __init__(self, steps, layout, rollback=True, purge=True, on_phase=None, clock=time.time,
                 releases_dir="the releases directory", log_path=None, source=None, min_tokps_ratio=None,
                 lease=None, config=None, config_id=None, release=None, mark_good=True, restore_config=False):
        # a trainer group's rollback: the configuration proved with the release is put back before its start
        self.restore_config = restore_config
        # False: a member of a trainer group - proved here, marked good by the play once every member is
        self.marks_good = mark_good
        # the release to run: current is switched to it (under the lease, before the stop); None - current's
        self.target = release
        self.lease = lease  # .check() raises LeaseLost once the deploy lock is not ours
        # the configuration id of what a start runs (target.config_id: a keyed hash of the installed command and
        # environment, for the ledger): a callable read at each start, or a str; None - unknown
        self.config_id = config_id
        # the configuration (unit, environment file, launcher) proved with the last good release:
        # .kept_for(rid), .keep(rid), .restore(rid) -> names restored (target.install.ProvedConfig); None - not kept
        self.config = config
        self.source = source
        self.min_tokps_ratio = min_tokps_ratio
        self.releases_dir = releases_dir
        self.log_path = log_path
        self.steps = steps
        self.layout = layout
        self.rollback = rollback
        self.purge = purge
        self.on_phase = on_phase or (lambda phase, **kw: None)
        self.clock = clock
        self.phases = []
        self.warnings = []

    def phase(self, name, **kw):
        self.phases.append(name)
        self.on_phase(name, **kw)

    def _ours(self):
        """Before anything is stopped, switched or started: the deploy lock is still ours."""
        if self.lease is not None:
            self.lease.check()

    def _step(self, name, fn, *args):
        """Run one step; any error becomes StepFailed, so whatever fails after the stop ends in a
        restore or a rollback with a recorded reason, never in a stranded trainer."""
        try:
            return fn(*args)
        except StepFailed:
            raise
        except Exception as exc:  # an OSError from the purge (EBUSY), from switching current, ...
            raise StepFailed("%s failed: %s" % (name, _words(exc)), unexpected=True)

    def cycle(self, release, prefix="", strict_drain=True, reproof=False):
        """stop -> drain -> purge -> start -> prove on the release ``current`` points at (``reproof``: a
        release brought back with the configuration it was proved with, see the module's words).

        ``strict_drain`` False (bringing back a release that ran before): memory still held after
        the stop is noted and the start goes ahead - a trainer that ran beside it before is not
        left stopped because of it (another tenant's memory, a leak outside the unit). A purge that
        fails while bringing back is noted the same way: the start matters more than the cache."""
        self._ours()
        self.phase(prefix + "stopping", release=release)
        self._step("stop", self.steps.stop)
        self.phase(prefix + "draining", release=release)
        try:
            self._step("drain", self.steps.drain)
        except StepFailed as exc:
            if strict_drain:
                raise
            self.warnings.append("%s: %s; started anyway (it ran beside that memory before)"
                                 % ((prefix + "drain gate").strip(), exc.msg))
        if self.purge:
            self.phase(prefix + "purging", release=release)
            try:
                self._step("purge", self.steps.purge)
            except StepFailed as exc:
                if strict_drain:
                    raise
                self.warnings.append("%s: %s; started without it" % ((prefix + "purge").strip(), exc.msg))
        self._ours()
        self.phase(prefix + "starting", release=release)
        started = self._step("start", self.steps.start)
        self.phase(prefix + "proving", release=release, invocation_id=started.get("invocation_id"))
        proof = self._step("proof", self.steps.prove, started["invocation_id"], started["n_restarts"], reproof)
        return started, proof

    def _source_of(self, release, ledger):
        for e in reversed(ledger):
            if e.get("release") == release and e.get("source"):
                return e["source"]
        return None

    def run(self):
        """The restart and, on failure, its restore or rollback -> the result dict (its keys: those
        of ``job.result.FIELDS``; built as a ``JobResult``, so no other key can appear). Once the
        deploy lock is no longer this job's, nothing more is stopped, switched or started."""
        try:
            return self._run()
        except LeaseLost as exc:
            self.phase("done")
            msg = ("the restart job stopped acting: the deploy lock is no longer its own (%s); nothing more was "
                   "stopped, switched or started by it" % exc.msg)
            return JobResult(ok=False, msg=msg, lease_lost=True,
                             failed_phase=self.phases[-2] if len(self.phases) > 1 else None,
                             outcome="%s. %s" % (msg, self.steps.unit_state())).to_dict()

    def _switch(self):
        """Point current at the release to run (before anything is stopped) -> (release, previous)."""
        previous = self.layout.current()
        release = self.target or previous
        if release != previous:
            self._ours()
            self.phase("switching", release=release, previous=previous)
            self._step("switching current to %s" % release, self.layout.switch, release)
        return release, previous

    def _run(self):
        release, previous = self._switch()  # a failure here changed nothing: the job ends with the old trainer running
        result = JobResult(release=release, previous=previous, switched=release != previous, restarted=False,
                           rolled_back=False, proof=None)
        ledger = self.layout.ledger()
        # what the release was built from: the controller's git description, else what an earlier
        # job recorded for it, else its id (a content hash)
        self.source = self.source or self._source_of(release, ledger) or "content %s" % release
        config_id = self._config_id_now()  # what this start runs: installed before the job
        try:
            restored = self._put_back_config(release) if self.restore_config else []
            started, proof = self.cycle(release)
            result.update(restarted=True, started=started)
            figures = proof.get("figures") or {}
            comparison = compare(figures, ledger, release, self.source, config=config_id)
            result.update(figures=figures, comparison=comparison)
            refusal = gate(comparison, self.min_tokps_ratio)
            if refusal:
                self.phase("gated")
                raise StepFailed(refusal)
            try:
                if self.marks_good:
                    self.layout.mark_good(release)
            except Exception as exc:  # the trainer is proved: a bookkeeping error is said, not rolled back
                self.warnings.append("could not record %s as last good: %s" % (release, _words(exc)))
                result["warnings"] = list(self.warnings)
            else:
                if self.marks_good:
                    self._keep_config(release)
                if self.warnings:
                    result["warnings"] = list(self.warnings)
            if self.marks_good:  # a group's member: recorded once the group's check has passed (operation=good)
                self._record(result, [entry(release, PROVED, figures, self.source, now=self.clock(), config=config_id)])
            result.update(ok=True, proof=proof, outcome="ready: release %s proved%s (pid %s, step %s, %s tok/s)%s" % (
                release, self._config_said(restored), proof.get("main_pid"), proof.get("step"), proof.get("tok_s"),
                "" if self.marks_good else "; the group's check decides"))
            self.phase("done")
            return result.to_dict()
        except LeaseLost:
            raise
        except Exception as error:  # pylint: disable=broad-exception-caught  # never a stranded trainer
            exc = error if isinstance(error, StepFailed) else StepFailed("unexpected error: %s" % _words(error),
                                                                         unexpected=True)
            result.update(ok=False, msg=exc.msg, failure=exc.msg, failed_phase=self.phases[-1] if self.phases else None,
                          log_tail=exc.details.get("log_tail") or [], failure_details=exc.details)
            result["restarted"] = any(p == "proving" for p in self.phases)
        records = []
        last_good = self.layout.last_good()
        if not self.rollback:
            result["outcome"] = "no rollback (trainer_rollback is off): %s" % self.steps.unit_state()
        elif (result["failed_phase"] in ("stopping", "draining", "purging", "starting")
              or exc.details.get("unexpected")) and last_good in (None, release):
            # nothing was proved wrong (it never started, or our own step failed): the release that
            # ran is brought back rather than left stopped
            # (with the configuration it was proved with, when the job changed it)
            self.phase("restoring", release=release)
            try:
                restored = self._put_back_config(last_good) if last_good == release else []
                _started, proof = self.cycle(release, prefix="restore ", strict_drain=False,
                                             reproof=proved_before(ledger, release, self._config_id_now()))
                result.update(restored=True, rollback_proof=proof, outcome=(
                    "Restored: release %s runs again%s and is proved ready (pid %s, step %s, %s tok/s)."
                    % (release, self._config_said(restored), proof.get("main_pid"), proof.get("step"),
                       proof.get("tok_s"))))
            except StepFailed as exc:
                result.update(rollback_failure=exc.msg, outcome="Restoring release %s FAILED as well: %s. %s" % (
                    release, exc.msg.splitlines()[0], self.steps.unit_state()))
        elif not last_good or (last_good == release and not self._config_kept(release)):
            self.phase("stopping failed trainer")
            try:
                self._step("stop", self.steps.stop)
            except StepFailed as exc:
                result["stop_failure"] = exc.msg
            if not last_good:
                what = ("nothing was rolled back: no earlier release was proved here; %s" % self.steps.unit_state())
            else:  # a job before this collection kept the proved configuration
                what = ("nothing was rolled back: no configuration proved with release %s is kept; %s"
                        % (release, self.steps.unit_state()))
            result["outcome"] = ("No rollback: no other release under %s has passed the proof (last good: %s): "
                                 "%s; the failed start's log is kept%s." % (
                                     self.releases_dir, last_good or "none", what,
                                     " in %s" % self.log_path if self.log_path else ""))
        else:
            # the last good release - this same one after an environment-only or forced restart - with
            # the configuration (unit, environment file, launcher) it was proved with
            self.phase("rolling back", release=last_good)
            result.update(rolled_back=True, rollback_release=last_good)
            try:
                self._ours()
                if last_good != release:
                    self._step("switching current back", self.layout.switch, last_good)
                restored = self._put_back_config(last_good)
                config_back = self._config_id_now()  # what the rollback's start runs
                _started, proof = self.cycle(last_good, prefix="rollback ", strict_drain=False,
                                             reproof=proved_before(ledger, last_good, config_back))
                self._keep_config(last_good)
                records.append(entry(release, "rolled back" if last_good != release else "failed",
                                     result.get("figures"), self.source, result["failure"], now=self.clock(),
                                     config=config_id))
                records.append(entry(last_good, PROVED, proof.get("figures"), self._source_of(last_good, ledger),
                                     "re-proved by a rollback", now=self.clock(), config=config_back))
                if last_good == release:
                    outcome = ("Rolled back: release %s runs again%s and is proved ready (pid %s, step %s, %s tok/s); "
                               "the failed start's log is kept%s." % (
                                   release, self._config_said(restored) or " with the configuration it was proved "
                                   "with (unchanged)", proof.get("main_pid"), proof.get("step"), proof.get("tok_s"),
                                   " in %s" % self.log_path if self.log_path else ""))
                else:
                    outcome = ("Rolled back: the last good release %s runs again%s and is proved ready (pid %s, step "
                               "%s, %s tok/s). The failed release %s stays under %s; the failed start's log is kept%s."
                               % (last_good, self._config_said(restored), proof.get("main_pid"), proof.get("step"),
                                  proof.get("tok_s"), release, self.releases_dir,
                                  " in %s" % self.log_path if self.log_path else ""))
                result.update(rollback_proof=proof, outcome=outcome)
            except StepFailed as exc:
                result.update(rollback_failure=exc.msg, outcome="Rollback to release %s FAILED as well: %s. %s" % (
                    last_good, exc.msg.splitlines()[0], self.steps.unit_state()))
        if not records:
            records.append(entry(release, "failed", result.get("figures"), self.source, result["failure"],
                                 now=self.clock(), config=config_id))
        if self.warnings:
            result["warnings"] = list(self.warnings)
            result["outcome"] = "%s (%s)" % (result.get("outcome", ""), "; ".join(self.warnings))
        self._record(result, records)
        self.phase("done")
        return result.to_dict()

    def _config_kept(self, release):
        try:
            return self.config is not None and bool(release) and self.config.kept_for(release)
        except Exception:  # pylint: disable=broad-exception-caught  # unreadable: as if none was kept
            return False

    def _keep_config(self, release):
        """After a proof: the configuration in place is the one proved with ``release`` (kept beside
        last_good). Bookkeeping: a failure is a warning, never a rollback."""
        if self.config is None:
            return
        try:
            self.config.keep(release)
        except Exception as exc:  # pylint: disable=broad-exception-caught
            self.warnings.append("could not keep the configuration proved with %s: %s" % (release, _words(exc)))

    def _put_back_config(self, release):
        """The configuration proved with ``release`` back in place (the files that differ) -> their
        names ([] when none differ or none was kept)."""
        if not self._config_kept(release):
            return []
        return self._step("restoring the proved configuration", self.config.restore, release) or []

    def _config_said(self, restored):
        if not restored:
            return ""
        return " with the configuration it was proved with (%s restored)" % config_words(restored)

    def _config_id_now(self):
        """The configuration id of what the next start runs (None: unknown; never raises: bookkeeping)."""
        try:
            return self.config_id() if callable(self.config_id) else self.config_id
        except Exception:  # pylint: disable=broad-exception-caught
            return None

    def _record(self, result, records):
        """The ledger is bookkeeping: failing to write it never changes the verdict (it is said)."""
        try:
            self.layout.record(records)
        except Exception as exc:  # pylint: disable=broad-exception-caught
            result["ledger_error"] = "Unable to write the release ledger: %s" % exc
