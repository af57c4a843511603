"""extras/dflash-pct-wrapper: the sudo wrapper lets through exec/push/pull/status for the listed
containers, in unambiguous shapes, and refuses everything else before pct runs.

The wrapper runs as it is (dash), from a copy whose PCT and ALLOWED lines point at a fake pct
(records its argv, one JSON list per call) and a list file in tmp_path."""
import json
import os
import pathlib
import pwd
import re
import shutil
import subprocess
import tempfile

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
WRAPPER = os.path.join(ROOT, "extras", "dflash-pct-wrapper")

FAKE_PCT = r"""#!/usr/bin/python3
import json, os, shutil, sys
with open(os.environ.get("FAKE_PCT_LOG", "%(log)s"), "a") as fh:
    fh.write(json.dumps(sys.argv[1:]) + "\n")
args = sys.argv[1:]
if args[0] == "push":
    shutil.copyfile(args[2], "%(box)s/pushed")
elif args[0] == "pull":
    if not os.path.exists("%(box)s/" + os.path.basename(args[2])):
        sys.stderr.write("failed to open %%s for reading\n" %% args[2]); sys.exit(255)
    shutil.copyfile("%(box)s/" + os.path.basename(args[2]), args[3])
elif args[0] == "exec":
    sys.stdout.write(sys.stdin.read() if args[2:] == ["--", "cat"] else "ran\n")
    sys.exit(int(os.environ.get("FAKE_PCT_RC", "0")))
elif args[0] == "status":
    print("status: running")
"""


class Setup:
    def __init__(self, tmp_path):
        self.tmp = tmp_path
        self.log = tmp_path / "calls.jsonl"
        self.box = tmp_path / "box"  # the container's files, for push/pull
        self.box.mkdir()
        self.pct = tmp_path / "pct"
        self.pct.write_text(FAKE_PCT % {"log": self.log, "box": self.box})
        self.pct.chmod(0o755)
        self.allowed = tmp_path / "pct-allowed"
        self.allowed.write_text("# trainer containers\n200\n201 # the drafter\n")
        self.allowed.chmod(0o644)
        text = open(WRAPPER).read()
        text, n1 = re.subn(r"(?m)^PCT=.*$", "PCT=%s" % self.pct, text)
        text, n2 = re.subn(r"(?m)^ALLOWED=.*$", "ALLOWED=%s" % self.allowed, text)
        assert (n1, n2) == (1, 1)
        self.wrapper = tmp_path / "dflash-pct-wrapper"
        self.wrapper.write_text(text)
        self.wrapper.chmod(0o755)

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


@pytest.mark.parametrize("argv,why", [
    ([], "no container id given"),
    (["exec"], "no container id given"),
    (["stop", "200"], "pct stop is not allowed"),
    (["enter", "200"], "pct enter is not allowed"),
    (["set", "200", "--mp0", "/:/host"], "pct set is not allowed"),
    (["destroy", "200"], "pct destroy is not allowed"),
    (["--help", "200"], "pct --help is not allowed"),
    (["list", "x"], "pct list is not allowed"),
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
    (["push", "200", "/etc/hostname"], "push must be"),
    (["push", "200", "--perms", "/etc/hostname", "/x"], "FILE '--perms' starts with '-'"),
    (["push", "200", "/etc/hostname", "-x"], "DEST '-x' starts with '-'"),
    (["push", "200", "/etc/hostname", "x"], "DEST 'x' must be an absolute path"),
    (["push", "200", "/etc/hostname", "/x", "--perms=0644"], "push option '--perms=0644' is not allowed"),
    (["push", "200", "/etc/hostname", "/x", "--perms"], "option '--perms' needs a value"),
    (["push", "200", "/etc/hostname", "/x", "--perms", "rwx"], "--perms 'rwx' is not an octal mode"),
    (["push", "200", "/etc/hostname", "/x", "--user", "-0"], "--user '-0' is not a user"),
    (["push", "200", "/etc/hostname", "/x", "--user", "a b"], "--user 'a b' is not a user"),
    (["push", "200", "/etc/hostname", "/x", "--user", "0", "--user", "1"], "option '--user' given twice"),
    (["push", "200", "/etc/hostname", "/x", "--force", "1"], "push option '--force' is not allowed"),
    (["pull", "200", "/etc/hostname"], "pull must be"),
    (["pull", "200", "/etc/hostname", "/tmp/x", "--x"], "pull must be"),
    (["pull", "200", "etc/hostname", "/tmp/x"], "PATH 'etc/hostname' must be an absolute path"),
    (["pull", "200", "/etc/hostname", "--perms"], "DEST '--perms' starts with '-'"),
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


def test_push_and_pull_with_options(w, tmp_path):
    src = tmp_path / "in.txt"
    src.write_text("hello\n")
    res = w.run("push", "200", str(src), "/root/in.txt", "--perms", "0640", "--user", "0", "--group", "root")
    assert res.returncode == 0, res.stderr
    (call,) = w.calls()
    assert call[:2] == ["push", "200"] and call[3:] == ["/root/in.txt", "--perms", "0640", "--user", "0", "--group", "root"]
    assert call[2] != str(src)  # a copy the wrapper read (as the caller)
    assert (w.box / "pushed").read_text() == "hello\n"
    (w.box / "out.txt").write_text("from the container\n")
    dst = tmp_path / "out.txt"
    res = w.run("pull", "200", "/root/out.txt", str(dst))
    assert res.returncode == 0, res.stderr
    assert dst.read_text() == "from the container\n"
    res = w.run("pull", "200", "/root/missing", str(tmp_path / "missing"))
    assert res.returncode == 255 and "failed to open /root/missing" in res.stderr
    assert not (tmp_path / "missing").exists()


@pytest.mark.skipif(os.geteuid() != 0, reason="runuser needs root")
def test_host_files_are_opened_as_the_sudo_caller(w):
    """Under sudo, push reads FILE and pull writes DEST as SUDO_USER: no host file beyond theirs."""
    nobody = pwd.getpwnam("nobody")
    tmp_path = pathlib.Path(tempfile.mkdtemp(prefix="pct-wrapper-"))  # pytest's own tmp is 0700
    secret = tmp_path / "secret"
    secret.write_text("root only\n")
    secret.chmod(0o600)
    os.chmod(tmp_path, 0o755)
    caller = {"SUDO_USER": "nobody", "SUDO_UID": str(nobody.pw_uid)}
    res = w.run("push", "200", str(secret), "/root/x", env=caller)
    assert res.returncode == 255 and "unable to open file '%s' - not readable by nobody" % secret in res.stderr
    assert w.calls() == []
    (w.box / "shadow").write_text("pwned\n")
    victim = tmp_path / "victim"
    victim.write_text("root's file\n")
    victim.chmod(0o644)
    res = w.run("pull", "200", "/etc/shadow", str(victim), env=caller)
    assert res.returncode != 0 and "Permission denied" in res.stderr
    assert victim.read_text() == "root's file\n"
    public = tmp_path / "pub"
    public.mkdir()
    os.chown(public, nobody.pw_uid, nobody.pw_gid)
    res = w.run("pull", "200", "/etc/shadow", str(public / "copy"), env=caller)
    assert res.returncode == 0, res.stderr
    assert (public / "copy").stat().st_uid == nobody.pw_uid
    shutil.rmtree(tmp_path)
