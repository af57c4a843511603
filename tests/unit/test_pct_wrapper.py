"""extras/dflash-pct-wrapper: the sudo wrapper lets through exec/status for the listed
unprivileged containers, in unambiguous shapes, and refuses everything else before pct runs:
push and pull (node root outside the container's device rules), other subcommands, containers
not listed, and containers whose Proxmox config does not say `unprivileged: 1` unless listed in
the privileged-allowed file.

The wrapper runs as it is (dash), from a copy whose PCT, ALLOWED, PRIVILEGED_ALLOWED and PVE_LXC
lines point at a fake pct (records its argv, one JSON list per call), list files and a config
directory in tmp_path."""
import json
import os
import re
import subprocess

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
WRAPPER = os.path.join(ROOT, "extras", "dflash-pct-wrapper")

FAKE_PCT = r"""#!/usr/bin/python3
import json, os, sys
with open(os.environ.get("FAKE_PCT_LOG", "%(log)s"), "a") as fh:
    fh.write(json.dumps(sys.argv[1:]) + "\n")
args = sys.argv[1:]
if args[0] == "exec":
    sys.stdout.write(sys.stdin.read() if args[2:] == ["--", "cat"] else "ran\n")
    sys.exit(int(os.environ.get("FAKE_PCT_RC", "0")))
elif args[0] == "status":
    print("status: running")
else:
    sys.exit("fake pct: %%s must never be reached through the wrapper" %% args[0])
"""

# As pve-container writes a container's config: description lines first, keys sorted.
UNPRIVILEGED_CONF = """#trainer
arch: amd64
hostname: ct%(vmid)s
memory: 2048
ostype: debian
rootfs: local-lvm:vm-%(vmid)s-disk-0,size=32G
unprivileged: 1
"""
PRIVILEGED_CONF = """arch: amd64
hostname: ct%(vmid)s
ostype: debian
rootfs: local-lvm:vm-%(vmid)s-disk-0,size=32G
"""
CONTAINERS = ("200", "201", "300", "301", "302", "303")


class Setup:
    def __init__(self, tmp_path):
        self.tmp = tmp_path
        self.log = tmp_path / "calls.jsonl"
        self.pct = tmp_path / "pct"
        self.pct.write_text(FAKE_PCT % {"log": self.log})
        self.pct.chmod(0o755)
        self.allowed = tmp_path / "pct-allowed"
        self.allowed.write_text("# trainer containers\n200\n201 # the drafter\n")
        self.allowed.chmod(0o644)
        self.privileged = tmp_path / "pct-privileged-allowed"  # absent: no privileged container
        self.pve = tmp_path / "pve-lxc"
        self.pve.mkdir()
        for vmid in CONTAINERS:
            self.conf(vmid, UNPRIVILEGED_CONF % {"vmid": vmid})
        text = open(WRAPPER).read()
        n = []
        for name, value in (("PCT", self.pct), ("ALLOWED", self.allowed),
                            ("PRIVILEGED_ALLOWED", self.privileged), ("PVE_LXC", self.pve)):
            text, count = re.subn(r"(?m)^%s=.*$" % name, "%s=%s" % (name, value), text)
            n.append(count)
        assert n == [1, 1, 1, 1]
        self.wrapper = tmp_path / "dflash-pct-wrapper"
        self.wrapper.write_text(text)
        self.wrapper.chmod(0o755)

    def conf(self, vmid, text):
        path = self.pve / ("%s.conf" % vmid)
        path.write_text(text)
        return path

    def run(self, *args, env=None, **kw):
        full = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin"}
        full.update(env or {})
        return subprocess.run(["/bin/sh", str(self.wrapper), *args], capture_output=True, text=True,
                              env=full, timeout=30, check=False, **kw)

    def calls(self):
        if not self.log.exists():
            return []
        return [json.loads(line) for line in self.log.read_text().splitlines()]


@pytest.fixture
def w(tmp_path):
    return Setup(tmp_path)


def test_wrapper_is_posix_sh():
    assert open(WRAPPER).readline() == "#!/bin/sh\n"
    assert os.stat(WRAPPER).st_mode & 0o111
    assert subprocess.run(["/bin/sh", "-n", WRAPPER], check=False).returncode == 0


@pytest.mark.parametrize("argv", [
    ["exec", "200", "--", "/bin/sh", "-c", "echo hi; exit 3", "--keep-env", "0"],
    ["exec", "201", "--", "true"],
    ["status", "200"],
])
def test_allowed_shapes_reach_pct_verbatim(w, argv):
    res = w.run(*argv)
    assert res.returncode == 0, res.stderr
    assert w.calls() == [argv]


def test_exec_keeps_the_commands_status_stdin_and_stdout(w):
    res = w.run("exec", "200", "--", "cat", input="payload\n")
    assert (res.returncode, res.stdout) == (0, "payload\n")
    res = w.run("exec", "200", "--", "false", env={"FAKE_PCT_RC": "7"})
    assert res.returncode == 7


PUSH_PULL = "is not allowed: it works as the node's root outside the container's device rules"


@pytest.mark.parametrize("argv,why", [
    ([], "no subcommand given"),
    (["exec"], "no container id given"),
    (["status"], "no container id given"),
    (["stop", "200"], "pct stop is not allowed"),
    (["enter", "200"], "pct enter is not allowed"),
    (["set", "200", "--mp0", "/:/host"], "pct set is not allowed"),
    (["destroy", "200"], "pct destroy is not allowed"),
    (["--help", "200"], "pct --help is not allowed"),
    (["list", "x"], "pct list is not allowed"),
    (["push", "200", "/etc/hostname", "/root/x"], "pct push " + PUSH_PULL),
    (["push", "200", "./blob", "/root/sda", "--perms", "0644"], "pct push " + PUSH_PULL),
    (["push"], "pct push " + PUSH_PULL),
    (["pull", "200", "/dev/zero", "/tmp/x"], "pct pull " + PUSH_PULL),
    (["pull", "999", "/etc/shadow", "x"], "pct pull " + PUSH_PULL),
    (["exec", "202", "--", "true"], "container 202 is not in"),
    (["status", "2000"], "container 2000 is not in"),
    (["exec", "0200", "--", "true"], "'0200' is not a container id"),
    (["exec", "200x", "--", "true"], "'200x' is not a container id"),
    (["exec", "99", "--", "true"], "'99' is not a container id"),
    (["exec", "", "--", "true"], "'' is not a container id"),
    (["exec", "--", "200", "true"], "'--' is not a container id"),
    (["exec", "200", "true"], "exec must be: exec 200 -- COMMAND"),
    (["exec", "200", "--keep-env", "0", "--", "true"], "exec must be: exec 200 -- COMMAND"),
    (["exec", "200", "--"], "exec must be: exec 200 -- COMMAND"),
    (["status", "200", "--verbose"], "status takes the container id only"),
])
def test_refused_before_pct_runs(w, argv, why):
    res = w.run(*argv)
    assert res.returncode == 77, (res.returncode, res.stderr)
    assert res.stderr.startswith("dflash-pct-wrapper: refused: ") and why in res.stderr, res.stderr
    assert res.stderr.count("\n") == 1
    assert w.calls() == []


def test_list_file_comments_globs_and_blanks(w):
    w.allowed.write_text("*\n  300\t301 # 302\n#303\n")
    assert w.run("status", "300").returncode == 0
    assert w.run("status", "301").returncode == 0
    for vmid in ("302", "303", "200"):
        assert w.run("status", vmid).returncode == 77
    assert w.calls() == [["status", "300"], ["status", "301"]]


@pytest.mark.parametrize("damage,why", [
    (lambda p: p.unlink(), "is missing"),
    (lambda p: p.chmod(0o664), "must not be writable by group or others (mode 664)"),
    (lambda p: p.chmod(0o646), "must not be writable by group or others (mode 646)"),
    (lambda p: (p.unlink(), p.symlink_to("/etc/hostname")), "is missing"),
])
def test_an_unsafe_or_missing_list_refuses_everything(w, damage, why):
    damage(w.allowed)
    res = w.run("status", "200")
    assert res.returncode == 78 and why in res.stderr, res.stderr
    assert w.calls() == []


@pytest.mark.skipif(os.geteuid() != 0, reason="chown needs root")
def test_a_list_not_owned_by_root_refuses_everything(w):
    os.chown(w.allowed, 65534, 65534)
    res = w.run("status", "200")
    assert res.returncode == 78 and "must be owned by root (owner uid 65534)" in res.stderr


# --- only unprivileged containers -------------------------------------------------------------

BASE = "arch: amd64\nhostname: ct200\nostype: debian\n"
SNAPSHOT = "\n[before-upgrade]\narch: amd64\nhostname: ct200\nsnaptime: 1731000000\n"


@pytest.mark.parametrize("conf", [
    BASE + "unprivileged: 1\n",
    BASE + "unprivileged:1\n",
    BASE + "unprivileged: \t1 \t\n",
    BASE + "unprivileged: 1",  # no newline at the end
    "unprivileged: 1\n" + BASE + "unprivileged: 1\n",
    BASE + "unprivileged: 1\n" + SNAPSHOT + "unprivileged: 0\n",  # a snapshot's own kind does not count
    BASE + "unprivileged: 1\n[pve:pending]\nunprivileged: 0\n",
    BASE + "lxc.idmap: u 0 100000 1005\nlxc.idmap: u 1005 1005 1\nlxc.idmap = g 0 100000 65536\nunprivileged: 1\n",
], ids=["proxmox", "no-blank", "blanks", "no-newline", "twice", "snapshot-0", "pending-0", "idmap"])
def test_an_unprivileged_container_is_reached(w, conf):
    w.conf("200", conf)
    for argv in (["exec", "200", "--", "true"], ["status", "200"]):
        res = w.run(*argv)
        assert res.returncode == 0, res.stderr
    assert w.calls() == [["exec", "200", "--", "true"], ["status", "200"]]


PRIVILEGED = "is privileged (no 'unprivileged: 1' in the main section of "
ROOT_IDMAP = "maps ids onto the node's root (an lxc.idmap line with host id 0 in "


@pytest.mark.parametrize("conf,why", [
    (None, "has no Proxmox config ("),
    (BASE + "unprivileged: 0\n", PRIVILEGED),
    (BASE, PRIVILEGED),
    ("", PRIVILEGED),
    (BASE + SNAPSHOT + "unprivileged: 1\n", PRIVILEGED),  # only in a snapshot section
    (BASE + "[pve:pending]\nunprivileged: 1\n", PRIVILEGED),  # only pending
    (BASE + "unprivileged: 1\nunprivileged: 0\n", PRIVILEGED),
    (BASE + "unprivileged: 0\nunprivileged: 1\n", PRIVILEGED),
    (BASE + " unprivileged: 1\n", PRIVILEGED),  # pve-container reads no such line
    (BASE + "#unprivileged: 1\n", PRIVILEGED),  # the description
    (BASE + "unprivileged: yes\n", PRIVILEGED),
    (BASE + "unprivileged: 10\n", PRIVILEGED),
    (BASE + "unprivileged: 1 # sure\n", PRIVILEGED),
    (BASE + "unprivileged 1\n", PRIVILEGED),
    (BASE + "xunprivileged: 1\n", PRIVILEGED),
    (BASE + "description: unprivileged: 1\n", PRIVILEGED),
    (BASE + "unprivileged: 1\nlxc.idmap: u 0 0 65536\n", ROOT_IDMAP),
    (BASE + "unprivileged: 1\nlxc.idmap = g 0 000 1\n", ROOT_IDMAP),
    (BASE + "unprivileged: 1\nlxc.idmap: u 0 100000\n", ROOT_IDMAP),  # unreadable: as bad
])
@pytest.mark.parametrize("argv", [["exec", "200", "--", "true"], ["status", "200"]], ids=["exec", "status"])
def test_a_privileged_or_unknown_container_is_refused(w, conf, why, argv):
    path = w.pve / "200.conf"
    if conf is None:
        path.unlink()
    else:
        w.conf("200", conf)
    res = w.run(*argv)
    assert res.returncode == 77, (res.returncode, res.stderr)
    assert res.stderr.startswith("dflash-pct-wrapper: refused: container 200 ") and why + str(path) in res.stderr, \
        res.stderr
    assert res.stderr.count("\n") == 1
    if conf is not None:
        assert "only %s can grant that" % w.privileged in res.stderr
    assert w.calls() == []


def test_the_privileged_allow_file_lets_only_its_ids_through(w):
    w.conf("200", BASE + "unprivileged: 0\n")
    w.conf("201", BASE)
    w.conf("300", BASE)
    w.privileged.write_text("# node root for the operator, on purpose\n200 300\n")
    w.privileged.chmod(0o644)
    assert w.run("exec", "200", "--", "true").returncode == 0
    res = w.run("exec", "201", "--", "true")
    assert res.returncode == 77 and "container 201 " + PRIVILEGED in res.stderr, res.stderr
    res = w.run("exec", "300", "--", "true")  # listed there, but not in ALLOWED
    assert res.returncode == 77 and "container 300 is not in %s" % w.allowed in res.stderr, res.stderr
    res = w.run("push", "200", "./blob", "/root/sda")  # still no push into it
    assert res.returncode == 77 and "pct push " + PUSH_PULL in res.stderr
    (w.pve / "200.conf").unlink()  # no config: refused, listed or not
    res = w.run("exec", "200", "--", "true")
    assert res.returncode == 77 and "container 200 has no Proxmox config" in res.stderr, res.stderr
    assert w.calls() == [["exec", "200", "--", "true"]]


@pytest.mark.parametrize("damage,why", [
    (lambda p: p.chmod(0o664), "must not be writable by group or others (mode 664)"),
    (lambda p: p.chmod(0o602), "must not be writable by group or others (mode 602)"),
    (lambda p: (p.unlink(), p.symlink_to("/etc/hostname")), "must be a regular file, not a link"),
    (lambda p: (p.unlink(), p.mkdir()), "must be a regular file, not a link"),
])
def test_an_unsafe_privileged_allow_file_refuses_privileged_containers(w, damage, why):
    w.conf("201", BASE)
    w.privileged.write_text("201\n")
    w.privileged.chmod(0o644)
    damage(w.privileged)
    res = w.run("exec", "201", "--", "true")
    assert res.returncode == 78 and str(w.privileged) + " " + why in res.stderr, res.stderr
    # read only for a privileged container: an unprivileged one is reached as before
    assert w.run("exec", "200", "--", "true").returncode == 0
    assert w.calls() == [["exec", "200", "--", "true"]]


@pytest.mark.skipif(os.geteuid() != 0, reason="chown needs root")
def test_a_privileged_allow_file_not_owned_by_root_is_refused(w):
    w.conf("201", BASE)
    w.privileged.write_text("201\n")
    w.privileged.chmod(0o644)
    os.chown(w.privileged, 65534, 65534)
    res = w.run("exec", "201", "--", "true")
    assert res.returncode == 78 and "%s must be owned by root (owner uid 65534)" % w.privileged in res.stderr
    assert w.calls() == []
    os.chown(w.privileged, 0, 0)
    assert w.run("exec", "201", "--", "true").returncode == 0
