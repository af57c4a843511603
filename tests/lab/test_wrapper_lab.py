"""The operator's sudo wrapper reaches only unprivileged containers, and only by exec (issue 13).

Proxmox's `pct push`/`pull` do their file work as the node's root, outside the container's device
rules: in a privileged container, `exec mknod /root/sda b 8 0` and then `push ./blob /root/sda`
would write the node's disk. Through the wrapper, as the lab's operator over ssh, both steps are
refused before pct runs; in an unprivileged container exec works (and its mapped root cannot even
mknod); a privileged container is reached by exec only when root lists it in the privileged-allowed
file. `lab.py up` writes each container's Proxmox config (/etc/pve/lxc/<vmid>.conf) that the
wrapper reads, `down` removes it. Containers: 261 privileged, 262 unprivileged (both listed for the
operator), 263 brought up and down."""
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
LAB = os.path.join(ROOT, "lab", "lab.py")
PRIV = "261"
UNPRIV = "262"
GONE = "263"


def lab_cmd(*args):
    res = subprocess.run([sys.executable, LAB, *args], capture_output=True, text=True, timeout=300, check=False)
    assert res.returncode == 0, res.stdout + res.stderr
    return res


@pytest.fixture(scope="module")
def cts(lab):
    lab_cmd("up", "--fresh", "--ids", PRIV)
    lab_cmd("up", "--fresh", "--unprivileged", "--ids", UNPRIV)
    lab_cmd("allow", "--ids", PRIV, UNPRIV)
    lab_cmd("allow", "--privileged", "--remove", "--ids", PRIV)  # whatever an earlier run left
    yield
    lab_cmd("allow", "--privileged", "--remove", "--ids", PRIV)
    lab_cmd("allow", "--remove", "--ids", PRIV, UNPRIV)


def operator(lab, *words):
    """`sudo -n WRAPPER WORDS...` run by the lab's operator over ssh, as a deploy would."""
    op = lab.facts["operator"]
    remote = " ".join(["sudo", "-n", op["pct_path"], *words])  # words are plain: no quoting needed
    argv = ["ssh", "-p", str(lab.port), "-i", lab.key, "-o", "StrictHostKeyChecking=yes",
            "-o", "UserKnownHostsFile=" + lab.facts["known_hosts"], "-o", "BatchMode=yes", "-o", "LogLevel=ERROR",
            "%s@%s" % (op["ssh_user"], lab.host), remote]
    return subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)


def test_up_writes_the_proxmox_config_the_wrapper_reads(lab, cts):
    pve = lab.facts["pve_lxc"]
    with open(os.path.join(pve, UNPRIV + ".conf")) as fh:
        unpriv = fh.read().splitlines()
    with open(os.path.join(pve, PRIV + ".conf")) as fh:
        priv = fh.read().splitlines()
    assert "unprivileged: 1" in unpriv and "hostname: ct%s" % UNPRIV in unpriv
    assert not [line for line in priv if line.startswith("unprivileged")] and "hostname: ct%s" % PRIV in priv
    for lines in (unpriv, priv):
        keys = [line for line in lines if not line.startswith("#")]
        assert keys == sorted(keys) and any(line.startswith("arch: ") for line in keys)  # as Proxmox writes it
    st = os.stat(os.path.join(pve, PRIV + ".conf"))
    assert (st.st_uid, st.st_mode & 0o777) == (0, 0o640)


def test_the_escape_through_a_privileged_container_is_refused(lab, cts):
    res = operator(lab, "exec", PRIV, "--", "mknod", "/root/sda", "b", "8", "0")
    try:
        assert res.returncode == 77, (res.returncode, res.stderr)
        assert ("dflash-pct-wrapper: refused: container %s is privileged (no 'unprivileged: 1' in the main section "
                "of /etc/pve/lxc/%s.conf): root in it is root on the node" % (PRIV, PRIV)) in res.stderr, res.stderr
        assert lab.ct(PRIV, "test", "-e", "/root/sda").returncode == 1  # nothing ran in the container
    finally:
        lab.ct(PRIV, "rm", "-f", "/root/sda")
    res = operator(lab, "push", PRIV, "/etc/hostname", "/root/sda")
    assert res.returncode == 77 and "dflash-pct-wrapper: refused: pct push is not allowed" in res.stderr, res.stderr
    res = operator(lab, "pull", UNPRIV, "/dev/zero", "/tmp/zero")  # unprivileged or not: no pull
    assert res.returncode == 77 and "dflash-pct-wrapper: refused: pct pull is not allowed" in res.stderr, res.stderr
    res = operator(lab, "status", PRIV)
    assert res.returncode == 77 and "container %s is privileged" % PRIV in res.stderr, res.stderr
    assert lab.pct("status", PRIV).stdout == "status: running\n"  # refused, not broken


def test_an_unprivileged_container_is_reached_by_exec(lab, cts):
    res = operator(lab, "exec", UNPRIV, "--", "id", "-u")
    assert (res.returncode, res.stdout) == (0, "0\n"), res.stderr
    res = operator(lab, "status", UNPRIV)
    assert (res.returncode, res.stdout) == (0, "status: running\n"), res.stderr
    # its root is mapped (100000 on the node): the kernel refuses it even the device node
    res = operator(lab, "exec", UNPRIV, "--", "mknod", "/root/sda", "b", "8", "0")
    assert res.returncode != 0 and "Operation not permitted" in res.stderr, (res.returncode, res.stderr)
    assert lab.ct(UNPRIV, "test", "-e", "/root/sda").returncode == 1


def test_a_privileged_container_listed_on_purpose_is_reached_by_exec_only(lab, cts):
    lab_cmd("allow", "--privileged", "--ids", PRIV)
    try:
        st = os.stat(lab.facts["operator"]["privileged_allowed"])
        assert (st.st_uid, st.st_mode & 0o022) == (0, 0)
        res = operator(lab, "exec", PRIV, "--", "id", "-u")
        assert (res.returncode, res.stdout) == (0, "0\n"), res.stderr
        res = operator(lab, "push", PRIV, "/etc/hostname", "/root/sda")
        assert res.returncode == 77 and "refused: pct push is not allowed" in res.stderr, res.stderr
    finally:
        lab_cmd("allow", "--privileged", "--remove", "--ids", PRIV)
    assert not os.path.exists(lab.facts["operator"]["privileged_allowed"])  # none listed: no file
    res = operator(lab, "exec", PRIV, "--", "true")
    assert res.returncode == 77 and "container %s is privileged" % PRIV in res.stderr, res.stderr


def test_down_removes_the_proxmox_config(lab, cts):
    conf = os.path.join(lab.facts["pve_lxc"], GONE + ".conf")
    lab_cmd("allow", "--ids", GONE)
    try:
        lab_cmd("up", "--ids", GONE)
        assert os.path.exists(conf)
        lab_cmd("down", "--ids", GONE)
        assert not os.path.exists(conf)
        res = operator(lab, "exec", GONE, "--", "true")
        assert res.returncode == 77, (res.returncode, res.stderr)
        assert "container %s has no Proxmox config (/etc/pve/lxc/%s.conf)" % (GONE, GONE) in res.stderr, res.stderr
    finally:
        lab_cmd("allow", "--remove", "--ids", GONE)
