# -*- coding: utf-8 -*-
# Copyright: dflash.trainer maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The log patterns of the proof (O(ready_regex), O(step_regex), O(tokps_regex)), with the role's
defaults (roles/trainer/defaults/main.yml: trainer_ready_regex, trainer_step_regex, trainer_tokps_regex)."""

from __future__ import annotations


class ModuleDocFragment(object):

    DOCUMENTATION = r"""
options:
  ready_regex:
    description:
      - Python regular expression a line of this start's log must match.
      - The default matches a throughput line and, while no line of this start matched it, also takes a line
        of the training counter (trainers that print no tok/s); a loading or evaluation bar never counts.
        A regex of your own is kept strictly.
    type: str
    default: 'tok(?:en)?s?/s(?:ec)?\b|tokens? per sec'
  step_regex:
    description:
      - Python regular expression whose first group that takes part in the match is the step counter.
      - The default reads step, global_step, iter, iteration, it=, batch, [N/M] and tqdm's N/M [.
      - Terminal colour codes are taken out first; the training counter is followed, never a loading or
        evaluation bar (counters are told apart by their words and total).
    type: str
    default: >-
      (?x)(?=[gGsSiIbB\[\d])(?:
      (?<![A-Za-z_])(?i:global[_ ]step|step|iteration|iter|batch)(?:[ \t]*[=:#])?[ \t]*(?:\[[ \t]*)?
      (\d{1,3}(?:,\d{3})+|\d+)(?!\w|[.,]\d)
      |(?<![A-Za-z_])it[ \t]*[=:][ \t]*(\d+)(?!\w|[.,]\d)
      |\[\s*(\d+)\s*/\s*\d+\s*\]
      |(?<![\w./:])(\d+)(?:/\d+|it)\s+\[\d+:\d)
  tokps_regex:
    description:
      - Python regular expression whose first group that takes part in the match is the throughput in tokens per second.
      - The figure is read as people write it (12.4K, 12,400, 1.2e4) and kept in tok/s; the default also reads
        TorchTitan's tps.
    type: str
    default: >-
      (?x)(?=[t\d])(?:
      (?<![A-Za-z])tok(?:en)?s?(?:/s(?:ec)?|\s+per\s+sec(?:ond)?)(?![\w/])(?:\s*[=:])?\s*
      ((?:\d{1,3}(?:,\d{3})+|\d{1,3}(?:_\d{3})+|\d+)(?:\.\d+)?(?:[eE][+-]?\d+)?(?:[kKMG](?![A-Za-z]))?)(?!\w|\.\d)
      |(?<![A-Za-z_])tps(?:[ \t]*[=:])?[ \t]*
      ((?:\d{1,3}(?:,\d{3})+|\d{1,3}(?:_\d{3})+|\d+)(?:\.\d+)?(?:[eE][+-]?\d+)?(?:[kKMG](?![A-Za-z]))?)(?!\w|\.\d)
      |(?<![\w.,])((?:\d{1,3}(?:,\d{3})+|\d{1,3}(?:_\d{3})+|\d+)(?:\.\d+)?(?:[eE][+-]?\d+)?(?:[kKMG](?![A-Za-z]))?)(?!\w|\.\d)
      \s*(?<![A-Za-z])tok(?:en)?s?(?:/s(?:ec)?|\s+per\s+sec(?:ond)?)(?![\w/])(?!(?:\s*[=:])?\s*\d))
"""
