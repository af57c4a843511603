#!/usr/bin/env python3
"""The dflash.trainer lab: a Proxmox-like host on this machine, one command up, one down.

    python3 lab/lab.py up [--ids 200 201 ...]   # idempotent
    python3 lab/lab.py down [--ids ...] [--purge]
    python3 lab/lab.py status

What `up` builds (all real parts, only the GPU is simulated):
- a Debian bookworm rootfs (debootstrap, minbase + systemd + python3), cached once under
  CACHE_DIR, the mirror read from this machine's apt configuration at run time;
- one LXC container per id with systemd as PID 1, rootfs = overlay(cache, per-container upper),
  no network (lxc.net.0.type = empty);
- the simulated GPU (lab/fakegpu: library + nvidia-smi stand-in) inside each container;
- /usr/sbin/pct (lab/pct): Proxmox's pct CLI shapes on top of lxc-attach/lxc-start;
- sshd on 127.0.0.1:PORT with its own host key, pid file and a client key, so playbooks take the
  real path ssh -> pct exec -> container; the host key goes into SSH_DIR/known_hosts
  (`[127.0.0.1]:PORT ssh-ed25519 ...`), so clients check it as they would a real node's;
- a careful operator's account: user OPERATOR (`dflash`, same lab key) whose sudo allows only the
  collection's pct wrapper (extras/dflash-pct-wrapper at WRAPPER_PATH) for the ids in
  PCT_ALLOWED (`lab.py allow --ids 230 [--remove]`; none by default).

    python3 lab/lab.py delay SECONDS [--ids ...]  # pct start-up cost per call (0: none, the default)
"""
import argparse
import glob
import json
import os
import re
import shutil
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
CACHE_DIR = os.environ.get("DFLASH_LAB_CACHE", "/var/cache/dflash-lab")
STATE_DIR = os.environ.get("DFLASH_LAB_STATE", "/var/lib/dflash-lab")
LXC_PATH = "/var/lib/lxc"
SSH_PORT = int(os.environ.get("DFLASH_LAB_SSH_PORT", "2222"))
SSH_DIR = os.path.join(STATE_DIR, "ssh")
# The lab sshd's host key as ssh expects it, written by `up`: inventories of the lab name this file
# (ansible_pct_known_hosts_file) and keep host key checking on, as for a real node.
KNOWN_HOSTS = os.path.join(SSH_DIR, "known_hosts")
PCT_PATH = "/usr/sbin/pct"
# lab/pct reads its per-call delay here: pct-delay (every call) or pct-delay.<vmid> (one container)
PCT_CONF_DIR = "/etc/dflash-lab"
OPERATOR = "dflash"
WRAPPER_PATH = "/usr/local/sbin/dflash-pct-wrapper"
PCT_ALLOWED = "/etc/dflash-trainer/pct-allowed"
SUDOERS = "/etc/sudoers.d/dflash-lab-operator"
OPERATOR_KEYS = os.path.join(STATE_DIR, "operator", "authorized_keys")
HOST_PACKAGES = ["lxc", "debootstrap", "openssh-server", "openssh-client", "sudo"]
# Each container's systemd takes inotify instances; the kernel's default (128 per user) lets
# only about 20 containers boot - the next one's init exits 255 at once.
HOST_SYSCTLS = {"fs.inotify.max_user_instances": 8192, "fs.inotify.max_user_watches": 1048576}
ROOTFS_PACKAGES = "systemd,systemd-sysv,python3,dbus,procps"
DEFAULT_GPU_CONFIG = {"count": 8, "memory_mib": 81559, "name": "NVIDIA H100 80GB HBM3", "release_delay_s": 0}


def log(msg):
    print("lab: " + msg, flush=True)


def run(argv, **kw):
    kw.setdefault("check", True)
    return subprocess.run(argv, **kw)  # pylint: disable=subprocess-run-check  # check is set above


def apt_mirror(sources_dir="/etc/apt/sources.list.d", sources_list="/etc/apt/sources.list"):
    """First Debian mirror of this machine's apt configuration (deb822 `URIs:` or one-line form)."""
    for path in sorted(glob.glob(os.path.join(sources_dir, "*.sources"))):
        with open(path) as fh:
            text = fh.read()
        for stanza in re.split(r"\n\s*\n", text):
            if re.search(r"^Suites:.*\bbookworm\b", stanza, re.M) and "security" not in stanza:
                m = re.search(r"^URIs:\s*(\S+)", stanza, re.M)
                if m:
                    return m.group(1)
    if os.path.exists(sources_list):
        with open(sources_list) as fh:
            for line in fh:
                parts = line.split()
                if len(parts) >= 3 and parts[0] == "deb" and "security" not in line:
                    return [p for p in parts[1:] if not p.startswith("[")][0]
    raise SystemExit("lab: no Debian mirror found in the apt configuration (%s, %s)" % (sources_dir, sources_list))


def ensure_host_packages():
    missing = [p for p in HOST_PACKAGES
               if subprocess.run(["dpkg-query", "-W", "-f=${Status}", p], capture_output=True, text=True, check=False)
               .stdout.strip() != "install ok installed"]
    if missing:
        log("installing host packages: " + " ".join(missing))
        env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
        run(["apt-get", "update", "-qq"], env=env)
        run(["apt-get", "install", "-y", "-qq", "--no-install-recommends"] + missing, env=env, stdout=subprocess.DEVNULL)


def ensure_sysctls():
    """Raise (never lower) the kernel limits that many containers need."""
    for key, want in HOST_SYSCTLS.items():
        path = "/proc/sys/" + key.replace(".", "/")
        with open(path) as fh:
            have = int(fh.read().split()[0])
        if have < want:
            with open(path, "w") as fh:
                fh.write(str(want))
            log("%s: %d -> %d" % (key, have, want))


def rootfs_path():
    return os.path.join(CACHE_DIR, "rootfs")


def ensure_rootfs():
    target = rootfs_path()
    if os.path.exists(os.path.join(target, "usr/bin/python3")):
        return
    os.makedirs(CACHE_DIR, exist_ok=True)
    tmp = target + ".tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    mirror = apt_mirror()
    log("debootstrap bookworm (≈ 1 min, cached in %s afterwards)" % CACHE_DIR)
    run(["debootstrap", "--variant=minbase", "--include=" + ROOTFS_PACKAGES, "bookworm", tmp, mirror],
        stdout=subprocess.DEVNULL)
    os.rename(tmp, target)


def lxc_config(vmid):
    upper = os.path.join(STATE_DIR, "ct", vmid, "upper")
    return "\n".join([
        "# written by dflash.trainer lab/lab.py",
        "lxc.include = /usr/share/lxc/config/common.conf",
        "lxc.uts.name = ct%s" % vmid,
        "lxc.rootfs.path = overlay:%s:%s" % (rootfs_path(), upper),
        "lxc.net.0.type = empty",
        "lxc.apparmor.profile = unconfined",
        "lxc.autodev = 1",
        "lxc.init.cmd = /sbin/init",
        "",
    ])


def install_into(upper, rel, src, mode):
    dst = os.path.join(upper, rel.lstrip("/"))
    os.makedirs(os.path.dirname(dst), exist_ok=True)
    shutil.copyfile(src, dst)
    os.chmod(dst, mode)


def seed_container(vmid):
    """Files every lab container gets in its upper layer before it boots."""
    upper = os.path.join(STATE_DIR, "ct", vmid, "upper")
    os.makedirs(upper, exist_ok=True)
    fakegpu = os.path.join(HERE, "fakegpu")
    install_into(upper, "/usr/lib/python3/dist-packages/fakegpu.py", os.path.join(fakegpu, "fakegpu.py"), 0o644)
    install_into(upper, "/usr/bin/nvidia-smi", os.path.join(fakegpu, "nvidia-smi"), 0o755)
    cfg = os.path.join(upper, "var/lib/fakegpu/config.json")
    if not os.path.exists(cfg):
        os.makedirs(os.path.dirname(cfg), exist_ok=True)
        with open(cfg, "w") as fh:
            json.dump(DEFAULT_GPU_CONFIG, fh)
    with open(_mk(upper, "etc/hostname"), "w") as fh:
        fh.write("ct%s\n" % vmid)


def _mk(upper, rel):
    path = os.path.join(upper, rel)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    return path


def lxc_running(vmid):
    out = subprocess.run(["lxc-info", "-n", vmid, "-s", "-H"], capture_output=True, text=True, check=False).stdout
    return out.strip() == "RUNNING"


def wait_booted(vmid, timeout=60):
    """Poll systemd inside the container until it has finished booting."""
    deadline = time.monotonic() + timeout
    state = ""
    while time.monotonic() < deadline:
        state = subprocess.run(["lxc-attach", "-n", vmid, "--", "systemctl", "is-system-running"],
                               capture_output=True, text=True, check=False).stdout.strip()
        if state in ("running", "degraded"):
            return state
        time.sleep(0.1)
    raise SystemExit("lab: container %s did not finish booting in %d s (systemd says %r)" % (vmid, timeout, state))


def ensure_container(vmid):
    conf_dir = os.path.join(LXC_PATH, vmid)
    os.makedirs(conf_dir, exist_ok=True)
    os.makedirs(os.path.join(STATE_DIR, "ct", vmid), exist_ok=True)
    with open(os.path.join(conf_dir, "config"), "w") as fh:
        fh.write(lxc_config(vmid))
    if not lxc_running(vmid):
        seed_container(vmid)
        run(["lxc-start", "-n", vmid, "-d"])
        log("container %s started" % vmid)
    else:
        # refresh the simulated GPU code in a running container through the container itself
        for rel, src, mode in (("/usr/lib/python3/dist-packages/fakegpu.py", "fakegpu/fakegpu.py", "0644"),
                               ("/usr/bin/nvidia-smi", "fakegpu/nvidia-smi", "0755")):
            # input= (a pipe), never the file itself as stdin: lxc-attach fchmods a regular file
            # given as stdio to 0700 — it would change the checkout's own files.
            with open(os.path.join(HERE, src), "rb") as fh:
                data = fh.read()
            run(["lxc-attach", "-n", vmid, "--", "sh", "-c", 'cat > "$1.new" && chmod "$2" "$1.new" && mv "$1.new" "$1"',
                 "sh", rel, mode], input=data)
    state = wait_booted(vmid)
    log("container %s: systemd %s" % (vmid, state))


def ensure_pct():
    src = os.path.join(HERE, "pct")
    tmp = PCT_PATH + ".new"
    shutil.copyfile(src, tmp)
    os.chmod(tmp, 0o755)
    os.replace(tmp, PCT_PATH)


def ensure_operator():
    """The non-root operator: ssh with the lab key, sudo for the pct wrapper and nothing else."""
    if subprocess.run(["id", "-u", OPERATOR], capture_output=True, check=False).returncode:
        run(["useradd", "--create-home", "--shell", "/bin/bash", OPERATOR])
    # '*': no password, yet not locked ('!'), so sshd (UsePAM no) lets the key in
    run(["usermod", "-p", "*", OPERATOR])
    tmp = WRAPPER_PATH + ".new"
    os.makedirs(os.path.dirname(WRAPPER_PATH), exist_ok=True)
    shutil.copyfile(os.path.join(HERE, "..", "extras", "dflash-pct-wrapper"), tmp)
    os.chmod(tmp, 0o755)
    os.replace(tmp, WRAPPER_PATH)
    os.makedirs(os.path.dirname(PCT_ALLOWED), mode=0o755, exist_ok=True)
    if not os.path.exists(PCT_ALLOWED):
        write_allowed([])
    rule = "# written by dflash.trainer lab/lab.py\n%s ALL=(root) NOPASSWD: %s\n" % (OPERATOR, WRAPPER_PATH)
    tmp = SUDOERS + ".new"
    with open(tmp, "w") as fh:
        fh.write(rule)
    os.chmod(tmp, 0o440)
    run(["visudo", "-cqf", tmp])
    os.replace(tmp, SUDOERS)


def read_allowed():
    try:
        with open(PCT_ALLOWED) as fh:
            return [w for line in fh for w in line.split("#", 1)[0].split()]
    except FileNotFoundError:
        return []


def write_allowed(ids):
    tmp = PCT_ALLOWED + ".new"
    with open(tmp, "w") as fh:
        fh.write("# containers the lab operator (%s) may reach through %s; lab.py allow\n" % (OPERATOR, WRAPPER_PATH))
        fh.write("".join("%s\n" % i for i in sorted(set(ids), key=int)))
    os.chmod(tmp, 0o644)
    os.replace(tmp, PCT_ALLOWED)


def allow(ids, remove):
    have = read_allowed()
    write_allowed([i for i in have if i not in ids] if remove else have + ids)
    log("%s: %s" % (PCT_ALLOWED, " ".join(read_allowed()) or "(none)"))


def set_delay(seconds, ids):
    """pct's per-call delay (lab/pct reads it on every call): for ids, else for every call."""
    os.makedirs(PCT_CONF_DIR, exist_ok=True)
    for name in (["pct-delay.%s" % i for i in ids] if ids else ["pct-delay"]):
        path = os.path.join(PCT_CONF_DIR, name)
        if seconds == 0:
            if os.path.exists(path):
                os.unlink(path)
        else:
            with open(path + ".new", "w") as fh:
                fh.write("%g\n" % seconds)
            os.replace(path + ".new", path)
        log("%s: %g s per pct call" % (path, seconds))


def sshd_config():
    return "\n".join([
        "# dflash.trainer lab sshd: loopback only, key auth only",
        "Port %d" % SSH_PORT,
        "ListenAddress 127.0.0.1",
        "HostKey %s/ssh_host_ed25519_key" % SSH_DIR,
        "PidFile %s/sshd.pid" % SSH_DIR,
        # the second file is readable by the operator (sshd reads it as the user logging in)
        "AuthorizedKeysFile %s/authorized_keys %s" % (SSH_DIR, OPERATOR_KEYS),
        "PermitRootLogin prohibit-password",
        "PasswordAuthentication no",
        "KbdInteractiveAuthentication no",
        "UsePAM no",
        "StrictModes no",
        "MaxSessions 64",
        "MaxStartups 64:30:128",
        # A stock Proxmox root shell has no pyenv; this host's ~/.bashrc runs `pyenv init` for
        # every ssh command (bash sources it when SHLVL < 2 under ssh). SHLVL=1 keeps it out.
        "SetEnv SHLVL=1",
        "Subsystem sftp /usr/lib/openssh/sftp-server",
        "",
    ])


def sshd_pid():
    try:
        with open(os.path.join(SSH_DIR, "sshd.pid")) as fh:
            pid = int(fh.read().strip())
        os.kill(pid, 0)
        return pid
    except (OSError, ValueError):
        return None


def ensure_sshd():
    os.makedirs(SSH_DIR, mode=0o700, exist_ok=True)
    hostkey = os.path.join(SSH_DIR, "ssh_host_ed25519_key")
    client = os.path.join(SSH_DIR, "id_ed25519")
    for key in (hostkey, client):
        if not os.path.exists(key):
            run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "dflash-lab", "-f", key])
    with open(client + ".pub") as fh:
        pub = fh.read()
    with open(os.path.join(SSH_DIR, "authorized_keys"), "w") as fh:
        fh.write(pub)
    os.makedirs(os.path.dirname(OPERATOR_KEYS), mode=0o755, exist_ok=True)
    with open(OPERATOR_KEYS, "w") as fh:
        fh.write('from="127.0.0.1" ' + pub)
    os.chmod(OPERATOR_KEYS, 0o644)
    write_known_hosts(hostkey + ".pub")
    cfg = os.path.join(SSH_DIR, "sshd_config")
    with open(cfg, "w") as fh:
        fh.write(sshd_config())
    os.makedirs("/run/sshd", exist_ok=True)
    run(["/usr/sbin/sshd", "-t", "-f", cfg])
    pid = sshd_pid()
    if pid:
        os.kill(pid, 1)  # SIGHUP: reread the config
    else:
        run(["/usr/sbin/sshd", "-f", cfg])
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        probe = subprocess.run(ssh_argv() + ["true"], capture_output=True, check=False)
        if probe.returncode == 0:
            log("sshd on 127.0.0.1:%d" % SSH_PORT)
            return
        time.sleep(0.1)
    raise SystemExit("lab: sshd on 127.0.0.1:%d does not accept the lab key" % SSH_PORT)


def known_hosts_line(host_pub, host="127.0.0.1", port=SSH_PORT):
    """The known_hosts entry for the lab sshd: `[host]:port keytype key` (plain `host` on 22)."""
    keytype, key = host_pub.split()[:2]
    name = host if port == 22 else "[%s]:%d" % (host, port)
    return "%s %s %s\n" % (name, keytype, key)


def write_known_hosts(host_pub_path):
    """SSH_DIR/known_hosts from the host key; rewritten (atomically) only when it differs."""
    with open(host_pub_path) as fh:
        line = known_hosts_line(fh.read())
    try:
        with open(KNOWN_HOSTS) as fh:
            if fh.read() == line:
                return
    except OSError:
        pass
    tmp = KNOWN_HOSTS + ".new"
    with open(tmp, "w") as fh:
        fh.write(line)
    os.chmod(tmp, 0o644)
    os.replace(tmp, KNOWN_HOSTS)


def ssh_argv():
    return ["ssh", "-p", str(SSH_PORT), "-i", os.path.join(SSH_DIR, "id_ed25519"),
            "-o", "StrictHostKeyChecking=yes", "-o", "UserKnownHostsFile=" + KNOWN_HOSTS,
            "-o", "LogLevel=ERROR", "-o", "BatchMode=yes", "root@127.0.0.1"]


def write_facts(ids):
    facts = {"ssh_host": "127.0.0.1", "ssh_port": SSH_PORT, "ssh_user": "root",
             "ssh_private_key": os.path.join(SSH_DIR, "id_ed25519"), "known_hosts": KNOWN_HOSTS, "pct": PCT_PATH,
             "operator": {"ssh_user": OPERATOR, "pct_path": WRAPPER_PATH, "pct_sudo": True, "allowed": PCT_ALLOWED},
             "pct_delay_dir": PCT_CONF_DIR,
             "containers": sorted(set(ids) | set(lab_ids()), key=int)}
    with open(os.path.join(STATE_DIR, "lab.json"), "w") as fh:
        json.dump(facts, fh, indent=2)


def lab_ids():
    base = os.path.join(STATE_DIR, "ct")
    return sorted((d for d in os.listdir(base) if d.isdigit()), key=int) if os.path.isdir(base) else []


def up(ids):
    ensure_host_packages()
    ensure_sysctls()
    ensure_rootfs()
    ensure_pct()
    ensure_operator()
    for vmid in ids:
        ensure_container(vmid)
    ensure_sshd()
    write_facts(ids)
    log("up: containers %s; try: %s pct exec %s -- nvidia-smi -L" % (" ".join(ids), " ".join(ssh_argv()), ids[0]))


def down(ids, purge):
    for vmid in ids:
        if lxc_running(vmid):
            run(["lxc-stop", "-n", vmid, "-k"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        shutil.rmtree(os.path.join(LXC_PATH, vmid), ignore_errors=True)
        shutil.rmtree(os.path.join(STATE_DIR, "ct", vmid), ignore_errors=True)
        log("container %s removed" % vmid)
    if not lab_ids():
        pid = sshd_pid()
        if pid:
            os.kill(pid, 15)
            log("sshd stopped")
    if purge:
        shutil.rmtree(CACHE_DIR, ignore_errors=True)
        log("rootfs cache removed")


def status():
    for vmid in lab_ids():
        print("%s %s" % (vmid, "running" if lxc_running(vmid) else "stopped"))
    print("sshd %s" % ("running pid %d" % sshd_pid() if sshd_pid() else "stopped"))


def main(argv=None):
    p = argparse.ArgumentParser(prog="lab", description=__doc__.split("\n", maxsplit=1)[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    for name in ("up", "down"):
        s = sub.add_parser(name)
        s.add_argument("--ids", nargs="+", default=None, help="container ids (default: 200 for up, all for down)")
        if name == "down":
            s.add_argument("--purge", action="store_true", help="also remove the cached rootfs")
    sub.add_parser("status")
    a = sub.add_parser("allow", help="containers the operator's pct wrapper may reach")
    a.add_argument("--ids", nargs="+", required=True)
    a.add_argument("--remove", action="store_true")
    d = sub.add_parser("delay", help="seconds each pct call waits first (Proxmox's start-up); 0: none")
    d.add_argument("seconds", type=float)
    d.add_argument("--ids", nargs="+", default=None, help="only these containers (default: every call)")
    args = p.parse_args(argv)
    if os.geteuid() != 0:
        raise SystemExit("lab: must run as root (LXC containers, /usr/sbin/pct, sshd)")
    if args.cmd in ("up", "down", "allow", "delay") and args.ids:
        bad = [i for i in args.ids if not i.isdigit() or not 100 <= int(i) <= 999999999]
        if bad:
            raise SystemExit("lab: invalid container id(s) %s: Proxmox ids are integers >= 100" % ", ".join(bad))
    if args.cmd == "up":
        up(args.ids or ["200"])
    elif args.cmd == "down":
        down(args.ids or lab_ids(), args.purge)
    elif args.cmd == "allow":
        allow(args.ids, args.remove)
    elif args.cmd == "delay":
        if args.seconds < 0:
            raise SystemExit("lab: the delay is seconds >= 0")
        set_delay(args.seconds, args.ids or [])
    else:
        status()
    return 0


if __name__ == "__main__":
    sys.exit(main())
