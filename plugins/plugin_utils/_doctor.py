# -*- coding: utf-8 -*-
# Copyright: dflash.trainer maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The doctor's judgement (playbooks/doctor.yml, `dflash-trainer doctor`): every assumption the collection
makes about a node and its container, one check each, read-only.

Two shell scripts ask (``node_script`` on the node over the connection's plain ssh, ``container_script``
through ``pct exec``, the latter only when ``enter`` says so: ``container_answer``); each prints sections
``@@dflash-doctor NAME``, the output, ``@@dflash-doctor-rc NAME RC``. ``judge`` reads both answers (as Ansible's
``raw`` results: rc/stdout, or unreachable/msg when the transport failed - the container's made so by
``answered`` and ``unreachable``) with the controller's clock around the container's and returns the checks in
order, each ``{name, mark, detail, remedy}``: mark "✓" holds, "✗" does not (with the remedy), "?" not checked (a check
before it failed, or the node would not say). Pure: the unit test drives it with recorded outputs.

``record`` (``judged``: with the report) keeps what the node and the container answered (the raw results' fields ``judge`` reads, the
clock around them, the judge's parameters) with the lines judged from it, the trainer's environment values
masked: `dflash-trainer doctor --record DIR` writes one per host, and ``replay`` judges it again - a node's
answers become a unit test's fixture (tests/unit/fixtures/doctor/).
"""
from __future__ import annotations

import re
import shlex

from ansible_collections.dflash.trainer.plugins.connection.pct import pct_refusal
from ansible_collections.dflash.trainer.plugins.module_utils.target import nvidia_smi as _nvidia_smi
from ansible_collections.dflash.trainer.plugins.module_utils.target.node_gpu import in_container
from ansible_collections.dflash.trainer.plugins.module_utils.target.secrets import mask
from ansible_collections.dflash.trainer.plugins.plugin_utils import _freezer

OK, BAD, UNKNOWN = "✓", "✗", "?"
# exit codes as dflash_trainer/results.py's: 0 every assumption holds, 1 one does not, 3 the node unreachable
EXIT_OK, EXIT_FAILED, EXIT_UNREACHABLE = 0, 1, 3
MIN_FREE_MIB = 2048  # room for a release or two (the code, a virtualenv's worth) under trainer_root
MAX_SKEW_S = 5.0  # the proof compares the container's journal and log times with the controller's
SECTION = "@@dflash-doctor "
SECTION_RC = "@@dflash-doctor-rc "
_FUNC = ("s() { n=$1; shift; printf '%s%%s\\n' \"$n\"; \"$@\" </dev/null 2>&1; r=$?; "
         "printf '\\n%s%%s %%s\\n' \"$n\" \"$r\"; }; " % (SECTION, SECTION_RC))
_SYSTEMD_OK = ("running", "degraded")
# every check, in the order judge returns them
NAMES = ("ssh", "privilege", "pct", "container", "lock", "cgroup", "pct exec", "systemd", "python", "nvidia-smi",
         "GPU pairing", "device nodes", "free space", "clock")


def _q(*argv):
    return " ".join(shlex.quote(str(a)) for a in argv)


def node_script(vmid, pct_path="/usr/sbin/pct", sudo=False, node_nvidia_smi="nvidia-smi"):
    """The shell script run on the node (as the ssh user, no sudo of ours but pct's)."""
    pct = ["sudo", "-n", pct_path] if sudo else [pct_path]
    parts = [_FUNC, "s id sh -c 'id -u; id -un'; ", "s pct test -x %s; " % _q(pct_path)]
    if sudo:
        parts.append("s sudo sudo -n -l %s; " % _q(pct_path))
    parts += ["s version pveversion; ", "s status %s; " % _q(*pct + ["status", vmid]),
              "s list %s; " % _q(*pct + ["list"]), "s cgroup %s; " % _q(*_freezer.cgroup_argv(vmid)),
              "s nodesmi %s; " % _q(*_nvidia_smi.list_argv(node_nvidia_smi)), "true"]
    return "".join(parts)


def container_script(trainer_root="/opt/dflash-trainer", python="/usr/bin/python3", nvidia_smi="nvidia-smi"):
    """The shell script run in the container (through pct exec)."""
    dev = ("for f in /dev/nvidia*; do [ -e \"$f\" ] || continue; if [ -c \"$f\" ]; then k=chr; "
           "elif [ -f \"$f\" ] && [ ! -s \"$f\" ]; then k=empty; else k=other; fi; echo \"${f#/dev/} $k\"; done")
    df = 'd=$1; while [ ! -d "$d" ]; do d=$(dirname "$d"); done; echo "$d"; df -Pk "$d"'
    return "".join([
        _FUNC, "s pid1 cat /proc/1/comm; ", "s systemd systemctl is-system-running; ",
        "s python test -x %s; " % _q(python),
        "s smi %s; " % _q(*_nvidia_smi.list_argv(nvidia_smi)),
        "s dev sh -c %s; " % _q(dev), "s df sh -c %s sh %s; " % (_q(df), _q(trainer_root)),
        "s date date +%s.%N; true"])


def script(where, **kw):
    """The shell script that asks the node (WHERE ``node``: vmid, pct_path, sudo, node_nvidia_smi) or the container
    (WHERE ``container``: trainer_root, python, nvidia_smi); an empty value is its default. The role's node task
    has it from the filter dflash.trainer.trainer_doctor_script, the trainer_doctor action the container's."""
    if where == "node":
        return node_script(kw["vmid"], kw.get("pct_path") or "/usr/sbin/pct", bool(kw.get("sudo")),
                           kw.get("node_nvidia_smi") or "nvidia-smi")
    return container_script(kw.get("trainer_root") or "/opt/dflash-trainer", kw.get("python") or "/usr/bin/python3",
                            kw.get("nvidia_smi") or "nvidia-smi")


def sections(stdout):
    """{name: (rc, text)} of a script's output (rc None when the section did not end)."""
    out, name, lines = {}, None, []
    for line in (stdout or "").replace("\r\n", "\n").split("\n"):
        if line.startswith(SECTION_RC) and name is not None:
            parts = line[len(SECTION_RC):].split()
            rc = int(parts[1]) if len(parts) > 1 and parts[1].isdigit() else None
            out[name] = (rc, "\n".join(lines).strip("\n"))
            name, lines = None, []
        elif line.startswith(SECTION):
            name, lines = line[len(SECTION):].strip(), []
        elif name is not None:
            lines.append(line)
    if name is not None:
        out[name] = (None, "\n".join(lines).strip("\n"))
    return out


def check(name, mark, detail, remedy=""):
    return {"name": name, "mark": mark, "detail": detail, "remedy": remedy if mark == BAD else ""}


def _first_line(text):
    lines = [x.strip() for x in (text or "").splitlines() if x.strip()]
    return lines[-1] if lines else "(no output)"


def _transport_remedy(msg, host):
    if "host key" in msg:
        if "CHANGED" in msg:
            return "compare the node's key fingerprint on its console before replacing its known_hosts line"
        return ("record the node's key after comparing its fingerprint: ssh-keyscan %s, ssh-keygen -lf, then "
                "known_hosts (or ansible_pct_known_hosts_file); docs/real-host.md" % host)
    if "authentication" in msg:
        return "install your public key for the ssh user on the node (ssh-copy-id), or set ansible_ssh_private_key_file"
    if "timed out" in msg:
        return "the node answered too slowly: check its load, or raise pct_command_timeout"
    return "check ansible_host / ansible_port, that the node is up and that its sshd listens there"


def judge_ssh(node, host, user):
    """The first check: the node reached over ssh with its host key accepted."""
    if node.get("unreachable") or (node.get("failed") and "stdout" not in node):
        msg = re.sub(r"^Task failed: ", "", " ".join(str(node.get("msg") or "unreachable").split()))
        return check("ssh", BAD, msg, _transport_remedy(msg, host))
    if SECTION not in (node.get("stdout") or ""):
        return check("ssh", BAD, "%s@%s logged in, but the node ran no command (exit %s): %s" % (
            user, host, node.get("rc"), _first_line((node.get("stdout") or "") + "\n" + (node.get("stderr") or ""))),
            "the ssh user needs a login shell on the node (`chsh -s /bin/bash USER`)")
    return check("ssh", OK, "%s@%s reached, host key accepted" % (user or "(default user)", host))


def judge_privilege(sec, user, sudo, pct_path):
    rc, text = sec.get("id", (None, ""))
    ids = text.split()
    if rc != 0 or not ids:
        return check("privilege", UNKNOWN, "`id` did not answer on the node: %s" % _first_line(text))
    if ids[0] == "0":
        return check("privilege", OK, "root on the node: pct runs without sudo")
    who = ids[1] if len(ids) > 1 else user
    if not sudo:
        return check("privilege", BAD, "%s is not root on the node and pct_sudo is false" % who,
                     "log in as root (ansible_user: root), or set pct_sudo: true with a sudo rule for %s "
                     "(docs/real-host.md)" % pct_path)
    rc, text = sec.get("sudo", (None, ""))
    if rc == 0:
        return check("privilege", OK, "%s may run %s through sudo -n" % (who, pct_path))
    if rc == 127:
        return check("privilege", BAD, "sudo is not installed on the node: %s" % _first_line(text),
                     "apt install sudo on the node and add the rule for %s (docs/real-host.md), or log in as root"
                     % pct_path)
    return check("privilege", BAD, "sudo -n refuses %s for %s: %s" % (pct_path, who, _first_line(text)),
                 "add a NOPASSWD sudo rule for %s: `%s ALL=(root) NOPASSWD: %s` (docs/real-host.md)"
                 % (who, who, pct_path))


def judge_pct(sec, pct_path):
    rc, _text = sec.get("pct", (None, ""))
    if rc != 0:
        return check("pct", BAD, "no executable %s on the node" % pct_path,
                     "set pct_path to where pct is (a Proxmox VE node has /usr/sbin/pct)")
    vrc, version = sec.get("version", (None, ""))
    version = _first_line(version) if vrc == 0 else ""
    return check("pct", OK, "%s present%s" % (pct_path, " (%s)" % version if version else ""))


def _list_row(text, vmid):
    for line in (text or "").splitlines():
        cells = line.split()
        if cells[:1] == [str(vmid)]:
            return cells
    return None


def judge_container(sec, vmid, host):
    """(running check, lock check) from `pct status VMID` and `pct list`."""
    rc, text = sec.get("status", (None, ""))
    refusal = pct_refusal(text, host, str(vmid))
    if refusal and "locked" not in refusal:
        remedy = ("start it: `pct start %s` on the node" % vmid if "not running" in refusal
                  else "check proxmox_vmid (`pct list` on the node lists the containers)")
        running = check("container", BAD, refusal, remedy)
    elif rc == 0 and re.search(r"^status:\s*running\s*$", text, re.M):
        running = check("container", OK, "%s exists and is running" % vmid)
    elif rc == 0 and re.search(r"^status:\s*\w+", text, re.M):
        running = check("container", BAD, "container %s is not running (%s)" % (vmid, _first_line(text)),
                        "start it: `pct start %s` on the node" % vmid)
    else:
        running = check("container", UNKNOWN, "`pct status %s` did not answer (exit %s): %s" % (
            vmid, rc, _first_line(text)))
    lrc, ltext = sec.get("list", (None, ""))
    row = _list_row(ltext, vmid) if lrc == 0 else None
    if row is None:
        lock = check("lock", UNKNOWN, "not read: `pct list` %s" % (
            "does not list %s" % vmid if lrc == 0 else "answered exit %s: %s" % (lrc, _first_line(ltext))))
    elif len(row) >= 4:
        lock = check("lock", BAD, "container %s is locked by Proxmox (lock: %s)" % (vmid, row[2]),
                     "wait for the %s to end, or `pct unlock %s` on the node if nothing holds it" % (row[2], vmid))
    else:
        lock = check("lock", OK, "no Proxmox lock on %s" % vmid)
    return running, lock


def judge_cgroup(sec, vmid):
    """The container's cgroup on the node: found where the node view looks for it (Proxmox's lxc/<vmid>/ns,
    plain LXC's lxc.payload.<vmid>), and not frozen."""
    rc, text = sec.get("cgroup", (None, ""))
    found, frozen = _freezer.cgroups(text)
    if rc is None:
        return check("cgroup", UNKNOWN, "not read")
    if frozen:
        return check("cgroup", BAD, "container %s is frozen (%s): pct exec would hang in it, a trainer "
                     "in it stands still" % (vmid, frozen[0]),
                     "a suspend-mode backup (vzdump --mode suspend) thaws it when it ends; if nothing is backing "
                     "it up, `lxc-unfreeze -n %s` on the node" % vmid)
    if not found:
        return check("cgroup", UNKNOWN, "no cgroup of container %s under /sys/fs/cgroup/lxc/%s or "
                     "/sys/fs/cgroup/lxc.payload.%s: the node view (trainer_gpu_host_view) would attribute none of "
                     "its processes" % (vmid, vmid, vmid))
    shown = [d for d in found if "/freezer/" not in d] or found  # the unified hierarchy's, deepest last
    layout = "Proxmox VE's" if "/lxc/%s" % vmid in shown[-1] else "LXC's"
    return check("cgroup", OK, "%s, %s layout, as the node view reads it; not frozen" % (shown[-1], layout))


def judge_gpu_pairing(csec, nsec, node_nvidia_smi="nvidia-smi"):
    """The container's GPUs paired with the node's by UUID: the container numbers the GPUs it was given 0..k-1,
    the node by slot, and the node view (trainer_gpu_host_view) judges the node's GPU of each UUID."""
    crc, ctext = csec.get("smi", (None, ""))
    nrc, ntext = nsec.get("nodesmi", (None, ""))
    if crc != 0 and not _nvidia_smi.warning_message(crc, ctext):
        return check("GPU pairing", UNKNOWN, "not paired: nvidia-smi in the container did not list its GPUs")
    if nrc == 127:
        return check("GPU pairing", UNKNOWN, "not paired: no %s on the node (the node view needs it: "
                     "trainer_node_nvidia_smi)" % node_nvidia_smi)
    if nrc != 0 and not _nvidia_smi.warning_message(nrc, ntext):
        return check("GPU pairing", UNKNOWN, "not paired: the node's %s answered exit %s: %s" % (
            node_nvidia_smi, nrc, _first_line(ntext)))
    try:
        mine = _nvidia_smi.parse_list(_gpu_lines(ctext))
        node = _nvidia_smi.parse_list(_gpu_lines(ntext))
    except _nvidia_smi.NvidiaSmiError as exc:
        return check("GPU pairing", UNKNOWN, "not paired: %s" % exc)
    if not mine or not node:
        return check("GPU pairing", UNKNOWN, "not paired: %s lists no GPU" % (
            "the container" if not mine else "the node's %s" % node_nvidia_smi))
    paired, unpaired = in_container(node, mine)  # the node view's own pairing
    if unpaired:
        return check("GPU pairing", BAD, "the node does not list the container's %s" % ", ".join(unpaired),
                     "the container's GPUs are not this node's as its nvidia-smi lists them: check "
                     "trainer_node_nvidia_smi and the container's GPU device entries in /etc/pve/lxc/<vmid>.conf")
    if all(g["slot"] == g["index"] for g in paired):
        return check("GPU pairing", OK, "the container's %d GPU(s) are the node's, numbered alike" % len(paired))
    return check("GPU pairing", OK, "by UUID: %s" % ", ".join(
        "GPU %d is the node's GPU %d" % (g["index"], g["slot"]) for g in paired))


def _gpu_lines(text):
    """The ``GPU n: ... (UUID: ...)`` and MIG lines of an nvidia-smi -L answer (a warning may come with them)."""
    return "\n".join(row for row in (text or "").splitlines() if re.match(r"^\s*(GPU|MIG) ", row))


def judge_exec(ct, vmid):
    if ct.get("unreachable") or (ct.get("failed") and "stdout" not in ct):
        msg = re.sub(r"^Task failed: ", "", " ".join(str(ct.get("msg") or "unreachable").split()))
        return check("pct exec", BAD, msg, "see the lines above; the container must run and pct exec reach it")
    return check("pct exec", OK, "reaches container %s" % vmid)


def judge_systemd(sec):
    _rc, comm = sec.get("pid1", (None, ""))
    comm = comm.strip()
    if comm != "systemd":
        return check("systemd", BAD, "PID 1 in the container is %r, not systemd" % (comm or "unknown"),
                     "the trainer runs as a systemd unit: use a container template whose init is systemd")
    _rc, state = sec.get("systemd", (None, ""))
    state = _first_line(state)
    if state in _SYSTEMD_OK:
        extra = " (some unit failed: `systemctl --failed` names it)" if state == "degraded" else ""
        return check("systemd", OK, "PID 1, is-system-running: %s%s" % (state, extra))
    if state in ("initializing", "starting"):
        return check("systemd", BAD, "PID 1, but still booting (is-system-running: %s)" % state,
                     "wait for the boot to end (`systemctl list-jobs` in the container shows what it waits for)")
    return check("systemd", BAD, "PID 1, but is-system-running answers %r" % state,
                 "look at `systemctl status` in the container")


def judge_python(sec, python):
    rc, _text = sec.get("python", (None, ""))
    if rc == 0:
        return check("python", OK, "%s present" % python)
    return check("python", BAD, "no executable %s in the container" % python,
                 "install it in the container (`apt install python3`) or set ansible_python_interpreter")


def judge_nvidia_smi(sec, nvidia_smi):
    rc, text = sec.get("smi", (None, ""))
    if rc is None:
        return check("nvidia-smi", UNKNOWN, "did not run")
    if rc == 127:
        return check("nvidia-smi", BAD, "%s not found in the container" % nvidia_smi,
                     "install the NVIDIA driver's user-space in the container, the node's driver version, "
                     "without its kernel module")
    msg = _nvidia_smi.failure_message(rc, text, "")
    if msg:
        remedy = (_nvidia_smi.NODE_FAULTS[rc] if rc in _nvidia_smi.NODE_FAULTS
                  else "run `nvidia-smi` in the container and on the node: their driver versions must match")
        return check("nvidia-smi", BAD, msg.split(" - the node's fault")[0], remedy)
    gpus = [line for line in text.splitlines() if line.startswith("GPU ")]
    warning = _nvidia_smi.warning_message(rc, text)
    return check("nvidia-smi", OK, "answers: %d GPU(s)%s" % (len(gpus), "; " + warning if warning else ""))


def judge_device_nodes(sec):
    rc, text = sec.get("dev", (None, ""))
    if rc is None:
        return check("device nodes", UNKNOWN, "not listed")
    nodes = {}
    for line in text.splitlines():
        cells = line.split()
        if len(cells) == 2:
            nodes[cells[0]] = cells[1]
    problems, _warnings = _nvidia_smi.node_problems(nodes)
    if problems:
        first = problems[0]
        detail, _sep, remedy = first.partition("): ")
        return check("device nodes", BAD, detail + ")" + ("; and %d more" % (len(problems) - 1) if problems[1:] else ""),
                     remedy or first)
    gpus = sorted(n for n, k in nodes.items() if re.match(r"^nvidia\d+$", n) and k == "chr")
    return check("device nodes", OK, "/dev/nvidiactl, /dev/nvidia-uvm and %d /dev/nvidiaN are character devices"
                 % len(gpus))


def judge_free_space(sec, trainer_root, min_free_mib=MIN_FREE_MIB):
    rc, text = sec.get("df", (None, ""))
    lines = text.splitlines()
    cells = lines[-1].split() if rc == 0 and len(lines) >= 3 else []
    if len(cells) < 6 or not cells[3].isdigit():
        return check("free space", UNKNOWN, "df did not answer for %s: %s" % (trainer_root, _first_line(text)))
    free_mib = int(cells[3]) // 1024
    where = trainer_root + ("" if lines[0] == trainer_root else " (not made yet: %s is)" % lines[0]) + \
        ", on the filesystem mounted on %s" % cells[5]
    if free_mib < min_free_mib:
        return check("free space", BAD, "%d MiB free for releases under %s, less than %d MiB" % (
            free_mib, where, min_free_mib), "free space there, or set trainer_root on a larger filesystem")
    return check("free space", OK, "%d MiB free under %s" % (free_mib, where))


def judge_clock(sec, before, after, max_skew_s=MAX_SKEW_S):
    _rc, text = sec.get("date", (None, ""))
    try:
        theirs, before, after = float(text.strip()), float(before), float(after)
    except (TypeError, ValueError):
        return check("clock", UNKNOWN, "the container's time not read: %s" % _first_line(text))
    # the container read its clock between the controller's two readings: only what lies outside is skew
    skew = theirs - after if theirs > after else (theirs - before if theirs < before else 0.0)
    if abs(skew) > max_skew_s:
        return check("clock", BAD, "the container's clock is %+.1f s off the controller's" % skew,
                     "sync the clocks (chrony or systemd-timesyncd on the node and the controller): a container "
                     "shares its node's clock")
    return check("clock", OK, "within %.1f s of the controller's (%.1f s to ask)" % (max_skew_s, after - before))


def judge(node, ct, before=None, after=None, vmid="", host="", user="", pct_path="/usr/sbin/pct", sudo=False,
          python="/usr/bin/python3", nvidia_smi="nvidia-smi", trainer_root="/opt/dflash-trainer",
          node_nvidia_smi="nvidia-smi", min_free_mib=MIN_FREE_MIB, max_skew_s=MAX_SKEW_S):
    """Every check, in order (see the module's docstring)."""
    node, ct = node or {}, ct or {}
    ssh = judge_ssh(node, host, user)
    if ssh["mark"] == BAD:
        return [ssh] + [check(n, UNKNOWN, "not checked: the node was not reached") for n in NAMES[1:]]
    nsec = sections(node.get("stdout"))
    checks = [ssh, judge_privilege(nsec, user, sudo, pct_path), judge_pct(nsec, pct_path)]
    running, lock = judge_container(nsec, vmid, host)
    cgroup = judge_cgroup(nsec, vmid) if running["mark"] == OK else check(
        "cgroup", UNKNOWN, "not checked: the container is not reachable as it is")
    checks += [running, lock, cgroup]
    if running["mark"] != OK or cgroup["mark"] == BAD:  # a lock alone leaves pct exec working: the checks go on
        why = "frozen" if cgroup["mark"] == BAD else "not reachable as it is"
        return checks + [check(n, UNKNOWN, "not checked: the container is %s" % why) for n in NAMES[len(checks):]]
    exec_check = judge_exec(ct, vmid)
    if exec_check["mark"] == BAD:
        return checks + [exec_check] + [check(n, UNKNOWN, "not checked: pct exec failed")
                                        for n in NAMES[len(checks) + 1:]]
    csec = sections(ct.get("stdout"))
    return checks + [exec_check, judge_systemd(csec), judge_python(csec, python), judge_nvidia_smi(csec, nvidia_smi),
                     judge_gpu_pairing(csec, nsec, node_nvidia_smi), judge_device_nodes(csec),
                     judge_free_space(csec, trainer_root, min_free_mib), judge_clock(csec, before, after, max_skew_s)]


def enter(node):
    """Whether the container is asked at all (its pct exec): not when the node was not reached, nor when the
    container is frozen - pct exec would hang in it until the connection's timeout."""
    node = node or {}
    if node.get("unreachable"):
        return False
    return not _freezer.cgroups(sections(node.get("stdout")).get("cgroup", (None, ""))[1])[1]


def container_answer(node, ask):
    """What the container answered: ``ask()`` (its script run through pct exec, ``answered`` or ``unreachable``)
    when ``enter(node)``, else no answer at all ({}: what the judge reads and the record keeps of a skipped ask)."""
    return ask() if enter(node) else {}


def answered(executed):
    """The container's answer from its script's run (rc, stdout, stderr: ActionBase._low_level_execute_command's), as
    an ``ansible.builtin.raw`` task registered it with ``failed_when: false``: never failed, a non-zero exit
    status said as raw says it."""
    out = dict(executed, failed=False)
    if out.get("rc") not in (0, None):
        out["msg"] = "non-zero return code"
    return out


def unreachable(msg):
    """The container's answer when the connection failed (pct exec did not reach it): as the result of a raw task
    with ``ignore_unreachable`` - ``judge_exec``'s ✗ with MSG, the connection's own words."""
    return {"unreachable": True, "msg": msg}


def exit_code(checks):
    """0 every check holds (or could not be made), 3 the node was not reached, 1 another check failed."""
    if checks and checks[0]["name"] == "ssh" and checks[0]["mark"] == BAD:
        return EXIT_UNREACHABLE
    return EXIT_FAILED if any(c["mark"] == BAD for c in checks) else EXIT_OK


def line(c):
    """One check as one line: `✓ name  detail`, a failed one with `- remedy: ...`."""
    text = "%s %-12s %s" % (c["mark"], c["name"], c["detail"])
    return text + (" - remedy: %s" % c["remedy"] if c["mark"] == BAD and c["remedy"] else "")


def report(checks):
    """{checks, lines, failed, exit_code, summary} for the play and the CLI."""
    bad = [c for c in checks if c["mark"] == BAD]
    summary = ("every assumption holds (%d checks)" % len(checks) if not bad else
               "%d of %d assumptions do not hold: %s" % (len(bad), len(checks), line(bad[0])))
    return {"checks": checks, "lines": [line(c) for c in checks], "failed": bool(bad),
            "exit_code": exit_code(checks), "summary": summary}


# what judge reads of a raw result, and its parameters: all a record keeps
RAW_FIELDS = ("rc", "stdout", "stderr", "unreachable", "failed", "msg")
JUDGE_PARAMS = ("vmid", "host", "user", "pct_path", "sudo", "python", "nvidia_smi", "trainer_root", "node_nvidia_smi")
RECORD_VERSION = 1


def _raw(result):
    return {k: result[k] for k in RAW_FIELDS if k in (result or {})} if result is not None else None


def answers(node, ct, before=None, after=None, secrets=(), **params):
    """What the doctor was answered, as ``replay`` judges it: the raw results (RAW_FIELDS), the clock around them
    and the judge's parameters, every value of ``secrets`` masked (***)."""
    kept = {k: params[k] for k in JUDGE_PARAMS if k in params}
    return mask({"version": RECORD_VERSION, "params": kept, "node": _raw(node), "container": _raw(ct),
                 "before": before, "after": after}, list(secrets))


def judged(node, ct, before=None, after=None, secrets=(), **params):
    """The report judged from the masked answers (``answers``) -> (report, record): the record is the answers
    with the lines judged, for ``doctor --record``; the judge runs once for both."""
    rec = answers(node, ct, before, after, secrets, **params)
    out = replay(rec)
    return out, dict(rec, lines=out["lines"])


def record(node, ct, before=None, after=None, secrets=(), **params):
    """What the doctor was answered, for ``replay``: ``answers`` with the lines judged from them."""
    return judged(node, ct, before, after, secrets, **params)[1]


def replay_checks(rec):
    """The checks judged from a record."""
    if rec.get("version") != RECORD_VERSION:
        raise ValueError("a doctor record of version %r; this collection reads version %d" % (
            rec.get("version"), RECORD_VERSION))
    return judge(rec.get("node"), rec.get("container"), rec.get("before"), rec.get("after"), **rec.get("params", {}))


def replay(rec):
    """The report (as ``report``) judged from a record."""
    return report(replay_checks(rec))
