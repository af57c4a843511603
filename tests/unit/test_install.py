"""module_utils/target/install.py: one file compared and written atomically."""
import os
import stat

from ansible_collections.dflash.trainer.plugins.module_utils.target.install import install_file, masked_env, plan


def mode(path):
    return stat.S_IMODE(os.stat(path).st_mode)


def test_new_then_nothing_then_content_then_mode(tmp_path):
    path = str(tmp_path / "etc" / "d" / "trainer.env")
    assert install_file(path, b"A=1\n", 0o600, dir_mode=0o700, check_mode=True) == ["new"]
    assert not os.path.exists(path)
    assert install_file(path, b"A=1\n", 0o600, dir_mode=0o700) == ["new"]
    assert open(path, "rb").read() == b"A=1\n" and mode(path) == 0o600 and mode(os.path.dirname(path)) == 0o700
    assert install_file(path, b"A=1\n", 0o600) == []
    assert install_file(path, b"A=2\n", 0o600) == ["content"]
    os.chmod(path, 0o644)
    assert plan(path, b"A=2\n", 0o600) == ["mode"]
    assert install_file(path, b"A=2\n", 0o600) == ["mode"] and mode(path) == 0o600
    assert [n for n in os.listdir(os.path.dirname(path)) if ".tmp-" in n] == []


def test_a_symlink_is_replaced_not_followed(tmp_path):
    target = tmp_path / "elsewhere"
    target.write_text("keep")
    link = tmp_path / "unit.service"
    link.symlink_to(target)
    assert install_file(str(link), b"[Unit]\n", 0o644) == ["new"]
    assert target.read_text() == "keep" and not link.is_symlink() and link.read_text() == "[Unit]\n"


def test_masked_env_hides_values():
    assert masked_env('HF_TOKEN="hunter2"\nN="1"\n') == "HF_TOKEN=********\nN=********\n"
    assert masked_env("") == ""
