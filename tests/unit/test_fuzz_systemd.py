# -*- coding: utf-8 -*-
"""Foreign output, fuzzed: ``systemctl show`` parsing and the helpers that read its properties.

Properties: parse_show never raises and reads back exactly the properties written (unknown ones
included, missing ones absent, garbage values verbatim but stripped); a value holding a
character that str.splitlines() treats as a line end does not forge another property; the
helpers never raise on any props and read junk as "unknown" (int_prop's default), never as a
number.
"""

import os

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ansible_collections.dflash.trainer.plugins.module_utils.target import systemd as sd

FUZZ = settings(max_examples=int(os.environ.get("DFLASH_FUZZ_EXAMPLES", "100")), deadline=None,
                derandomize=True, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])

SURROGATES = st.integers(0xDC80, 0xDCFF).map(chr)
ODD_BREAKS = "\r\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029"
GARBAGE_VALUE = st.text(st.characters(blacklist_characters="\n", blacklist_categories=("Cs",))
                        | SURROGATES | st.sampled_from(ODD_BREAKS), max_size=40)
VALUE = st.one_of(
    GARBAGE_VALUE,
    st.sampled_from(["active", "inactive", "failed", "activating", "running", "dead", "auto-restart",
                     "exited", "success", "exit-code", "[not set]", "", "0", "1", "yes", "no",
                     "18446744073709551615", "-1", "1_0", "\u0661\u0662", "1" + "0" * 400]),
    st.integers(-(1 << 70), 1 << 70).map(str),
)
KEY = st.sampled_from(sd.SHOW_PROPERTIES) | st.from_regex(r"[A-Z][A-Za-z0-9]{0,15}", fullmatch=True)


def exec_safe(key, value):
    """Only Exec* values starting with "{" may span lines: keep generated Exec* values one line."""
    if key.startswith("Exec") and value.lstrip().startswith("{") and not value.rstrip().endswith("}"):
        return value + "}"
    return value


@st.composite
def show_output(draw):
    """(text, expected props): unknown and missing properties, garbage values, junk lines."""
    lines, expected = [], {}
    for key, value in draw(st.lists(st.tuples(KEY, VALUE), max_size=25)):
        value = exec_safe(key, value)
        lines.append("%s=%s" % (key, value))
        expected[key] = value.strip()
        if draw(st.integers(0, 9)) == 0:  # a junk line without "="
            lines.append(draw(st.text(st.characters(blacklist_characters="=\n"), max_size=20)))
    return "\n".join(lines) + draw(st.sampled_from(["\n", ""])), expected


@FUZZ
@given(show_output())
def test_parse_show_reads_back_what_was_written(case):
    text, expected = case
    props = sd.parse_show(text)
    assert props == expected
    assert sd.parse_show(text.split("\n")) == expected


@FUZZ
@given(st.text(max_size=400) | st.binary(max_size=400).map(lambda b: b.decode("utf-8", "surrogateescape")))
def test_parse_show_never_raises(text):
    props = sd.parse_show(text)
    assert all(isinstance(k, str) and isinstance(v, str) for k, v in props.items())


@FUZZ
@given(st.sampled_from(ODD_BREAKS), st.sampled_from(["FragmentPath", "Id", "UnitFileState"]))
def test_a_value_never_forges_another_property(brk, key):
    """Regression: parse_show split with str.splitlines(), so a value holding U+2028, U+0085 or
    \\x1c (a unit path, a name) ended the line there and its tail became a property."""
    text = "ActiveState=failed\nSubState=failed\nNRestarts=3\n%s=/x%sActiveState=active%sNRestarts=0\n" % (
        key, brk, brk)
    props = sd.parse_show(text)
    assert (props["ActiveState"], props["SubState"], props["NRestarts"]) == ("failed", "failed", "3")
    assert not sd.is_running(props)


def plain_int(value):
    """The oracle: an ASCII decimal (optionally signed, blanks around) within 64 bits, else None."""
    text = value.strip()
    digits = text[1:] if text.startswith("-") else text
    if not digits or not all("0" <= c <= "9" for c in digits):
        return None
    number = int(text)
    return number if -(1 << 63) <= number < (1 << 64) else None


@FUZZ
@given(VALUE, st.integers(-5, 5))
def test_int_prop_reads_only_plain_decimals(value, default):
    number = plain_int(value)
    assert sd.int_prop({"K": value}, "K", default) == (default if number is None else number)
    assert sd.int_prop({}, "K", default) == default


@pytest.mark.parametrize("value", ["1_0", "\u0661\u0662", "1" + "0" * 400, "9" * 5000, "0x10", "1e3"])
def test_int_prop_regressions(value):
    """int() took "1_0" as 10 and Arabic-Indic digits as numbers; a 400-digit timestamp made
    runtime_s raise OverflowError; 5000 digits hit Python's int() digit limit (ValueError)."""
    assert sd.int_prop({"K": value}, "K", -7) == -7
    props = {"ExecMainStartTimestampMonotonic": "1", "ExecMainExitTimestampMonotonic": value}
    assert sd.runtime_s(props) is None


PROPS = st.dictionaries(st.sampled_from(sd.SHOW_PROPERTIES), VALUE, max_size=len(sd.SHOW_PROPERTIES)) \
    | show_output().map(lambda case: sd.parse_show(case[0]))


@FUZZ
@given(PROPS, st.none() | st.floats(0, 1e9))
def test_helpers_never_raise_and_read_junk_as_unknown(props, now):
    running = sd.is_running(props)
    assert running == (props.get("ActiveState") == "active" and props.get("SubState") == "running")
    assert sd.is_active(props) == (props.get("ActiveState") in sd.ACTIVE_STATES)
    words = sd.exit_description(props)
    code = plain_int(props.get("ExecMainCode", ""))
    assert (words is None) == (code not in (sd.CLD_EXITED, sd.CLD_KILLED, sd.CLD_DUMPED))
    runtime = sd.runtime_s(props, now)
    assert runtime is None or (isinstance(runtime, float) and 0 <= runtime < float("inf"))
    assert sd.state_words(props).startswith("ActiveState=")
    assert set(sd.pick(props)) <= set(sd.FAILURE_PROPERTIES)
    action, message = sd.start_decision("trainer.service", props)
    assert action in ("start", "fail")
    if action == "start":
        assert message is None and not sd.is_active(props) and sd.is_loaded(props)
    before = plain_int(props.get("NRestarts", "")) or 0
    assert sd.restart_baseline(props, {"NRestarts": "0"}) == (0 if 0 < before else before)
