"""Real PyTorch in the test bed (issue 15 item 4), on lab container 300.

`lab.py torch --ids 300` makes torch (CPU build, a venv on the host, built once) available read-only
in the container with what inductor's C++ backend needs there (g++, Python.h, openssl).
examples/torch_trainer compiles a tiny transformer with torch.compile and holds memory on simulated
GPUs 0 and 1. Against it: the proof passes; a forced restart purges the real inductor cache (the
purge guard accepts its real layout) and the trainer refills it; no process of the old invocation
- inductor's compile workers included - survives the restart; a release failing with a real
ImportError is refused by the pre-flight with the old trainer untouched. Figures are printed at
the end (pytest -s): README.md "Real PyTorch in the lab"."""
import json
import os
import re
import shutil
import subprocess
import sys
import time

import pytest

from ansible_collections.dflash.trainer.plugins.module_utils.target import inductor_cache as _inductor_cache

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CT = "300"
CACHE = "/var/cache/dflash-trainer/inductor"  # the role's default trainer_inductor_cache_dir: root's cache
LOG = "/workspace/trainer.log"
UNIT = "dflash-trainer"
FIGURES = {}

# The trainer unit's processes, read inside the container: [pid, start time, cmdline] of each
# process whose cgroup is the unit's (the start time tells a reused pid from the same process).
PROCS = r"""
import json, os
out = []
for pid in filter(str.isdigit, os.listdir("/proc")):
    try:
        with open("/proc/%s/cgroup" % pid) as fh:
            if "/UNIT.service" not in fh.read():
                continue
        with open("/proc/%s/stat" % pid) as fh:
            start = fh.read().rsplit(")", 1)[1].split()[19]
        with open("/proc/%s/cmdline" % pid, "rb") as fh:
            cmd = fh.read().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        continue
    out.append([int(pid), start, cmd])
print(json.dumps(out))
""".replace("UNIT", UNIT)

# Every file under the cache: [path, mtime]
FILES = r"""
import json, os, sys
out = []
for base, _dirs, files in os.walk(sys.argv[1]):
    for name in files:
        path = os.path.join(base, name)
        out.append([os.path.relpath(path, sys.argv[1]), os.lstat(path).st_mtime])
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def torch_ct(lab):
    """Container 300 with torch; the PYTHONPATH the trainer needs there, read from the lab's words."""
    t0 = time.monotonic()
    res = subprocess.run([sys.executable, os.path.join(ROOT, "lab", "lab.py"), "torch", "--ids", CT],
                         capture_output=True, text=True, timeout=1200, check=False)
    assert res.returncode == 0, (res.stdout + res.stderr)[-3000:]
    FIGURES["lab.py torch --ids %s (s)" % CT] = round(time.monotonic() - t0, 1)
    FIGURES["lab.py torch says"] = [line for line in res.stdout.splitlines() if line.startswith("lab: torch")]
    site = re.search(r"torch \S+ with PYTHONPATH=(\S+)", res.stdout)
    assert site, res.stdout[-3000:]
    return site.group(1)


@pytest.fixture(scope="module")
def deploy(lab, torch_ct, tmp_path_factory):
    base = tmp_path_factory.mktemp("torch")
    inv = base / "hosts.json"
    inv.write_text(json.dumps({"all": {"hosts": {"t": {"proxmox_vmid": int(CT)}}, "vars": lab.conn_vars()}}))

    def run(src, **changes):
        extra = {"trainer_target_hosts": "all", "trainer_src": src, "trainer_gpus": [0, 1],
                 "trainer_env": {"PYTHONPATH": torch_ct, "TORCH_TRAINER_GPUS": "0,1",
                                 # two workers even where torch counts one CPU: the restart must end them
                                 "TORCHINDUCTOR_COMPILE_THREADS": "2"},
                 # 2 shared cores: the first compile takes tens of seconds, steps come every second
                 "trainer_ready_hold_s": 8, "trainer_ready_stall_s": 8, "trainer_ready_timeout_s": 400}
        extra.update(changes)
        (base / "extra.json").write_text(json.dumps(extra))
        env = dict(os.environ, ANSIBLE_CONFIG=os.path.join(ROOT, "ansible.cfg"), ANSIBLE_NOCOLOR="1")
        t0 = time.monotonic()
        res = subprocess.run(["ansible-playbook", "-i", str(inv), "deploy.yml", "-l", "t", "-e",
                              "@%s" % (base / "extra.json")], cwd=ROOT, env=env, capture_output=True, text=True,
                             timeout=900, check=False)
        res.wall_s = round(time.monotonic() - t0, 1)
        return res

    good = str(base / "good")
    shutil.copytree(os.path.join(ROOT, "examples", "torch_trainer"), good)
    # forced: the container keeps what earlier runs left (its .debs cost a minute to reinstall, so
    # it is not made fresh); a trainer of the same tree may already run there, proved or not. Its
    # cache is the one thing a test plants into: the known start has none (stopped, then removed)
    lab.ct(CT, "systemctl", "stop", UNIT)
    lab.ct(CT, "rm", "-rf", CACHE)
    first = run(good, trainer_force_restart=True)
    assert first.returncode == 0, (first.stdout + first.stderr)[-4000:]
    FIGURES["first deploy: play (s)"] = first.wall_s
    FIGURES["first deploy: start to ready, the proof's figure (s)"] = to_ready(first.stdout)
    yield run, good, base, first
    lab.ct(CT, "systemctl", "stop", UNIT)  # the shared cores: no trainer left computing
    print("\ntorch lab figures: " + json.dumps(FIGURES, indent=1))


def unit_state(lab):
    out = lab.ct(CT, "systemctl", "show", UNIT, "-p", "MainPID", "-p", "InvocationID", "-p", "ActiveState").stdout
    return out, lab.ct(CT, "readlink", "/opt/dflash-trainer/current").stdout.strip()


def py_json(lab, code, *args):
    res = lab.ct(CT, "python3", "-c", code, *args)
    assert res.returncode == 0, res.stderr
    return json.loads(res.stdout)


def to_ready(play_out):
    """The proof's own figure: 'dflash-trainer ready: ... pid N, 67.007 s to ready, ...'."""
    found = re.search(r"([\d.]+)\s+s\s+to\s+ready", play_out)
    assert found, play_out[-3000:]
    return float(found.group(1))


def compile_seconds(log_text):
    found = re.findall(r"compiled: first step \(forward \+ backward\) in ([\d.]+) s", log_text)
    assert found, log_text[-2000:]
    return float(found[-1])


def test_the_real_trainer_is_proved_ready(lab, torch_ct, deploy):
    _run, _good, _base, first = deploy
    log = lab.ct(CT, "cat", LOG).stdout
    assert "torch trainer starting" in log and re.search(r"^step=\d+ loss=[\d.]+ tok/s=[\d.]+$", log, re.M), log[-2000:]
    FIGURES["first compile, forward + backward (s)"] = compile_seconds(log)
    assert "ActiveState=active" in unit_state(lab)[0]
    # torch reaches the container read-only: no release, trainer or compile can change it
    probe = lab.ct(CT, "touch", torch_ct.split("/lib/")[0] + "/probe")
    assert probe.returncode != 0 and "Read-only file system" in probe.stderr, probe
    # every trainer GPU holds the trainer's memory (the proof's own condition, read again here)
    used = lab.ct(CT, "nvidia-smi", "--query-gpu=index,memory.used", "--format=csv,noheader,nounits").stdout
    held = {int(i): int(m) for i, m in (line.split(", ") for line in used.strip().splitlines())}
    assert held[0] >= 2048 and held[1] >= 2048, used


def test_the_real_cache_layout_passes_the_purge_guard(lab, deploy):
    # the purge's own judge, run in the container on the cache real torch wrote (stdlib only)
    with open(_inductor_cache.__file__, encoding="utf-8") as fh:
        source = fh.read()
    facts = py_json(lab, source + "\nimport json\nprint(json.dumps(observe(%r)))" % CACHE)
    facts["tree"] = [tuple(e) for e in facts.get("tree") or []]
    names = sorted(rel + ("/" if k == "dir" else "") for rel, k in facts["tree"] if "/" not in rel)
    FIGURES["real cache top level"] = names
    FIGURES["real cache entries judged"] = len(facts["tree"])
    print("real inductor cache %s top level: %s" % (CACHE, " ".join(names)))
    assert facts["type"] == "dir" and names, facts
    assert _inductor_cache.cache_problem(facts) is None, _inductor_cache.cache_problem(facts)
    files = py_json(lab, FILES, CACHE)
    FIGURES["real cache files"] = len(files)
    # what inductor's C++ backend really wrote: compiled kernels in two-character hash directories
    assert [p for p, _m in files if p.endswith(".so") and re.match(r"^[a-z0-9_]{2}/", p)], files


def test_a_forced_restart_purges_the_real_cache_and_ends_every_old_process(lab, deploy):
    run, good, _base, _first = deploy
    old = py_json(lab, PROCS)
    workers = [p for p in old if "compile_worker" in p[2]]
    assert workers, old  # inductor's compile workers live in the unit, beside the trainer
    before_state = unit_state(lab)[0]
    hash_dir = sorted(p.split("/")[0] for p, _m in py_json(lab, FILES, CACHE) if re.match(r"^[a-z0-9_]{2}/", p))[0]
    # named as inductor names its files (a key whose 2nd and 3rd characters are its directory's),
    # so the purge judges it inductor's and deletes it with the rest
    marker = "%s/%s/c%sdflashpurgemarker%s.py" % (CACHE, hash_dir, hash_dir, "0" * 32)
    assert lab.ct(CT, "sh", "-c", "echo old > %s" % marker).returncode == 0
    since = float(lab.ct(CT, "date", "+%s.%N").stdout)
    res = run(good, trainer_force_restart=True)
    assert res.returncode == 0, (res.stdout + res.stderr)[-4000:]
    FIGURES["forced restart: play (s)"] = res.wall_s
    FIGURES["forced restart: start to ready, the proof's figure (s)"] = to_ready(res.stdout)
    after_state = unit_state(lab)[0]
    assert after_state != before_state and "ActiveState=active" in after_state
    # nothing of the old invocation is left: not the trainer, not one compile worker
    alive = {(pid, start) for pid, start, _cmd in py_json(lab, PROCS)}
    assert not alive & {(pid, start) for pid, start, _cmd in old}, (old, alive)
    # the cache was emptied (the marker and every file older than the restart are gone) and refilled
    assert lab.ct(CT, "test", "-e", marker).returncode == 1
    files = py_json(lab, FILES, CACHE)
    assert [p for p, _m in files if p.endswith(".so")], files
    stale = [p for p, mtime in files if mtime < since]
    assert not stale, stale
    FIGURES["compile after the purge (s)"] = compile_seconds(lab.ct(CT, "cat", LOG).stdout)


def test_a_release_with_a_real_import_error_is_refused_by_the_preflight(lab, deploy):
    run, _good, base, _first = deploy
    bad = base / "import-error"
    shutil.copytree(os.path.join(ROOT, "examples", "torch_trainer"), bad)
    text = (bad / "train.py").read_text()
    (bad / "train.py").write_text(text.replace("import torch\n", "import torch\nfrom torch import dflash_no_such_name\n", 1))
    before = unit_state(lab)
    res = run(str(bad), trainer_preflight_command=["python3", "-c", "import train"])
    out = res.stdout + res.stderr
    FIGURES["import error refused by the pre-flight, whole play (s)"] = res.wall_s
    assert res.returncode != 0
    assert "pre-flight refused the release" in out, out[-4000:]
    assert "ImportError: cannot import name 'dflash_no_such_name' from 'torch'" in out, out[-4000:]
    assert unit_state(lab) == before  # same MainPID, InvocationID and `current`
