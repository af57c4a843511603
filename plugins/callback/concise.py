# -*- coding: utf-8 -*-
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""ansible.builtin.default's output without the tasks a run skips, the banner of a task that speaks while it
runs printed before its words."""
from __future__ import annotations

DOCUMENTATION = r"""
name: concise
type: stdout
short_description: ansible.builtin.default's output without the tasks a run skips
version_added: "0.1.0"
description:
  - The output of the C(ansible.builtin.default) stdout callback, less the tasks a run skips.
    A deploy skips most of the role's tasks (the branches not taken); this callback leaves them out,
    as C(display_skipped_hosts=false) does with the default callback.
  - With the default callback, hiding skipped tasks delays each task's banner until its first result,
    so the lines a restart job's watch says while it runs (C([host] restart job - proving ...)) came before
    the banner of the task that said them. This callback prints the banner of a task whose action speaks
    while it runs (the collection's trainer_plan, trainer_restart, trainer_lock and trainer_release)
    when that task starts; such a task, when skipped, says C(skipping) under its banner.
  - From C(-vvv) on, where Ansible says each task's connection and module lines while it runs, every task's
    banner is printed when it starts and a skipped task says C(skipping) under it, as with the default callback.
  - The answer of the collection's C(trainer_group) action (a trainer group's plan or verdict), of its
    C(trainer_doctor) action (the doctor's report), of C(trainer_node_gpus) (who holds the trainer's GPUs, as the
    node sees it) and of C(trainer_status) (a failure, or what the watch after a proof saw) is shown by its words
    alone (its C(msg), and the C(lines) beside the message of a failure), as C(ansible.builtin.debug) shows its
    message.
  - Set O(display_skipped_hosts=true) to see every skipped task again.
extends_documentation_fragment:
  - ansible.builtin.default_callback
  - ansible.builtin.result_format_callback
options:
  display_skipped_hosts:
    default: false
requirements:
  - set as stdout callback in configuration (C(stdout_callback = dflash.trainer.concise) in ansible.cfg's
    C([defaults]), or C(ANSIBLE_STDOUT_CALLBACK=dflash.trainer.concise))
"""

from ansible import constants as C
from ansible.plugins.callback.default import CallbackModule as DefaultCallback

# The collection's actions that print lines while their task runs: the restart job's phases
# (plugins/plugin_utils/_watch.py) and a trainer group's waits (_group_hold.py's warnings).
# tests/unit/test_concise_callback.py fails if an action that speaks is missing here.
SPEAKING_ACTIONS = frozenset("dflash.trainer.%s" % name for name in (
    "trainer_plan", "trainer_restart", "trainer_lock", "trainer_release"))


# The collection's actions whose answer may carry words to say (``msg``, with ``_ansible_verbose_always``: a trainer
# group's plan or verdict, registered whole; the doctor's report; the node's view of the GPUs; a watch's words): the
# words are shown alone, as ansible.builtin.debug's msg is.
SAYING_ACTIONS = frozenset("dflash.trainer.%s" % name for name in (
    "trainer_group", "trainer_doctor",
    "trainer_node_gpus",  # who holds the trainer's GPUs, as the node sees it
    "trainer_status"))  # what the watch after a proof saw
# (lines: the doctor's report, beside the message of its failure)
_SAID_KEYS = ("msg", "lines", "exception", "warnings", "deprecations")


# From -vvv on, Ansible says each task's connection and module lines while it runs: every banner is printed
# when its task starts (and a skipped task says so under it), as the default callback does.
VERBOSE_EVERY_BANNER = 3


def speaks(resolved_action):
    """Whether a task of RESOLVED_ACTION (a FQCN, or None when unresolved) may print lines while it runs."""
    return resolved_action in SPEAKING_ACTIONS


class CallbackModule(DefaultCallback):
    """The default callback, skipped tasks left out, a speaking task's banner printed when it starts."""

    CALLBACK_VERSION = 2.0
    CALLBACK_TYPE = "stdout"
    CALLBACK_NAME = "dflash.trainer.concise"

    def __init__(self):
        super().__init__()
        self._eager_banners = set()

    def _task_start(self, task, prefix=None):
        super()._task_start(task, prefix)
        if self._last_task_name is None or self._last_task_banner == task._uuid:
            return  # a free strategy names no task at its start; or its banner is printed already
        if speaks(task.resolved_action) or self._display.verbosity >= VERBOSE_EVERY_BANNER:
            self._print_task_banner(task)
            self._eager_banners.add(task._uuid)

    def _clean_results(self, result, task_name):
        if task_name in SAYING_ACTIONS and "msg" in result:  # its words alone, not the whole answer
            # (the lines beside a failure's message; a success's lines to show are its msg)
            said = _SAID_KEYS if result.get("failed") else tuple(k for k in _SAID_KEYS if k != "lines")
            for key in [k for k in result if k not in said and not str(k).startswith("_")]:
                result.pop(key)
            return
        super()._clean_results(result, task_name)

    def v2_runner_on_skipped(self, result):
        if result.task._uuid in self._eager_banners and not self.get_option("display_skipped_hosts"):
            # its banner is on the screen: say what became of it, as the default callback does
            self._display.display("skipping: [%s]" % result.host.get_name(), color=C.COLOR_SKIP)
            return
        super().v2_runner_on_skipped(result)
