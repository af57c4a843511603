"""dflash_trainer.api runs the playbooks with the caller's configuration and inventory: the
checkout's ansible.cfg only when the caller names none, never host key checking switched off
behind their back (ansible-runner alone sets ANSIBLE_HOST_KEY_CHECKING=False), the configured
inventory when none is given, the checkout's collections first on the configured path."""
import os

import pytest

from dflash_trainer import api
from dflash_trainer.__main__ import main

ROOT = api.REPO_ROOT
OURS = os.path.join(ROOT, "collections")


def kwargs(**environ):
    return api.runner_kwargs("deploy", private_data_dir="/tmp/pdd", environ=environ)


def test_default_is_the_checkouts_configuration_with_host_keys_checked():
    kw = kwargs()
    assert kw["envvars"] == {"ANSIBLE_CONFIG": os.path.join(ROOT, "ansible.cfg"),
                             "ANSIBLE_COLLECTIONS_PATH": OURS, "ANSIBLE_HOST_KEY_CHECKING": "True"}
    assert "inventory" not in kw


def test_the_callers_configuration_is_used_and_read(tmp_path):
    cfg = tmp_path / "ansible.cfg"
    cfg.write_text("[defaults]\ninventory = hosts.yml\ncollections_path = ./colls:/opt/colls\n")
    env = kwargs(ANSIBLE_CONFIG=str(cfg))["envvars"]
    assert env["ANSIBLE_CONFIG"] == str(cfg)
    assert env["ANSIBLE_COLLECTIONS_PATH"].split(os.pathsep) == [OURS, str(tmp_path / "colls"), "/opt/colls"]
    assert env["ANSIBLE_HOST_KEY_CHECKING"] == "True"
    # a directory in ANSIBLE_CONFIG means its ansible.cfg, as for Ansible
    assert kwargs(ANSIBLE_CONFIG=str(tmp_path))["envvars"]["ANSIBLE_CONFIG"] == str(cfg)


def test_configured_collections_default_follows_ansible_home(tmp_path):
    cfg = tmp_path / "ansible.cfg"
    cfg.write_text("[defaults]\nforks = 3\n")
    env = kwargs(ANSIBLE_CONFIG=str(cfg), ANSIBLE_HOME="/srv/ah")["envvars"]
    assert env["ANSIBLE_COLLECTIONS_PATH"].split(os.pathsep) == [
        OURS, "/srv/ah/collections", "/usr/share/ansible/collections"]


def test_host_key_checking_off_only_when_the_caller_says_so(tmp_path):
    cfg = tmp_path / "ansible.cfg"
    cfg.write_text("[defaults]\nhost_key_checking = False\n")
    assert kwargs(ANSIBLE_CONFIG=str(cfg))["envvars"]["ANSIBLE_HOST_KEY_CHECKING"] == "False"
    assert kwargs(ANSIBLE_HOST_KEY_CHECKING="false")["envvars"]["ANSIBLE_HOST_KEY_CHECKING"] == "False"
    assert kwargs(ANSIBLE_CONFIG=str(cfg), ANSIBLE_HOST_KEY_CHECKING="yes")["envvars"][
        "ANSIBLE_HOST_KEY_CHECKING"] == "True"


def test_collections_path_from_the_environment_keeps_ours_first():
    env = kwargs(ANSIBLE_COLLECTIONS_PATH="/a:%s:/b" % OURS)["envvars"]
    assert env["ANSIBLE_COLLECTIONS_PATH"] == os.pathsep.join([OURS, "/a", "/b"])


def test_missing_configuration_is_an_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        kwargs(ANSIBLE_CONFIG=str(tmp_path / "nope.cfg"))


@pytest.mark.parametrize("given,expected", [
    (None, None),
    ("inventory/example-proxmox.yml", os.path.join(ROOT, "inventory", "example-proxmox.yml")),
    ("host1,host2,", "host1,host2,"),
    (["a.yml", "b.yml"], ["a.yml", "b.yml"]),
], ids=["configured", "path", "host-list", "list"])
def test_inventory(monkeypatch, given, expected):
    monkeypatch.chdir(ROOT)
    kw = api.runner_kwargs("status", private_data_dir="/tmp/pdd", inventory=given, environ={})
    assert kw.get("inventory") == expected


def test_cli_without_i_leaves_the_inventory_to_the_configuration(monkeypatch, capsys):
    seen = {}

    def fake_run_playbook(playbook, **kw):
        seen.update(kw, playbook=playbook)
        # what run_playbook_live makes of ansible-playbook's "... leaves us with no hosts to target" (rc 1)
        return api.RunResult(ok=False, rc=1, status="failed", refused=api.refused_before_play(1, [
            "[ERROR]: Specified inventory, host pattern and/or --limit leaves us with no hosts to target."]),
            reason="ansible-playbook ended (runner status failed, rc 1) without a play recap:\n[ERROR]: Specified "
                   "inventory, host pattern and/or --limit leaves us with no hosts to target.")

    monkeypatch.setattr(api, "run_playbook_live", fake_run_playbook)  # the CLI's runs show progress
    assert main(["status", "-l", "typo"]) == 2  # refused before any change
    assert seen["playbook"] == "status" and seen["inventory"] is None and seen["limit"] == "typo"
    out = capsys.readouterr().out
    assert "no host matched" in out and "'typo'" in out


def test_an_ansible_cfg_in_a_directory_every_user_may_write_is_never_read(tmp_path, monkeypatch, capsys):
    """As Ansible: another user's ansible.cfg in /tmp-like directory could name an inventory script
    that ansible-playbook would run as the operator. The run says which configuration it read."""
    shared = tmp_path / "shared"
    shared.mkdir()
    (shared / "ansible.cfg").write_text("[defaults]\ninventory = ./evil.sh\n")
    shared.chmod(0o1777)
    home = tmp_path / "home"
    home.mkdir()
    env = {"HOME": str(home)}
    assert api.find_config_file(str(shared), env) in (None, "/etc/ansible/ansible.cfg")
    assert api.ignored_config_file(str(shared)) == str(shared / "ansible.cfg")
    kw = api.runner_kwargs("status", private_data_dir="/tmp/pdd", environ=env, cwd=str(shared))
    assert kw["envvars"].get("ANSIBLE_CONFIG") != str(shared / "ansible.cfg")
    # the same directory, writable by its owner only: its ansible.cfg is the one read
    shared.chmod(0o755)
    assert api.find_config_file(str(shared), env) == str(shared / "ansible.cfg")
    assert api.ignored_config_file(str(shared)) is None
    # what the run read, and what it left unread, are in its summary
    from dflash_trainer import progress
    from dflash_trainer.results import RunResult
    result = RunResult(ok=True, rc=0, status="successful", playbook="status", config=None,
                       config_ignored=str(shared / "ansible.cfg"))
    text = progress.summary(result)
    assert "Ansible configuration none (Ansible's defaults)" in text
    assert "not read: %s (its directory is one every user may write" % (shared / "ansible.cfg") in text
    assert RunResult.from_dict(result.to_dict()).config_ignored == str(shared / "ansible.cfg")
