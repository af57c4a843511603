"""Helpers shared by the lab tests."""
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
