"""plugins/connection/pct.py: argv building and error classification from tables, plus the
exec/put/fetch/timeout paths in local mode against a fake `pct` (no lab, no ssh)."""
from __future__ import annotations

import hashlib
import os
import shlex
import subprocess
import time

import pytest
import yaml

from ansible import constants as C
from ansible.errors import AnsibleConnectionFailure, AnsibleError
from ansible.playbook.play_context import PlayContext

from ansible_collections.dflash.trainer.plugins.connection import pct

NAME = "dflash.trainer.pct"
KEY = "/var/lib/dflash-lab/ssh/id_ed25519"
CP = os.path.join(os.path.expanduser("~/.ansible/cp"), "dflash-%C")

# Options that would otherwise come from ansible.cfg / the environment: pin them.
BASE = {"remote_addr": "pve1", "proxmox_vmid": "200", "port": None, "remote_user": None,
        "private_key_file": None, "pct_path": "/usr/sbin/pct", "ssh_executable": "ssh",
        "ssh_extra_args": "", "pct_tty": False, "pct_local": False, "pct_sudo": False,
        "control_persist": 60, "control_path_dir": "~/.ansible/cp", "pct_command_timeout": 1800,
        "connect_timeout": 10, "host_key_checking": True, "pipelining": True,
        "pct_timeout_in_container": False}


def make_conn(var_options=None, **direct):
    if not C.config.has_configuration_definition("connection", NAME):
        C.config.initialize_plugin_configuration_definitions(
            "connection", NAME, yaml.safe_load(pct.DOCUMENTATION)["options"])
    conn = pct.Connection(PlayContext(), None)
    conn._load_name = NAME
    opts = dict(BASE)
    opts.update(direct)
    if var_options:  # let variables speak: drop the pinned values they are meant to set
        for key in ("remote_addr", "proxmox_vmid", "port", "remote_user", "private_key_file",
                    "pct_command_timeout", "pct_local", "pct_sudo"):
            if key not in direct:
                opts.pop(key, None)
    conn.set_options(var_options=var_options or {}, direct=opts)
    return conn


SSH_OPTS = ["-o", "BatchMode=yes", "-o", "LogLevel=ERROR", "-o", "ConnectTimeout=10"]
MUX = ["-o", "ControlMaster=auto", "-o", "ControlPersist=60s", "-o", "ControlPath=" + CP]
NOHK = ["-o", "StrictHostKeyChecking=no", "-o", "UserKnownHostsFile=/dev/null"]

# (id, options, shell command in the container, expected local argv)
ARGV_CASES = [
    ("defaults", {}, "echo hi",
     ["ssh", "-T", *SSH_OPTS, *MUX, "--", "pve1", "/usr/sbin/pct exec 200 -- /bin/sh -c 'echo hi'"]),
    ("port-user-key", {"port": 2222, "remote_user": "root", "private_key_file": KEY}, "true",
     ["ssh", "-T", "-p", "2222", "-l", "root", "-i", KEY, *SSH_OPTS, *MUX, "--", "pve1",
      "/usr/sbin/pct exec 200 -- /bin/sh -c true"]),
    ("no-host-key-checking", {"host_key_checking": False}, "true",
     ["ssh", "-T", *SSH_OPTS, *NOHK, *MUX, "--", "pve1", "/usr/sbin/pct exec 200 -- /bin/sh -c true"]),
    ("control-persist-off", {"control_persist": 0}, "true",
     ["ssh", "-T", *SSH_OPTS, "-o", "ControlMaster=no", "-o", "ControlPath=none", "--", "pve1",
      "/usr/sbin/pct exec 200 -- /bin/sh -c true"]),
    ("control-persist-300-dir", {"control_persist": 300, "control_path_dir": "/run/cp"}, "true",
     ["ssh", "-T", *SSH_OPTS, "-o", "ControlMaster=auto", "-o", "ControlPersist=300s",
      "-o", "ControlPath=/run/cp/dflash-%C", "--", "pve1", "/usr/sbin/pct exec 200 -- /bin/sh -c true"]),
    ("extra-args-first", {"ssh_extra_args": "-o LogLevel=DEBUG -J 'jump host'", "connect_timeout": 3}, "true",
     ["ssh", "-o", "LogLevel=DEBUG", "-J", "jump host", "-T", "-o", "BatchMode=yes", "-o", "LogLevel=ERROR",
      "-o", "ConnectTimeout=3", *MUX, "--", "pve1", "/usr/sbin/pct exec 200 -- /bin/sh -c true"]),
    ("sudo", {"pct_sudo": True, "remote_user": "ansible"}, "id -u",
     ["ssh", "-T", "-l", "ansible", *SSH_OPTS, *MUX, "--", "pve1",
      "sudo -n /usr/sbin/pct exec 200 -- /bin/sh -c 'id -u'"]),
    ("tty", {"pct_tty": True}, "tty",
     ["ssh", "-tt", *SSH_OPTS, *MUX, "--", "pve1", "/usr/sbin/pct exec 200 -- /bin/sh -c tty"]),
    ("pct-path-executable", {"pct_path": "/opt/pve bin/pct", "ssh_executable": "/usr/local/bin/ssh",
                             "proxmox_vmid": "1234"}, "true",
     ["/usr/local/bin/ssh", "-T", *SSH_OPTS, *MUX, "--", "pve1",
      "'/opt/pve bin/pct' exec 1234 -- /bin/sh -c true"]),
    ("guard", {"pct_timeout_in_container": True, "pct_command_timeout": 30}, "echo hi",
     ["ssh", "-T", *SSH_OPTS, *MUX, "--", "pve1",
      "/usr/sbin/pct exec 200 -- /bin/sh -c '" + pct.GUARD_SCRIPT.replace("'", "'\"'\"'") + "' sh 32 'echo hi'"]),
    ("guard-not-on-tty", {"pct_timeout_in_container": True, "pct_tty": True}, "tty",
     ["ssh", "-tt", *SSH_OPTS, *MUX, "--", "pve1", "/usr/sbin/pct exec 200 -- /bin/sh -c tty"]),
    ("guard-local", {"pct_local": True, "pct_timeout_in_container": True, "pct_command_timeout": 5}, "true",
     ["/usr/sbin/pct", "exec", "200", "--", "/bin/sh", "-c", pct.GUARD_SCRIPT, "sh", "7", "true"]),
    ("local", {"pct_local": True}, "echo 'a b'",
     ["/usr/sbin/pct", "exec", "200", "--", "/bin/sh", "-c", "echo 'a b'"]),
    ("local-sudo", {"pct_local": True, "pct_sudo": True}, "true",
     ["sudo", "-n", "/usr/sbin/pct", "exec", "200", "--", "/bin/sh", "-c", "true"]),
]


@pytest.mark.parametrize("opts,cmd,expected", [c[1:] for c in ARGV_CASES], ids=[c[0] for c in ARGV_CASES])
def test_ssh_argv_table(opts, cmd, expected):
    conn = make_conn(**opts)
    tty = bool(opts.get("pct_tty"))
    assert conn._build_ssh_argv(conn._build_remote_command(cmd, tty=tty), tty=tty) == expected


def test_options_from_inventory_variables():
    conn = make_conn(var_options={
        "inventory_hostname": "gpu-host", "ansible_host": "127.0.0.1", "ansible_port": 2222,
        "ansible_user": "root", "ansible_ssh_private_key_file": KEY, "proxmox_vmid": 200,
        "pct_command_timeout": 7, "pct_sudo": True})
    argv = conn._build_ssh_argv(conn._build_remote_command("true"))
    assert argv[:7] == ["ssh", "-T", "-p", "2222", "-l", "root", "-i"]
    assert argv[-2:] == ["127.0.0.1", "sudo -n /usr/sbin/pct exec 200 -- /bin/sh -c true"]
    assert conn.get_option("pct_command_timeout") == 7


def test_missing_vmid_is_a_connection_failure():
    conn = make_conn(proxmox_vmid=None)
    with pytest.raises(AnsibleConnectionFailure, match="proxmox_vmid is not set"):
        conn._build_remote_command("true")


WEIRD = [
    "/tmp/with space/file name.txt",
    "/tmp/it's \"quoted\".txt",
    "/tmp/semi;colon; rm -rf /tmp/nothing",
    "/tmp/$(touch /tmp/pwned)`id`$HOME",
    "/tmp/unicodé ☃ 日本.bin",
    "/tmp/new\nline\ttab",
    "-starts-with-dash",
    "",
]


@pytest.mark.parametrize("path", WEIRD, ids=range(len(WEIRD)))
def test_remote_string_round_trips(path):
    conn = make_conn()
    remote = conn._pct_argv(["/bin/sh", "-c", pct.PUT_SCRIPT, "sh", path])
    argv = conn._build_ssh_argv(remote)
    assert shlex.split(argv[-1]) == remote
    # and a real shell (what sshd hands the string to) gives the same argv back
    out = subprocess.run(["/bin/sh", "-c", pct.quote_remote(["printf", "%s\\0", *remote])],
                         capture_output=True, check=True).stdout
    assert out.split(b"\0")[:-1] == [a.encode() for a in remote]


@pytest.mark.parametrize("cmd", WEIRD[:6], ids=range(6))
def test_shell_command_is_one_argument(cmd):
    conn = make_conn()
    assert shlex.split(conn._build_ssh_argv(conn._build_remote_command(cmd))[-1])[-1] == cmd


NODE_CONF = "Configuration file 'nodes/pve1/lxc/999.conf' does not exist\n"
# (id, rc, stderr, local, expected message fragment or None = the command's own result)
CLASSIFY = [
    ("no-config", 255, NODE_CONF, False, "no container 999 on pve1: Configuration file"),
    ("no-config-local", 255, NODE_CONF, True, "no container 999 on this host (local pct)"),
    ("not-running", 255, "container '999' not running!\n", False, "container 999 is not running on pve1"),
    ("not-running-old", 255, "Error: container '999' not running!\n", False, "is not running on pve1"),
    ("push-not-running", 255, "can only push files to a running CT\n", False, "is not running"),
    ("pull-not-running", 255, "can only pull files from a running VM\n", False, "is not running"),
    ("bad-vmid", 255, "400 Parameter verification failed.\nvmid: invalid format - value does not look like a "
     "valid VM ID\n", False, "invalid container id"),
    ("refused", 255, "ssh: connect to host pve1 port 1: Connection refused\n", False,
     "host pve1 is unreachable (ssh): ssh: connect to host pve1 port 1: Connection refused"),
    ("resolve", 255, "ssh: Could not resolve hostname pve1: Name or service not known\n", False, "unreachable"),
    ("timed-out", 255, "ssh: connect to host 10.9.9.9 port 22: Connection timed out\n", False, "unreachable"),
    ("no-route", 255, "ssh: connect to host 10.9.9.9 port 22: No route to host\n", False, "unreachable"),
    ("closed", 255, "Connection closed by 10.0.0.1 port 22\n", False, "unreachable"),
    ("kex", 255, "kex_exchange_identification: read: Connection reset by peer\n", False, "unreachable"),
    ("auth", 255, "root@pve1: Permission denied (publickey).\n", False,
     "authentication to pve1 failed (ssh): root@pve1: Permission denied (publickey)."),
    ("auth-with-warning", 255, "Warning: Permanently added 'pve1' (ED25519) to the list of known hosts.\r\n"
     "root@pve1: Permission denied (publickey,password).\r\n", False, "authentication to pve1 failed"),
    ("host-key", 255, "Host key verification failed.\n", False, "host key of pve1 was not accepted"),
    ("sudo-password", 1, "sudo: a password is required\n", False, "sudo -n for pct failed on pve1"),
    ("pct-missing", 127, "bash: line 1: /usr/sbin/pct: No such file or directory\n", False,
     "pct (/usr/sbin/pct) cannot be run on pve1"),
    # the container command's own failures are results, not transport errors
    ("cmd-255", 255, "", False, None),
    ("cmd-255-text", 255, "my tool: fatal error\n", False, None),
    ("cmd-1", 1, "grep: x: No such file or directory\n", False, None),
    ("cmd-127", 127, "/bin/sh: 1: nvidia-smi: not found\n", False, None),
    ("cmd-permission-in-ct", 1, "cat: /root/x: Permission denied\n", False, None),
    ("ssh-text-in-local-mode", 255, "ssh: connect to host x port 22: Connection refused\n", True, None),
]


@pytest.mark.parametrize("rc,stderr,local,expected", [c[1:] for c in CLASSIFY], ids=[c[0] for c in CLASSIFY])
def test_classify_failure_table(rc, stderr, local, expected):
    msg = pct.classify_failure(rc, stderr, "pve1", "999", "/usr/sbin/pct", local=local)
    if expected is None:
        assert msg is None
    else:
        assert msg is not None and expected in msg


# ---- local mode against a fake pct: exec / put / fetch / timeout without the lab ------------
FAKE_PCT = r"""#!/bin/sh
# fake pct: `exec VMID -- CMD...`; 999 unknown, 201 stopped, 300 swallows uploads
[ "$1" = exec ] || { echo "unsupported" >&2; exit 2; }
vmid=$2; shift 3
case $vmid in
  999) echo "Configuration file 'nodes/fake/lxc/999.conf' does not exist" >&2; exit 255;;
  201) echo "container '201' not running!" >&2; exit 255;;
  300) cat >/dev/null; echo 0; exit 0;;
esac
exec "$@"
"""


@pytest.fixture
def fake_pct(tmp_path):
    path = tmp_path / "pct"
    path.write_text(FAKE_PCT)
    path.chmod(0o755)
    return str(path)


def local_conn(fake_pct, **opts):
    conn = make_conn(pct_local=True, pct_path=fake_pct, **opts)
    conn._connect()
    return conn


def test_local_exec_pipelining_binary(fake_pct):
    conn = local_conn(fake_pct)
    data = bytes(range(256)) * 4096  # 1 MiB in and out: no pipe deadlock
    rc, out, err = conn.exec_command("cat; echo done >&2; exit 3", in_data=data)
    assert (rc, out, err) == (3, data, b"done\n")


def test_local_put_fetch_round_trip(fake_pct, tmp_path):
    conn = local_conn(fake_pct)
    src = tmp_path / "src.bin"
    src.write_bytes(os.urandom(300000) + "é☃".encode())
    dest_dir = tmp_path / "it's a \"dir\"; $(x)"
    dest_dir.mkdir()
    dest = str(dest_dir / "日本 file.bin")
    conn.put_file(str(src), dest)
    assert open(dest, "rb").read() == src.read_bytes()
    back = str(tmp_path / "back.bin")
    conn.fetch_file(dest, back)
    assert hashlib.sha256(open(back, "rb").read()).digest() == hashlib.sha256(src.read_bytes()).digest()


def test_local_put_size_mismatch_raises(fake_pct, tmp_path):
    conn = local_conn(fake_pct, proxmox_vmid="300")
    src = tmp_path / "src.bin"
    src.write_bytes(b"x" * 1000)
    with pytest.raises(AnsibleError, match=r"failed to transfer .* \(rc=0, 0 of 1000 bytes\)"):
        conn.put_file(str(src), str(tmp_path / "dest"))


def test_local_fetch_missing_file_raises_and_leaves_nothing(fake_pct, tmp_path):
    conn = local_conn(fake_pct)
    with pytest.raises(AnsibleError, match="failed to fetch /nonexistent/x"):
        conn.fetch_file("/nonexistent/x", str(tmp_path / "out"))
    assert os.listdir(tmp_path) == ["pct"]


@pytest.mark.parametrize("vmid,fragment", [("999", "no container 999 on this host"),
                                           ("201", "container 201 is not running on this host")])
def test_local_pct_errors(fake_pct, vmid, fragment):
    conn = local_conn(fake_pct, proxmox_vmid=vmid)
    with pytest.raises(AnsibleConnectionFailure, match=fragment):
        conn.exec_command("true")


def test_local_timeout_kills_the_process_group(fake_pct, tmp_path):
    conn = local_conn(fake_pct, pct_command_timeout=1)
    marker = tmp_path / "late"
    start = time.monotonic()
    with pytest.raises(AnsibleConnectionFailure, match=r"command timed out after 1 s .*sleep 5"):
        conn.exec_command("(sleep 5; touch %s) & sleep 5" % shlex.quote(str(marker)))
    assert time.monotonic() - start < 4
    time.sleep(5)
    assert not marker.exists()  # the background child died with its group


@pytest.mark.parametrize("guard", [False, True])
def test_local_guard_is_transparent(fake_pct, guard):
    conn = local_conn(fake_pct, pct_timeout_in_container=guard)
    data = b"in\x00put"
    assert conn.exec_command("cat; printf ' %s' \"$0\" >&2; exit 7", in_data=data) == (7, data, b" /bin/sh")


def test_guard_without_timeout_binary(fake_pct, tmp_path):
    env_path = os.environ["PATH"]
    try:
        os.environ["PATH"] = str(tmp_path)  # no timeout(1) on PATH: the guard falls back to plain sh
        (tmp_path / "cat").symlink_to("/bin/cat")
        conn = local_conn(fake_pct, pct_timeout_in_container=True)
        assert conn.exec_command("cat", in_data=b"x") == (0, b"x", b"")
    finally:
        os.environ["PATH"] = env_path
