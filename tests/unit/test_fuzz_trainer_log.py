# -*- coding: utf-8 -*-
"""Foreign output, fuzzed: the trainer log's "this start" analysis.

Properties: any text (NUL bytes, invalid UTF-8 as decoded by the modules, \\r, odd line
breaks, no final newline) gives the same analysis however it is cut into chunks; the lines of
this start are exactly those after the last marker of our invocation up to the next marker
(an independent reading of the documented rule), so lines of earlier starts never count and
no marker means no lines; steps only ever increase; lines of 10 MiB are analysed in linear time.
"""

import codecs
import os
import re
import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ansible_collections.dflash.trainer.plugins.module_utils.proof import trainer_log as tl

FUZZ = settings(max_examples=int(os.environ.get("DFLASH_FUZZ_EXAMPLES", "100")), deadline=None,
                derandomize=True, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])

INV = "6f0c1b7e2a8d4c5e9f1a2b3c4d5e6f70"
OTHER = "0a0a0a0a0a0a0a0a0a0a0a0a0a0a0a0a"
PREFIX = "==> dflash.trainer start "


def marker(invocation, release="0123456789abcdef"):
    return tl.marker_line(invocation, release, 4242, "2026-11-30T04:05:06Z")


NOISE = st.text(st.characters(blacklist_characters="\n", blacklist_categories=("Cs",))
                | st.sampled_from("\x00\r\ufffd\u2028\x1c"), max_size=30).filter(
    lambda s: not s.startswith("==>"))
LINE = st.one_of(
    NOISE,
    st.integers(0, 10 ** 6).map(lambda n: "step=%d loss=2.1 tok/s=%d.5 queue_target=4 queue_drafter=4" % (n, n)),
    st.integers(0, 50).map(lambda n: "[rank0]: step: %d" % n),
    st.sampled_from(["Traceback (most recent call last):", "RuntimeError: CUDA out of memory",
                     "torch.OutOfMemoryError: x", "NCCL error in: a.cpp:1", "ValueError: bad value",
                     "tok/s=abc", "step=", "\x00\x00\x00", "caf\ufffd\ufffd", "line\r"]),
    st.sampled_from([marker(INV), marker(OTHER), marker(INV, "fedcba9876543210"),
                     PREFIX + "release=x <==", PREFIX + "invocation=%s" % INV]),
)


@st.composite
def log_text(draw):
    lines = draw(st.lists(LINE, max_size=40))
    return "\n".join(lines) + draw(st.sampled_from(["\n", "", "\r\n"]))


def summary(follower):
    a = follower.analysis
    return (follower.marker, follower.in_start, follower.ended, list(a.lines), a.line_count, a.steps,
            a.last_step, a.tok_s, a.ready_line, a.ready_count, a.errors, a.reason, a.progress_line)


def cut(text, cuts):
    points = sorted({c % (len(text) + 1) for c in cuts})
    return [text[i:j] for i, j in zip([0] + points, points + [len(text)])]


@FUZZ
@given(log_text() | st.text(max_size=300), st.lists(st.integers(0, 10 ** 4), max_size=8))
def test_chunking_does_not_change_the_analysis(text, cuts):
    whole = tl.StartLog(INV).feed(text).finish()
    pieces = tl.StartLog(INV)
    for chunk in cut(text, cuts):
        pieces.feed(chunk)
    assert summary(pieces.finish()) == summary(whole)


@FUZZ
@given(st.binary(max_size=400), st.lists(st.integers(0, 10 ** 4), max_size=8))
def test_invalid_utf8_decoded_as_the_modules_do(data, cuts):
    """The proof (proof.log_file.LogFileReader) decodes with an incremental UTF-8 decoder (errors="replace"): a
    multibyte sequence cut between two reads must give the same analysis as the whole file."""
    prefix = (marker(INV) + "\n").encode()
    data = prefix + data + b"\nstep=3 tok/s=1.0"
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
    pieces = tl.StartLog(INV)
    points = sorted({c % (len(data) + 1) for c in cuts})
    for i, j in zip([0] + points, points + [len(data)]):
        pieces.feed(decoder.decode(data[i:j]))
    pieces.feed(decoder.decode(b"", final=True))
    whole = tl.StartLog(INV).feed(data.decode("utf-8", "replace"))
    assert summary(pieces.finish()) == summary(whole.finish())
    assert pieces.analysis.last_step == 3  # the line after the garbage, without a final newline


def oracle_marker(line):
    """The documented marker, read without the module's regex: "==> dflash.trainer start
    key=value ... <==" (blanks after "<==" allowed); None unless it names an invocation."""
    text = line.rstrip("\r\n")
    if not text.startswith(PREFIX) or not text.rstrip().endswith("<=="):
        return None
    fields = dict(token.split("=", 1) for token in text.rstrip()[len(PREFIX):-3].split() if "=" in token)
    return fields if "invocation" in fields else None


def oracle_this_start(text, invocation):
    """(marker, lines) of the last start of ``invocation``: the lines after its last marker up to
    the next marker of any start."""
    # a line ends at "\r\n", "\n" or a lone "\r" (tqdm's redraw); a "\r" at the very end waits
    text = text.replace("\r\n", "\n")
    text = text[:-1].replace("\r", "\n") + text[-1:] if text else text
    lines = text.split("\n")
    found, start = None, None
    for i, line in enumerate(lines):
        fields = oracle_marker(line)
        if fields is not None and fields["invocation"] == invocation:
            found, start = fields, i + 1
    if found is None:
        return None, []
    out = []
    for line in lines[start:]:
        if oracle_marker(line) is not None:
            break
        out.append(tl.strip_ansi(line.rstrip("\r\n")))  # lines as shown: without escape sequences
    if text.endswith("\n") and out and out[-1] == "" and start + len(out) == len(lines):
        out.pop()  # the empty "line" after the final newline
    return found, out


@FUZZ
@given(log_text())
def test_this_start_is_the_last_marker_of_our_invocation(text):
    assert tl.this_start(text, INV) == oracle_this_start(text, INV)


@FUZZ
@given(st.lists(LINE.filter(lambda s: INV not in s), max_size=40))
def test_no_marker_of_ours_means_nothing_counts(lines):
    """Stale progress (tok/s, steps) from other starts, or a log with no marker at all."""
    follower = tl.StartLog(INV).feed("\n".join(lines)).finish()
    a = follower.analysis
    assert follower.marker is None
    assert (list(a.lines), a.ready_line, a.steps, a.errors, a.tok_s) == ([], None, [], [], None)


@FUZZ
@given(st.lists(LINE, max_size=60))
def test_steps_only_increase(lines):
    a = tl.analyze(lines)
    values = []
    for line in lines:
        m = re.search(tl.DEFAULT_STEP_REGEX, line.rstrip("\r\n"))
        if m:
            values.append(int(m.group(1)))
    record = []
    for v in values:
        if not record or v > record[-1]:
            record.append(v)
    assert a.steps == record
    assert a.last_step == (values[-1] if values else None)
    assert a.max_step == (max(values) if values else None)


# The regexes as they were before they were made linear: the oracle on short lines.
OLD_MARKER_RE = re.compile(r"^==> dflash\.trainer start (?P<fields>.*?)\s*<==\s*$")
OLD_REASON_RE = re.compile(r"^\s*(?:\[rank\d+\]:\s*)?(?:[\w.]+\.)?\w*(?:Error|Exception)\b.*?:\s*\S")
TOKENS = st.sampled_from(["Error", "Exception", ".", ":", " ", "\t", "a", "_", "1", "[rank0]:", "(", "\r",
                          "<==", PREFIX, "invocation=x", "=", "\u2028", "\x00"])


@FUZZ
@given(st.lists(TOKENS, max_size=20).map("".join))
def test_linear_regexes_mean_what_the_old_ones_meant(line):
    assert tl.is_reason_line(line) == bool(OLD_REASON_RE.match(line))
    old = OLD_MARKER_RE.match(line.rstrip("\r\n"))
    new = tl.MARKER_RE.match(line.rstrip("\r\n"))
    assert bool(new) == bool(old)
    if old:
        assert new.group("fields").split() == old.group("fields").split()


MIB = 1 << 20


@pytest.mark.parametrize("name,line", [
    ("blank marker", PREFIX + " " * (10 * MIB)),
    ("dotted errors", "a." + "Error." * (10 * MIB // 6)),
    ("NUL bytes", "\x00" * (10 * MIB)),
    ("replacement chars", "\ufffd" * (10 * MIB)),
    # the default step and tok/s regexes (figures as people write them, issue 15)
    ("step and blanks", "step" + " " * (10 * MIB)),
    ("tok/s and blanks", "tok/s" + " " * (10 * MIB) + "x"),
    ("digits before a unit", "1" * (10 * MIB) + " tok"),
    # escape sequences, TorchTitan's tps, the words of a progress-like line, a counter's name
    ("unfinished escapes", "\x1b]" * (10 * MIB // 2)),
    ("a CSI that never ends", "\x1b[" + "0;" * (5 * MIB)),
    ("tps and blanks", "tps" + " " * (10 * MIB) + "x"),
    ("progress words", "loss " * (2 * MIB)),
    ("a bar after a long name", "a" * (10 * MIB) + " 5/9 [00:01<00:01]"),
])
def test_a_10_mib_line_is_analysed_in_linear_time(name, line):
    """Regression: the marker regex ("(.*?)\\s*<==") and the reason regex ("Error\\b.*?:") were
    quadratic; a 160 KiB line took 20 s, so a 10 MiB one would hang the proof for a day.
    Fed in 1 MiB chunks as the proof reads, with no final newline."""
    start = time.monotonic()
    follower = tl.StartLog(INV).feed(marker(INV) + "\n")
    for i in range(0, len(line), MIB):
        follower.feed(line[i:i + MIB])
    follower.feed("\nstep=7 tok/s=2.5")  # the last line has no newline: finish() takes it
    follower.finish()
    assert time.monotonic() - start < 20.0, name
    a = follower.analysis
    assert a.line_count == 2 and len(a.lines[0]) == len(tl.strip_ansi(line)) and a.last_step == 7 and a.tok_s == 2.5


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow])
@given(st.text(alphabet=st.sampled_from(list("loadvalEVALsavTesting_ -:0129é\u0130K\u212a")), max_size=60)
       | st.lists(st.sampled_from(tl.ASIDE_STEMS + ("Loading", "step", "latest", "xload", "Valid")),
                  max_size=6).map(" ".join))
def test_names_aside_is_the_word_by_word_judge(text):
    """One regex search over a text says what testing each of its words did: a word (a run of ASCII
    letters) that begins with an aside stem, in any case."""
    by_word = any(w.lower().startswith(stem) for w in re.findall(r"[A-Za-z]+", text) for stem in tl.ASIDE_STEMS)
    assert tl.names_aside(text) is by_word
    assert [tl.is_aside_word(w) for w in re.findall(r"[A-Za-z]+", text)] == [
        any(w.lower().startswith(stem) for stem in tl.ASIDE_STEMS) for w in re.findall(r"[A-Za-z]+", text)]
