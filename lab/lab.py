#!/usr/bin/env python3
"""The dflash.trainer lab: a Proxmox-like host on this machine, one command up, one down.

    python3 lab/lab.py up [--ids 200 201 ...] [--unprivileged]   # idempotent
    python3 lab/lab.py down [--ids ...] [--purge]
    python3 lab/lab.py status

What `up` builds (all real parts, only the GPU is simulated):
- a Debian bookworm rootfs (debootstrap, minbase + systemd + python3), cached once under
  CACHE_DIR, the mirror read from this machine's apt configuration at run time;
- one LXC container per id with systemd as PID 1, rootfs = overlay(cache, per-container upper),
  no network (lxc.net.0.type = empty);
- with --unprivileged, containers as Proxmox creates them by default (`unprivileged: 1`): ids
  0-65535 inside are 100000-165535 outside (lxc.idmap, userns.conf), the overlay's lower layer a
  copy of the cache whose owners are shifted by 100000 (built once, rebuilt when the cache
  changes). Each container keeps the kind it was created with: a plain `up` of an unprivileged
  one keeps it unprivileged, and `up --unprivileged` of a privileged one is refused (take it
  down first); `status` shows the kind;
- the simulated GPU (lab/fakegpu: library + nvidia-smi stand-in) inside each container;
- /usr/sbin/pct (lab/pct): Proxmox's pct CLI shapes on top of lxc-attach/lxc-start;
- sshd on 127.0.0.1:PORT with its own host key, pid file and a client key, so playbooks take the
  real path ssh -> pct exec -> container; the host key goes into SSH_DIR/known_hosts
  (`[127.0.0.1]:PORT ssh-ed25519 ...`), so clients check it as they would a real node's;
- each container's Proxmox config, PVE_LXC_DIR/<vmid>.conf, as pve-container writes it (`arch`,
  `hostname`, `ostype`, and `unprivileged: 1` for an unprivileged one): what the pct wrapper
  reads to refuse privileged containers; `down` removes it (the LXC config under LXC_PATH is what
  really runs the container);
- a careful operator's account: user OPERATOR (`dflash`, same lab key) whose sudo allows only the
  collection's pct wrapper (extras/dflash-pct-wrapper at WRAPPER_PATH) for the ids in
  PCT_ALLOWED (`lab.py allow --ids 260 [--remove]`; none by default) that are unprivileged, or
  privileged and listed in PCT_PRIVILEGED_ALLOWED (`lab.py allow --privileged --ids 261`: the
  node's root for the operator; none by default, and no file).

    python3 lab/lab.py delay SECONDS [--ids ...]  # pct start-up cost per call (0: none, the default)
    python3 lab/lab.py pct-errno N|off --ids ...  # pct errors exit as Perl's die would (errno N; off: 255)
    python3 lab/lab.py lock NAME|off --ids ...    # a Proxmox `lock: NAME` in the containers' config
    python3 lab/lab.py dev-nodes --ids ... [--missing nvidia-uvm ...]  # the /dev/nvidia* nodes CUDA opens
    python3 lab/lab.py node-gpus [--ids 231 232]  # containers whose GPUs are the node's (lab/node.py)
    python3 lab/lab.py torch --ids 300           # real PyTorch (CPU) in a container (issue 15 item 4)
    python3 lab/lab.py group --name g1 --ids 330 331 [--fresh]  # containers sharing /mnt/dflash-rdzv
    python3 lab/lab.py cgroup-layout proxmox|lxc --ids 540  # cgroups in lxc/<vmid>/ns as Proxmox VE's, or lxc.payload.<vmid>
    python3 lab/lab.py bind --source /srv/logs --target /mnt/logs --ids 542 [--remove]  # a node dir, not id-mapped
"""
import argparse
import fcntl
import glob
import json
import os
import re
import shutil
import stat
import subprocess
import sys
import time

import node  # the node's own nvidia-smi (lab/node.py)
from hostfiles import install_file, write_sudoers, write_text

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
PCT_PRIVILEGED_ALLOWED = "/etc/dflash-trainer/pct-privileged-allowed"
# Where Proxmox keeps the containers' configs (on a node: pmxcfs, root:www-data 0640); the
# wrapper reads `unprivileged: 1` there.
PVE_LXC_DIR = os.environ.get("DFLASH_LAB_PVE_LXC", "/etc/pve/lxc")
PVE_ARCH = {"x86_64": "amd64", "aarch64": "arm64", "armv7l": "armhf", "i686": "i386"}
SUDOERS = "/etc/sudoers.d/dflash-lab-operator"
OPERATOR_KEYS = os.path.join(STATE_DIR, "operator", "authorized_keys")
HOST_PACKAGES = ["lxc", "debootstrap", "openssh-server", "openssh-client", "sudo"]
# Each container's systemd takes inotify instances; the kernel's default (128 per user) lets
# only about 20 containers boot - the next one's init exits 255 at once.
HOST_SYSCTLS = {"fs.inotify.max_user_instances": 8192, "fs.inotify.max_user_watches": 1048576}
ROOTFS_PACKAGES = "systemd,systemd-sysv,python3,dbus,procps"
# Proxmox's idmap for `unprivileged: 1`: uid/gid 0-65535 inside are 100000-165535 outside.
IDMAP_BASE = 100000
IDMAP_COUNT = 65536
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


def shifted_rootfs_path():
    return os.path.join(CACHE_DIR, "rootfs-shifted-%d" % IDMAP_BASE)


def rootfs_stamp():
    """Identity of the cached rootfs: a new debootstrap (a new directory) or a changed package
    set (dpkg's status file) gives another stamp, and the shifted copy is rebuilt."""
    src = rootfs_path()
    top = os.stat(src)
    dpkg = os.stat(os.path.join(src, "var/lib/dpkg/status"))
    return "%d:%d:%d:%d\n" % (top.st_dev, top.st_ino, dpkg.st_mtime_ns, dpkg.st_size)


def shift_owners(top, offset):
    """Add offset to the owner and group of every entry under top (top included), in place.

    Entries already at or above offset are left alone, so hard links (one inode, several
    names) and a rerun shift nothing twice. lchown: symlinks themselves, never their targets.
    chown clears setuid/setgid bits: the mode is set again afterwards. Returns the count."""
    count = 0
    paths = [top]
    for base, dirs, files in os.walk(top):
        paths.extend(os.path.join(base, n) for n in dirs + files)
    for path in paths:
        st = os.lstat(path)
        if st.st_uid >= offset and st.st_gid >= offset:
            continue
        os.lchown(path, st.st_uid % offset + offset if st.st_uid < offset else st.st_uid,
                  st.st_gid % offset + offset if st.st_gid < offset else st.st_gid)
        if not stat.S_ISLNK(st.st_mode) and st.st_mode & (stat.S_ISUID | stat.S_ISGID):
            os.chmod(path, stat.S_IMODE(st.st_mode))
        count += 1
    return count


def ensure_shifted_rootfs():
    """The unprivileged containers' lower layer: a copy of the cache, owners shifted by IDMAP_BASE."""
    target = shifted_rootfs_path()
    stamp_path = os.path.join(CACHE_DIR, os.path.basename(target) + ".stamp")
    want = rootfs_stamp()
    try:
        with open(stamp_path) as fh:
            if fh.read() == want and os.path.isdir(target):
                return target
    except OSError:
        pass
    t0 = time.monotonic()
    tmp = target + ".tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    run(["cp", "-a", "--reflink=auto", rootfs_path(), tmp])
    n = shift_owners(tmp, IDMAP_BASE)
    if os.path.isdir(target):  # a stale copy: moved aside, removed once the new one is in place
        old = "%s.old.%d" % (target, os.getpid())
        os.rename(target, old)
        os.rename(tmp, target)
        users = [i for i in lab_ids() if container_kind(i) == "unprivileged" and lxc_running(i)]
        if users:  # their overlays still read it: removed by a later `down --purge`
            log("kept %s: containers %s still run on it" % (old, " ".join(users)))
        else:
            shutil.rmtree(old, ignore_errors=True)
    else:
        os.rename(tmp, target)
    write_text(stamp_path, want)
    log("shifted rootfs for unprivileged containers: %d entries owned from %d on, %.1f s (%s)"
        % (n, IDMAP_BASE, time.monotonic() - t0, target))
    return target


def kind_path(vmid):
    return os.path.join(STATE_DIR, "ct", vmid, "kind.json")


def container_kind(vmid):
    """'unprivileged', 'privileged', or None when the lab has no container vmid.

    The kind recorded by `up`; a container of an older lab, without the record, is read from its
    LXC config (idmap lines: unprivileged), or is privileged when only its upper layer is left."""
    try:
        with open(kind_path(vmid)) as fh:
            return "unprivileged" if json.load(fh).get("unprivileged") else "privileged"
    except (OSError, ValueError):
        pass
    try:
        with open(os.path.join(LXC_PATH, vmid, "config")) as fh:
            return "unprivileged" if re.search(r"^lxc\.idmap\s*=", fh.read(), re.M) else "privileged"
    except OSError:
        pass
    return "privileged" if os.path.isdir(os.path.join(STATE_DIR, "ct", vmid)) else None


def record_kind(vmid, unprivileged):
    write_text(kind_path(vmid), json.dumps({"unprivileged": unprivileged,
                                            "idmap": [0, IDMAP_BASE, IDMAP_COUNT] if unprivileged else None}))


# The device nodes a Proxmox container with GPUs gets from the node, bind-mounted as pve-container's
# users write it (`lxc.mount.entry: /dev/nvidia-uvm dev/nvidia-uvm none bind,optional,create=file`):
# name -> (major, minor) of the node's character device. The lab's nodes live in
# STATE_DIR/ct/<vmid>/dev (mknod'ed on the host; nothing opens them: the GPU is simulated), less the
# names in STATE_DIR/ct/<vmid>/dev-missing (`lab.py dev-nodes --missing`): as on a node after a
# reboot where nothing loaded nvidia-uvm, the optional bind of a missing node is skipped.
DEV_NODES = dict([("nvidiactl", (195, 255)), ("nvidia-uvm", (511, 0)), ("nvidia-uvm-tools", (511, 1))] +
                 [("nvidia%d" % i, (195, i)) for i in range(8)])


def dev_dir(vmid):
    return os.path.join(STATE_DIR, "ct", vmid, "dev")


def dev_missing(vmid):
    try:
        with open(os.path.join(STATE_DIR, "ct", vmid, "dev-missing")) as fh:
            return set(fh.read().split())
    except FileNotFoundError:
        return set()


def ensure_dev_nodes(vmid):
    """The host side of the container's device nodes: present unless missing, each a character device."""
    os.makedirs(dev_dir(vmid), exist_ok=True)
    missing = dev_missing(vmid)
    for name, (major, minor) in DEV_NODES.items():
        path = os.path.join(dev_dir(vmid), name)
        if name in missing:
            if os.path.lexists(path):
                os.unlink(path)
        elif not (os.path.exists(path) and stat.S_ISCHR(os.stat(path).st_mode)):
            if os.path.lexists(path):
                os.unlink(path)
            os.mknod(path, 0o666 | stat.S_IFCHR, os.makedev(major, minor))


def sync_dev_nodes_live(vmid):
    """A running privileged container's /dev as the host side says (its binds only apply at start)."""
    script = 'for n in $1; do umount "/dev/$n" 2>/dev/null; rm -f "/dev/$n"; done; ' \
             'shift; while [ $# -gt 0 ]; do [ -c "/dev/$1" ] || { rm -f "/dev/$1"; mknod -m 666 "/dev/$1" c "$2" "$3"; }; ' \
             'shift 3; done'
    missing = dev_missing(vmid)
    args = []
    for name, (major, minor) in DEV_NODES.items():
        if name not in missing:
            args += [name, str(major), str(minor)]
    run(["lxc-attach", "-n", vmid, "--", "sh", "-c", script, "sh", " ".join(sorted(missing))] + args)


def set_dev_nodes(ids, missing):
    for vmid in ids:
        if not os.path.isdir(os.path.join(STATE_DIR, "ct", vmid)):
            raise SystemExit("lab: no lab container %s" % vmid)
        bad = sorted(set(missing) - set(DEV_NODES))
        if bad:
            raise SystemExit("lab: unknown device node(s) %s (known: %s)" % (", ".join(bad), ", ".join(DEV_NODES)))
        write_text(os.path.join(STATE_DIR, "ct", vmid, "dev-missing"), "".join(n + "\n" for n in sorted(missing)))
        ensure_dev_nodes(vmid)
        if lxc_running(vmid) and container_kind(vmid) != "unprivileged":
            sync_dev_nodes_live(vmid)
        log("container %s: /dev nodes missing: %s" % (vmid, " ".join(sorted(missing)) or "none"))


def lxc_config(vmid, unprivileged=False):
    upper = os.path.join(STATE_DIR, "ct", vmid, "upper")
    lower = shifted_rootfs_path() if unprivileged else rootfs_path()
    lines = [
        "# written by dflash.trainer lab/lab.py",
        "lxc.include = /usr/share/lxc/config/common.conf",
    ]
    if unprivileged:  # as pve-container writes it for `unprivileged: 1`
        lines += [
            "lxc.include = /usr/share/lxc/config/userns.conf",
            "lxc.idmap = u 0 %d %d" % (IDMAP_BASE, IDMAP_COUNT),
            "lxc.idmap = g 0 %d %d" % (IDMAP_BASE, IDMAP_COUNT),
        ]
    return "\n".join(lines + [
        "lxc.uts.name = ct%s" % vmid,
        "lxc.rootfs.path = overlay:%s:%s" % (lower, upper),
        "lxc.net.0.type = empty",
        "lxc.apparmor.profile = unconfined",
        "lxc.autodev = 1",
        "lxc.init.cmd = /sbin/init",
    ] + ["lxc.mount.entry = %s dev/%s none bind,optional,create=file" % (os.path.join(dev_dir(vmid), name), name)
         for name in DEV_NODES] + [""])


def pve_config(vmid, unprivileged=False, machine=None, lock=None):
    """The container's config as Proxmox's pve-container writes it: description (`#` lines)
    first, then `key: value` lines sorted by key; `unprivileged: 1` only for an unprivileged one
    (Proxmox writes no line for a privileged container)."""
    machine = machine or os.uname().machine
    keys = {"arch": PVE_ARCH.get(machine, machine), "hostname": "ct%s" % vmid, "ostype": "debian"}
    if unprivileged:
        keys["unprivileged"] = "1"
    if lock:
        keys["lock"] = lock
    return "#written by dflash.trainer lab/lab.py (LXC runs %s/%s/config)\n" % (LXC_PATH, vmid) + \
        "".join("%s: %s\n" % (k, keys[k]) for k in sorted(keys))


def pve_config_path(vmid):
    return os.path.join(PVE_LXC_DIR, "%s.conf" % vmid)


def write_pve_config(vmid, unprivileged, lock=None):
    os.makedirs(PVE_LXC_DIR, mode=0o755, exist_ok=True)
    write_text(pve_config_path(vmid), pve_config(vmid, unprivileged, lock=lock), 0o640)


def set_lock(name, ids):
    """A Proxmox config lock (`lock: backup`, `migrate`, `snapshot`, ...) on each container, or none
    (name "off"): lab/pct's start/stop/shutdown refuse a locked container, as Proxmox's do."""
    for vmid in ids:
        if not os.path.isdir(os.path.join(STATE_DIR, "ct", vmid)):
            raise SystemExit("lab: no lab container %s" % vmid)
        write_pve_config(vmid, container_kind(vmid) == "unprivileged", lock=None if name == "off" else name)
        log("%s: lock %s" % (pve_config_path(vmid), name))


def set_pct_errno(value, ids):
    """lab/pct's exit status for its errors in these containers: "off" = 255 (the lab's default), else
    Perl's die with errno ``value`` current (a missing config: ENOENT, 2)."""
    os.makedirs(PCT_CONF_DIR, exist_ok=True)
    for vmid in ids:
        path = os.path.join(PCT_CONF_DIR, "pct-errno.%s" % vmid)
        if value == "off":
            if os.path.exists(path):
                os.unlink(path)
        else:
            write_text(path, "%d\n" % int(value))
        log("%s: pct errors exit %s" % (path, "255" if value == "off" else "as die with errno %s" % value))


def ensure_dirs(upper, lower, rel_dir, root_id):
    """Create upper/rel_dir; each directory made takes the owner and mode of its counterpart in
    the lower layer (the merged view keeps the upper's), else root's (root_id) and 0755."""
    path = upper
    for part in [p for p in rel_dir.split("/") if p]:
        path = os.path.join(path, part)
        lower_path = os.path.join(lower, os.path.relpath(path, upper))
        if os.path.isdir(path):
            continue
        os.mkdir(path)
        try:
            st = os.stat(lower_path)
            os.chown(path, st.st_uid, st.st_gid)
            os.chmod(path, stat.S_IMODE(st.st_mode))
        except OSError:
            os.chown(path, root_id, root_id)
            os.chmod(path, 0o755)


def install_into(upper, lower, rel, root_id, mode, src=None, data=None):
    """A file owned by the container's root (root_id outside), from src or data."""
    dst = os.path.join(upper, rel.lstrip("/"))
    ensure_dirs(upper, lower, os.path.dirname(rel.lstrip("/")), root_id)
    if src is not None:
        shutil.copyfile(src, dst)
    elif data is not None:
        with open(dst, "w") as fh:
            fh.write(data)
    os.chown(dst, root_id, root_id)
    os.chmod(dst, mode)


def seed_container(vmid, unprivileged=False):
    """Files every lab container gets in its upper layer before it boots, owned by its root."""
    upper = os.path.join(STATE_DIR, "ct", vmid, "upper")
    lower = shifted_rootfs_path() if unprivileged else rootfs_path()
    root_id = IDMAP_BASE if unprivileged else 0
    os.makedirs(upper, exist_ok=True)
    st = os.stat(lower)  # the upper's top is the container's /
    os.chown(upper, st.st_uid, st.st_gid)
    os.chmod(upper, stat.S_IMODE(st.st_mode))
    # LXC mounts an unprivileged container's overlay inside its user namespace, as the mapped
    # root: it cannot create the work directory next to upper itself.
    work = os.path.join(os.path.dirname(upper), "work")
    os.makedirs(work, exist_ok=True)
    os.chown(work, root_id, root_id)
    fakegpu = os.path.join(HERE, "fakegpu")
    install_into(upper, lower, "/usr/lib/python3/dist-packages/fakegpu.py", root_id, 0o644,
                 src=os.path.join(fakegpu, "fakegpu.py"))
    install_into(upper, lower, "/usr/bin/nvidia-smi", root_id, 0o755, src=os.path.join(fakegpu, "nvidia-smi"))
    cfg = "/var/lib/fakegpu/config.json"
    install_into(upper, lower, cfg, root_id, 0o644,
                 data=None if os.path.exists(os.path.join(upper, cfg.lstrip("/"))) else json.dumps(DEFAULT_GPU_CONFIG))
    install_into(upper, lower, "/etc/hostname", root_id, 0o644, data="ct%s\n" % vmid)


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


def ensure_container(vmid, unprivileged=False):
    conf_dir = os.path.join(LXC_PATH, vmid)
    os.makedirs(conf_dir, exist_ok=True)
    os.makedirs(os.path.join(STATE_DIR, "ct", vmid), exist_ok=True)
    record_kind(vmid, unprivileged)
    with open(os.path.join(conf_dir, "config"), "w") as fh:
        fh.write(lxc_config(vmid, unprivileged) + extra_config(vmid))
    write_pve_config(vmid, unprivileged)
    ensure_dev_nodes(vmid)
    if not lxc_running(vmid):
        seed_container(vmid, unprivileged)
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
        if not unprivileged:  # started before its config bound the device nodes: made in place
            sync_dev_nodes_live(vmid)
    state = wait_booted(vmid)
    log("container %s%s: systemd %s" % (vmid, " (unprivileged)" if unprivileged else "", state))


def ensure_pct():
    install_file(os.path.join(HERE, "pct"), PCT_PATH, 0o755)


def ensure_operator():
    """The non-root operator: ssh with the lab key, sudo for the pct wrapper and nothing else."""
    if subprocess.run(["id", "-u", OPERATOR], capture_output=True, check=False).returncode:
        run(["useradd", "--create-home", "--shell", "/bin/bash", OPERATOR])
    # '*': no password, yet not locked ('!'), so sshd (UsePAM no) lets the key in
    run(["usermod", "-p", "*", OPERATOR])
    os.makedirs(os.path.dirname(WRAPPER_PATH), exist_ok=True)
    install_file(os.path.join(HERE, "..", "extras", "dflash-pct-wrapper"), WRAPPER_PATH, 0o755)
    os.makedirs(os.path.dirname(PCT_ALLOWED), mode=0o755, exist_ok=True)
    if not os.path.exists(PCT_ALLOWED):
        write_allowed([])
    write_sudoers(SUDOERS, "# written by dflash.trainer lab/lab.py\n%s ALL=(root) NOPASSWD: %s\n"
                  % (OPERATOR, WRAPPER_PATH))


def read_allowed(path=PCT_ALLOWED):
    try:
        with open(path) as fh:
            return [w for line in fh for w in line.split("#", 1)[0].split()]
    except FileNotFoundError:
        return []


ALLOWED_HEADERS = {
    PCT_ALLOWED: "# containers the lab operator (%s) may reach through %s; lab.py allow\n" % (OPERATOR, WRAPPER_PATH),
    PCT_PRIVILEGED_ALLOWED: "# PRIVILEGED containers the lab operator (%s) may reach through %s - root in them is the "
                            "node's root; lab.py allow --privileged\n" % (OPERATOR, WRAPPER_PATH),
}


def write_allowed(ids, path=PCT_ALLOWED):
    write_text(path, ALLOWED_HEADERS[path] + "".join("%s\n" % i for i in sorted(set(ids), key=int)))


def allow(ids, remove, privileged=False):
    """Add ids to (or remove them from) the wrapper's list; --privileged: its privileged-allowed
    list, removed when it becomes empty (the wrapper's default: no such file)."""
    path = PCT_PRIVILEGED_ALLOWED if privileged else PCT_ALLOWED
    have = read_allowed(path)
    want = [i for i in have if i not in ids] if remove else have + ids
    if privileged and not want:
        if os.path.exists(path):
            os.unlink(path)
    else:
        os.makedirs(os.path.dirname(path), mode=0o755, exist_ok=True)
        write_allowed(want, path)
    log("%s: %s" % (path, " ".join(read_allowed(path)) or "(none)"))


def set_delay(seconds, ids):
    """pct's per-call delay (lab/pct reads it on every call): for ids, else for every call."""
    os.makedirs(PCT_CONF_DIR, exist_ok=True)
    for name in (["pct-delay.%s" % i for i in ids] if ids else ["pct-delay"]):
        path = os.path.join(PCT_CONF_DIR, name)
        if seconds == 0:
            if os.path.exists(path):
                os.unlink(path)
        else:
            write_text(path, "%g\n" % seconds)
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
    # Each `up` (every lab test file, every Molecule create) comes here while other tests connect: a file
    # is rewritten (atomically) only when it differs, and sshd reloaded only when its config did - a
    # reload re-executes sshd, and a connection made meanwhile is refused.
    write_if_changed(os.path.join(SSH_DIR, "authorized_keys"), pub)
    os.makedirs(os.path.dirname(OPERATOR_KEYS), mode=0o755, exist_ok=True)
    write_if_changed(OPERATOR_KEYS, 'from="127.0.0.1" ' + pub)
    write_known_hosts(hostkey + ".pub")
    cfg = os.path.join(SSH_DIR, "sshd_config")
    changed = write_if_changed(cfg, sshd_config())
    os.makedirs("/run/sshd", exist_ok=True)
    pid = sshd_pid()
    if changed or not pid:
        run(["/usr/sbin/sshd", "-t", "-f", cfg])
    if pid and changed:
        os.kill(pid, 1)  # SIGHUP: reread the config
    elif not pid:
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


def write_if_changed(path, text, mode=0o644):
    """Write ``text`` to ``path`` (atomically) unless it holds it already; whether it was written."""
    try:
        with open(path) as fh:
            if fh.read() == text and stat.S_IMODE(os.stat(path).st_mode) == mode:
                return False
    except OSError:
        pass
    write_text(path, text, mode)
    return True


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
    write_text(KNOWN_HOSTS, line)


def ssh_argv():
    return ["ssh", "-p", str(SSH_PORT), "-i", os.path.join(SSH_DIR, "id_ed25519"),
            "-o", "StrictHostKeyChecking=yes", "-o", "UserKnownHostsFile=" + KNOWN_HOSTS,
            "-o", "LogLevel=ERROR", "-o", "BatchMode=yes", "root@127.0.0.1"]


def write_facts(ids):
    facts = {"ssh_host": "127.0.0.1", "ssh_port": SSH_PORT, "ssh_user": "root",
             "ssh_private_key": os.path.join(SSH_DIR, "id_ed25519"), "known_hosts": KNOWN_HOSTS, "pct": PCT_PATH,
             "operator": {"ssh_user": OPERATOR, "pct_path": WRAPPER_PATH, "pct_sudo": True, "allowed": PCT_ALLOWED,
                          "privileged_allowed": PCT_PRIVILEGED_ALLOWED},
             "pve_lxc": PVE_LXC_DIR,
             "pct_delay_dir": PCT_CONF_DIR,
             "containers": sorted(set(ids) | set(lab_ids()), key=int),
             "unprivileged": [i for i in lab_ids() if container_kind(i) == "unprivileged"],
             "idmap": {"base": IDMAP_BASE, "count": IDMAP_COUNT}}
    with open(os.path.join(STATE_DIR, "lab.json"), "w") as fh:
        json.dump(facts, fh, indent=2)


def lab_ids():
    base = os.path.join(STATE_DIR, "ct")
    return sorted((d for d in os.listdir(base) if d.isdigit()), key=int) if os.path.isdir(base) else []


def wanted_kinds(ids, unprivileged):
    """{vmid: True (unprivileged) / False}: an existing container keeps its kind; asking for
    --unprivileged on a privileged one is refused (its upper layer holds files of host root)."""
    kinds = {}
    for vmid in ids:
        have = container_kind(vmid)
        if unprivileged and have == "privileged":
            raise SystemExit("lab: container %s exists and is privileged; `lab.py down --ids %s` first to "
                             "recreate it unprivileged (up never changes a container's kind)" % (vmid, vmid))
        kinds[vmid] = unprivileged or have == "unprivileged"
    return kinds


def reset(vmid):
    """Stop container vmid and drop its upper layer: its next start boots the cached rootfs as
    new (same id, kind, and extra LXC config), with nothing of earlier runs in it."""
    if lxc_running(vmid):
        run(["lxc-stop", "-n", vmid, "-k"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    for layer in ("upper", "work"):
        shutil.rmtree(os.path.join(STATE_DIR, "ct", vmid, layer), ignore_errors=True)
    if os.path.exists(os.path.join(STATE_DIR, "ct", vmid, "dev-missing")):  # every device node, as new
        os.unlink(os.path.join(STATE_DIR, "ct", vmid, "dev-missing"))
    log("container %s reset" % vmid)


def up(ids, unprivileged=False, fresh=False):
    kinds = wanted_kinds(ids, unprivileged)
    ensure_host_packages()
    ensure_sysctls()
    ensure_rootfs()
    if any(kinds.values()):
        ensure_shifted_rootfs()
    ensure_pct()
    ensure_operator()
    node.ensure_node_smi(OPERATOR)
    for vmid in ids:
        if fresh and container_kind(vmid):
            reset(vmid)
        ensure_container(vmid, kinds[vmid])
    ensure_sshd()
    write_facts(ids)
    record_up(ids)
    log("up: containers %s; try: %s pct exec %s -- nvidia-smi -L" % (" ".join(ids), " ".join(ssh_argv()), ids[0]))


def record_up(ids):
    """Name the containers brought up in the file $DFLASH_LAB_UP_RECORD (one id a line), when set: a
    lab test session sets it, and takes down exactly those at its end (tests/lab/conftest.py)."""
    path = os.environ.get("DFLASH_LAB_UP_RECORD")
    if path:
        with open(path, "a") as fh:
            fh.write("".join("%s\n" % vmid for vmid in ids))


def down(ids, purge):
    for vmid in ids:
        if lxc_running(vmid):
            run(["lxc-stop", "-n", vmid, "-k"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        shutil.rmtree(os.path.join(LXC_PATH, vmid), ignore_errors=True)
        if os.path.exists(pve_config_path(vmid)):
            os.unlink(pve_config_path(vmid))
        shutil.rmtree(os.path.join(STATE_DIR, "ct", vmid), ignore_errors=True)
        log("container %s removed" % vmid)
    if ids and os.path.exists(os.path.join(STATE_DIR, "lab.json")):
        write_facts([])  # lab.json names only the containers that are left
    if not lab_ids():
        pid = sshd_pid()
        if pid:
            os.kill(pid, 15)
            log("sshd stopped")
    if purge:
        shutil.rmtree(CACHE_DIR, ignore_errors=True)
        log("rootfs cache removed")


# -- real PyTorch in a container (issue 15 item 4; FIELD-NOTES "Real PyTorch in an LXC container") --
# Containers have no network: torch (CPU build) goes into a venv on the host, built once, bind-mounted
# read-only into the container, which runs it with its own /usr/bin/python3 and PYTHONPATH (the venv's
# python links to the host's interpreter). What inductor's C++ backend needs there - g++, Python.h,
# openssl - comes as .debs that the host's apt fetches (its configured mirror), for the closure the
# cached rootfs lacks.
TORCH_VERSION = os.environ.get("DFLASH_LAB_TORCH_VERSION", "2.13.0")
TORCH_WHEELS = "/opt/wheels"  # where this machine keeps the CPU build of it
TORCH_DIR = os.path.join(CACHE_DIR, "torch")  # venv/ and debs/
TORCH_MOUNT = "opt/dflash-lab-torch"  # in the container (lxc.mount.entry's form: no leading /)
TORCH_DEB_PACKAGES = ["g++", "python3-dev", "openssl"]


def extra_config_path(vmid):
    return os.path.join(STATE_DIR, "ct", vmid, "lxc-extra.conf")


def extra_config(vmid):
    """LXC config lines a lab subcommand added for this container (`torch`: its bind mount); every
    `up` keeps them."""
    try:
        with open(extra_config_path(vmid)) as fh:
            return fh.read()
    except FileNotFoundError:
        return ""


def rootfs_python():
    """'python3.11': the interpreter the containers run (the venv must be built for the same)."""
    return os.path.basename(os.path.realpath(os.path.join(rootfs_path(), "usr/bin/python3")))


def torch_site_packages(root="/" + TORCH_MOUNT):
    """The venv's site-packages as the container sees it: its PYTHONPATH for torch."""
    return os.path.join(root, "venv", "lib", rootfs_python(), "site-packages")


def apt_plan(text):
    """`apt-get -s install` output -> [[package, version]] it would install or upgrade (Inst lines)."""
    return [list(m) for m in re.findall(r"^Inst (\S+) (?:\[[^\]]*\] )?\((\S+)", text, re.M)]


def ensure_torch_venv():
    """torch==TORCH_VERSION in TORCH_DIR/venv, built once (its stamp is written last); seconds spent."""
    venv = os.path.join(TORCH_DIR, "venv")
    stamp = os.path.join(venv, ".dflash-lab-torch")
    try:
        with open(stamp) as fh:
            if fh.read().strip() == TORCH_VERSION:
                return 0.0
    except OSError:
        pass
    have = "python%d.%d" % sys.version_info[:2]
    if have != rootfs_python():
        raise SystemExit("lab: the containers run %s but lab.py runs %s: the torch venv must be built by the same "
                         "Python version" % (rootfs_python(), have))
    t0 = time.monotonic()
    shutil.rmtree(venv, ignore_errors=True)
    os.makedirs(TORCH_DIR, exist_ok=True)
    run([sys.executable, "-m", "venv", venv])
    want = "torch==" + TORCH_VERSION
    links = []
    if glob.glob(os.path.join(TORCH_WHEELS, "torch-%s+cpu-*.whl" % TORCH_VERSION)):
        want, links = want + "+cpu", ["--find-links", TORCH_WHEELS]
    else:
        log("no CPU build of torch %s in %s: pip takes the registry's (the CUDA build, several GB)"
            % (TORCH_VERSION, TORCH_WHEELS))
    log("torch venv: pip install %s into %s" % (want, venv))
    res = subprocess.run([os.path.join(venv, "bin", "python"), "-m", "pip", "install", "-q",
                          "--disable-pip-version-check"] + links + [want], capture_output=True, text=True, check=False)
    if res.returncode:  # pip's output only then: a machine's pip configuration may warn on every package
        raise SystemExit("lab: pip install %s failed: %s" % (want, (res.stdout + res.stderr).strip()[-3000:]))
    write_text(stamp, TORCH_VERSION + "\n")
    return time.monotonic() - t0


def _apt(argv, **kw):
    """An apt-get call; on failure (stale package lists) once more after `apt-get update`."""
    res = subprocess.run(argv, capture_output=True, text=True, check=False, **kw)
    if res.returncode:
        run(["apt-get", "update", "-qq"], stdout=subprocess.DEVNULL)
        res = subprocess.run(argv, capture_output=True, text=True, check=False, **kw)
    if res.returncode:
        raise SystemExit("lab: %s failed: %s" % (" ".join(argv[:3]), res.stderr.strip()[-2000:]))
    return res.stdout


def ensure_torch_debs():
    """The .debs of TORCH_DEB_PACKAGES and what they need beyond the cached rootfs, in TORCH_DIR/debs
    (apt-get download, fetched once); returns (file names, seconds spent)."""
    debs = os.path.join(TORCH_DIR, "debs")
    record = os.path.join(debs, "plan.json")
    try:
        with open(record) as fh:
            files = json.load(fh)["files"]
        if files and all(os.path.exists(os.path.join(debs, f)) for f in files):
            return files, 0.0
    except (OSError, ValueError, KeyError):
        pass
    t0 = time.monotonic()
    status_file = os.path.join(rootfs_path(), "var/lib/dpkg/status")
    plan = apt_plan(_apt(["apt-get", "-s", "-o", "Dir::State::status=" + status_file, "-o",
                          "APT::Install-Recommends=false", "install"] + TORCH_DEB_PACKAGES))
    if not plan:
        raise SystemExit("lab: apt plans nothing to install for %s over the rootfs" % " ".join(TORCH_DEB_PACKAGES))
    shutil.rmtree(debs, ignore_errors=True)
    os.makedirs(debs)
    _apt(["apt-get", "download", "-q"] + ["%s=%s" % (p, v) for p, v in plan], cwd=debs)
    files = sorted(f for f in os.listdir(debs) if f.endswith(".deb"))
    write_text(record, json.dumps({"packages": TORCH_DEB_PACKAGES, "plan": plan, "files": files}, indent=1))
    log("torch debs: %d packages fetched in %.1f s (%s)" % (len(files), time.monotonic() - t0, debs))
    return files, time.monotonic() - t0


def attach(vmid, *cmd, **kw):
    kw.setdefault("capture_output", True)
    kw.setdefault("text", True)
    kw.setdefault("check", False)
    return run(["lxc-attach", "-n", vmid, "--", "env", "PATH=/usr/sbin:/usr/bin:/sbin:/bin"] + list(cmd), **kw)


def ensure_torch_container(vmid):
    """The venv mounted (the container restarted when it runs without the mount) and the .debs
    installed; seconds spent installing (0: already there)."""
    stamp = "/%s/venv/.dflash-lab-torch" % TORCH_MOUNT
    if attach(vmid, "test", "-f", stamp).returncode:
        log("container %s: restarting it with %s mounted" % (vmid, "/" + TORCH_MOUNT))
        run(["lxc-stop", "-n", vmid, "-t", "30"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        run(["lxc-start", "-n", vmid, "-d"])
        wait_booted(vmid)
        if attach(vmid, "test", "-f", stamp).returncode:
            raise SystemExit("lab: container %s does not see %s after its restart" % (vmid, stamp))
    states = attach(vmid, "dpkg-query", "-W", "-f=${Status}\n", *TORCH_DEB_PACKAGES).stdout.split("\n")
    spent = 0.0
    if [s for s in states if s] != ["install ok installed"] * len(TORCH_DEB_PACKAGES):
        t0 = time.monotonic()
        res = attach(vmid, "sh", "-c", 'DEBIAN_FRONTEND=noninteractive dpkg -i "$1"/debs/*.deb', "sh",
                     "/" + TORCH_MOUNT)
        if res.returncode:
            raise SystemExit("lab: container %s: dpkg -i of the torch debs failed: %s"
                             % (vmid, (res.stdout + res.stderr)[-2000:]))
        spent = time.monotonic() - t0
        log("container %s: %s installed in %.1f s" % (vmid, " ".join(TORCH_DEB_PACKAGES), spent))
    probe = attach(vmid, "env", "PYTHONPATH=" + torch_site_packages(), "python3", "-c",
                   "import torch, sysconfig, os, shutil; print(torch.__version__); "
                   "assert os.path.exists(os.path.join(sysconfig.get_path('include'), 'Python.h')), 'no Python.h'; "
                   "assert shutil.which('g++') and shutil.which('openssl'), 'no g++ or openssl'")
    if probe.returncode:
        raise SystemExit("lab: container %s cannot run torch: %s" % (vmid, probe.stderr.strip()[-2000:]))
    log("container %s: torch %s with PYTHONPATH=%s" % (vmid, probe.stdout.strip(), torch_site_packages()))
    return spent


def torch_up(ids):
    """`lab.py torch`: containers ids up with real PyTorch (CPU) available read-only."""
    ensure_host_packages()
    ensure_rootfs()
    venv_s = ensure_torch_venv()
    _files, debs_s = ensure_torch_debs()
    line = "lxc.mount.entry = %s %s none bind,ro,create=dir 0 0\n" % (TORCH_DIR, TORCH_MOUNT)
    for vmid in ids:
        os.makedirs(os.path.join(STATE_DIR, "ct", vmid), exist_ok=True)
        have = extra_config(vmid)
        if line not in have:
            write_text(extra_config_path(vmid), have + line)
    up(ids)
    install_s = {vmid: ensure_torch_container(vmid) for vmid in ids}
    log("torch: venv %s, debs %s, container install %s" % (
        "built in %.1f s" % venv_s if venv_s else "cached", "fetched in %.1f s" % debs_s if debs_s else "cached",
        ", ".join("%s %.1f s" % kv for kv in install_s.items())))


# -- trainer groups: one rendezvous directory shared by several containers (they have no network) --
RDZV_DIR = os.path.join(STATE_DIR, "rdzv")  # RDZV_DIR/<name> on the host
RDZV_MOUNT = "mnt/dflash-rdzv"  # in each container of the group (lxc.mount.entry's form)
RDZV_MARK = ".dflash-lab-group"  # holds the group's name: a container sees its group's directory
GROUP_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")


def rdzv_line(name):
    return "lxc.mount.entry = %s %s none bind,rw,create=dir 0 0\n" % (os.path.join(RDZV_DIR, name), RDZV_MOUNT)


def with_rdzv_line(text, line):
    """Extra config text with ``line`` as its one rendezvous mount (a container is in one group at a
    time: an earlier group's line goes), every other line (torch's mount) kept in place."""
    kept = [x for x in text.splitlines(True)
            if not (x.startswith("lxc.mount.entry") and (" %s " % RDZV_MOUNT) in x)]
    if kept and not kept[-1].endswith("\n"):
        kept[-1] += "\n"
    return "".join(kept) + line


def group_up(name, ids, fresh=False):
    """`lab.py group`: containers ids up, each with RDZV_DIR/<name> (0700, the containers' root)
    bind-mounted read-write at /RDZV_MOUNT; fresh: fresh containers and an empty directory."""
    if not GROUP_NAME.match(name):
        raise SystemExit("lab: invalid group name %r: letters, digits, '_', '.', '-' (64 at most)" % name)
    kinds = {vmid: container_kind(vmid) for vmid in ids}
    unpriv = sorted(v for v, k in kinds.items() if k == "unprivileged")
    if unpriv and len(unpriv) != len(ids):
        raise SystemExit("lab: group %s mixes unprivileged containers (%s) with privileged ones: their roots "
                         "are different owners of one directory" % (name, " ".join(unpriv)))
    root_id = IDMAP_BASE if unpriv else 0
    path = os.path.join(RDZV_DIR, name)
    os.makedirs(RDZV_DIR, mode=0o755, exist_ok=True)
    os.makedirs(path, mode=0o700, exist_ok=True)
    os.chown(path, root_id, root_id)
    os.chmod(path, 0o700)
    if fresh:
        for entry in os.listdir(path):
            full = os.path.join(path, entry)
            if os.path.isdir(full) and not os.path.islink(full):
                shutil.rmtree(full)
            else:
                os.unlink(full)
    write_text(os.path.join(path, RDZV_MARK), name + "\n")
    line = rdzv_line(name)
    for vmid in ids:
        os.makedirs(os.path.join(STATE_DIR, "ct", vmid), exist_ok=True)
        have = extra_config(vmid)
        want = with_rdzv_line(have, line)
        if want != have:
            write_text(extra_config_path(vmid), want)
    up(ids, fresh=fresh)
    mark = "/%s/%s" % (RDZV_MOUNT, RDZV_MARK)
    for vmid in ids:  # a container that ran before its line was added needs a restart to mount it
        if attach(vmid, "cat", mark).stdout.strip() != name:
            log("container %s: restarting it with %s mounted" % (vmid, "/" + RDZV_MOUNT))
            run(["lxc-stop", "-n", vmid, "-t", "30"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            run(["lxc-start", "-n", vmid, "-d"])
            wait_booted(vmid)
            if attach(vmid, "cat", mark).stdout.strip() != name:
                raise SystemExit("lab: container %s does not see group %s at /%s after its restart"
                                 % (vmid, name, RDZV_MOUNT))
    log("group %s: containers %s share %s at /%s" % (name, " ".join(ids), path, RDZV_MOUNT))


# -- a container's LXC config lines of the lab's subcommands (cgroup-layout, bind): applied at the next start --
def set_extra_lines(vmid, drop, add):
    """The container's extra LXC config without the lines ``drop(line)`` selects, plus ``add`` (lines, each
    ending in a newline); True when it changed (a running container takes it at its next start)."""
    if not container_kind(vmid):
        raise SystemExit("lab: no lab container %s" % vmid)
    have = extra_config(vmid)
    kept = [x if x.endswith("\n") else x + "\n" for x in have.splitlines(True) if not drop(x)]
    want = "".join(kept + add)
    if want == have:
        return False
    write_text(extra_config_path(vmid), want)
    return True


def restart_changed(changed):
    """Containers whose LXC config changed, brought up with it: a running one is stopped first (its layout and
    its mounts apply only at a start)."""
    for vmid in changed:
        if lxc_running(vmid):
            log("container %s: restarting it with its new LXC config" % vmid)
            run(["lxc-stop", "-n", vmid, "-t", "30"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


# Proxmox VE's cgroup layout for a container (pve-container, src/PVE/LXC.pm update_lxc_config, for LXC >= 4): the
# monitor in lxc.monitor/<vmid>, the container in lxc/<vmid>, its own init and everything under it one level
# deeper, in lxc/<vmid>/ns (lxc.cgroup.dir.container.inner: a cgroup namespace the container cannot climb out of).
# Plain LXC (the lab's default) puts it in lxc.payload.<vmid> (lxc.monitor.<vmid> for the monitor).
CGROUP_KEYS = ("lxc.cgroup.relative", "lxc.cgroup.dir.")


def proxmox_cgroup_lines(vmid):
    return ["lxc.cgroup.relative = 0\n", "lxc.cgroup.dir.monitor = lxc.monitor/%s\n" % vmid,
            "lxc.cgroup.dir.container = lxc/%s\n" % vmid, "lxc.cgroup.dir.container.inner = ns\n"]


def running_cgroup(vmid):
    """The cgroup path of the container's init, as the node's /proc shows it: the unified line (cgroup v2, a
    hybrid host), else the v1 freezer's; None when it is not running."""
    pid = subprocess.run(["lxc-info", "-n", vmid, "-p", "-H"], capture_output=True, text=True, check=False).stdout.strip()
    try:
        with open("/proc/%s/cgroup" % pid) as fh:
            rows = [line.rstrip("\n").split(":", 2) for line in fh if line.count(":") >= 2]
    except OSError:
        return None
    paths = {hier: path for _n, hier, path in rows}
    return paths.get("", paths.get("freezer"))


def set_cgroup_layout(layout, ids):
    """`lab.py cgroup-layout proxmox|lxc`: the containers' cgroups where Proxmox VE puts them (lxc/<vmid>/ns) or
    where plain LXC does (lxc.payload.<vmid>); LXC itself makes them at the container's (re)start."""
    version = subprocess.run(["lxc-start", "--version"], capture_output=True, text=True, check=False).stdout.strip()
    if layout == "proxmox" and not re.match(r"^([4-9]|\d\d+)\.", version):
        raise SystemExit("lab: LXC %s has no lxc.cgroup.dir.container (LXC 4.0 or later): no Proxmox layout" % version)
    changed = [vmid for vmid in ids
               if set_extra_lines(vmid, lambda x: x.startswith(CGROUP_KEYS),
                                  proxmox_cgroup_lines(vmid) if layout == "proxmox" else [])]
    restart_changed(changed)
    up(ids)
    for vmid in ids:
        path = running_cgroup(vmid) or ""
        want = "/lxc/%s/ns/" % vmid if layout == "proxmox" else "/lxc.payload.%s" % vmid
        if not path.startswith(want):
            raise SystemExit("lab: container %s runs in cgroup %r, not under %s" % (vmid, path, want))
        log("container %s: %s layout, init in cgroup %s" % (vmid, layout, path))


def bind_line(source, target):
    return "lxc.mount.entry = %s %s none bind,rw,create=dir 0 0\n" % (source, target)


def set_bind(source, target, ids, remove=False):
    """`lab.py bind`: the node's directory ``source`` bind-mounted at /``target`` in the containers, as a Proxmox
    mount point of a node path (`mpN: /node/dir,mp=/target`) - not id-mapped: in an unprivileged container a
    node file whose owner its id map does not cover (the node's root) shows as nobody (uid 65534)."""
    target = target.strip("/")
    if not os.path.isabs(source) or not os.path.isdir(source) or any(c.isspace() for c in source + target):
        raise SystemExit("lab: bind needs an existing absolute node directory and a target, without spaces")
    if not target or ".." in target.split("/"):
        raise SystemExit("lab: invalid bind target %r" % target)
    changed = [vmid for vmid in ids
               if set_extra_lines(vmid, lambda x: x.startswith("lxc.mount.entry") and (" %s " % target) in x,
                                  [] if remove else [bind_line(source, target)])]
    restart_changed(changed)
    up(ids)
    log("containers %s: %s %s /%s" % (" ".join(ids), source, "unbound from" if remove else "bound at", target))


def status():
    for vmid in lab_ids():
        print("%s %s %s" % (vmid, "running" if lxc_running(vmid) else "stopped", container_kind(vmid)))
    print("sshd %s" % ("running pid %d" % sshd_pid() if sshd_pid() else "stopped"))


def _errno_arg(text):
    if text != "off" and not (text.isdigit() and int(text) < 256):
        raise argparse.ArgumentTypeError("an errno 0-255 or off")
    return text


def _lock_arg(text):
    if not re.fullmatch(r"[a-z][a-z-]*", text):
        raise argparse.ArgumentTypeError("a Proxmox lock name (backup, migrate, snapshot, ...) or off")
    return text


def main(argv=None):
    p = argparse.ArgumentParser(prog="lab", description=__doc__.split("\n", maxsplit=1)[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    for name in ("up", "down"):
        s = sub.add_parser(name)
        s.add_argument("--ids", nargs="+", default=None, help="container ids (default: 200 for up, all for down)")
        if name == "down":
            s.add_argument("--purge", action="store_true", help="also remove the cached rootfs")
        else:
            s.add_argument("--unprivileged", action="store_true",
                           help="new containers unprivileged (idmap 0 %d %d), as Proxmox's default; "
                                "an existing container keeps its kind" % (IDMAP_BASE, IDMAP_COUNT))
            s.add_argument("--fresh", action="store_true",
                           help="boot each container as new: stop it and drop everything earlier runs left in it "
                                "(a test's known start; its kind and extra config stay)")
    sub.add_parser("status")
    a = sub.add_parser("allow", help="containers the operator's pct wrapper may reach")
    a.add_argument("--ids", nargs="+", required=True)
    a.add_argument("--remove", action="store_true")
    a.add_argument("--privileged", action="store_true",
                   help="the list of privileged containers it may reach (%s): the node's root for the operator"
                        % PCT_PRIVILEGED_ALLOWED)
    d = sub.add_parser("delay", help="seconds each pct call waits first (Proxmox's start-up); 0: none")
    d.add_argument("seconds", type=float)
    d.add_argument("--ids", nargs="+", default=None, help="only these containers (default: every call)")
    e = sub.add_parser("pct-errno", help="pct's errors for these containers exit as Proxmox's Perl does: die with "
                                         "errno N current (0: 255), a missing config 2; off: always 255")
    e.add_argument("value", type=_errno_arg)
    e.add_argument("--ids", nargs="+", required=True)
    lk = sub.add_parser("lock", help="a Proxmox config lock on these containers (backup, migrate, snapshot, ...); off: none")
    lk.add_argument("name", type=_lock_arg)
    lk.add_argument("--ids", nargs="+", required=True)
    dn = sub.add_parser("dev-nodes", help="the /dev/nvidia* device nodes these containers get from the node "
                                          "(bind-mounted; all by default): --missing NAME... leaves those out")
    dn.add_argument("--ids", nargs="+", required=True)
    dn.add_argument("--missing", nargs="*", default=[], help="e.g. nvidia-uvm (as after a node reboot)")
    g = sub.add_parser("node-gpus", help="containers whose simulated GPUs are the node's (its nvidia-smi shows "
                                         "their holders under host PIDs); no --ids: none")
    g.add_argument("--ids", nargs="*", default=[])
    cg = sub.add_parser("cgroup-layout", help="where LXC puts these containers' cgroups from their next start on: "
                                              "proxmox - lxc/<vmid>/ns, as Proxmox VE's pve-container configures LXC "
                                              "(lxc.cgroup.dir.container, .inner); lxc - lxc.payload.<vmid> (the default); "
                                              "a running container is restarted")
    cg.add_argument("layout", choices=("proxmox", "lxc"))
    cg.add_argument("--ids", nargs="+", required=True)
    bd = sub.add_parser("bind", help="a node directory bind-mounted into these containers, not id-mapped (a Proxmox "
                                     "mount point of a node path); a running container is restarted")
    bd.add_argument("--source", required=True, help="the node's directory (absolute)")
    bd.add_argument("--target", required=True, help="where the containers see it, e.g. /mnt/logs")
    bd.add_argument("--ids", nargs="+", required=True)
    bd.add_argument("--remove", action="store_true", help="the mount at --target taken out again")
    t = sub.add_parser("torch", help="real PyTorch (CPU) in these containers: a venv built once on the host, "
                                     "bind-mounted read-only at /%s, and a C++ compiler, the Python headers and "
                                     "openssl from .debs fetched on the host" % TORCH_MOUNT)
    t.add_argument("--ids", nargs="+", required=True)
    gr = sub.add_parser("group", help="a trainer group: these containers share one rendezvous directory, %s/NAME "
                                      "bind-mounted read-write at /%s, and are brought up" % (RDZV_DIR, RDZV_MOUNT))
    gr.add_argument("--name", required=True)
    gr.add_argument("--ids", nargs="+", required=True)
    gr.add_argument("--fresh", action="store_true", help="fresh containers (as up --fresh) and an empty directory")
    args = p.parse_args(argv)
    if os.geteuid() != 0:
        raise SystemExit("lab: must run as root (LXC containers, /usr/sbin/pct, sshd)")
    if args.cmd in ("up", "down", "allow", "delay", "node-gpus", "torch", "group", "pct-errno", "lock", "dev-nodes", "cgroup-layout", "bind") and args.ids:
        bad = [i for i in args.ids if not i.isdigit() or not 100 <= int(i) <= 999999999]
        if bad:
            raise SystemExit("lab: invalid container id(s) %s: Proxmox ids are integers >= 100" % ", ".join(bad))
    # One lab.py at a time: the lab's shared state (lab.json, known_hosts, the allow lists, the node's
    # tenants, the cached rootfs) is read-modify-written, and tests may run in parallel (make test-lab).
    os.makedirs(STATE_DIR, exist_ok=True)
    with open(os.path.join(STATE_DIR, "lab.lock"), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        return run_command(args)


def run_command(args):
    if args.cmd == "up":
        up(args.ids or ["200"], args.unprivileged, args.fresh)
    elif args.cmd == "down":
        down(args.ids or lab_ids(), args.purge)
    elif args.cmd == "allow":
        allow(args.ids, args.remove, args.privileged)
    elif args.cmd == "torch":
        torch_up(args.ids)
    elif args.cmd == "group":
        group_up(args.name, args.ids, args.fresh)
    elif args.cmd == "node-gpus":
        node.set_tenants(args.ids)
    elif args.cmd == "pct-errno":
        set_pct_errno(args.value, args.ids)
    elif args.cmd == "dev-nodes":
        set_dev_nodes(args.ids, args.missing)
    elif args.cmd == "lock":
        set_lock(args.name, args.ids)
    elif args.cmd == "cgroup-layout":
        set_cgroup_layout(args.layout, args.ids)
    elif args.cmd == "bind":
        set_bind(args.source, args.target, args.ids, args.remove)
    elif args.cmd == "delay":
        if args.seconds < 0:
            raise SystemExit("lab: the delay is seconds >= 0")
        set_delay(args.seconds, args.ids or [])
    else:
        status()
    return 0


if __name__ == "__main__":
    sys.exit(main())
