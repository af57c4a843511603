"""Big releases at disk speed (issue 15, item 5), in the lab: over dflash.trainer.pct a release
bigger than SMALL_ARCHIVE_MAX goes as a plain tar streamed through a fifo straight into the module
(one PCT PUT (stream), no archive file on either side), lands byte-exact, leaves nothing behind, and
a re-run is a no-op. Container 206 (lab.py up --ids 206)."""
from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CT = "206"
RELEASE_ROOT = "/opt/stream-lab"

PLAY = [{"hosts": "ct", "gather_facts": False, "tasks": [
    {"name": "Release", "dflash.trainer.trainer_release": {"root": RELEASE_ROOT, "src": "{{ src }}"},
     "register": "r"},
    {"name": "Report", "ansible.builtin.copy": {"content": "{{ r | to_json }}", "dest": "{{ out }}"},
     "delegate_to": "localhost"}]}]


@pytest.fixture(scope="module")
def ct(lab, tmp_path_factory):
    subprocess.run([sys.executable, os.path.join(ROOT, "lab", "lab.py"), "up", "--fresh", "--ids", CT], check=True,
                   stdout=subprocess.DEVNULL)
    lab.ct(CT, "rm", "-rf", RELEASE_ROOT, check=True)
    base = tmp_path_factory.mktemp("stream")
    inv = base / "inv.json"
    inv.write_text(json.dumps({"all": {"hosts": {"ct": {"proxmox_vmid": int(CT)}}, "vars": lab.conn_vars()}}))
    (base / "play.yml").write_text(json.dumps(PLAY))
    yield base
    lab.ct(CT, "rm", "-rf", RELEASE_ROOT)


def deploy(base, src):
    out = base / "result.json"
    if out.exists():
        out.unlink()
    env = dict(os.environ, ANSIBLE_CONFIG=os.path.join(ROOT, "ansible.cfg"), ANSIBLE_NOCOLOR="1",
               XDG_CACHE_HOME=str(base / "cache"))
    proc = subprocess.run(["ansible-playbook", "-vvv", "-i", str(base / "inv.json"), str(base / "play.yml"),
                           "-e", json.dumps({"src": str(src), "out": str(out)})],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    text = proc.stdout.split("TASK [Release]", 1)[1].split("TASK [Report]", 1)[0]
    return json.loads(out.read_text()), text


def test_big_release_streams_into_the_module_and_lands_byte_exact(lab, ct, tmp_path):
    src = tmp_path / "src"
    (src / "pkg").mkdir(parents=True)
    (src / "trainer.py").write_text("print('step=1')\n")
    (src / "pkg" / "model.py").write_text("W = 1\n")
    weights = os.urandom(12 * 1024 * 1024 + 5)
    (src / "pkg" / "weights.bin").write_bytes(weights)

    first, text = deploy(ct, src)
    assert first["transferred"] is True and first["changed"] is True
    puts = [line for line in text.splitlines() if "PCT PUT" in line]
    assert len(puts) == 1 and "PCT PUT (stream) TO " in puts[0] and puts[0].rstrip().endswith(".tar.fifo"), puts
    assert "plain tar, %d bytes, into the module through" % first["archive_bytes"] in text
    assert first["archive_bytes"] > len(weights)

    # (the release lands beside current: the restart job switches current to it)
    got = lab.ct(CT, "sha256sum", "%s/releases/%s/pkg/weights.bin" % (RELEASE_ROOT, first["release"]),
                 check=True).stdout.split()[0]
    assert got == hashlib.sha256(weights).hexdigest()
    # nothing left: no Ansible tmp dir (with its fifo), no partial release
    left = lab.ct(CT, "sh", "-c", "ls -A /root/.ansible/tmp 2>/dev/null; ls -A %s/releases" % RELEASE_ROOT,
                  check=True).stdout.split()
    assert left == [first["release"]], left

    again, text = deploy(ct, src)
    assert again["changed"] is False and again["release"] == first["release"]
    assert "PCT PUT" not in text
