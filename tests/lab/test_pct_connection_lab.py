"""dflash.trainer.pct against the lab: ssh (127.0.0.1:2222) -> /usr/sbin/pct -> LXC container.

Both through the `ansible` CLI (inline inventory, as users run it) and by driving the plugin
object directly (exact bytes). Container 200 stays up; the stopped-container case uses 201.
"""
from __future__ import annotations

import hashlib
import json
import os
import stat
import subprocess
import sys
import tempfile
import textwrap
import time

import pytest
import yaml

from ansible import constants as C
from ansible.errors import AnsibleConnectionFailure
from ansible.playbook.play_context import PlayContext

from ansible_collections.dflash.trainer.plugins.connection import pct

pytestmark = pytest.mark.lab

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
NAME = "dflash.trainer.pct"
CT_DIR = "/tmp/dflash pct-test it's; $(x) é"  # spaces, quotes, ';', '$()', unicode


def inventory(tmp_path, lab, connection=NAME, vmid=200, **extra):
    host = {"ansible_connection": connection, "ansible_host": lab.host, "ansible_port": lab.port,
            "ansible_user": lab.user, "ansible_ssh_private_key_file": lab.key,
            "ansible_python_interpreter": "/usr/bin/python3",
            "ansible_pct_known_hosts_file": lab.facts["known_hosts"], "proxmox_vmid": vmid}
    if connection != NAME:  # paramiko reads ~/.ssh/known_hosts only: lab inventory/lab.yml does the same
        host["ansible_host_key_checking"] = False
    host.update(extra)
    path = tmp_path / ("inv-%s-%s.yml" % (connection.rsplit(".", 1)[-1], vmid))
    path.write_text(yaml.safe_dump({"all": {"hosts": {"ct": host}}}))
    return str(path)


def ansible(inv, *args, timeout=180):
    env = dict(os.environ, ANSIBLE_FORCE_COLOR="0", ANSIBLE_NOCOLOR="1")
    if args and args[0] == "playbook":
        argv = ["ansible-playbook", "-i", inv, *args[1:]]
    else:
        argv = ["ansible", "ct", "-i", inv, *args]
    start = time.monotonic()
    proc = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout, check=False)
    proc.elapsed = time.monotonic() - start
    return proc


def conn_for(lab, **direct):
    if not C.config.has_configuration_definition("connection", NAME):
        C.config.initialize_plugin_configuration_definitions(
            "connection", NAME, yaml.safe_load(pct.DOCUMENTATION)["options"])
    conn = pct.Connection(PlayContext(), None)
    conn._load_name = NAME
    opts = {"remote_addr": lab.host, "port": lab.port, "remote_user": lab.user,
            "private_key_file": lab.key, "proxmox_vmid": "200", "known_hosts_file": lab.facts["known_hosts"]}
    opts.update(direct)
    conn.set_options(direct=opts)
    conn._connect()
    return conn


@pytest.fixture(scope="module")
def ct_dir(lab):
    lab.ct(200, "mkdir", "-p", CT_DIR, check=True)
    yield CT_DIR
    lab.ct(200, "rm", "-rf", CT_DIR)


# ---- through the ansible CLI ----------------------------------------------------------------
@pytest.mark.parametrize("connection", [NAME, "community.proxmox.proxmox_pct_remote"])
def test_ping_both_connections(lab, tmp_path, connection):
    proc = ansible(inventory(tmp_path, lab, connection), "-m", "ansible.builtin.ping")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "pong" in proc.stdout


@pytest.mark.parametrize("connection", [NAME, "community.proxmox.proxmox_pct_remote"])
def test_lab_inventory_switch(lab, connection):
    proc = subprocess.run(["ansible", "gpu-host", "-i", os.path.join(ROOT, "inventory", "lab.yml"),
                           "-m", "ansible.builtin.ping", "-e", "dflash_connection=" + connection],
                          cwd=ROOT, capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 0 and "pong" in proc.stdout, proc.stdout + proc.stderr


def test_raw_unicode(lab, tmp_path):
    proc = ansible(inventory(tmp_path, lab), "-m", "ansible.builtin.raw",
                   "-a", "printf '%s|' 'héllo wörld ☃ 日本' \"$(printf 'a;b')\"")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "héllo wörld ☃ 日本|a;b|" in proc.stdout


def test_copy_fetch_round_trip(lab, tmp_path, ct_dir):
    payload = bytes(range(256)) * 64 + "\nunicodé ☃\n".encode()
    src = tmp_path / "src é.bin"
    src.write_bytes(payload)
    fetched = tmp_path / "fetched"
    remote = ct_dir + "/file \"q\" ;x.bin"
    play = [{"hosts": "ct", "gather_facts": False, "tasks": [
        {"ansible.builtin.copy": {"src": str(src), "dest": remote, "mode": "0640"}},
        {"ansible.builtin.copy": {"content": "plain ünïcode text\n", "dest": ct_dir + "/text é.txt"}},
        {"ansible.builtin.fetch": {"src": remote, "dest": str(fetched) + "/", "flat": True}},
        {"ansible.builtin.fetch": {"src": ct_dir + "/text é.txt", "dest": str(fetched) + "/", "flat": True}},
    ]}]
    pb = tmp_path / "play.yml"
    pb.write_text(yaml.safe_dump(play, allow_unicode=True))
    proc = ansible(inventory(tmp_path, lab), "playbook", str(pb))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert (fetched / "file \"q\" ;x.bin").read_bytes() == payload
    assert (fetched / "text é.txt").read_text() == "plain ünïcode text\n"
    inside = lab.ct(200, "sha256sum", remote, text=False).stdout.split()[0].decode()
    assert inside == hashlib.sha256(payload).hexdigest()


def test_stopped_container_is_a_clear_error(lab, tmp_path):
    subprocess.run([sys.executable, os.path.join(ROOT, "lab", "lab.py"), "up", "--fresh", "--ids", "201"],
                   check=True, stdout=subprocess.DEVNULL)
    lab.pct("stop", "201")
    try:
        proc = ansible(inventory(tmp_path, lab, vmid=201), "-m", "ansible.builtin.ping")
    finally:
        lab.pct("start", "201")
    assert proc.returncode != 0
    assert "UNREACHABLE" in proc.stdout
    assert "container 201 is not running on 127.0.0.1: container '201' not running!" in proc.stdout


def test_unknown_vmid_is_a_clear_error(lab, tmp_path):
    proc = ansible(inventory(tmp_path, lab, vmid=999), "-m", "ansible.builtin.ping")
    assert "UNREACHABLE" in proc.stdout
    assert "no container 999 on 127.0.0.1: Configuration file 'nodes/" in proc.stdout
    assert "999.conf' does not exist" in proc.stdout


def test_command_timeout(lab, tmp_path):
    proc = ansible(inventory(tmp_path, lab, pct_command_timeout=2), "-m", "ansible.builtin.raw", "-a", "sleep 300")
    assert proc.elapsed < 150, proc.elapsed  # ended by the 2 s timeout, not the 300 s command: no bound only a fast machine meets
    assert proc.returncode != 0
    assert "command timed out after 2 s" in proc.stdout and "sleep 300" in proc.stdout


def test_timed_out_command_is_ended_in_the_container(lab):
    tag = "dflash-timeout-%d" % os.getpid()
    with pytest.raises(AnsibleConnectionFailure, match="command timed out after 1 s"):
        conn_for(lab, pct_command_timeout=1).exec_command("sleep 300; : %s" % tag)
    deadline = time.monotonic() + 60  # the in-container guard (3 s) vs the command's own end (300 s): polled, not raced
    while time.monotonic() < deadline:
        if tag not in lab.ct(200, "ps", "-eo", "args").stdout:
            break
        time.sleep(0.3)
    assert tag not in lab.ct(200, "ps", "-eo", "args").stdout


def test_module_timeout_with_pipelining(lab, tmp_path):
    proc = ansible(inventory(tmp_path, lab, pct_command_timeout=3), "-m", "ansible.builtin.command",
                   "-a", "sleep 300")
    assert proc.elapsed < 150, proc.elapsed  # ended by the 3 s timeout, not the 300 s command: no bound only a fast machine meets
    assert "command timed out after 3 s" in proc.stdout


def test_unreachable_host(lab, tmp_path):
    proc = ansible(inventory(tmp_path, lab, ansible_port=1), "-m", "ansible.builtin.ping")
    assert "UNREACHABLE" in proc.stdout
    assert "host 127.0.0.1 is unreachable (ssh): ssh: connect to host 127.0.0.1 port 1: Connection refused" \
        in proc.stdout


def test_auth_failure(lab, tmp_path):
    proc = ansible(inventory(tmp_path, lab, ansible_user="nobody-dflash"), "-m", "ansible.builtin.ping")
    assert "UNREACHABLE" in proc.stdout
    assert "authentication to 127.0.0.1 failed (ssh)" in proc.stdout and "Permission denied" in proc.stdout


# ---- host keys: checked against the known_hosts file the lab writes ---------------------------
def short_dir():
    """A fresh ControlPath directory short enough for a socket path (< 108 bytes)."""
    return tempfile.mkdtemp(prefix="dflash-cp-")


def test_lab_writes_its_host_key_to_known_hosts(lab):
    with open(lab.facts["known_hosts"]) as fh:
        entry = fh.read().split()
    with open(os.path.join(os.path.dirname(lab.key), "ssh_host_ed25519_key.pub")) as fh:
        pub = fh.read().split()
    assert entry == ["[%s]:%d" % (lab.host, lab.port)] + pub[:2]


@pytest.mark.parametrize("known", ["empty", "other-key"])
def test_unknown_host_key_is_refused(lab, tmp_path, known):
    """Without the lab's key in the known_hosts file the connection fails (its own ssh master,
    so no master opened by another run is reused), and nothing runs in the container."""
    known_hosts = tmp_path / "known_hosts"
    if known == "other-key":
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(tmp_path / "k")], check=True)
        known_hosts.write_text("[%s]:%d %s" % (lab.host, lab.port, (tmp_path / "k.pub").read_text()))
    else:
        known_hosts.write_text("")
    proc = ansible(inventory(tmp_path, lab, ansible_pct_known_hosts_file=str(known_hosts),
                             ansible_control_path_dir=short_dir()), "-m", "ansible.builtin.ping")
    assert proc.returncode != 0 and "UNREACHABLE" in proc.stdout, proc.stdout + proc.stderr
    assert "host key of 127.0.0.1 was not accepted (ssh): " in proc.stdout
    assert ("it CHANGED" if known == "other-key" else "No ED25519 host key is known for [127.0.0.1]:2222") \
        in proc.stdout.replace("\n        ", " ")


def test_host_key_checking_ignores_the_users_ssh_config(lab, tmp_path):
    """StrictHostKeyChecking=yes is on the command line: an ssh config saying `no` does not
    switch it off (only ssh_extra_args could)."""
    cfg = tmp_path / "ssh_config"
    cfg.write_text("Host *\n  StrictHostKeyChecking no\n")
    known_hosts = tmp_path / "known_hosts"
    known_hosts.write_text("")
    proc = ansible(inventory(tmp_path, lab, ansible_pct_known_hosts_file=str(known_hosts),
                             ansible_ssh_extra_args="-F %s" % cfg, ansible_control_path_dir=short_dir()),
                   "-m", "ansible.builtin.ping")
    assert "host key of 127.0.0.1 was not accepted" in proc.stdout, proc.stdout + proc.stderr
    assert known_hosts.read_text() == ""


def test_accept_new_only_when_asked(lab, tmp_path):
    known_hosts = tmp_path / "known_hosts"
    known_hosts.write_text("")
    proc = ansible(inventory(tmp_path, lab, ansible_pct_known_hosts_file=str(known_hosts),
                             ansible_pct_host_key_accept_new=True, ansible_control_path_dir=short_dir()),
                   "-m", "ansible.builtin.ping")
    assert proc.returncode == 0 and "pong" in proc.stdout, proc.stdout + proc.stderr
    with open(lab.facts["known_hosts"]) as fh:
        lab_key = fh.read().split()[1:3]
    assert lab_key == known_hosts.read_text().split()[1:3]


# ---- a command's own failure is a result, never UNREACHABLE ------------------------------------
@pytest.mark.parametrize("rc,text", [
    (1, "sudo: a password is required"),
    (255, "ssh: connect to host db1 port 22: Connection refused"),
    (255, "container '200' not running!"),
], ids=["sudo", "ssh", "pct"])
def test_transport_like_failure_of_a_command_in_the_container_is_failed_not_unreachable(lab, tmp_path, rc, text):
    proc = ansible(inventory(tmp_path, lab, pct_sudo=False), "-m", "ansible.builtin.raw",
                   "-a", "echo \"%s\" >&2; exit %d" % (text, rc))
    assert "UNREACHABLE" not in proc.stdout, proc.stdout
    assert "FAILED" in proc.stdout and "rc=%d" % rc in proc.stdout.replace(" | ", " "), proc.stdout
    assert text in proc.stdout and "dflash-pct-started" not in proc.stdout


def test_mark_never_reaches_the_task(lab):
    conn = conn_for(lab)
    assert conn.exec_command("echo out; echo err >&2") == (0, b"out\n", b"err\n")
    assert conn_for(lab, pct_timeout_in_container=False).exec_command("echo err >&2; exit 1") == (1, b"", b"err\n")


# ---- the plugin object, exact bytes ------------------------------------------------------------
def test_exec_exact_bytes(lab):
    conn = conn_for(lab)
    data = bytes(range(256)) * 1024
    rc, out, err = conn.exec_command("cat; printf 'err ☃' >&2; exit 255", in_data=data)
    assert (rc, out, err) == (255, data, "err ☃".encode())  # 255 from the command is a result
    rc, out, _ignored = conn.exec_command("printf '\\000\\377\\303\\251'")
    assert (rc, out) == (0, b"\x00\xff\xc3\xa9")


def test_put_fetch_weird_paths(lab, tmp_path, ct_dir):
    conn = conn_for(lab)
    src = tmp_path / "s"
    src.write_bytes(os.urandom(65536))
    for name in ["a b", "it's \"q\"", "x;touch pwned-dflash", "$(touch pwned-dflash)`id`", "ü ☃", "-dash"]:
        remote = ct_dir + "/" + name
        conn.put_file(str(src), remote)
        back = tmp_path / "back"
        conn.fetch_file(remote, str(back))
        assert back.read_bytes() == src.read_bytes(), name
    assert lab.ct(200, "sh", "-c", "ls / /root /tmp | grep -c pwned-dflash").stdout.strip() == "0"


BIG_SCRIPT = textwrap.dedent("""
    import json, resource, sys, time, yaml
    sys.path.insert(0, %(collections)r)
    from ansible import constants as C
    from ansible.playbook.play_context import PlayContext
    from ansible_collections.dflash.trainer.plugins.connection import pct
    C.config.initialize_plugin_configuration_definitions(
        "connection", "dflash.trainer.pct", yaml.safe_load(pct.DOCUMENTATION)["options"])
    conn = pct.Connection(PlayContext(), None)
    conn._load_name = "dflash.trainer.pct"
    conn.set_options(direct=json.loads(sys.argv[1]))
    conn._connect()
    t0 = time.monotonic()
    getattr(conn, sys.argv[2])(sys.argv[3], sys.argv[4])
    print(json.dumps({"seconds": time.monotonic() - t0,
                      "maxrss_kib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss}))
""")


def test_100mb_put_fetch_streams(lab, tmp_path, ct_dir):
    opts = json.dumps({"remote_addr": lab.host, "port": lab.port, "remote_user": lab.user, "private_key_file": lab.key,
                       "proxmox_vmid": "200", "known_hosts_file": lab.facts["known_hosts"]})
    script = BIG_SCRIPT % {"collections": os.path.join(ROOT, "collections")}
    big = tmp_path / "big.bin"
    digest = hashlib.sha256()
    with open(big, "wb") as fh:
        for _ignored in range(100):
            chunk = os.urandom(1 << 20)
            digest.update(chunk)
            fh.write(chunk)
    small = tmp_path / "small.bin"
    small.write_bytes(b"x")
    remote = ct_dir + "/big file.bin"

    def run(op, a, b):
        proc = subprocess.run([sys.executable, "-c", script, opts, op, a, b], capture_output=True, text=True,
                              timeout=300, cwd=ROOT, check=False)
        assert proc.returncode == 0, proc.stderr
        return json.loads(proc.stdout.strip().splitlines()[-1])

    baseline = run("put_file", str(small), ct_dir + "/small")
    put = run("put_file", str(big), remote)
    inside = lab.ct(200, "sha256sum", remote).stdout.split()[0]
    assert inside == digest.hexdigest()
    back = tmp_path / "back.bin"
    fetch = run("fetch_file", remote, str(back))
    with open(back, "rb") as fh:
        assert hashlib.file_digest(fh, "sha256").hexdigest() == digest.hexdigest()
    # streamed, not buffered: a 100 MiB file moves no more than a few MiB of controller memory
    for result in (put, fetch):
        assert result["maxrss_kib"] - baseline["maxrss_kib"] < 20 * 1024, (baseline, put, fetch)
        assert result["maxrss_kib"] < 100 * 1024
    print("100 MiB: put %.2fs fetch %.2fs, maxrss base/put/fetch %d/%d/%d KiB" % (
        put["seconds"], fetch["seconds"], baseline["maxrss_kib"], put["maxrss_kib"], fetch["maxrss_kib"]))


def test_reset_stops_the_master(lab):
    conn = conn_for(lab, control_path_dir="/tmp/dflash-cp-reset-test")
    assert conn.exec_command("true")[0] == 0
    check = conn._build_ssh_argv([], control=["-O", "check"])
    assert subprocess.run(check, capture_output=True, check=False).returncode == 0
    conn.reset()
    deadline = time.monotonic() + 5
    while subprocess.run(check, capture_output=True, check=False).returncode == 0 and time.monotonic() < deadline:
        time.sleep(0.1)
    assert subprocess.run(check, capture_output=True, check=False).returncode != 0
    assert conn.exec_command("echo again")[1] == b"again\n"  # a new master comes up
    conn.reset()


def test_direct_errors(lab):
    with pytest.raises(AnsibleConnectionFailure, match="no container 999 on 127.0.0.1"):
        conn_for(lab, proxmox_vmid="999").exec_command("true")
    start = time.monotonic()
    with pytest.raises(AnsibleConnectionFailure, match="command timed out after 1 s"):
        conn_for(lab, pct_command_timeout=1).exec_command("sleep 300")
    assert time.monotonic() - start < 150  # the 1 s timeout, not the 300 s command: no bound only a fast machine meets


@pytest.mark.parametrize("local", [False, True], ids=["ssh", "pct_local"])
def test_transfers_leave_controller_file_modes_alone(lab, tmp_path, ct_dir, local):
    """pct exec runs lxc-attach, which fchmods regular files given to it as stdio to 0700; the
    plugin must never hand it the controller's own files (local mode runs pct right here)."""
    conn = conn_for(lab, pct_local=local)
    src = tmp_path / "src"
    src.write_bytes(b"payload\n" * 1000)
    src.chmod(0o644)
    conn.put_file(str(src), ct_dir + "/moded")
    assert stat.S_IMODE(src.stat().st_mode) == 0o644
    back = tmp_path / "back"
    conn.fetch_file(ct_dir + "/moded", str(back))
    assert back.read_bytes() == src.read_bytes()
    assert not back.stat().st_mode & 0o111  # not turned into 0700 on the way
