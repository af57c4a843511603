# -*- coding: utf-8 -*-
# Copyright: dflash.trainer maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The restart job's settings, passed whole: the role builds them once (roles/trainer/vars/main.yml:
``__trainer_job_args``) and every task that starts a job - a restart, a group member's, a stop - gives them
as trainer_restart's ``job``, naming on the task only what differs for it (its reasons, its owner, its wait).
A setting added to the job is one line in its options (module_utils/job/options.py) and one in
``__trainer_job_args``; no task writes it out again (tests/unit/test_job_args.py holds this)."""
from __future__ import annotations

from collections.abc import Mapping

from ansible_collections.dflash.trainer.plugins.module_utils.job.start import JOB_OPTIONS

# what only a start does: a deliberate stop (operation=stop) has nothing to pre-flight or enable, so the
# job's pre-flight settings (whose release is a start's) are not passed to it
START_ONLY = ("preflight", "enable")


def with_job(args):
    """A task's args with ``job`` popped and spread under them -> the module's args (the task's own
    options win; a stop takes no START_ONLY setting from it); ValueError, before anything runs, for a ``job`` that is not a dict of the job's options."""
    args = dict(args)
    job = args.pop("job", None)
    if job is None:
        return args
    if not isinstance(job, Mapping):
        raise ValueError("job must be a dictionary of the restart job's settings, got %s" % type(job).__name__)
    unknown = sorted(str(k) for k in job if k not in JOB_OPTIONS)
    if unknown:
        raise ValueError("job: %s %s no setting of the restart job (its settings: %s)" % (
            ", ".join(unknown), "is" if len(unknown) == 1 else "are", ", ".join(sorted(JOB_OPTIONS))))
    if args.get("operation") == "stop":
        job = {k: v for k, v in job.items() if k not in START_ONLY}
    return dict(job, **args)
