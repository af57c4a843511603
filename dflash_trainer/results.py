"""Typed results of a dflash.trainer playbook run, built from ansible-runner events.

Pure: no ansible-runner, no I/O. `build_run_result(events, rc=..., status=...)` reads only the
structured event data (`event`, `event_data.host/task/task_action/resolved_action/res`, and the
`playbook_on_stats` counters), never the text a callback printed. Unknown keys are ignored; a
missing key becomes None.

Where each field comes from (per host):
- ok: the play recap (`playbook_on_stats`): no `failures`, no `dark` (unreachable). A failure
  that a rescue block handled is still a `runner_on_failed` event but leaves the recap clean.
  Without a recap (run killed, timeout) no host is ok.
- failed_task / reason: the last unrescued `runner_on_failed` / `runner_on_unreachable` of the
  host (its task name and result `msg`); None when the host is ok.
- changed: any task result with `changed: true`, or a non-zero `changed` count in the recap.
- release / previous_release: the release the restart job switched `current` to and the one it pointed at
  before (the job's `release` / `previous`), else the last `dflash.trainer.trainer_release` upload
  (state present); failing that, the `current` of the last one. A job that switched nothing (a restart, a
  start) ran the release current points at: it is release and previous_release both.
- rolled_back: the job rolled back, or a rollback entry point's job switched `current` (the plan's entry,
  `trainer_plan`'s `plan`).
- restarted: the restart job (`dflash.trainer.trainer_restart`, finished: in the call that started it or in
  the watch) says it restarted the unit.
- proof: the restart job's `proof` (or, after a rollback, its `rollback_proof`); its finished result carries
  proof, rolled_back, log_tail, read as `RestartJobResult`, whose fields are keys the job's result declares.
- log_tail: the restart job's `log_tail` (the failed start's log).
- status: the last `dflash.trainer.trainer_status` or `trainer_plan` (the first read) result (for a
  deploy that restarted, the read before the restart; run `status()` for the state afterwards); status's
  verdict (a `trainer_status` result with `group_status`) reads nothing and is no read.
- group: a trainer group's member: the group as a whole, the fact `__trainer_group_status` status's verdict sets.
- log: `log` of the last trainer_status result that read the log (playbooks/logs.yml).
- diffs: every task result's `diff` (diff mode: `--diff`), in order, each with its task's name.
- unreachable: the host's last unrescued failure was `runner_on_unreachable`, or the recap counts it
  `dark`.
- refused: the host's first failure was a check that runs before any change: the input checks
  (`dflash.trainer.trainer_validate`, `validate_argument_spec`, an `assert`, the read-only entry points' read that
  checks first - `trainer_status` returned `input_refused`), the deploy lock not taken
  or a plan refused (`trainer_plan` returned `lock_refused` or `plan.refused`), or the restart job not
  started (`trainer_restart` returned `not_started`: a refused pre-flight, a failed install, another
  restart running - reported by the role's fail task after it). A refused host's release is the one
  current still points at (an uploaded release no job switched to is not it), as previous_release too.
- source / reasons / outcome / failed_phase: the source's description (`trainer_validate`'s `source`:
  "git 4f1c2d9 dirty"), why the trainer was restarted (`trainer_restart`'s `reasons`), the job's
  `outcome` words and `failed_phase`.
- config / previous_config: the configuration id measured (the job's `comparison`), else the one the
  status read found installed; previous_config: the comparison's.
- elapsed_s: from the host's first event to its last (the events' `created` times), when they carry one.

Exit codes (`HostResult.exit_code`, `RunResult.exit_code`; the CLI exits with the run's), from the
fields above, never from text:
  0 healthy / proved; 1 the trainer is unhealthy or the proof failed (rolled back or not), or the run
  was stopped; 2 refused before any change (bad input, lock held, pre-flight refused, no host matched);
  3 a host unreachable; 4 Ansible could not be started (no ansible-playbook, no configuration, no
  collection, or ansible-playbook ended before any play). Over several hosts the first of 1, 3, 2
  that a host has wins: a failed proof on one host matters more than another host's refusal.

`RunResult.from_dict(result.to_dict())` gives the result back (JSON included: GPU indices that
json.dumps made strings become ints again).
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping, Optional

__all__ = ["Proof", "TrainerStatus", "TrainerLog", "HostResult", "RunResult", "build_run_result",
           "build_host_results", "EXIT_OK", "EXIT_FAILED", "EXIT_REFUSED", "EXIT_UNREACHABLE", "EXIT_NO_ANSIBLE",
           "EXIT_CODES"]

EXIT_OK = 0  # every host healthy / proved
EXIT_FAILED = 1  # the trainer is unhealthy or the proof failed (rolled back or not); a run stopped
EXIT_REFUSED = 2  # refused before any change: bad input, lock held, pre-flight refused, no host matched
EXIT_UNREACHABLE = 3  # a host unreachable
EXIT_NO_ANSIBLE = 4  # Ansible could not be started
EXIT_CODES = {
    EXIT_OK: "healthy / proved",
    EXIT_FAILED: "the trainer is unhealthy or the proof failed (rolled back or not), or the run was stopped",
    EXIT_REFUSED: "refused before any change (bad input, lock held, pre-flight refused, no host matched)",
    EXIT_UNREACHABLE: "a host unreachable",
    EXIT_NO_ANSIBLE: "Ansible could not be started",
}
# the playbooks that restart the trainer (their ok is "proved" when they did)
CHANGING = ("deploy", "restart", "rollback", "start")
# a run over several hosts: the first of these that a host has (then 0)
_PRECEDENCE = (EXIT_FAILED, EXIT_UNREACHABLE, EXIT_REFUSED)

COLLECTION = "dflash.trainer"
_RESULT_EVENTS = {
    "runner_on_ok": "ok",
    "runner_on_failed": "failed",
    "runner_on_unreachable": "unreachable",
    "runner_on_skipped": "skipped",
    "runner_item_on_ok": "ok",
    "runner_item_on_failed": "failed",
    "runner_item_on_skipped": "skipped",
}

# the status of a trainer group as a whole (roles/trainer/tasks/status.yml: trainer_status's verdict, plugin_utils/_group.py's as_one)
GROUP_STATUS_FACT = "__trainer_group_status"


# --- lenient conversions ------------------------------------------------------------------------

def _int(value: Any) -> Optional[int]:
    if value is None or isinstance(value, bool):
        return None
    try:
        return int(value)
    except (TypeError, ValueError):
        try:
            return int(float(value))
        except (TypeError, ValueError):
            return None


def _float(value: Any) -> Optional[float]:
    if value is None or isinstance(value, bool):
        return None
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


def _str(value: Any) -> Optional[str]:
    if value is None:
        return None
    return value if isinstance(value, str) else str(value)


def _bool(value: Any) -> Optional[bool]:
    if value is None:
        return None
    if isinstance(value, str):
        return value.strip().lower() in ("1", "true", "yes", "on", "y")
    return bool(value)


def _gpus_mib(value: Any) -> Optional[dict[int, int]]:
    """{"0": 70000, ...} (JSON keys are strings) -> {0: 70000, ...}; entries that are not numbers are dropped."""
    if not isinstance(value, Mapping):
        return None
    out = {}
    for k, v in value.items():
        idx, mib = _int(k), _int(v)
        if idx is not None and mib is not None:
            out[idx] = mib
    return dict(sorted(out.items()))


def _lines(value: Any) -> list[str]:
    if value is None:
        return []
    if isinstance(value, str):
        return value.splitlines()
    if isinstance(value, (list, tuple)):
        return [_str(x) or "" for x in value]
    return []


def _mapping(value: Any) -> Mapping:
    return value if isinstance(value, Mapping) else {}


# --- typed module results -----------------------------------------------------------------------

@dataclass(frozen=True)
class Proof:
    """What the restart job's proof observed when it proved the trainer ready (its result's `proof`)."""
    release: Optional[str] = None
    invocation_id: Optional[str] = None
    main_pid: Optional[int] = None
    gpus_mib: Optional[dict[int, int]] = None
    matched_line: Optional[str] = None
    tok_s: Optional[float] = None
    step: Optional[int] = None
    seconds_to_ready: Optional[float] = None

    @classmethod
    def from_result(cls, proof: Any) -> Optional["Proof"]:
        """From the module result's `proof` dict; None when there is none."""
        if not isinstance(proof, Mapping):
            return None
        return cls(release=_str(proof.get("release")), invocation_id=_str(proof.get("invocation_id")),
                   main_pid=_int(proof.get("main_pid")), gpus_mib=_gpus_mib(proof.get("gpus_mib")),
                   matched_line=_str(proof.get("matched_line")), tok_s=_float(proof.get("tok_s")),
                   step=_int(proof.get("step")), seconds_to_ready=_float(proof.get("seconds_to_ready")))


@dataclass(frozen=True)
class TrainerStatus:
    """A `dflash.trainer.trainer_status` result."""
    active: Optional[bool] = None
    active_state: Optional[str] = None
    sub_state: Optional[str] = None
    main_pid: Optional[int] = None
    n_restarts: Optional[int] = None
    running_release: Optional[str] = None
    current_release: Optional[str] = None
    last_good: Optional[str] = None
    drift: Optional[bool] = None
    gpus_mib: Optional[dict[int, int]] = None
    last_progress_line: Optional[str] = None
    tok_s: Optional[float] = None
    seconds_since_start: Optional[float] = None
    # the release ledger's last entries, newest first (playbooks/history.yml), and the last restart job
    history: list = field(default_factory=list)
    last_job: Optional[dict] = None
    # whether it runs its proved release healthily: ok, words ("died 3 min after its proof: ..."), died
    health: Optional[dict] = None
    # the configuration id of the installed command and environment (a keyed hash, as the ledger's rows
    # carry it in `config`; each row's `vs` compares it with the entry before it that was proved); None: unknown
    config: Optional[str] = None

    @classmethod
    def from_result(cls, res: Any) -> Optional["TrainerStatus"]:
        if not isinstance(res, Mapping):
            return None
        # the module returns `running` (active and running); accept `active` too
        active = res.get("active", res.get("running"))
        return cls(active=_bool(active), active_state=_str(res.get("active_state")),
                   sub_state=_str(res.get("sub_state")), main_pid=_int(res.get("main_pid")),
                   n_restarts=_int(res.get("n_restarts")), running_release=_str(res.get("running_release")),
                   current_release=_str(res.get("current_release")), last_good=_str(res.get("last_good")),
                   drift=_bool(res.get("drift")), gpus_mib=_gpus_mib(res.get("gpus_mib")),
                   last_progress_line=_str(res.get("last_progress_line")), tok_s=_float(res.get("tok_s")),
                   seconds_since_start=_float(res.get("seconds_since_start")),
                   history=[dict(row) for row in res.get("history") or [] if isinstance(row, Mapping)],
                   last_job=dict(res["last_job"]) if isinstance(res.get("last_job"), Mapping) else None,
                   health=dict(res["health"]) if isinstance(res.get("health"), Mapping) else None,
                   config=_str(res.get("config")))


@dataclass(frozen=True)
class TrainerLog:
    """A start's log as `trainer_status` read it (log_lines / log_offset): its lines, and the offset
    and inode a follower passes back for the lines after them."""
    invocation: Optional[str] = None
    release: Optional[str] = None
    lines: list = field(default_factory=list)
    offset: Optional[int] = None
    inode: Optional[int] = None
    ended: bool = False
    found: bool = False
    problem: Optional[str] = None

    @classmethod
    def from_result(cls, log: Any) -> Optional["TrainerLog"]:
        if not isinstance(log, Mapping):
            return None
        return cls(invocation=_str(log.get("invocation")), release=_str(log.get("release")),
                   lines=_lines(log.get("lines")), offset=_int(log.get("offset")), inode=_int(log.get("inode")),
                   ended=bool(_bool(log.get("ended"))), found=bool(_bool(log.get("found"))),
                   problem=_str(log.get("problem")))


@dataclass(frozen=True)
class RestartJobResult:
    """What the API reads of the restart job's result (`dflash.trainer.trainer_restart`'s `result`).

    The job's result is declared once, in the collection's plugins/module_utils/job/result.py
    (`FIELDS`; trainer_restart's RETURN documents it). This package does not import it: `pip
    install` gives dflash_trainer alone, and the collection it drives is found on the collections
    path, never on sys.path. So each field here is named as a declared key and holds a value of its
    declared type (Proof for a dict that is a proof), and tests/unit/test_job_result.py holds them to
    the declaration."""
    release: Optional[str] = None
    previous: Optional[str] = None
    switched: bool = False
    restarted: bool = False
    rolled_back: bool = False
    rollback_release: Optional[str] = None
    restored: bool = False
    proof: Optional[Proof] = None
    rollback_proof: Optional[Proof] = None
    figures: Optional[dict] = None
    comparison: Optional[dict] = None
    outcome: Optional[str] = None
    failed_phase: Optional[str] = None
    # None when the result has no lines
    log_tail: Optional[list] = None

    @classmethod
    def from_result(cls, job: Any) -> "RestartJobResult":
        """From the module result's `result` dict (anything else reads as an empty one)."""
        job = _mapping(job)
        return cls(release=_str(job.get("release")), previous=_str(job.get("previous")),
                   switched=bool(_bool(job.get("switched"))), restarted=bool(_bool(job.get("restarted"))),
                   rolled_back=bool(_bool(job.get("rolled_back"))), rollback_release=_str(job.get("rollback_release")),
                   restored=bool(_bool(job.get("restored"))), proof=Proof.from_result(job.get("proof")),
                   rollback_proof=Proof.from_result(job.get("rollback_proof")),
                   figures=dict(job["figures"]) if isinstance(job.get("figures"), Mapping) else None,
                   comparison=dict(job["comparison"]) if isinstance(job.get("comparison"), Mapping) else None,
                   outcome=_str(job.get("outcome")), failed_phase=_str(job.get("failed_phase")),
                   log_tail=_lines(job.get("log_tail")) if job.get("log_tail") else None)


def _diffs(task: Optional[str], value: Any) -> list[dict]:
    """Ansible's `diff` of a result (a dict or a list of them) as [{task, prepared | before/after...}]."""
    items = value if isinstance(value, list) else [value]
    out = []
    for item in items:
        if isinstance(item, Mapping) and any(item.get(k) for k in ("prepared", "before", "after")):
            d = dict((k, _str(item.get(k))) for k in ("prepared", "before", "after", "before_header", "after_header")
                     if item.get(k) is not None)
            out.append(dict(task=task, **d))
    return out


@dataclass
class HostResult:
    host: str
    ok: bool = False
    changed: bool = False
    failed_task: Optional[str] = None
    reason: Optional[str] = None
    release: Optional[str] = None
    previous_release: Optional[str] = None
    restarted: bool = False
    proof: Optional[Proof] = None
    rolled_back: bool = False
    status: Optional[TrainerStatus] = None
    log_tail: list[str] = field(default_factory=list)
    # measured throughput of the restarted release and its comparison with the entry before it that was
    # proved (words, median, release, config, previous_release, previous_config, previous_at,
    # previous_median, change_pct, best_median)
    figures: Optional[dict] = None
    comparison: Optional[dict] = None
    log: Optional[TrainerLog] = None
    diffs: list = field(default_factory=list)
    unreachable: bool = False
    refused: bool = False
    source: Optional[str] = None
    reasons: list = field(default_factory=list)
    outcome: Optional[str] = None
    failed_phase: Optional[str] = None
    config: Optional[str] = None
    previous_config: Optional[str] = None
    elapsed_s: Optional[float] = None
    # status of a trainer group's member: the group as a whole (ok: true, false or null - not judged; words; members)
    group: Optional[dict] = None

    @property
    def exit_code(self) -> int:
        """0 ok; 3 unreachable; 2 refused before any change; 1 any other failure."""
        if self.ok:
            return EXIT_OK
        if self.unreachable:
            return EXIT_UNREACHABLE
        if self.refused:
            return EXIT_REFUSED
        return EXIT_FAILED

    def to_dict(self, playbook: Optional[str] = None) -> dict:
        """dataclasses.asdict plus exit_code and summary (derived: from_dict ignores them)."""
        return dict(dataclasses.asdict(self), exit_code=self.exit_code, summary=self.summary(playbook))

    def verdict(self, playbook: Optional[str] = None) -> str:
        """One word or two: proved, unchanged, healthy, ok, stopped, refused, unreachable, unhealthy,
        failed, failed, rolled back."""
        if self.ok:
            if playbook == "status":
                # a trainer stopped on purpose (the stop playbook) is no failure, and not running either
                health = self.status.health if self.status is not None else None
                return "stopped" if isinstance(health, Mapping) and health.get("stopped") else "healthy"
            if playbook == "stop":
                return "stopped"
            if playbook in CHANGING:
                return "proved" if self.restarted and self.proof is not None else "unchanged"
            return "ok"
        if self.unreachable:
            return "unreachable"
        if self.refused:
            return "refused"
        if playbook == "status":
            return "unhealthy"
        return "failed, rolled back" if self.rolled_back else "failed"

    def tok_s(self) -> dict:
        """The measured tok/s against the previous configuration's: now, previous, change_pct (None when
        unknown), from the job's comparison, else the proof, else the status read."""
        c = self.comparison or {}
        now = _float(c.get("median"))
        if now is None and self.proof is not None:
            now = self.proof.tok_s
        if now is None and self.status is not None:
            now = self.status.tok_s
        return dict(now=now, previous=_float(c.get("previous_median")), change_pct=_float(c.get("change_pct")),
                    previous_release=_str(c.get("previous_release")), previous_config=self.previous_config)

    def done(self) -> list:
        """What the run did on this host, in words (restarted because ..., rolled back to ..., ...)."""
        first = (self.reason or "").strip().splitlines()
        first = first[0] if first else "(no message)"
        words = []
        if self.unreachable:
            return ["unreachable: %s" % first]
        if self.refused:
            return ["refused before any change: %s" % first]
        if self.restarted:
            words.append("restarted" + (" because: %s" % "; ".join(self.reasons) if self.reasons else ""))
        if self.rolled_back:
            words.append("rolled back to %s (from %s)" % (self.release, self.previous_release or "?"))
        if self.proof is not None:
            words.append("proved ready: release %s, step %s, %s s to ready" % (
                self.proof.release, self.proof.step, self.proof.seconds_to_ready))
        if not self.ok:
            where = self.failed_phase or self.failed_task
            words.append("failed%s: %s" % (" (%s)" % where if where else "", first))
        elif not self.restarted and not words:
            words.append("nothing restarted")
        return words

    def summary(self, playbook: Optional[str] = None) -> dict:
        """The end-of-run block for this host: verdict, exit code, release and its source, config,
        tok/s against the previous configuration, what was done, time taken."""
        return dict(verdict=self.verdict(playbook), exit_code=self.exit_code, release=self.release,
                    previous_release=self.previous_release, source=self.source, config=self.config,
                    tok_s=self.tok_s(), done=self.done(), elapsed_s=self.elapsed_s)

    @classmethod
    def from_dict(cls, data: Mapping) -> "HostResult":
        """The inverse of dataclasses.asdict (and of its JSON)."""
        data = _mapping(data)
        names = set(f.name for f in dataclasses.fields(cls))
        kw = dict((k, v) for k, v in data.items() if k in names)
        kw["proof"] = Proof.from_result(data.get("proof"))
        kw["status"] = TrainerStatus.from_result(data.get("status"))
        kw["log"] = TrainerLog.from_result(data.get("log"))
        kw["elapsed_s"] = _float(data.get("elapsed_s"))
        return cls(**kw)


@dataclass
class RunResult:
    ok: bool
    rc: Optional[int]
    status: Optional[str]
    hosts: dict[str, HostResult] = field(default_factory=dict)
    stats: dict[str, dict[str, int]] = field(default_factory=dict)
    # why the run failed as a whole (it could not start: ansible-playbook not found; it ended
    # without a play recap); None when the play ran to its recap
    reason: Optional[str] = None
    # False: Ansible could not be started (no ansible-playbook, configuration or collection)
    started: bool = True
    # ansible-playbook refused the run before any play: its host pattern and --limit matched no host
    # ("... leaves us with no hosts to target"), or it refused its arguments (rc 4, 5)
    refused: bool = False
    # the playbook run (a key of api.PLAYBOOKS), the inventory it read and where that came from
    # (-i, ANSIBLE_INVENTORY, the configuration file, Ansible's default), the run's wall time
    playbook: Optional[str] = None
    inventory: list = field(default_factory=list)
    inventory_from: Optional[str] = None
    elapsed_s: Optional[float] = None
    # the Ansible configuration file the run read (None: Ansible's defaults), and an ansible.cfg left
    # unread because the directory it lies in is one every user may write (as Ansible does)
    config: Optional[str] = None
    config_ignored: Optional[str] = None

    @property
    def exit_code(self) -> int:
        """The code a script branches on (see the module's docstring)."""
        if not self.started:
            return EXIT_NO_ANSIBLE
        codes = set(h.exit_code for h in self.hosts.values())
        for code in _PRECEDENCE:
            if code in codes:
                return code
        if self.hosts:
            return EXIT_OK if self.ok else EXIT_FAILED
        if self.status in ("canceled", "timeout"):
            return EXIT_FAILED
        if self.refused or self.stats:  # a recap without hosts: no host matched
            return EXIT_REFUSED
        return EXIT_NO_ANSIBLE  # ansible-playbook ended before any play

    def to_dict(self) -> dict:
        """JSON-ready (GPU indices stay ints; json.dumps makes them strings), with exit_code (the run's
        and each host's; derived, from_dict ignores them)."""
        data = dataclasses.asdict(self)
        data["hosts"] = dict((name, h.to_dict(self.playbook)) for name, h in self.hosts.items())
        data["exit_code"] = self.exit_code
        return data

    @classmethod
    def from_dict(cls, data: Mapping) -> "RunResult":
        """A RunResult from to_dict() or its JSON (the CLI's --json)."""
        data = _mapping(data)
        return cls(ok=bool(data.get("ok")), rc=_int(data.get("rc")), status=_str(data.get("status")),
                   hosts=dict((h, HostResult.from_dict(r)) for h, r in _mapping(data.get("hosts")).items()),
                   stats=dict((k, dict(v)) for k, v in _mapping(data.get("stats")).items()),
                   reason=_str(data.get("reason")), started=data.get("started", True) is not False,
                   refused=bool(data.get("refused")), playbook=_str(data.get("playbook")),
                   inventory=[_str(x) for x in data.get("inventory") or []],
                   inventory_from=_str(data.get("inventory_from")), elapsed_s=_float(data.get("elapsed_s")),
                   config=_str(data.get("config")), config_ignored=_str(data.get("config_ignored")))

    @property
    def failed_hosts(self) -> list[str]:
        return [h for h, r in self.hosts.items() if not r.ok]


# --- building from events -----------------------------------------------------------------------

def _action(event_data: Mapping) -> str:
    return _str(event_data.get("resolved_action")) or _str(event_data.get("task_action")) or ""


def _is(action: str, module: str) -> bool:
    return action in ("%s.%s" % (COLLECTION, module), module)


def _release_state(res: Mapping) -> Optional[str]:
    """trainer_release's state (present, mark_good, query): from the module's invocation, else the
    result's shape (its documented RETURN keys)."""
    args = _mapping(_mapping(res.get("invocation")).get("module_args"))
    state = _str(args.get("state"))
    if state:
        return state
    if "transferred" in res or "needs_archive" in res:
        return "present"
    if "previous" in res:
        return "mark_good"
    return "query" if res else None


def _failure_msg(res: Mapping) -> Optional[str]:
    msg = _str(res.get("msg")) or _str(res.get("reason"))
    results = res.get("results")
    if isinstance(results, list):  # a loop: the aggregate says "One or more items failed"
        for item in reversed(results):
            if isinstance(item, Mapping) and (item.get("failed") or item.get("unreachable")):
                return _str(item.get("msg")) or msg
    if msg:
        return msg
    return _str(res.get("stderr")) or _str(res.get("module_stderr")) or None


_CHECKS = ("ansible.builtin.assert", "assert", "ansible.builtin.validate_argument_spec", "validate_argument_spec")


def _is_refusal(action: str, res: Mapping) -> bool:
    """A failed result of a check that runs before any change (see the module's docstring)."""
    if _is(action, "trainer_validate") or action in _CHECKS:
        return True
    if _is(action, "trainer_status") and _bool(res.get("input_refused")):  # a read's own input check (check: status)
        return True
    if _is(action, "trainer_plan") and (_bool(res.get("lock_refused")) or _mapping(res.get("plan")).get("refused")):
        return True
    return _is(action, "trainer_restart") and bool(_bool(res.get("not_started")) or _bool(res.get("preflight_refused")))


def _created(event: Mapping) -> Optional[float]:
    """An event's `created` time (ISO 8601, as ansible-runner writes it) in seconds; None without one."""
    import datetime
    value = event.get("created")
    if not isinstance(value, str):
        return None
    try:
        stamp = datetime.datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None
    if stamp.tzinfo is None:
        stamp = stamp.replace(tzinfo=datetime.timezone.utc)
    return stamp.timestamp()


class _HostState:
    def __init__(self, host: str):
        self.result = HostResult(host=host)
        self.last_failure: Optional[tuple[Optional[str], Optional[str]]] = None
        self.last_failure_kind: Optional[str] = None
        self.first_failure_refused: Optional[bool] = None
        self.times: list[float] = []
        self.release_from_switch = False
        self.current_fallback: Optional[str] = None
        # the deploy's release was current already (no trainer_release ran): previous is the same release
        self.unswitched = False
        self.entry: Optional[str] = None  # the plan's entry point (trainer_plan)
        # what current pointed at when this run uploaded its release (None: no upload); the job switched it
        self.upload_over: Optional[str] = None
        self.job_switched = False
        self.not_started = False  # the call that starts the restart job said nothing was started

    def observe(self, kind: str, is_item: bool, event_data: Mapping, res: Mapping) -> None:
        r = self.result
        task = _str(event_data.get("task"))
        if _bool(res.get("changed")):
            r.changed = True
        if not is_item and kind in ("failed", "unreachable") and not _bool(event_data.get("ignore_errors")):
            self.last_failure = (task, _failure_msg(res))
            self.last_failure_kind = kind
            if self.first_failure_refused is None:
                # the role reports a job that never started with a fail task (nothing was stopped)
                self.first_failure_refused = kind == "failed" and (_is_refusal(_action(event_data), res) or (
                    self.not_started and _action(event_data) in ("ansible.builtin.fail", "fail")))
        if kind not in ("ok", "failed"):
            return
        facts = res.get("ansible_facts")
        if isinstance(facts, Mapping) and isinstance(facts.get(GROUP_STATUS_FACT), Mapping):
            r.group = dict(facts[GROUP_STATUS_FACT])
        # a loop's aggregate result repeats its items (seen as runner_item_on_* events)
        if not is_item and isinstance(res.get("results"), list):
            return
        if res.get("diff"):
            r.diffs.extend(_diffs(task, res.get("diff")))
        action = _action(event_data)
        if _is(action, "trainer_restart"):
            self.job_start(kind, res)
        elif _is(action, "trainer_validate") and kind == "ok" and res.get("source") is not None:
            r.source = _str(res.get("source"))  # "": trainer_src is not a git checkout
        elif (_is(action, "trainer_status") and "group_status" not in res  # (status's verdict reads nothing)
              or _is(action, "trainer_plan")) and kind == "ok":
            r.status = TrainerStatus.from_result(res)
            plan = _mapping(res.get("plan"))
            self.entry = _str(plan.get("entry")) or self.entry
            # a deploy that changed nothing (no_op), or whose release was already current, uploads nothing:
            # the release is the one current points at
            if plan.get("entry") == "deploy" and (_bool(plan.get("no_op")) or not _bool(plan.get("upload"))):
                self.current_fallback = self.current_fallback or _str(res.get("current_release"))
                self.unswitched = True
            if isinstance(res.get("log"), Mapping):
                r.log = TrainerLog.from_result(res.get("log"))
            if isinstance(res.get("job_start"), Mapping):  # the first read started the plan's restart job
                self.job_start(kind, res["job_start"])
        elif _is(action, "trainer_release") and kind == "ok":
            state = _release_state(res)
            # present: uploaded (the restart job switches current to it)
            if state == "present":
                r.release = _str(res.get("release"))
                r.previous_release = self.upload_over = _str(res.get("previous"))
                self.release_from_switch = True
            else:
                self.current_fallback = _str(res.get("current")) or _str(res.get("release")) or self.current_fallback

    def job_start(self, kind: str, res: Mapping) -> None:
        """A result of the restart job's start or watch (trainer_restart; trainer_plan's job_start)."""
        r = self.result
        if _bool(res.get("finished")):
            # the restart job (stop, drain, purge, start, prove; rollback), watched with operation=wait
            if isinstance(res.get("reasons"), list):  # a job that ended within the call that started it
                r.reasons = [_str(x) or "" for x in res["reasons"]]
            job = RestartJobResult.from_result(res.get("result"))
            if job.restarted:
                r.restarted = True
            if job.comparison is not None:
                r.comparison = job.comparison
            if job.figures is not None:
                r.figures = job.figures
            if job.proof is not None:
                r.proof = job.proof
            if job.log_tail is not None:
                r.log_tail = job.log_tail
            r.outcome = job.outcome or r.outcome
            r.failed_phase = job.failed_phase or r.failed_phase
            if job.restored and job.rollback_proof is not None:
                r.proof = job.rollback_proof
            if job.switched and job.release:  # the job switched current to the plan's release
                r.release, r.previous_release = job.release, job.previous
                self.release_from_switch = self.job_switched = True
                if self.entry == "rollback":
                    r.rolled_back = True
            elif job.release:  # a restart or start of the current release: nothing switched
                self.current_fallback = job.release
                self.unswitched = True
            if job.rolled_back:
                r.rolled_back = True
                r.release = job.rollback_release or r.release
                r.previous_release = job.release or r.previous_release
                self.release_from_switch = True
                if job.rollback_proof is not None:
                    r.proof = job.rollback_proof
        elif kind == "ok" and _bool(res.get("not_started")):
            self.not_started = True
        elif kind == "ok" and isinstance(res.get("reasons"), list):
            # the call that started the job: why the trainer restarts
            r.reasons = [_str(x) or "" for x in res["reasons"]]

    def finish(self, stats: Optional[Mapping]) -> HostResult:
        r = self.result
        host = r.host
        if r.comparison:
            r.config = _str(r.comparison.get("config"))
            r.previous_config = _str(r.comparison.get("previous_config"))
        if r.config is None and r.status is not None:
            r.config = r.status.config
        if len(self.times) >= 2:
            r.elapsed_s = round(max(self.times) - min(self.times), 1)
        if not self.release_from_switch and r.release is None:
            r.release = self.current_fallback
            if self.unswitched and r.previous_release is None:
                r.previous_release = r.release
        if stats is None:
            r.ok = False
        else:
            failures = _int(_mapping(stats.get("failures")).get(host)) or 0
            dark = _int(_mapping(stats.get("dark")).get(host)) or 0
            r.ok = failures == 0 and dark == 0
            if (_int(_mapping(stats.get("changed")).get(host)) or 0) > 0:
                r.changed = True
        if r.ok:
            r.failed_task = r.reason = None
        elif self.last_failure is not None:
            r.failed_task, r.reason = self.last_failure
        elif stats is None:
            r.reason = "the run ended without a play recap"
        if not r.ok:
            dark = 0 if stats is None else _int(_mapping(stats.get("dark")).get(host)) or 0
            r.unreachable = self.last_failure_kind == "unreachable" or dark > 0
            r.refused = bool(self.first_failure_refused) and not r.unreachable
            if r.refused:  # nothing was started: no rollback, and current is where it was
                r.rolled_back = False
                if self.upload_over is not None and not self.job_switched:
                    r.release = r.previous_release = self.upload_over
        return r


_STATS_KEYS = ("ok", "changed", "failures", "dark", "skipped", "rescued", "ignored", "processed")


def build_host_results(events: Iterable[Mapping], status: Optional[str] = None
                       ) -> tuple[dict[str, HostResult], Optional[dict[str, dict[str, int]]]]:
    """Per-host results and the recap counters (None when the run produced no recap)."""
    hosts: dict[str, _HostState] = {}
    stats: Optional[Mapping] = None
    for event in events:
        if not isinstance(event, Mapping):
            continue
        name = event.get("event")
        data = _mapping(event.get("event_data"))
        if name == "playbook_on_stats":
            stats = data
            continue
        kind = _RESULT_EVENTS.get(name)
        if kind is None:
            continue
        host = _str(data.get("host"))
        if not host:
            continue
        state = hosts.setdefault(host, _HostState(host))
        when = _created(event)
        if when is not None:
            state.times.append(when)
        state.observe(kind, name.startswith("runner_item_"), data, _mapping(data.get("res")))
    recap = None
    if stats is not None:
        recap = {k: {h: _int(n) or 0 for h, n in _mapping(stats.get(k)).items()} for k in _STATS_KEYS}
        for k in _STATS_KEYS:
            for h in recap[k]:
                hosts.setdefault(h, _HostState(h))
    results = {h: hosts[h].finish(stats) for h in sorted(hosts)}
    if stats is None and status:
        for r in results.values():
            if r.reason == "the run ended without a play recap":
                r.reason = "the run ended without a play recap (runner status: %s)" % status
    return results, recap


def build_run_result(events: Iterable[Mapping], rc: Optional[int] = None, status: Optional[str] = None) -> RunResult:
    """A RunResult from runner events. ok: the run succeeded (rc 0, status successful when given),
    at least one host was processed, and every host is ok."""
    hosts, recap = build_host_results(events, status=status)
    ok = bool(hosts) and all(h.ok for h in hosts.values())
    if rc is not None and rc != 0:
        ok = False
    if status is not None and status != "successful":
        ok = False
    if recap is None:
        ok = False
    return RunResult(ok=ok, rc=rc, status=status, hosts=hosts, stats=recap or {})
