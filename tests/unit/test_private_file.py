"""module_utils/target/private_file.py: the one writer of the job state, the lock record and the ledger."""
import os

from ansible_collections.dflash.trainer.plugins.module_utils.target.private_file import replace_private


def test_replaces_atomically_with_mode_0600_and_leaves_no_temporary_file(tmp_path):
    path = tmp_path / "state.json"
    path.write_text("old")
    os.chmod(path, 0o644)
    replace_private(str(path), "new", sync=True)
    assert path.read_text() == "new"
    assert oct(os.stat(path).st_mode & 0o777) == "0o600"
    assert sorted(os.listdir(tmp_path)) == ["state.json"]


def test_a_planted_symlink_at_the_temporary_name_is_removed_never_followed(tmp_path):
    victim = tmp_path / "victim"
    victim.write_text("untouched")
    path = tmp_path / "ledger.json"
    tmp = "%s.tmp-%d" % (path, os.getpid())
    os.symlink(str(victim), tmp)
    replace_private(str(path), "ours")
    assert victim.read_text() == "untouched"
    assert path.read_text() == "ours" and not os.path.islink(path)


def test_a_given_temporary_name_is_used(tmp_path):
    lock = tmp_path / "lock"
    lock.mkdir()
    (lock / "owner.json.tmp").write_text("leftover of a killed writer")
    replace_private(str(lock / "owner.json"), "{}", tmp=str(lock / "owner.json.tmp"))
    assert sorted(os.listdir(lock)) == ["owner.json"] and (lock / "owner.json").read_text() == "{}"
