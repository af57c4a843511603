"""Trainers as the field writes them, proved with the role's DEFAULT log patterns on lab container
239: a trainer that first draws a tqdm loading bar (carriage-return redraws on stderr, longer than
the stall window) and then prints HF-style `step N | loss | 12.4K tok/s` lines; a TorchTitan-format
trainer (ANSI colours on, `tps: 12,345`); a Megatron-LM-format trainer (no tokens per second). Each
deploy succeeds and the ledger records the release as proved, with tok/s as the trainer wrote it
(none for Megatron-LM). `dflash-trainer check-log` on each start's captured log reaches the verdict
the lab reached. A format the defaults cannot read fails within seconds of its first progress-like
line (not at trainer_ready_timeout_s), naming the variable to set, and check-log says the same of
its captured log."""
import json
import os
import re
import subprocess
import sys
import textwrap
import time

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CT = "239"
TIMEOUT_S = 60
FAST = {"trainer_ready_hold_s": 3, "trainer_ready_stall_s": 2, "trainer_ready_timeout_s": TIMEOUT_S,
        "trainer_target_hosts": "all"}

# The stand-in trainer: holds GPU memory through the lab's fakegpu (as examples/trainer does), then
# writes its progress in the format named in format.txt. Python 3.11 stdlib only.
TRAINER = textwrap.dedent(r'''
    import os, sys, time
    import fakegpu

    HERE = os.path.dirname(os.path.abspath(__file__))
    FORMAT = open(os.path.join(HERE, "format.txt")).read().strip()
    for gpu in range(8):
        fakegpu.allocate(gpu, 4096)
    print("model ready on 8 gpus", flush=True)
    if FORMAT == "hf":
        # transformers' "Loading checkpoint shards" tqdm bar: stderr, "\r" redraws, ~4 s
        for k in range(6):
            sys.stderr.write("\rLoading checkpoint shards: %3d%%|%s%s| %d/5 [00:%02d<00:04,  1.25s/it]"
                             % (k * 20, "\u2588" * (2 * k), " " * (10 - 2 * k), k, k))
            sys.stderr.flush()
            time.sleep(0.8)
        sys.stderr.write("\n")
        sys.stderr.flush()
    RED, GREEN, ORANGE, TURQ, BLUE, CYAN, MAGENTA, RESET = (
        "\033[31m", "\033[32m", "\033[38;2;180;60;0m", "\033[38;2;54;234;195m", "\033[34m", "\033[36m",
        "\033[35m", "\033[39m")
    step = 0
    while True:
        step += 1
        if FORMAT == "hf":
            line, out = "step %d | loss 2.31 | 12.4K tok/s" % (1199 + step), sys.stdout
        elif FORMAT == "titan":   # torchtitan/components/metrics.py through logging (stderr)
            line, out = ("[titan] 2026-12-01 10:00:00,123 - root - INFO - "
                         f"{RED}step: {step:2}  {GREEN}loss: {7.809:7.4f}  {ORANGE}grad_norm: {1.2345:7.4f}  "
                         f"{TURQ}memory: {30.12:5.2f}GiB({38.05:.2f}%)  {BLUE}tps: {12345:,}  "
                         f"{CYAN}tflops: {301.22:,.2f}  {MAGENTA}mfu: {30.46:.2f}%{RESET}"), sys.stderr
        elif FORMAT == "fairseq":  # fairseq's progress bar: "epoch 001: 5 / 1000", wps - the defaults read neither
            line, out = "| epoch 001:  {:5d} / 1000 loss=2.31, wps=12400, ups=1.2".format(step), sys.stdout
        else:                     # megatron/training/training.py training_log
            line, out = (" [2026-12-01 10:00:00.123456] iteration {:8d}/{:8d} |".format(step, 10000)
                         + " consumed samples: {:12d} |".format(256 * step)
                         + " elapsed time per iteration (ms): 250.1 |"
                         + " throughput per GPU (TFLOP/s/GPU): 312.5 | learning rate: 1.000000E-04 |"
                         + " global batch size:   256 | lm loss: 7.100000E+00 | loss scale: 1.0 |"
                         + " grad norm: 1.200 | number of skipped iterations:   0 |"
                         + " number of nan iterations:   0 |"), sys.stdout
        out.write(line + "\n")
        out.flush()
        time.sleep(0.25)
''')


@pytest.fixture(scope="module")
def inv(lab, tmp_path_factory):
    subprocess.run([sys.executable, os.path.join(ROOT, "lab", "lab.py"), "up", "--fresh", "--ids", CT],
                   check=True, stdout=subprocess.DEVNULL)
    lab.ct(CT, "rm", "-rf", "/opt/dflash-trainer")
    base = tmp_path_factory.mktemp("formats")
    path = base / "hosts.json"
    path.write_text(json.dumps({"all": {"hosts": {"ff": {"proxmox_vmid": int(CT)}}, "vars": lab.conn_vars()}}))
    return str(path), base


def tree(base, fmt):
    dst = base / fmt
    dst.mkdir()
    (dst / "train.py").write_text(TRAINER)
    (dst / "format.txt").write_text(fmt + "\n")
    run = dst / "run.sh"
    run.write_text('#!/bin/bash\nexec python3 -u "$(dirname "$(readlink -f "$0")")/train.py" "$@"\n')
    run.chmod(0o755)
    return str(dst)


def deploy(inv_path, src):
    env = dict(os.environ, ANSIBLE_CONFIG=os.path.join(ROOT, "ansible.cfg"), ANSIBLE_NOCOLOR="1",
               PATH=os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", ""))
    began = time.monotonic()
    res = subprocess.run(["ansible-playbook", "-i", inv_path, "deploy.yml", "-l", "ff", "-e",
                          json.dumps(dict(FAST, trainer_src=src))],
                         cwd=ROOT, env=env, capture_output=True, text=True, timeout=300, check=False)
    return res, time.monotonic() - began


def ledger(lab):
    res = lab.ct(CT, "cat", "/opt/dflash-trainer/ledger.json")
    return json.loads(res.stdout)["entries"] if res.returncode == 0 else []


@pytest.mark.parametrize("fmt,tok_s", [("hf", 12400.0), ("titan", 12345.0), ("megatron", None)])
def test_each_format_is_proved_with_the_default_patterns(lab, inv, fmt, tok_s):
    inv_path, base = inv
    res, _seconds = deploy(inv_path, tree(base, fmt))
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-2000:]
    last = ledger(lab)[-1]
    assert last["verdict"] == "proved", last
    tok = last["figures"]["tok_s"]
    if tok_s is None:
        assert tok["n"] == 0 and tok["median"] is None, tok       # none printed: none invented
    else:
        assert tok["median"] == tok_s and tok["n"] >= 4, tok
    assert "\x1b[" not in res.stdout                               # the proof's words carry no colour codes
    # (no wall-clock bound on the play: a proof past trainer_ready_timeout_s fails it - rc 0 is the product's verdict)
    replay = check_log(lab, base, fmt, FAST)
    assert replay["ok"] and replay["verdict"]["state"] == "ready", replay["verdict"]


def captured_log(lab, base, name):
    """The container's trainer log, as a user captures it (cp trainer_log_path)."""
    out = base / ("%s.log" % name)
    out.write_bytes(lab.pct("exec", CT, "--", "cat", "/workspace/trainer.log", text=False, check=True).stdout)
    return str(out)


def check_log(lab, base, name, variables, start=-1):
    """check-log's verdict (--json) on one start of the captured log (``start``: its index among the
    log's starts, the last by default), replayed at the stand-in's own cadence (a line every 0.25 s;
    its Megatron lines carry one fixed time, so no timestamp clock)."""
    path = captured_log(lab, base, name)
    with open(path, encoding="utf-8", errors="replace") as fh:
        starts = re.findall(r"^==> dflash\.trainer start invocation=(\S+) ", fh.read(), re.M)
    res = subprocess.run([sys.executable, "-m", "dflash_trainer", "check-log", path, "--json", "--start", starts[start],
                          "--clock", "interval", "--line-interval-s", "0.25", "-e", json.dumps(variables)],
                         cwd=ROOT, capture_output=True, text=True, timeout=120, check=False)
    assert res.returncode in (0, 1), res.stdout[-2000:] + res.stderr[-2000:]
    return json.loads(res.stdout)


def test_an_unreadable_format_fails_within_seconds_naming_the_variable(lab, inv):
    """fairseq's lines (``epoch 001: 5 / 1000 loss=... wps=...``): nothing the defaults read. With the
    default windows and timeout (900 s), the early word fails the deploy seconds after the first
    progress-like line, quoting it and naming trainer_step_regex; check-log says the same."""
    inv_path, base = inv
    windows = {"trainer_ready_hold_s": 10, "trainer_ready_stall_s": 5, "trainer_ready_timeout_s": 900}
    env = dict(os.environ, ANSIBLE_CONFIG=os.path.join(ROOT, "ansible.cfg"), ANSIBLE_NOCOLOR="1",
               PATH=os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", ""))
    entries = len(ledger(lab))
    # the play's own 300 s bound is a third of the 900 s deadline: a run that waited for it never returns
    res = subprocess.run(["ansible-playbook", "-i", inv_path, "deploy.yml", "-l", "ff", "-e",
                          json.dumps(dict(FAST, trainer_src=tree(base, "fairseq"), **windows))],
                         cwd=ROOT, env=env, capture_output=True, text=True, timeout=300, check=False)
    out = res.stdout + res.stderr
    assert res.returncode != 0, out[-3000:]
    assert "trainer_step_regex" in out and "epoch 001:" in out, out[-3000:]
    # the early word, not the 900 s deadline: the product's verdict, not a 90 s wall-clock bound on a play that
    # also rolls back and proves again (a loaded machine's pace)
    assert "not ready after 900 s" not in out
    # the release that failed is on record as such; the last good one (the Megatron-format trainer
    # above) was put back and proved again
    new = ledger(lab)[entries:]
    assert new and new[0]["verdict"] != "proved" and new[-1]["verdict"] == "proved", new
    assert "Rolled back" in out, out[-3000:]
    replay = check_log(lab, base, "fairseq", windows, start=-2)  # the failed start (the last is the rollback's)
    assert not replay["ok"] and replay["verdict"]["state"] == "failed", replay["verdict"]
    assert "trainer_step_regex" in replay["verdict"]["reason"], replay["verdict"]
