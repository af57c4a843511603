# -*- coding: utf-8 -*-
# Copyright: dflash.trainer maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The names of the marker files the collection leaves in what it writes: the marker of a complete
release (``releases/<id>/.dflash-release``, written by ``release.install``, its manifest inside) and
the release root's (written by ``release.root.mark_root`` under the root's lock). Only names, so that
the judges of ownership (``target.ownership``), the release scan and the release root share them without
shipping one another.
"""

from __future__ import annotations

# a release's marker (its manifest); a scan of a release tree leaves it out
MARKER_NAME = ".dflash-release"
# the release root's own marker file and its text
ROOT_MARK_NAME = ".dflash-trainer-root"
ROOT_MARK = "# dflash.trainer: a release root of the collection (releases/, current, last_good, ledger.json)"
