"""The checks on what the first read of the target returned (module_utils/plan/target_checks.py): each
refusal names the variable and what is accepted; the file stands alone (stdlib only), so a module
on the target ships it without the controller's checks (_validate)."""
import ast
import os

from ansible_collections.dflash.trainer.plugins.module_utils.plan import target_checks as t
from ansible_collections.dflash.trainer.plugins.plugin_utils import _validate

SOURCE = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
                      "plugins", "module_utils", "plan/target_checks.py")
PATH = "/etc/systemd/system/dflash-trainer.service"
GPUS = [{"index": i, "memory_total_mib": 143771} for i in range(8)]
OURS = {"load_state": "loaded", "fragment_path": PATH,
        "description": "DFlash trainer (dflash-trainer), managed by dflash.trainer"}
VARS = {"trainer_gpus": [0, 1], "trainer_gpu_min_mib": 20000, "trainer_unit_name": "dflash-trainer",
        "trainer_nvidia_smi": "nvidia-smi"}


def one(problems):
    assert len(problems) == 1, problems
    assert isinstance(problems[0], t.Problem)
    return problems[0]


def test_what_the_target_has_passes():
    assert t.target_problems(VARS, GPUS, OURS, PATH) == []
    assert t.target_problems(VARS, GPUS, {"load_state": "not-found"}, PATH) == []
    assert t.target_problems(VARS) == []


def test_a_missing_gpu():
    p = one(t.target_problems(dict(VARS, trainer_gpus=[0, 8, 9]), GPUS, OURS, PATH))
    assert p.variable == "trainer_gpus"
    assert str(p) == ("trainer_gpus: asks for GPU 8, 9, which nvidia-smi does not list (it lists 0, 1, 2, 3, 4, 5, "
                      "6, 7) (got [0, 8, 9]); accepted: indexes nvidia-smi lists")
    p = one(t.target_problems(dict(VARS, trainer_gpus=["0"]), [], OURS, PATH))
    assert "(it lists none)" in str(p)


def test_a_gpu_smaller_than_the_minimum():
    gpus = GPUS[:1] + [{"index": 1, "memory_total_mib": 16384}]
    p = one(t.target_problems(dict(VARS, trainer_gpu_min_mib="20000"), gpus, OURS, PATH))
    assert p.variable == "trainer_gpu_min_mib"
    assert str(p) == ("trainer_gpu_min_mib: is above the memory of GPU 1 (16384 MiB) (got '20000'); accepted: at most "
                      "the smallest trainer GPU's memory.total")


def test_a_unit_this_collection_did_not_write():
    foreign = {"load_state": "loaded", "fragment_path": "/lib/systemd/system/ssh.service",
               "description": "OpenBSD Secure Shell server"}
    p = one(t.target_problems(dict(VARS, trainer_unit_name="ssh"), GPUS, foreign, "/etc/systemd/system/ssh.service"))
    assert p.variable == "trainer_unit_name"
    assert str(p) == ("trainer_unit_name: names a unit this collection did not write (/lib/systemd/system/ssh.service, "
                      "OpenBSD Secure Shell server) (got 'ssh'); accepted: %s" % t.UNIT_ACCEPTED)
    # our mark, but another unit file than the one the role writes
    p = one(t.target_problems(VARS, GPUS, dict(OURS, fragment_path="/run/systemd/system/dflash-trainer.service"), PATH))
    assert p.variable == "trainer_unit_name" and t.UNIT_MARK in str(p)


def test_an_nvidia_smi_error():
    p = one(t.target_problems(VARS, None, dict(OURS, gpu_error="nvidia-smi hung"), PATH))
    assert p.variable == "trainer_nvidia_smi"
    assert str(p) == ("trainer_nvidia_smi: nvidia-smi failed on the target: nvidia-smi hung (got 'nvidia-smi'); "
                      "accepted: an nvidia-smi that lists the trainer's GPUs")


def test_the_nodes_fault_is_named_as_the_node():
    """nvidia-smi exit 15 / 9 (the read marks gpu_node_fault): refused as the node's problem, not the input's."""
    err = "nvidia-smi failed (exit 15: GPU fell off the bus): ... - the node's fault, not the trainer's: ..."
    p = one(t.target_problems(VARS, None, dict(OURS, gpu_error=err, gpu_node_fault=True), PATH))
    assert p.variable == "the node" and err in str(p) and "nothing was stopped or changed" in str(p)
    assert "(got" not in str(p)


def test_message_and_numbers():
    problems = t.target_problems(dict(VARS, trainer_gpus=[9]), GPUS, dict(OURS, gpu_error="x"), PATH)
    assert t.message(problems) == "\n".join(["refused before any change on the target (2 problems):"] +
                                            ["- %s" % p for p in problems])
    assert t.message(problems[:1]).startswith("refused before any change on the target (1 problem):\n- ")
    assert [t._number(x) for x in (5, 2.5, "7", "1.5", True, "1e3", "1_0", " 5", float("inf"), "\u0665")] == [
        5, 2.5, 7, 1.5, None, None, None, None, None, None]
    assert t.gpu_indexes(["0", 3]) == [0, 3]
    assert t._show("s" * 300) == "'" + "s" * 196 + "..."
    assert str(t.Problem("x", "is bad", "good", "secret", secret=True)) == (
        "x: is bad (value not shown: it is a secret); accepted: good")


def test_validate_words_its_problems_with_the_same_objects():
    for name in ("Problem", "UNIT_ACCEPTED", "_number", "_is_int", "_show"):
        assert getattr(_validate, name) is getattr(t, name), name


def test_the_target_checks_are_imported_from_their_owner():
    """The controller's callers import them from plan.target_checks, as trainer_plan does; _validate does not
    pass them on."""
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(SOURCE))))
    for path in ("plugins/action/trainer_validate.py", "plugins/modules/trainer_plan.py"):
        with open(os.path.join(root, path)) as fh:
            tree = ast.parse(fh.read(), path)
        owners = {a.name: node.module.rsplit(".", 1)[-1] for node in ast.walk(tree)
                  if isinstance(node, ast.ImportFrom) and node.module for a in node.names}
        assert owners.get("target_problems") == "target_checks" and owners.get("message") == "target_checks", path
    assert not hasattr(_validate, "target_problems") and not hasattr(_validate, "message")


def test_imports_nothing_of_the_collection():
    with open(SOURCE) as fh:
        tree = ast.parse(fh.read(), SOURCE)
    imported = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            imported.extend(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            assert node.level == 0, "a relative import: %s" % node.module
            imported.append(node.module or "")
    assert imported, "the parser found no import at all"
    assert not [m for m in imported if m.startswith("ansible_collections") or m.startswith("ansible")], imported


def test_the_units_mark_is_the_one_the_unit_file_carries():
    """The mark that says a unit is ours is written twice (here, stdlib only, and in target.ownership): both are the
    words the role's unit template writes into Description=."""
    from ansible_collections.dflash.trainer.plugins.module_utils.target import ownership as _ownership
    template = os.path.join(os.path.dirname(SOURCE), "..", "..", "..", "roles", "trainer", "templates", "trainer.service.j2")
    with open(template) as fh:
        description = [line for line in fh if line.startswith("Description=")]
    assert t.UNIT_MARK == _ownership.UNIT_MARK and description and t.UNIT_MARK in description[0]
