"""The lab host's /usr/sbin/pct speaks Proxmox's shapes; containers boot systemd as PID 1; the
simulated GPU inside a container holds memory only while its holder lives."""
import os
import socket
import subprocess
import sys

from labkit import wait_for

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_status_and_list(lab, scratch_ct):
    res = lab.pct("status", scratch_ct)
    assert (res.returncode, res.stdout) == (0, "status: running\n")
    rows = lab.pct("list").stdout.splitlines()
    assert rows[0].split() == ["VMID", "Status", "Lock", "Name"]
    assert [scratch_ct, "running", "ct" + scratch_ct] in [r.split() for r in rows[1:]]


def test_unknown_vmid_is_proxmox_error(lab):
    for args in (["status", "999"], ["exec", "999", "--", "true"], ["push", "999", "/etc/hostname", "/tmp/x"]):
        res = lab.pct(*args)
        assert res.returncode == 255
        assert res.stderr.startswith("Configuration file 'nodes/") and res.stderr.rstrip().endswith("lxc/999.conf' does not exist")


def test_exec_passes_the_exit_status_and_forces_path(lab, scratch_ct):
    assert lab.ct(scratch_ct, "sh", "-c", "exit 7").returncode == 7
    assert lab.ct(scratch_ct, "no-such-command").returncode == 127
    res = lab.ct(scratch_ct, "sh", "-c", 'echo "$PATH $container"')
    assert res.stdout == "/sbin:/bin:/usr/sbin:/usr/bin lxc\n"


def test_systemd_is_pid1(lab, scratch_ct):
    assert lab.ct(scratch_ct, "cat", "/proc/1/comm").stdout.strip() == "systemd"
    state = lab.ct(scratch_ct, "systemctl", "is-system-running").stdout.strip()
    assert state in ("running", "degraded")


def test_push_pull_round_trip(lab, scratch_ct, tmp_path):
    src = tmp_path / "in.bin"
    src.write_bytes(bytes(range(256)) * 1000)
    src.chmod(0o644)
    assert lab.pct("push", scratch_ct, str(src), "/tmp/pushed.bin", "--perms", "0640").returncode == 0
    assert oct(src.stat().st_mode & 0o777) == oct(0o644)  # lxc-attach never saw the file itself
    assert lab.ct(scratch_ct, "stat", "-c", "%a %s", "/tmp/pushed.bin").stdout.split() == ["640", "256000"]
    out = tmp_path / "out.bin"
    assert lab.pct("pull", scratch_ct, "/tmp/pushed.bin", str(out)).returncode == 0
    assert out.read_bytes() == src.read_bytes()
    assert not out.stat().st_mode & 0o111
    res = lab.pct("push", scratch_ct, str(src), "/no/such/dir/x")
    assert res.returncode == 255 and "failed to create file: /no/such/dir/x" in res.stderr


def test_start_stop_shapes(lab, scratch_ct):
    res = lab.pct("start", scratch_ct)
    assert (res.returncode, res.stderr) == (255, "CT %s already running\n" % scratch_ct)
    assert lab.pct("stop", scratch_ct).returncode == 0
    try:
        assert lab.pct("status", scratch_ct).stdout == "status: stopped\n"
        res = lab.ct(scratch_ct, "true")
        assert (res.returncode, res.stderr) == (255, "container '%s' not running!\n" % scratch_ct)
        res = lab.pct("push", scratch_ct, "/etc/hostname", "/tmp/x")
        assert (res.returncode, res.stderr) == (255, "can only push files to a running CT\n")
        res = lab.pct("stop", scratch_ct)
        assert (res.returncode, res.stderr) == (255, "CT %s not running\n" % scratch_ct)
    finally:
        assert lab.pct("start", scratch_ct).returncode == 0
    # the lab's own boot deadline (lab.py wait_booted): a loaded machine's boot may take longer than 30 s
    assert wait_for(lambda: lab.ct(scratch_ct, "systemctl", "is-system-running").stdout.strip()
                    in ("running", "degraded"), timeout=60)


def test_lab_up_is_idempotent(lab, scratch_ct):
    lib = os.path.join(ROOT, "lab", "fakegpu", "fakegpu.py")
    mode = os.stat(lib).st_mode
    res = subprocess.run([sys.executable, os.path.join(ROOT, "lab", "lab.py"), "up", "--ids", scratch_ct],
                         capture_output=True, text=True, check=True)
    assert "started" not in res.stdout  # already running: nothing recreated
    assert "container %s: systemd" % scratch_ct in res.stdout
    assert os.stat(lib).st_mode == mode  # refreshing the container's copy leaves the checkout alone


def test_lab_has_no_network_and_sshd_only_on_loopback(lab, scratch_ct):
    links = lab.ct(scratch_ct, "cat", "/proc/net/dev").stdout
    assert [line.split(":")[0].strip() for line in links.splitlines()[2:]] == ["lo"]
    with socket.create_connection(("127.0.0.1", lab.port), timeout=5) as sock:
        assert sock.recv(64).startswith(b"SSH-2.0-OpenSSH")


def test_simulated_gpu_memory_follows_its_holder(lab, scratch_ct):
    unit = "gpu-holder-test"
    lab.ct(scratch_ct, "systemctl", "stop", unit)

    def used(gpu):
        out = lab.ct(scratch_ct, "nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits",
                     "-i", str(gpu)).stdout
        return int(out.strip())

    base = used(3)
    assert lab.ct(scratch_ct, "systemd-run", "--unit", unit, "python3", "-m", "fakegpu", "alloc",
                  "--gpu", "3", "--mib", "4096", "--hold").returncode == 0
    try:
        assert wait_for(lambda: used(3) == base + 4096, timeout=10)
        apps = lab.ct(scratch_ct, "nvidia-smi", "--query-compute-apps=pid,used_memory",
                      "--format=csv,noheader,nounits").stdout
        assert any(line.endswith(", 4096") for line in apps.splitlines())
    finally:
        lab.ct(scratch_ct, "systemctl", "stop", unit)
    assert wait_for(lambda: used(3) == base, timeout=10)


DELAY_CT = "230"  # its own delay file: other containers' callers never wait for this test
# "no delay" is shown against a delay that no call's own run time comes near (a bound of 0.5 s was one that only
# an idle machine's `pct status` meets); "a delay" by lower bounds, which a slow machine only makes easier
LONG_DELAY_S = 60


def test_per_call_delay_models_proxmox_start_up(lab, tmp_path):
    """lab.py delay S --ids CT: every pct call for CT waits S first (errors too); other containers
    and the default stay at 0; DFLASH_PCT_DELAY_S overrides for one caller."""
    import time  # pylint: disable=import-outside-toplevel
    subprocess.run([sys.executable, os.path.join(ROOT, "lab", "lab.py"), "up", "--fresh", "--ids", DELAY_CT],
                   check=True, stdout=subprocess.DEVNULL)

    def timed(*args, env=None):
        t0 = time.monotonic()
        res = subprocess.run(["pct", *args], capture_output=True, text=True, check=False,
                             env=dict(os.environ, **(env or {})))
        return time.monotonic() - t0, res

    lab_py = [sys.executable, os.path.join(ROOT, "lab", "lab.py")]
    subprocess.run(lab_py + ["delay", "0.6", "--ids", DELAY_CT], check=True, stdout=subprocess.DEVNULL)
    try:
        took, res = timed("status", DELAY_CT)
        assert res.stdout == "status: running\n" and took >= 0.6
        took, res = timed("exec", DELAY_CT, "--", "sh", "-c", "exit 3")
        assert res.returncode == 3 and took >= 0.6
        took, res = timed("status", "999999", env={"DFLASH_PCT_DELAY_S": "0.4"})
        assert res.returncode == 255 and took >= 0.4
        subprocess.run(lab_py + ["delay", str(LONG_DELAY_S), "--ids", DELAY_CT], check=True, stdout=subprocess.DEVNULL)
        took, _res = timed("status", DELAY_CT, env={"DFLASH_PCT_DELAY_S": "0"})
        assert took < LONG_DELAY_S
    finally:
        subprocess.run(lab_py + ["delay", "0", "--ids", DELAY_CT], check=True, stdout=subprocess.DEVNULL)
    assert not os.path.exists("/etc/dflash-lab/pct-delay.%s" % DELAY_CT)
    took, res = timed("status", DELAY_CT)
    assert res.returncode == 0 and took < LONG_DELAY_S  # the long delay set above is gone with the file
