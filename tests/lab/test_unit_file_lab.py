"""Everything that reaches the unit file is typed (issue 13 item 4): after a deploy with values
of each kind set, the unit file read back from the container holds exactly the directives
expected, one per line - no value can add a line. Lab container 236."""
import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CT = "236"


@pytest.fixture(scope="module")
def inv(lab, tmp_path_factory):
    subprocess.run([sys.executable, os.path.join(ROOT, "lab", "lab.py"), "up", "--fresh", "--ids", CT],
                   check=True, stdout=subprocess.DEVNULL)
    path = tmp_path_factory.mktemp("unit") / "hosts.json"
    path.write_text(json.dumps({"all": {"hosts": {"u": {"proxmox_vmid": int(CT)}}, "vars": lab.conn_vars()}}))
    return str(path)


def test_the_unit_file_holds_exactly_the_expected_directives(lab, inv, tmp_path):
    extra = {"trainer_target_hosts": "all", "trainer_src": os.path.join(ROOT, "examples", "trainer"),
             "trainer_ready_hold_s": 2, "trainer_ready_stall_s": 2, "trainer_ready_timeout_s": 30,
             "trainer_env": {"TRAINER_NOTE": "unit file lab"},
             "trainer_restart_policy": "on-abnormal", "trainer_restart_sec": "7", "trainer_stop_timeout_s": 45,
             "trainer_start_limit_burst": 4, "trainer_start_limit_interval_s": "600",
             "trainer_command": ["./run.sh", "--tag", "100%", "$HOME", "a b"]}
    vars_file = tmp_path / "extra.json"
    vars_file.write_text(json.dumps(extra))
    env = dict(os.environ, ANSIBLE_CONFIG=os.path.join(ROOT, "ansible.cfg"), ANSIBLE_NOCOLOR="1")
    res = subprocess.run(["ansible-playbook", "-i", inv, "deploy.yml", "-l", "u", "-e", "@%s" % vars_file],
                         cwd=ROOT, env=env, capture_output=True, text=True, timeout=300, check=False)
    assert res.returncode == 0, res.stdout[-3000:]
    text = lab.ct(CT, "cat", "/etc/systemd/system/dflash-trainer.service").stdout
    directives = sorted(line for line in text.splitlines() if line and not line.startswith("#"))
    assert directives == sorted([
        "[Unit]",
        "Description=DFlash trainer (dflash-trainer), managed by dflash.trainer",
        "StartLimitIntervalSec=600",
        "StartLimitBurst=4",
        "[Service]",
        "Type=exec",
        'ExecStart="/usr/local/lib/dflash-trainer/launch" "--root" "/opt/dflash-trainer" "--log" '
        '"/workspace/trainer.log" "--log-max-mib" "256" "--log-keep" "3" "--" "./run.sh" "--tag" "100%%" "$$HOME" "a b"',
        "WorkingDirectory=/opt/dflash-trainer",
        "User=root",
        "EnvironmentFile=-/etc/default/locale",
        "EnvironmentFile=-/etc/locale.conf",
        "EnvironmentFile=/etc/dflash-trainer/trainer.env",
        "CacheDirectory=dflash-trainer/inductor",
        "CacheDirectoryMode=0700",
        "StandardOutput=journal",
        "StandardError=journal",
        "KillMode=control-group",
        "KillSignal=SIGTERM",
        "SendSIGKILL=yes",
        "TimeoutStopSec=45",
        "Restart=on-abnormal",
        "RestartSec=7",
        "[Install]",
        "WantedBy=multi-user.target",
    ])
    # systemd reads them as written (nothing dropped or reset)
    show = lab.ct(CT, "systemctl", "show", "dflash-trainer", "-p", "Restart", "-p", "RestartUSec", "-p",
                  "TimeoutStopUSec", "-p", "StartLimitBurst", "-p", "StartLimitIntervalUSec").stdout
    assert sorted(show.split()) == sorted(["Restart=on-abnormal", "RestartUSec=7s", "TimeoutStopUSec=45s",
                                           "StartLimitBurst=4", "StartLimitIntervalUSec=10min"])
    # the login variables come from root's passwd entry, the locale files are read in order
    show = lab.ct(CT, "systemctl", "show", "dflash-trainer", "-p", "User", "-p", "EnvironmentFiles").stdout
    assert "User=root" in show and show.index("/etc/default/locale") < show.index("/etc/locale.conf") \
        < show.index("/etc/dflash-trainer/trainer.env"), show
    # the environment file carries the collection's mark as its first line
    first = lab.ct(CT, "head", "-1", "/etc/dflash-trainer/trainer.env").stdout.strip()
    assert first.startswith("# dflash.trainer: the trainer unit's environment")
