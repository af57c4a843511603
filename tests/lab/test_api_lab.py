"""dflash_trainer against the lab: the real playbooks through ansible-runner, typed results back.

Deploys the stand-in trainer (examples/trainer) to gpu-host (container 200), deploys it again
(nothing may change or restart), then reads the status through the API and through the CLI.
"""
import json
import os
import subprocess
import sys
import tempfile

import pytest

import dflash_trainer

pytestmark = pytest.mark.lab

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
HOST = "gpu-host"
EXTRAVARS = {"trainer_src": os.path.join(ROOT, "examples", "trainer")}


def explain(result):
    return json.dumps(result.to_dict(), indent=1, default=str)


@pytest.fixture(scope="module")
def deployed(lab):
    """Deploy (restarting and proving only when needed) and return its RunResult."""
    result = dflash_trainer.deploy(limit=HOST, extravars=EXTRAVARS, timeout=900)
    assert result.ok, explain(result)
    return result


def test_deploy_is_typed_and_proved_when_it_restarts(deployed):
    assert list(deployed.hosts) == [HOST] and deployed.rc == 0 and deployed.status == "successful"
    assert deployed.exit_code == 0 and deployed.playbook == "deploy"
    assert deployed.inventory == [os.path.join(ROOT, "inventory", "lab.yml")]  # inside the checkout: its lab
    h = deployed.hosts[HOST]
    assert h.ok and h.failed_task is None and h.reason is None and not h.rolled_back
    assert h.release and len(h.release) == 16
    if h.restarted:
        assert h.proof is not None and h.proof.release == h.release
        assert h.proof.main_pid > 0 and h.proof.step >= 1 and h.proof.tok_s > 0
        assert sorted(h.proof.gpus_mib) == list(range(8)) and min(h.proof.gpus_mib.values()) >= 1024


def test_second_deploy_changes_nothing(deployed):
    again = dflash_trainer.deploy(limit=HOST, extravars=EXTRAVARS, timeout=600)
    assert again.ok, explain(again)
    h = again.hosts[HOST]
    assert h.release == deployed.hosts[HOST].release == h.previous_release
    assert not h.restarted and h.proof is None and not h.changed, explain(again)


def test_status_reports_the_running_release(deployed):
    result = dflash_trainer.status(limit=HOST)
    assert result.ok, explain(result)
    s = result.hosts[HOST].status
    release = deployed.hosts[HOST].release
    assert s is not None, explain(result)
    assert s.active and s.active_state == "active" and s.sub_state == "running" and s.main_pid > 0
    assert s.running_release == s.current_release == release and s.drift is False
    assert s.last_good == release
    assert sorted(s.gpus_mib) == list(range(8)) and min(s.gpus_mib.values()) >= 1024
    assert s.seconds_since_start > 0 and s.last_progress_line and "step=" in s.last_progress_line


def test_cli_status_json(deployed):
    proc = subprocess.run([sys.executable, "-m", "dflash_trainer", "status", "-l", HOST, "--json"],
                          cwd=ROOT, capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = json.loads(proc.stdout)
    assert out["ok"] is True and out["hosts"][HOST]["status"]["running_release"] == deployed.hosts[HOST].release


# ---- the caller's configuration and inventory; no host matched (container 201, read-only) ------
def caller_config(tmp_path, lab, known_hosts, name="ct201"):
    """A caller's own ansible.cfg (no collections_path, no host_key_checking) and inventory."""
    inv = tmp_path / "hosts.yml"
    inv.write_text(json.dumps({"trainer_hosts": {"hosts": {name: {"proxmox_vmid": 201}}, "vars": {
        "ansible_connection": "dflash.trainer.pct", "ansible_host": lab.host, "ansible_port": lab.port,
        "ansible_user": lab.user, "ansible_ssh_private_key_file": lab.key,
        "ansible_python_interpreter": "/usr/bin/python3", "ansible_pct_known_hosts_file": known_hosts,
        "ansible_control_path_dir": tempfile.mkdtemp(prefix="dflash-cp-")}}}))
    cfg = tmp_path / "ansible.cfg"
    cfg.write_text("[defaults]\ninventory = %s\nstdout_callback = ansible.builtin.default\n" % inv)
    return str(cfg)


def test_api_uses_the_callers_configuration_and_its_inventory(lab, tmp_path, monkeypatch):
    monkeypatch.setenv("ANSIBLE_CONFIG", caller_config(tmp_path, lab, lab.facts["known_hosts"]))
    result = dflash_trainer.status(timeout=300)
    assert list(result.hosts) == ["ct201"], explain(result)  # the caller's inventory, read over its ssh settings
    assert result.hosts["ct201"].status is not None, explain(result)
    # nothing runs a proved release in ct201: status says so and fails (issue 15 item 3)
    assert result.ok == bool(result.hosts["ct201"].status.active), explain(result)


def test_api_keeps_host_keys_checked(lab, tmp_path, monkeypatch):
    """ansible-runner alone would set ANSIBLE_HOST_KEY_CHECKING=False: a known_hosts file without
    the lab's key must still refuse the connection."""
    empty = tmp_path / "known_hosts"
    empty.write_text("")
    monkeypatch.setenv("ANSIBLE_CONFIG", caller_config(tmp_path, lab, str(empty)))
    result = dflash_trainer.status(timeout=300)
    assert not result.ok, explain(result)
    h = result.hosts["ct201"]
    assert not h.ok and "host key of 127.0.0.1 was not accepted" in (h.reason or ""), explain(result)
    assert h.unreachable and result.exit_code == 3, explain(result)


def test_api_no_host_matched(lab):
    """lab-201 is in the lab inventory, not in trainer_hosts: the run fails saying so, touching nothing."""
    result = dflash_trainer.deploy(limit="lab-201", extravars=EXTRAVARS, timeout=300)
    assert not result.ok and result.rc != 0, explain(result)
    assert "no host matched the pattern 'trainer_hosts' within --limit 'lab-201'" in result.hosts["lab-201"].reason
    assert result.exit_code == 2, explain(result)  # refused before any change


def test_cli_limit_matching_nothing(lab):
    proc = subprocess.run([sys.executable, "-m", "dflash_trainer", "deploy", "-l", "no-such-host"],
                          cwd=ROOT, capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 2, proc.stdout + proc.stderr  # refused before any change
    assert "no host matched the limit 'no-such-host'" in proc.stdout


def test_readme_example_without_the_venv_on_path(lab):
    """The README's example run as `.venv/bin/python` from a cron job or a unit (PATH without the
    venv), from another directory: the package is the Quick start's editable install, ansible-playbook
    is taken from beside the interpreter, and the status is read. Outside the checkout the checkout's
    ansible.cfg is not read behind the caller's back: the job names it (ANSIBLE_CONFIG), as a caller
    names their own."""
    example = ("import json, dflash_trainer; r = dflash_trainer.status(limit=%r); "
               "print(json.dumps(r.to_dict()))" % HOST)
    res = subprocess.run([sys.executable, "-c", example], cwd=tempfile.gettempdir(), capture_output=True, text=True,
                         env={"HOME": os.environ.get("HOME", "/root"), "PATH": "/usr/bin:/bin", "LANG": "C.UTF-8",
                              "ANSIBLE_CONFIG": os.path.join(ROOT, "ansible.cfg")},
                         timeout=300, check=False)
    assert res.returncode == 0, res.stderr[-3000:]
    result = dflash_trainer.RunResult.from_dict(json.loads(res.stdout.splitlines()[-1]))
    assert result.ok and result.rc == 0 and result.reason is None, explain(result)
    assert result.hosts[HOST].status is not None and result.hosts[HOST].status.active_state


def test_outside_the_checkout_the_lab_is_not_the_default(lab, tmp_path):
    """From a directory outside the checkout, with no ansible.cfg of the caller's and no -i, the run
    reads Ansible's default inventory - not the checkout's lab - and says so; nothing is touched."""
    home = tmp_path / "home"
    home.mkdir()
    env = dict((k, v) for k, v in os.environ.items() if not k.startswith("ANSIBLE_"))
    env["HOME"] = str(home)
    proc = subprocess.run([sys.executable, "-m", "dflash_trainer", "status", "-l", HOST], cwd=str(tmp_path), env=env,
                          capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 2, proc.stdout + proc.stderr  # no host to target: refused before any change
    assert "; inventory /etc/ansible/hosts (Ansible's default" in proc.stdout, proc.stdout
    assert "inventory/lab.yml" not in proc.stdout, proc.stdout
