"""The device nodes CUDA opens in the container: judged from a listing (pure) and read from a directory."""
import os

import pytest

from ansible_collections.dflash.trainer.plugins.module_utils.target import nvidia_smi as d
from ansible_collections.dflash.trainer.plugins.module_utils.plan import target_checks as t

ALL = {"nvidiactl": "chr", "nvidia-uvm": "chr", "nvidia-uvm-tools": "chr", "nvidia0": "chr", "nvidia3": "chr"}


def test_every_node_present_is_fine():
    assert d.node_problems(ALL) == ([], [])


def test_a_missing_uvm_node_says_how_to_create_it_on_the_node():
    problems, warnings = d.node_problems({k: v for k, v in ALL.items() if not k.startswith("nvidia-uvm")})
    assert len(problems) == 1 and problems[0].startswith("/dev/nvidia-uvm is missing in the container")
    assert "nvidia-modprobe -u -c=0" in problems[0] and "restart the container" in problems[0]
    assert len(warnings) == 1 and warnings[0].startswith("/dev/nvidia-uvm-tools is missing")


def test_an_empty_file_left_by_an_optional_bind_is_no_device():
    problems, _warnings = d.node_problems(dict(ALL, **{"nvidia-uvm": "empty"}))
    assert problems == ["/dev/nvidia-uvm is an empty file, not a device in the container (CUDA cannot start "
                        "without it): " + d.UVM_REMEDY]


@pytest.mark.parametrize("nodes,fragment", [
    ({k: v for k, v in ALL.items() if k != "nvidiactl"}, "/dev/nvidiactl is missing"),
    ({k: v for k, v in ALL.items() if not k[-1].isdigit()}, "no /dev/nvidiaN GPU node"),
    (dict(ALL, nvidia0="empty", nvidia3="other"), "no /dev/nvidiaN GPU node"),
    ({}, "/dev/nvidiactl is missing"),
])
def test_the_other_nodes_name_the_bind_mount(nodes, fragment):
    problems, _warnings = d.node_problems(nodes)
    assert any(p.startswith(fragment) for p in problems), problems
    assert all("lxc.mount.entry" in p or "nvidia-modprobe" in p for p in problems)


def test_read_nodes(tmp_path):
    (tmp_path / "nvidia-uvm").write_bytes(b"")
    (tmp_path / "nvidia0").write_bytes(b"x")
    (tmp_path / "null").write_bytes(b"")
    os.symlink("/dev/null", str(tmp_path / "nvidiactl"))  # a character device, through a link
    assert d.read_nodes(str(tmp_path)) == {"nvidia-uvm": "empty", "nvidia0": "other", "nvidiactl": "chr"}
    assert d.read_nodes(str(tmp_path / "absent")) == {}


def test_the_first_read_refuses_them_as_the_nodes_problem():
    problems, _warnings = d.node_problems({"nvidiactl": "chr", "nvidia0": "chr"})
    refused = t.target_problems({}, None, {"device_problems": problems})
    assert [p.variable for p in refused] == ["the node"]
    assert "nvidia-modprobe -u -c=0" in t.message(refused) and "(got" not in t.message(refused)
