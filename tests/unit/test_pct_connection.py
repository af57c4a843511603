"""plugins/connection/pct.py: argv building and error classification from tables, plus the
exec/put/fetch/timeout paths in local mode against a fake `pct` (no lab, no ssh)."""
from __future__ import annotations

import hashlib
import os
import shlex
import subprocess
import sys
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
        "ssh_extra_args": "", "pct_tty": False, "pct_local": False, "pct_sudo": False, "pct_node": False,
        "control_persist": 60, "control_path_dir": "~/.ansible/cp", "pct_command_timeout": 1800,
        "connect_timeout": 10, "host_key_checking": True, "host_key_accept_new": False,
        "known_hosts_file": None, "pipelining": True, "pct_timeout_in_container": False}


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


SSH_BASE = ["-o", "BatchMode=yes", "-o", "LogLevel=ERROR", "-o", "ConnectTimeout=10"]
STRICT = ["-o", "StrictHostKeyChecking=yes"]
SSH_OPTS = SSH_BASE + STRICT
MUX = ["-o", "ControlMaster=auto", "-o", "ControlPersist=60s", "-o", "ControlPath=" + CP]
NOHK = ["-o", "StrictHostKeyChecking=no", "-o", "UserKnownHostsFile=/dev/null"]


def in_ct(cmd, pct_cmd="/usr/sbin/pct exec 200 --"):
    """The remote string for `cmd` run in the container without the timeout guard: mark, then cmd."""
    return "%s /bin/sh -c %s sh %s" % (pct_cmd, shlex.quote(pct.RUN_SCRIPT), shlex.quote(cmd))


# (id, options, shell command in the container, expected local argv)
ARGV_CASES = [
    ("defaults", {}, "echo hi",
     ["ssh", "-T", *SSH_OPTS, *MUX, "--", "pve1",
      "/usr/sbin/pct exec 200 -- /bin/sh -c '" + pct.RUN_SCRIPT.replace("'", "'\"'\"'") + "' sh 'echo hi'"]),
    ("port-user-key", {"port": 2222, "remote_user": "root", "private_key_file": KEY}, "true",
     ["ssh", "-T", "-p", "2222", "-l", "root", "-i", KEY, *SSH_OPTS, *MUX, "--", "pve1", in_ct("true")]),
    ("no-host-key-checking", {"host_key_checking": False}, "true",
     ["ssh", "-T", *SSH_BASE, *NOHK, *MUX, "--", "pve1", in_ct("true")]),
    ("known-hosts-file", {"known_hosts_file": "/var/lib/dflash-lab/ssh/known_hosts"}, "true",
     ["ssh", "-T", *SSH_OPTS, "-o", "UserKnownHostsFile=/var/lib/dflash-lab/ssh/known_hosts", *MUX, "--", "pve1",
      in_ct("true")]),
    ("known-hosts-file-space-home", {"known_hosts_file": "~/my keys/known_hosts"}, "true",
     ["ssh", "-T", *SSH_OPTS, "-o", 'UserKnownHostsFile="%s"' % os.path.expanduser("~/my keys/known_hosts"),
      *MUX, "--", "pve1", in_ct("true")]),
    ("accept-new-only-when-asked", {"host_key_accept_new": True}, "true",
     ["ssh", "-T", *SSH_BASE, "-o", "StrictHostKeyChecking=accept-new", *MUX, "--", "pve1", in_ct("true")]),
    ("accept-new-ignored-without-checking", {"host_key_accept_new": True, "host_key_checking": False,
                                             "known_hosts_file": "/x"}, "true",
     ["ssh", "-T", *SSH_BASE, *NOHK, *MUX, "--", "pve1", in_ct("true")]),
    ("control-persist-off", {"control_persist": 0}, "true",
     ["ssh", "-T", *SSH_OPTS, "-o", "ControlMaster=no", "-o", "ControlPath=none", "--", "pve1", in_ct("true")]),
    ("control-persist-300-dir", {"control_persist": 300, "control_path_dir": "/run/cp"}, "true",
     ["ssh", "-T", *SSH_OPTS, "-o", "ControlMaster=auto", "-o", "ControlPersist=300s",
      "-o", "ControlPath=/run/cp/dflash-%C", "--", "pve1", in_ct("true")]),
    ("extra-args-first", {"ssh_extra_args": "-o LogLevel=DEBUG -J 'jump host'", "connect_timeout": 3}, "true",
     ["ssh", "-o", "LogLevel=DEBUG", "-J", "jump host", "-T", "-o", "BatchMode=yes", "-o", "LogLevel=ERROR",
      "-o", "ConnectTimeout=3", *STRICT, *MUX, "--", "pve1", in_ct("true")]),
    ("sudo", {"pct_sudo": True, "remote_user": "ansible"}, "id -u",
     ["ssh", "-T", "-l", "ansible", *SSH_OPTS, *MUX, "--", "pve1",
      in_ct("id -u", "sudo -n /usr/sbin/pct exec 200 --")]),
    ("tty-no-mark", {"pct_tty": True}, "tty",
     ["ssh", "-tt", *SSH_OPTS, *MUX, "--", "pve1", "/usr/sbin/pct exec 200 -- /bin/sh -c tty"]),
    ("pct-path-executable", {"pct_path": "/opt/pve bin/pct", "ssh_executable": "/usr/local/bin/ssh",
                             "proxmox_vmid": "1234"}, "true",
     ["/usr/local/bin/ssh", "-T", *SSH_OPTS, *MUX, "--", "pve1", in_ct("true", "'/opt/pve bin/pct' exec 1234 --")]),
    ("guard", {"pct_timeout_in_container": True, "pct_command_timeout": 30}, "echo hi",
     ["ssh", "-T", *SSH_OPTS, *MUX, "--", "pve1",
      "/usr/sbin/pct exec 200 -- /bin/sh -c '" + pct.GUARD_SCRIPT.replace("'", "'\"'\"'") + "' sh 32 'echo hi'"]),
    ("guard-not-on-tty", {"pct_timeout_in_container": True, "pct_tty": True}, "tty",
     ["ssh", "-tt", *SSH_OPTS, *MUX, "--", "pve1", "/usr/sbin/pct exec 200 -- /bin/sh -c tty"]),
    ("guard-local", {"pct_local": True, "pct_timeout_in_container": True, "pct_command_timeout": 5}, "true",
     ["/usr/sbin/pct", "exec", "200", "--", "/bin/sh", "-c", pct.GUARD_SCRIPT, "sh", "7", "true"]),
    ("local", {"pct_local": True}, "echo 'a b'",
     ["/usr/sbin/pct", "exec", "200", "--", "/bin/sh", "-c", pct.RUN_SCRIPT, "sh", "echo 'a b'"]),
    ("local-sudo", {"pct_local": True, "pct_sudo": True}, "true",
     ["sudo", "-n", "/usr/sbin/pct", "exec", "200", "--", "/bin/sh", "-c", pct.RUN_SCRIPT, "sh", "true"]),
    # on the node itself: the same ssh and mark, no pct and no sudo (the wrapper is for pct only)
    ("node", {"pct_node": True, "pct_sudo": True, "remote_user": "dflash"}, "nvidia-smi -L",
     ["ssh", "-T", "-l", "dflash", *SSH_OPTS, *MUX, "--", "pve1",
      "/bin/sh -c %s sh %s" % (shlex.quote(pct.RUN_SCRIPT), shlex.quote("nvidia-smi -L"))]),
    ("node-local", {"pct_node": True, "pct_local": True}, "true",
     ["/bin/sh", "-c", pct.RUN_SCRIPT, "sh", "true"]),
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
    assert argv[-2:] == ["127.0.0.1", in_ct("true", "sudo -n /usr/sbin/pct exec 200 --")]
    assert "StrictHostKeyChecking=yes" in argv
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
L = {"local": True}
S = {"sudo": True}  # pct_sudo: `sudo -n pct ...` on the host
RAN = {"started": True}  # the container printed STARTED_MARK: the call reached the command
# (id, rc, stderr, classify_failure keywords, expected message fragment or None = the command's own result)
CLASSIFY = [
    ("no-config", 255, NODE_CONF, {}, "no container 999 on pve1: Configuration file"),
    ("no-config-local", 255, NODE_CONF, L, "no container 999 on this host (local pct)"),
    ("not-running", 255, "container '999' not running!\n", {}, "container 999 is not running on pve1"),
    ("not-running-old", 255, "Error: container '999' not running!\n", {}, "is not running on pve1"),
    ("push-not-running", 255, "can only push files to a running CT\n", {}, "is not running"),
    ("pull-not-running", 255, "can only pull files from a running VM\n", {}, "is not running"),
    ("bad-vmid", 255, "400 Parameter verification failed.\nvmid: invalid format - value does not look like a "
     "valid VM ID\n", {}, "invalid container id"),
    ("not-running-after-perl-warning", 255, "perl: warning: Setting locale failed.\ncontainer '999' not running!\n",
     {}, "container 999 is not running on pve1"),
    # pct is Perl: a `die` exits with the errno of the moment (255 only when it is 0); the texts decide
    ("no-config-errno", 2, NODE_CONF, {}, "no container 999 on pve1: Configuration file"),
    ("no-config-errno-sudo", 2, NODE_CONF, S, "no container 999 on pve1"),
    ("not-running-errno", 3, "container '999' not running!\n", {}, "container 999 is not running on pve1"),
    ("not-running-errno-local", 11, "CT 999 not running\n", L, "is not running on this host (local pct)"),
    ("push-not-running-errno", 5, "can only push files to a running CT\n", {}, "is not running"),
    ("locked", 255, "CT is locked (backup)\n", {}, "container 999 is locked by Proxmox (backup) on pve1"),
    ("locked-errno", 16, "CT is locked (snapshot)\n", {}, "pct unlock 999"),
    ("bad-vmid-errno", 22, "400 Parameter verification failed.\nvmid: invalid format - value does not look "
     "like a valid VM ID\n", {}, "invalid container id"),
    ("ran-locked-text-in-ct", 16, "CT is locked (backup)\n", RAN, None),
    ("ran-no-config-errno-in-ct", 2, NODE_CONF, RAN, None),
    ("cmd-2-text", 2, "ls: cannot access 'x': No such file or directory\n", {}, None),
    ("refused", 255, "ssh: connect to host pve1 port 1: Connection refused\n", {},
     "host pve1 is unreachable (ssh): ssh: connect to host pve1 port 1: Connection refused"),
    ("resolve", 255, "ssh: Could not resolve hostname pve1: Name or service not known\n", {}, "unreachable"),
    ("timed-out", 255, "ssh: connect to host 10.9.9.9 port 22: Connection timed out\n", {}, "unreachable"),
    ("no-route", 255, "ssh: connect to host 10.9.9.9 port 22: No route to host\n", {}, "unreachable"),
    ("closed", 255, "Connection closed by 10.0.0.1 port 22\n", {}, "unreachable"),
    ("kex", 255, "kex_exchange_identification: read: Connection reset by peer\n", {}, "unreachable"),
    ("auth", 255, "root@pve1: Permission denied (publickey).\n", {},
     "authentication to pve1 failed (ssh): root@pve1: Permission denied (publickey)."),
    ("auth-with-warning", 255, "Warning: Permanently added 'pve1' (ED25519) to the list of known hosts.\r\n"
     "root@pve1: Permission denied (publickey,password).\r\n", {}, "authentication to pve1 failed"),
    ("host-key", 255, "Host key verification failed.\n", {}, "host key of pve1 was not accepted"),
    ("host-key-unknown", 255, "No ED25519 host key is known for pve1 and you have requested strict checking.\n"
     "Host key verification failed.\n", {}, "host key of pve1 was not accepted (ssh): No ED25519 host key is known"),
    ("host-key-changed", 255, "@@@@@@@@@@@@\n@    WARNING: REMOTE HOST IDENTIFICATION HAS CHANGED!     @\n"
     "@@@@@@@@@@@@\nHost key verification failed.\n", {}, "host key of pve1 was not accepted (ssh): it CHANGED"),
    # sudo -n refusing to run pct: only with pct_sudo, only sudo's own texts, exit 1
    ("sudo-password", 1, "sudo: a password is required\n", S, "sudo -n for pct failed on pve1: sudo: a password"),
    ("sudo-password-local", 1, "sudo: a password is required\n", {**S, **L}, "sudo -n for pct failed on this host"),
    ("sudo-terminal", 1, "sudo: a terminal is required to read the password; either use the -S option to read "
     "from standard input or configure an askpass helper\n", S, "sudo -n for pct failed"),
    ("sudo-not-allowed", 1, "Sorry, user ansible is not allowed to execute '/usr/sbin/pct exec 200 -- /bin/sh -c "
     "true' as root on pve1.\n", S, "sudo -n for pct failed on pve1: Sorry, user ansible is not allowed"),
    ("sudo-not-in-sudoers", 1, "sudo: ansible is not in the sudoers file.\n", S, "sudo -n for pct failed"),
    ("sudo-old-no-tty", 1, "sudo: no tty present and no askpass program specified\n", S, "sudo -n for pct failed"),
    ("sudo-requiretty", 1, "sudo: sorry, you must have a tty to run sudo\n", S, "sudo -n for pct failed"),
    ("sudo-after-hostname-warning", 1, "sudo: unable to resolve host pve1: Name or service not known\n"
     "sudo: a password is required\n", S, "sudo -n for pct failed on pve1: sudo: a password is required"),
    ("sudo-pct-missing", 1, "sudo: /usr/sbin/pct: command not found\n", S, "pct (/usr/sbin/pct) cannot be run"),
    ("wrapper-refused", 77, "dflash-pct-wrapper: refused: container 231 is not in /etc/dflash-trainer/pct-allowed\n",
     S, "the pct wrapper on pve1 refused the call: dflash-pct-wrapper: refused: container 231 is not in"),
    ("wrapper-text-without-sudo", 77, "dflash-pct-wrapper: refused: pct stop is not allowed\n", {}, None),
    ("sudo-missing-bash", 127, "bash: line 1: sudo: command not found\n", S, "sudo cannot be run on pve1"),
    ("sudo-missing-dash", 127, "sh: 1: sudo: not found\n", S, "sudo cannot be run on pve1"),
    ("pct-missing", 127, "bash: line 1: /usr/sbin/pct: No such file or directory\n", {},
     "pct (/usr/sbin/pct) cannot be run on pve1"),
    # sudo's texts without pct_sudo: no sudo ran on the host, so they are a command's own
    ("sudo-text-without-pct-sudo", 1, "sudo: a password is required\n", {}, None),
    ("sudo-prefix-other-text", 1, "sudo: some other message of a command\n", S, None),
    ("sudo-text-other-rc", 2, "sudo: a password is required\n", S, None),
    # after the mark the call ran in the container: every status and text is the command's own
    ("ran-sudo-in-ct", 1, "sudo: a password is required\n", {**S, **RAN}, None),
    ("ran-sudo-in-ct-no-pct-sudo", 1, "sudo: a password is required\n", RAN, None),
    ("ran-ssh-in-ct", 255, "ssh: connect to host db1 port 22: Connection refused\n", RAN, None),
    ("ran-auth-in-ct", 255, "git@github.com: Permission denied (publickey).\n", RAN, None),
    ("ran-pct-text-in-ct", 255, NODE_CONF, RAN, None),
    ("ran-pct-missing-in-ct", 127, "/bin/sh: 1: /usr/sbin/pct: not found\n", RAN, None),
    # the container command's own failures are results, not transport errors
    ("cmd-255", 255, "", {}, None),
    ("cmd-255-text", 255, "my tool: fatal error\n", {}, None),
    ("cmd-1", 1, "grep: x: No such file or directory\n", {}, None),
    ("cmd-127", 127, "/bin/sh: 1: nvidia-smi: not found\n", {}, None),
    ("cmd-permission-in-ct", 1, "cat: /root/x: Permission denied\n", {}, None),
    ("ssh-text-in-local-mode", 255, "ssh: connect to host x port 22: Connection refused\n", L, None),
]


@pytest.mark.parametrize("rc,stderr,kw,expected", [c[1:] for c in CLASSIFY], ids=[c[0] for c in CLASSIFY])
def test_classify_failure_table(rc, stderr, kw, expected):
    msg = pct.classify_failure(rc, stderr, "pve1", "999", "/usr/sbin/pct", **kw)
    if expected is None:
        assert msg is None
    else:
        assert msg is not None and expected in msg


@pytest.mark.parametrize("stderr,started,rest", [
    (b"", False, b""),
    (b"sudo: a password is required\n", False, b"sudo: a password is required\n"),
    (b"dflash-pct-started\n", True, b""),
    (b"dflash-pct-started\nsudo: a password is required\n", True, b"sudo: a password is required\n"),
    (b"perl: warning: locale\ndflash-pct-started\nerr\n", True, b"perl: warning: locale\nerr\n"),
    # only the first mark is ours; a command printing it keeps its line
    (b"dflash-pct-started\ndflash-pct-started\n", True, b"dflash-pct-started\n"),
    (b"x dflash-pct-started\n", False, b"x dflash-pct-started\n"),
    (b"dflash-pct-started-not\n", False, b"dflash-pct-started-not\n"),
])
def test_split_started(stderr, started, rest):
    assert pct.split_started(stderr) == (started, rest)


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


# ---- who failed: sudo on the host, or a command in the container (local mode, fake sudo) -------
FAKE_SUDO = r"""#!/bin/sh
# fake sudo: refuses when $FAKE_SUDO_REFUSE is set, else runs `sudo -n CMD...` as CMD
[ "$1" = -n ] || { echo "fake sudo wants -n" >&2; exit 3; }
shift
if [ -n "$FAKE_SUDO_REFUSE" ]; then echo "$FAKE_SUDO_REFUSE" >&2; exit 1; fi
exec "$@"
"""
SUDO_TEXT = "sudo: a password is required"


@pytest.fixture
def fake_sudo(tmp_path, monkeypatch):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "sudo").write_text(FAKE_SUDO)
    (bin_dir / "sudo").chmod(0o755)
    monkeypatch.setenv("PATH", "%s:%s" % (bin_dir, os.environ["PATH"]))
    monkeypatch.delenv("FAKE_SUDO_REFUSE", raising=False)
    return monkeypatch


@pytest.mark.parametrize("refusal", [SUDO_TEXT, "Sorry, user ansible is not allowed to execute '/x' as root on h."])
def test_sudo_refusing_pct_is_unreachable(fake_pct, fake_sudo, refusal):
    fake_sudo.setenv("FAKE_SUDO_REFUSE", refusal)
    conn = local_conn(fake_pct, pct_sudo=True)
    with pytest.raises(AnsibleConnectionFailure, match="sudo -n for pct failed on this host"):
        conn.exec_command("true")


@pytest.mark.parametrize("guard", [False, True])
@pytest.mark.parametrize("sudo", [False, True])
def test_sudo_text_of_a_command_in_the_container_is_its_result(fake_pct, fake_sudo, guard, sudo):
    """A command in the container that fails like sudo (its own sudo, exit 1) is a task result."""
    conn = local_conn(fake_pct, pct_sudo=sudo, pct_timeout_in_container=guard)
    assert conn.exec_command("echo '%s' >&2; exit 1" % SUDO_TEXT) == (1, b"", (SUDO_TEXT + "\n").encode())


@pytest.mark.parametrize("rc,text", [
    (255, "ssh: connect to host db1 port 22: Connection refused"),
    (255, "Configuration file 'nodes/x/lxc/1.conf' does not exist"),
    (255, "container '200' not running!"),
    (127, "/usr/sbin/pct: not found"),
])
def test_transport_texts_of_a_command_in_the_container_are_its_result(fake_pct, rc, text):
    conn = local_conn(fake_pct)
    assert conn.exec_command("echo \"%s\" >&2; exit %d" % (text, rc)) == (rc, b"", (text + "\n").encode())


def test_put_and_fetch_errors_in_the_container_are_not_unreachable(fake_pct, tmp_path):
    """A transfer that reached the container fails as the task's error, never as UNREACHABLE."""
    conn = local_conn(fake_pct)
    src = tmp_path / "src"
    src.write_bytes(b"x")
    with pytest.raises(AnsibleError, match="failed to transfer") as err:
        conn.put_file(str(src), str(tmp_path / "no-such-dir" / "dest"))
    assert not isinstance(err.value, AnsibleConnectionFailure)
    assert "dflash-pct-started" not in str(err.value)


# ---- a call longer than the orphan check: input sent once, output whole; a dead play abandons it ----
def test_a_long_call_gets_its_input_once_and_its_whole_output():
    conn = make_conn()
    payload = b"x" * 300000  # more than a pipe buffer: written across several communicate() rounds
    proc = subprocess.Popen(["sh", "-c", "sleep 1.2; wc -c; echo done"], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
    out, _err = conn._communicate(proc, payload, 30, "a long call")
    assert out.split() == [b"300000", b"done"]


def test_a_call_is_abandoned_once_ansible_playbook_is_gone(monkeypatch):
    conn = make_conn(proxmox_vmid=200)
    parents = iter([4242, 4242, 1])  # the worker's parent: at the start, then gone
    monkeypatch.setattr(pct.os, "getppid", lambda: next(parents, 1))
    proc = subprocess.Popen(["sleep", "30"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            start_new_session=True)
    began = time.monotonic()
    with pytest.raises(AnsibleConnectionFailure, match="ansible-playbook is gone: a module in container 200 on"):
        conn._communicate(proc, None, 30, "a module")
    assert time.monotonic() - began < 5 and proc.poll() is not None  # killed, not waited for


def test_a_call_whose_stdio_are_files_serves_only_its_pipes(tmp_path):
    """put and fetch hand pct a file as stdin or stdout: the call waits for the process, reads
    stderr, and leaves the files to it."""
    conn = make_conn()
    src, dst = tmp_path / "src", tmp_path / "dst"
    src.write_bytes(b"payload\n" * 1000)
    with open(src, "rb") as fin, open(dst, "wb") as fout:
        proc = subprocess.Popen(["sh", "-c", "cat; echo warn >&2"], stdin=fin, stdout=fout, stderr=subprocess.PIPE,
                                start_new_session=True)
        out, err = conn._communicate(proc, None, 30, "a fetch")
    assert out is None and err == b"warn\n" and dst.read_bytes() == src.read_bytes() and proc.returncode == 0


# ---- the first read's frozen check: input held until the mark; no mark after FROZEN_CHECK_S asks the node ----
# a call that says on stderr whether its input came before its mark, then the mark, then its input's size
EARLY = ("import select, sys; early = select.select([sys.stdin], [], [], 0.5)[0]; "
         "sys.stderr.write('early\\n' if early else ''); sys.stderr.write('dflash-pct-started\\n'); sys.stderr.flush(); "
         "print(len(sys.stdin.buffer.read()))")


def call(argv):
    return subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            start_new_session=True)


@pytest.mark.parametrize("checked", [True, False])
def test_a_checked_call_gets_its_input_only_once_it_is_in_the_container(monkeypatch, checked):
    conn = make_conn(proxmox_vmid=200)
    monkeypatch.setattr(conn, "_frozen", lambda: pytest.fail("the node was asked"))
    out, err = conn._communicate(call([sys.executable, "-c", EARLY]), b"x" * 300000, 30, "a module", checked)
    assert out.split() == [b"300000"]
    assert err.startswith(b"early\n") is not checked, err


def test_a_checked_call_that_ends_before_its_mark_is_not_held_for_ever(monkeypatch):
    conn = make_conn(proxmox_vmid=200)
    monkeypatch.setattr(conn, "_frozen", lambda: pytest.fail("the node was asked"))
    proc = call(["sh", "-c", "echo 'CT is locked (backup)' >&2; exit 255"])
    out, err = conn._communicate(proc, b"module", 30, "a module", True)
    assert (out, err, proc.returncode) == (b"", b"CT is locked (backup)\n", 255)


def test_a_frozen_container_fails_the_checked_call_at_once_and_it_never_gets_its_input(monkeypatch, tmp_path):
    conn = make_conn(proxmox_vmid=200)
    monkeypatch.setattr(pct, "FROZEN_CHECK_S", 0.2)
    monkeypatch.setattr(conn, "_frozen", lambda: "container 200 is frozen on node (...)")
    got = tmp_path / "got"
    proc = call(["sh", "-c", 'sleep 30; cat > "$1"', "sh", str(got)])
    began = time.monotonic()
    with pytest.raises(AnsibleConnectionFailure, match=r"container 200 is frozen on node"):
        conn._communicate(proc, b"module", 60, "a module", True)
    assert time.monotonic() - began < 5 and proc.poll() is not None and not got.exists()


def test_a_container_that_is_not_frozen_is_asked_again_later_and_the_call_goes_on(monkeypatch):
    conn = make_conn(proxmox_vmid=200)
    monkeypatch.setattr(pct, "FROZEN_CHECK_S", 0.2)
    asked = []
    monkeypatch.setattr(conn, "_frozen", lambda: asked.append(time.monotonic()))
    proc = call(["sh", "-c", "sleep 1.5; echo dflash-pct-started >&2; wc -c"])
    out, _err = conn._communicate(proc, b"module", 30, "a slow pct", True)
    assert out.split() == [b"6"]
    # after 0.2 s, then at least 0.4 s later, 0.8 s later, ...: fewer checks the longer it waits
    gaps = [b - a for a, b in zip(asked, asked[1:])]
    assert len(asked) >= 2 and all(g >= 0.2 * 2 ** (i + 1) for i, g in enumerate(gaps)), asked


def test_the_node_says_the_container_is_frozen(monkeypatch, fake_pct):
    conn = local_conn(fake_pct, proxmox_vmid=200)
    rows = "cgroup /sys/fs/cgroup/unified/lxc/200\npopulated 1\nfrozen 0\ncgroup /sys/fs/cgroup/freezer/lxc/200\n%s\n"
    monkeypatch.setattr(pct._freezer, "cgroup_argv", lambda vmid: ["printf", rows % "freezer.state FROZEN"])
    words = conn._frozen()
    assert words.startswith("container 200 is frozen on this host (local pct) (/sys/fs/cgroup/freezer/lxc/200: "
                            "freezer.state FROZEN): pct exec waits in it until it thaws, so nothing was run in it")
    assert "`pct resume 200` or `lxc-unfreeze -n 200` on the node" in words
    monkeypatch.setattr(pct._freezer, "cgroup_argv", lambda vmid: ["printf", rows % "freezer.state THAWED"])
    assert conn._frozen() is None
    monkeypatch.setattr(pct._freezer, "cgroup_argv", lambda vmid: ["false"])  # the node would not say
    assert conn._frozen() is None


def test_a_first_contact_checks_for_a_freeze_only_while_it_runs():
    """frozen_checked: the pct connection's frozen_check on for the block (a task's first contact), off after it
    - an error too; off for a watch (on=False); a connection without the check is left alone."""
    from ansible_collections.dflash.trainer.plugins.plugin_utils._freezer import frozen_checked

    class Conn(object):
        frozen_check = False
    conn = Conn()
    with frozen_checked(conn):
        assert conn.frozen_check is True
    assert conn.frozen_check is False
    with pytest.raises(RuntimeError):
        with frozen_checked(conn):
            raise RuntimeError("the module failed")
    assert conn.frozen_check is False
    with frozen_checked(conn, on=False):
        assert conn.frozen_check is False
    other = object()
    with frozen_checked(other):
        assert not hasattr(other, "frozen_check")
