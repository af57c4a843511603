# -*- coding: utf-8 -*-
"""The proof's DEFAULT log patterns over the lines real trainers print.

Each line below is built the way the named source file builds it (format strings, colours and
logging formats copied from that file; only the numbers are ours). For each: the step, total and
tok/s the defaults read, whether the line looks like training progress, and whether its counter is
named as a loading or evaluation counter. Then a whole log per format (a tqdm loading bar with
"\\r" redraws first, then the trainer's lines) shows that the counter followed is the training one,
that the default ready pattern finds a ready line, and that the Judge proves it."""

import pytest

from ansible_collections.dflash.trainer.plugins.module_utils.proof import readiness as rd
from ansible_collections.dflash.trainer.plugins.module_utils.proof import trainer_log as tl

INV = "6f0c1b7e2a8d4c5e9f1a2b3c4d5e6f70"

# torchtitan/tools/utils.py Color (on unless metrics.disable_color_printing)
RED, GREEN, YELLOW, BLUE, MAGENTA, CYAN, RESET = (
    "\033[31m", "\033[32m", "\033[33m", "\033[34m", "\033[35m", "\033[36m", "\033[39m")
ORANGE, TURQUOISE = "\033[38;2;180;60;0m", "\033[38;2;54;234;195m"
# torchtitan/tools/logging.py: "[titan] %(asctime)s - %(name)s - %(levelname)s - %(message)s"
TITAN = "[titan] 2026-12-01 10:00:00,123 - root - INFO - "


def titan_step(step, tps=12345):
    """torchtitan/components/metrics.py MetricsProcessor.log"""
    return TITAN + (
        f"{RED}step: {step:2}  "
        f"{GREEN}loss: {7.809:7.4f}  "
        f"{ORANGE}grad_norm: {1.2345:7.4f}  "
        f"{TURQUOISE}memory: {30.12:5.2f}GiB"
        f"({38.05:.2f}%)  "
        f"{BLUE}tps: {round(tps):,}  "
        f"{CYAN}tflops: {301.22:,.2f}  "
        f"{MAGENTA}mfu: {30.46:.2f}%{RESET}")


def titan_validate(step):
    """torchtitan/components/metrics.py MetricsProcessor.log_validation"""
    return TITAN + (
        f"{YELLOW}validate step: {step:2}  "
        f"{GREEN}loss: {7.5:7.4f}  "
        f"{TURQUOISE}memory: {30.12:5.2f}GiB"
        f"({38.05:.2f}%)  "
        f"{BLUE}tps: {round(23456.7):,}{RESET}")


def megatron(iteration, total=10000):
    """megatron/training/training.py training_log (log_throughput on; no tokens per second)"""
    return (" [2026-12-01 10:00:00.123456]" + " iteration {:8d}/{:8d} |".format(iteration, total)
            + " consumed samples: {:12d} |".format(256 * iteration)
            + " elapsed time per iteration (ms): {:.1f} |".format(512.3)
            + f" throughput per GPU (TFLOP/s/GPU): {312.5:.1f} |"
            + f" learning rate: {1e-4:.6E} |" + f" global batch size: {256:5d} |"
            + " {}: {:.6E} |".format("lm loss", 7.1) + f" loss scale: {1.0:.1f} |"
            + f" grad norm: {1.2:.3f} |" + " number of skipped iterations: {:3d} |".format(0)
            + " number of nan iterations: {:3d} |".format(0))


def megatron_validation(iteration):
    """megatron/training/training.py evaluate_and_print_results"""
    return (" validation loss at iteration {} on validation set | ".format(iteration)
            + "{} value: {:.6E} | ".format("lm loss", 6.1) + "{} PPL: {:.6E} | ".format("lm loss", 445.9))


def tqdm_bar(n, total, desc="", rate="5.00it/s", postfix=""):
    """tqdm's default bar_format '{l_bar}{bar}| {n_fmt}/{total_fmt} [{elapsed}<{remaining}, {rate_fmt}{postfix}]'"""
    pct = n * 100 // total
    filled = pct // 10
    blocks = "\u2588" * filled + " " * (10 - filled)
    l_bar = ("%s: " % desc if desc else "") + "%3d%%|" % pct
    return "%s%s| %d/%d [00:%02d<00:10, %s%s]" % (l_bar, blocks, n, total, n % 60, rate, postfix)


def hf_loading(k, total=5):
    """transformers modeling_utils: logging.tqdm(desc="Loading checkpoint shards") on stderr"""
    return tqdm_bar(k, total, "Loading checkpoint shards", "1.50s/it")


def hf_train_bar(n, total=1000):
    """transformers/trainer_callback.py ProgressCallback: tqdm(total=state.max_steps)"""
    return tqdm_bar(n, total)


def hf_logs(epoch):
    """transformers/trainer_callback.py ProgressCallback.on_log: training_bar.write(str(logs))"""
    return str({"loss": 1.23, "grad_norm": 0.9, "learning_rate": 5e-05, "epoch": epoch})


def lightning(n, total=100, epoch=0):
    """lightning/pytorch/callbacks/progress/tqdm_progress.py: desc "Epoch {current_epoch}", metrics as postfix"""
    return tqdm_bar(n, total, "Epoch %d" % epoch, "4.90it/s", ", v_num=0, train_loss=1.230")


def deepspeed_step(step):
    """deepspeed/runtime/engine.py _report_progress through log_dist"""
    return ("[2026-12-01 10:00:00,123] [INFO] [logging.py:96:log_dist] [Rank 0] "
            f"step={step}, skipped=0, lr=[0.0001], mom=[(0.9, 0.999)]")


def deepspeed_timer(step):
    """deepspeed/utils/timer.py ThroughputTimer.stop (samples, not tokens)"""
    return ("[2026-12-01 10:00:00,124] [INFO] [timer.py:260:stop] "
            + "epoch={}/micro_step={}/global_step={}, RunningAvgSamplesPerSec={}, CurrSamplesPerSec={}, "
              "MemAllocated={}GB, MaxMemAllocated={}GB".format(0, 4 * step, step, 25.025771473496132,
                                                               25.704280480541442, 4.32, 38.49))


def nanogpt_iter(n):
    """nanoGPT train.py"""
    return f"iter {n}: loss {4.2345:.4f}, time {123.45:.2f}ms, mfu {12.34:.2f}%"


def nanogpt_eval(n):
    """nanoGPT train.py (every eval_interval, first at iter 0)"""
    return f"step {n}: train loss {10.9876:.4f}, val loss {10.9912:.4f}"


def llmc(step, total=74):
    """llm.c train_gpt2.cu (printf0)"""
    fmt = "step %4d/%d | loss %7.6f (%+.2fz)| norm %6.4f (%+.2fz)| lr %.2e | %.2f ms | %.1f%% bf16 MFU | %.0f tok/s"
    return fmt % (
        step, total, 11.012695, 0.0, 15.425, 0.0, 6e-06, 1263.59, 12.1, 414921.0)


def torchtune(step, total=1000):
    """torchtune recipes/full_finetune_single_device.py:
    pbar.set_description(f"{curr_epoch + 1}|{self.global_step}|Loss: {loss_to_log}")"""
    return tqdm_bar(step, total, "1|%d|Loss: 2.3456" % step, "1.70s/it")


# (source, line, step, total, tok/s, looks like training progress, aside: named as loading/evaluation)
TABLE = [
    ("torchtitan/components/metrics.py", titan_step(2), 2, None, 12345.0, True, False),
    ("torchtitan/components/metrics.py", titan_validate(2), 2, None, 23457.0, False, True),
    ("megatron/training/training.py", megatron(2), 2, 10000, None, True, False),
    ("megatron/training/training.py", megatron_validation(100), 100, None, None, False, True),
    ("transformers/trainer_callback.py", hf_train_bar(50), 50, 1000, None, True, False),
    ("transformers/trainer_callback.py", hf_logs(0.12), None, None, None, True, False),
    ("transformers/modeling_utils.py", hf_loading(2), 2, 5, None, False, True),
    ("lightning/pytorch/callbacks/progress/tqdm_progress.py", lightning(50), 50, 100, None, True, False),
    ("lightning/pytorch/callbacks/progress/tqdm_progress.py",
     tqdm_bar(2, 2, "Sanity Checking DataLoader 0", "10.00it/s"), 2, 2, None, False, True),
    ("lightning/pytorch/callbacks/progress/tqdm_progress.py",
     tqdm_bar(4, 10, "Validation DataLoader 0", "40.00it/s"), 4, 10, None, False, True),
    ("deepspeed/runtime/engine.py", deepspeed_step(10), 10, None, None, True, False),
    ("deepspeed/utils/timer.py", deepspeed_timer(10), 10, None, None, True, False),
    ("nanoGPT train.py", nanogpt_iter(10), 10, None, None, True, False),
    ("nanoGPT train.py", nanogpt_eval(0), 0, None, None, True, False),
    ("llm.c train_gpt2.cu", llmc(1), 1, 74, 414921.0, True, False),
    ("torchtune recipes/full_finetune_single_device.py", torchtune(3), 3, 1000, None, True, False),
]


@pytest.mark.parametrize("source,line,step,total,tok_s,progress_like,aside", TABLE,
                         ids=["%s-%d" % (row[0].split("/")[-1], i) for i, row in enumerate(TABLE)])
def test_the_defaults_read_each_format(source, line, step, total, tok_s, progress_like, aside):
    a = tl.analyze([line])
    assert "\x1b" not in a.tail(1)[0]                 # what the tail shows has no escape codes
    m = a.step_re.search(a.tail(1)[0])
    if step is None:
        assert m is None and a.last_step is None
    else:
        got = tl.step_value(m)
        assert got[:2] == (step, total), source
        words, got_total, got_aside = tl.counter_identity(m, got[1])
        assert got_aside == aside, (source, words)
        # a counter named as loading/evaluation is never followed, so never a step of the proof
        assert a.last_step == (None if aside else step)
    assert a.tok_s == tok_s, source
    assert (a.progress_like_line is not None) == progress_like, source
    assert a.problems == []


def test_ansi_sequences_are_stripped_before_matching_and_in_the_tail():
    line = "\x1b]0;title\x07\x1b[1;31mstep=3\x1b[0m tok/s=\x1b[32m5\x1b[39m\x1b[K\x1b[A"
    a = tl.analyze([line])
    assert a.tail(1) == ["step=3 tok/s=5"] and a.last_step == 3 and a.tok_s == 5.0
    assert tl.strip_ansi("plain") == "plain"
    assert tl.strip_ansi("\x1b]8;;http://x\x1b\\link\x1b]8;;\x1b\\") == "link"   # OSC 8 hyperlink


LOADING = "".join("\r" + hf_loading(k) for k in range(0, 6)) + "\n"   # tqdm on stderr: "\r" redraws

FORMATS = {
    # name: (lines after the loading bar, as a function of i = 1, 2, ...; tok/s; words of the counter)
    "hf-style steps": (lambda i: "step %d | loss 2.31 | 12.4K tok/s" % (1199 + i), 12400.0, ("step",)),
    "torchtitan": (titan_step, 12345.0, ("step",)),
    "megatron": (megatron, None, ("iteration",)),
    "hf trainer": (lambda i: "\r" + hf_train_bar(i) + ("\n" + hf_logs(i / 100.0) if i % 3 == 0 else ""), None, ()),
    "lightning": (lambda i: "\r" + lightning(i), None, ("epoch",)),
    "deepspeed": (lambda i: deepspeed_step(i) + "\n" + deepspeed_timer(i), None, ("step",)),
    "nanogpt": (lambda i: (nanogpt_eval(0) + "\n" if i == 1 else "") + nanogpt_iter(i - 1), None, ("iter",)),
    "llm.c": (llmc, 414921.0, ("step",)),
    "torchtune": (lambda i: "\r" + torchtune(i), None, ("loss",)),
}


def feed_format(name, n):
    follower = tl.StartLog(INV)
    follower.feed(tl.marker_line(INV, "0123456789abcdef", 4242, "t") + "\n" + LOADING)
    lines, _tok_s, _words = FORMATS[name]
    for i in range(1, n + 1):
        follower.feed(lines(i) + "\n")
    return follower


@pytest.mark.parametrize("name", sorted(FORMATS))
def test_after_a_loading_bar_the_training_counter_is_followed(name):
    follower = feed_format(name, 8)
    a = follower.analysis
    _lines, tok_s, words = FORMATS[name]
    assert a.counter[0] == words, a.counter
    assert a.n_steps >= 6 and a.steps == sorted(set(a.steps)) and a.went_back is None
    assert a.max_step > 5 and a.steps[-1] - a.steps[-2] == 1     # the loading bar's 5 is behind
    assert a.ready_line is not None and "Loading" not in a.ready_line
    assert tl.looks_like_progress(a.ready_line) and "Loading" not in a.progress_like_line
    assert a.tok_s == tok_s                                      # Megatron, DeepSpeed ...: none invented


def test_only_a_loading_bar_is_no_progress_and_no_ready_line():
    follower = tl.StartLog(INV).feed(tl.marker_line(INV, "r", 1, "t") + "\n" + LOADING)
    a = follower.analysis
    assert (a.n_steps, a.ready_line, a.progress_like_line, a.last_step) == (0, None, None, None)


def test_an_evaluation_bar_between_training_bars_does_not_count():
    a = tl.analyze([hf_train_bar(n) for n in (1, 2, 3)] + [tqdm_bar(n, 20, "Evaluating") for n in (1, 20)]
                   + [hf_train_bar(n) for n in (4, 5)])
    assert a.steps == [1, 2, 3, 4, 5] and a.counter == ((), 1000)


def test_a_bare_bar_that_ran_to_its_total_gives_way_to_step_lines_and_they_continue_above_it():
    """A loading bar without words ("100%|...| 5/5") is followed until step lines (no total) rise;
    they start at 1, below its 5: the proof's values go on from 5 (their next rise is progress)."""
    a = tl.analyze([tqdm_bar(k, 5) for k in range(6)] + ["iteration %d | loss 2.0" % i for i in (1, 2, 3)])
    assert a.counter == (("iteration",), None)
    assert a.steps == [0, 1, 2, 3, 4, 5, 6, 7] and a.last_step == 3 and a.went_back is None


def test_a_user_ready_regex_keeps_its_strict_meaning():
    a = tl.analyze([megatron(i) for i in (1, 2, 3)], ready_regex=r"tok/s")
    assert a.ready_line is None and a.n_steps == 3
    a = tl.analyze([megatron(i) for i in (1, 2, 3)])
    assert a.ready_line == megatron(3)


def test_a_throughput_line_is_the_ready_line_once_one_was_seen():
    a = tl.analyze(["step 1 | loss 2", "step 2 | 12 tok/s", "step 3 | loss 2"])
    assert a.ready_line == "step 2 | 12 tok/s" and a.ready_count == 2


def test_progress_like_line_is_the_first_and_last_progress_like_the_latest():
    a = tl.analyze(["loading model", hf_loading(3), "epoch 1 loss=2.3 (custom words)", "noise", "lr 1e-4 5 it/s"])
    assert a.progress_like_line == "epoch 1 loss=2.3 (custom words)" and a.progress_like_at == 3
    assert a.last_progress_like_line == "lr 1e-4 5 it/s"
    assert a.n_steps == 0              # the configured regexes read nothing from them


# --- the Judge with the defaults: the traces are proved --------------------------------

def _unit():
    return {"ActiveState": "active", "SubState": "running", "Result": "success", "InvocationID": INV,
            "NRestarts": "0", "MainPID": "4242"}


@pytest.mark.parametrize("name", sorted(FORMATS))
def test_the_judge_proves_each_format_after_a_10_s_loading_bar(name):
    """The reported failure: a 10 s loading bar fixed the counter at 5 and the step lines were
    ignored ("no progress for 5.2 s (last step=5)"). A poll a second, a line a second."""
    follower = tl.StartLog(INV).feed(tl.marker_line(INV, "0123456789abcdef", 4242, "t") + "\n")
    judge = rd.Judge(rd.Expectations(invocation_id=INV, hold_s=10.0, stall_s=5.0, timeout_s=300.0))
    lines, tok_s, _words = FORMATS[name]
    for t in range(0, 60):
        if t < 10:
            follower.feed("\r" + hf_loading(min(5, t // 2)))
        elif t == 10:
            follower.feed("\n")
        else:
            follower.feed(lines(t - 10) + "\n")
        v = judge.observe(rd.Snapshot(now=float(t), unit=_unit(), gpus_mib={0: 70000}, log=follower.analysis))
        if v.done:
            break
    assert v.state == rd.READY, v.reason
    assert t <= 10 + 2 + 10 + 2 and v.details["tok_s"] == tok_s


def test_the_roles_defaults_are_the_python_defaults():
    """roles/trainer/defaults/main.yml carries copies of the DEFAULT_* patterns (the ready pattern's
    counter rule keys on the default's exact text)."""
    import os
    import yaml
    path = os.path.join(os.path.dirname(__file__), "..", "..", "roles", "trainer", "defaults", "main.yml")
    with open(path) as f:
        defaults = yaml.safe_load(f)
    assert defaults["trainer_ready_regex"] == tl.DEFAULT_READY_REGEX
    assert defaults["trainer_step_regex"] == tl.DEFAULT_STEP_REGEX
    assert defaults["trainer_tokps_regex"] == tl.DEFAULT_TOKPS_REGEX
    assert defaults["trainer_error_regexes"] == list(tl.DEFAULT_ERROR_REGEXES)
