"""Mask first, cut after (module_utils/target/secrets.py): no prefix of a secret reaches the ledger when a
reason is cut; a text cut elsewhere before the mask leaves fewer than PARTIAL_MIN characters."""
import json

from ansible_collections.dflash.trainer.plugins.module_utils.target import secrets as s
from ansible_collections.dflash.trainer.plugins.module_utils.job.steps import Layout
from ansible_collections.dflash.trainer.plugins.module_utils.proof.throughput import REASON_CHARS, entry

SECRET = "hf_TOKENabcdefghijklmnopqrstuvwxyz0123456789"


def test_cut_masks_before_it_cuts():
    text = "x" * 490 + " token " + SECRET + " tail"
    out = s.cut(text, 500, [SECRET])
    assert out.endswith(" token ***") and "hf_" not in out


def test_a_text_cut_inside_a_secret_is_masked_from_the_piece_on():
    for n in range(s.PARTIAL_MIN, len(SECRET)):
        text = ("reason: " + SECRET)[:8 + n]
        assert s.mask(text, [SECRET]) == "reason: ***", n
        # cut from the left (a tail): the secret's end is left
        assert s.mask(SECRET[-n:] + " after", [SECRET]) == "*** after", n
    # inside a repr, as a log line shown in a message: line[:200] then %r
    line = ("y" * 180 + SECRET)[:200]
    assert SECRET[:8] not in s.mask("in line %r" % line, [SECRET])


def test_pieces_shorter_than_the_bound_are_left_and_full_values_still_go_first():
    assert s.mask("hf_TOKE", [SECRET]) == "hf_TOKE"  # 7 characters: below PARTIAL_MIN
    assert s.mask("a %s b %s" % (SECRET, SECRET[:20]), [SECRET]) == "a *** b ***"
    assert s.mask("abc", ["abc"]) == "***" and s.mask("no secret here", [SECRET]) == "no secret here"


def test_the_ledgers_reason_is_masked_then_cut(tmp_path):
    reason = "E" * (REASON_CHARS - 20) + " " + SECRET + " more"  # masked it fits; cut first it would not
    e = entry("r1", "failed", {}, "git 1", reason, now=1.0)
    assert SECRET in e["reason"]  # not cut yet: the writer masks first
    layout = Layout(str(tmp_path), secrets=[SECRET])
    layout.record([e])
    with open(tmp_path / "ledger.json") as fh:
        kept = json.load(fh)["entries"][-1]["reason"]
    assert len(kept) <= REASON_CHARS and "hf_" not in kept and kept.endswith(" *** more")
