"""After every fault case, the good release (examples/trainer) runs, proved and owned by systemd."""
import os
import sys

ROOT = os.environ.get("MOLECULE_PROJECT_DIRECTORY", os.path.abspath(os.path.join(os.path.dirname(__file__), "../../..")))
sys.path.insert(0, os.path.join(ROOT, "collections"))

from ansible_collections.dflash.trainer.plugins.module_utils.release.scan import DEFAULT_EXCLUDES, scan_tree  # noqa: E402


def test_good_release_runs_after_all_faults(host):
    expected = scan_tree(os.path.join(ROOT, "examples/trainer"), DEFAULT_EXCLUDES).release_id
    assert host.service("dflash-trainer").is_running
    assert os.path.basename(host.file("/opt/dflash-trainer/current").linked_to) == expected
    assert host.file("/opt/dflash-trainer/last_good").content_string.strip() == expected


def test_no_leaked_holder_left(host):
    assert host.run("systemctl list-units --no-legend 'dflash-leaked-*'").stdout.strip() == ""


def test_failed_starts_logs_are_kept(host):
    """Every start (good, faulty, rollback) left its marker: nothing of a failed start was lost."""
    markers = int(host.check_output("grep -c '^==> dflash.trainer start ' /workspace/trainer.log"))
    assert markers >= 20
    assert "ModuleNotFoundError: No module named 'flash_attn'" in host.file("/workspace/trainer.log").content_string
