"""Helpers shared by the lab tests."""
import os
import time


def wait_for(predicate, timeout=10.0, interval=0.1):
    """Poll predicate() until it returns a truthy value or timeout; return the last value."""
    deadline = time.monotonic() + timeout
    value = predicate()
    while not value and time.monotonic() < deadline:
        time.sleep(interval)
        value = predicate()
    return value


def holds(predicate, seconds, interval=0.1):
    """Poll predicate() for ``seconds`` (an absence check: nothing to wait for, only a window to
    watch); return False as soon as it fails, True when it held throughout."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if not predicate():
            return False
        time.sleep(interval)
    return bool(predicate())


NODE_SMI = "/usr/local/lib/dflash-lab/nvidia-smi-node"  # the lab node's nvidia-smi (lab/node.py, lab.py up)


def node_smi_of(base, *vmids):
    """The lab node's nvidia-smi, told that the GPUs of containers ``vmids`` are the node's by a list of the test's
    own (FAKEGPU_NODE_TENANTS_FILE; `lab.py node-gpus`, which other tests set, is left alone): a wrapper written
    to ``base`` (a pathlib.Path only root may write: the node view runs no program from another's) -> its path."""
    (base / "tenants").write_text("".join("%s\n" % vmid for vmid in vmids))
    smi = base / "nvidia-smi"
    smi.write_text("#!/bin/sh\nFAKEGPU_NODE_TENANTS_FILE=%s exec %s \"$@\"\n" % (base / "tenants", NODE_SMI))
    smi.chmod(0o755)
    return str(smi)


# The stand-in trainer (examples/trainer) run under a wrapper that logs all it prints through a
# logging.FileHandler to a file of its own, as a trainer with its own logging set-up does; stdout gets one line.
OWN_LOG_PY = '''import logging, os, subprocess, sys
os.makedirs(os.path.dirname(%(log)r), exist_ok=True)
handler = logging.FileHandler(%(log)r)
handler.setFormatter(logging.Formatter("%%(asctime)s %%(levelname)s %%(name)s: %%(message)s"))
log = logging.getLogger("train")
log.addHandler(handler)
log.setLevel(logging.INFO)
print("training; progress is logged to %%s" %% %(log)r, flush=True)
here = os.path.dirname(os.path.abspath(__file__))
child = subprocess.Popen([sys.executable, os.path.join(here, "trainer.py")], stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT, text=True)
for line in child.stdout:
    log.info(line.rstrip("\\n"))
sys.exit(child.wait())
'''


def own_log_trainer(src, log_path):
    """Make the stand-in trainer copied at SRC log its progress to LOG_PATH (own.py, run by its run.sh)."""
    with open(os.path.join(src, "own.py"), "w") as fh:
        fh.write(OWN_LOG_PY % {"log": log_path})
    with open(os.path.join(src, "run.sh"), "w") as fh:
        fh.write('#!/bin/bash\nexec python3 "$(dirname "$(readlink -f "$0")")/own.py" "$@"\n')
    os.chmod(os.path.join(src, "run.sh"), 0o755)
