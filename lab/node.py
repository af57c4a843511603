"""The lab node's own nvidia-smi: the GPUs its containers share, seen from the node (issue 8).

On a Proxmox node with GPUs passed through, nvidia-smi on the node lists every holder under its
host PID, other containers' included. `lab.py node-gpus --ids 231 232` makes those containers'
simulated GPUs the node's GPUs (fakegpu.NODE_TENANTS_FILE); `up` installs the stand-in
(lab/fakegpu/nvidia-smi-node) as the node's nvidia-smi. It names each holder as the real tool does:
its argv[0], unquoted, whatever a tenant put there (commas, newlines). Reading the containers' state needs root,
which the real tool does not: the operator's sudo permits exactly that program (the lab's own
emulation detail; the operator still has no other sudo than the pct wrapper's).
"""
import os

from hostfiles import install_file, write_sudoers, write_text

HERE = os.path.dirname(os.path.abspath(__file__))
NODE_LIB = "/usr/local/lib/dflash-lab"
NODE_SMI = "/usr/local/bin/nvidia-smi"
SUDOERS = "/etc/sudoers.d/dflash-lab-node-gpus"
TENANTS_FILE = "/etc/dflash-lab/node-gpus"


def ensure_node_smi(operator):
    os.makedirs(NODE_LIB, mode=0o755, exist_ok=True)
    install_file(os.path.join(HERE, "fakegpu", "fakegpu.py"), os.path.join(NODE_LIB, "fakegpu.py"), 0o644)
    tool = os.path.join(NODE_LIB, "nvidia-smi-node")
    install_file(os.path.join(HERE, "fakegpu", "nvidia-smi-node"), tool, 0o755)
    if os.path.realpath(NODE_SMI) != tool:
        tmp = NODE_SMI + ".new"
        if os.path.lexists(tmp):
            os.unlink(tmp)
        os.symlink(tool, tmp)
        os.replace(tmp, NODE_SMI)
    write_sudoers(SUDOERS, "# written by dflash.trainer lab/node.py\n%s ALL=(root) NOPASSWD: %s\n" % (operator, tool))


def read_tenants():
    try:
        with open(TENANTS_FILE, encoding="utf-8") as fh:
            return fh.read().split()
    except FileNotFoundError:
        return []


def set_tenants(ids):
    """The containers whose GPUs are the node's (none: the node shows no GPU)."""
    os.makedirs(os.path.dirname(TENANTS_FILE), mode=0o755, exist_ok=True)
    write_text(TENANTS_FILE, "".join("%s\n" % i for i in ids))
