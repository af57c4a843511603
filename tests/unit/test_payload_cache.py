"""A module's AnsiballZ payload kept between runs (plugins/plugin_utils/_payload_cache.py): its key
follows every file the build reads, the store is used only when it is this user's alone, and a real
ansible run uses the payload the run before it built."""
import os
import subprocess
import sys

import pytest

from ansible_collections.dflash.trainer.plugins.plugin_utils import _payload_cache as pc

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MODULES = os.path.join(ROOT, "plugins", "modules")
ACTIONS = os.path.join(ROOT, "plugins", "action")
PREFIX = "ansible_collections.dflash.trainer.plugins.modules.trainer_lock-ZIP_DEFLATED-"


def tree(tmp_path):
    utils = tmp_path / "module_utils"
    (utils / "sub").mkdir(parents=True)
    (utils / "_a.py").write_text("A = 1\n")
    (utils / "sub" / "_b.py").write_text("B = 2\n")
    module = tmp_path / "mod.py"
    module.write_text("import x\n")
    return str(module), str(utils)


def test_the_key_follows_the_module_every_module_util_and_the_runtime(tmp_path):
    module, utils = tree(tmp_path)
    runtime = ("2.19.0", "/ansible", "3.11", "ZIP_DEFLATED")
    key = pc.payload_key(module, utils, runtime)
    assert key == pc.payload_key(module, utils, runtime)
    changed = []
    for path, text in ((module, "import y\n"), (os.path.join(utils, "sub", "_b.py"), "B = 3\n")):
        old = open(path).read()
        open(path, "w").write(text)
        changed.append(pc.payload_key(module, utils, runtime))
        open(path, "w").write(old)
    (tmp_path / "module_utils" / "_new.py").write_text("")
    changed.append(pc.payload_key(module, utils, runtime))
    os.unlink(os.path.join(utils, "_new.py"))
    changed.append(pc.payload_key(module, utils, runtime[:3] + ("ZIP_STORED",)))
    changed.append(pc.payload_key(module, utils, ("2.19.1",) + runtime[1:]))
    assert key not in changed and len(set(changed)) == len(changed)
    # bytecode caches are not sources: a __pycache__ written by an import changes nothing
    (tmp_path / "module_utils" / "__pycache__").mkdir()
    (tmp_path / "module_utils" / "__pycache__" / "_a.cpython-311.pyc").write_bytes(b"\0")
    assert pc.payload_key(module, utils, runtime) == key


def test_the_store_is_made_private_and_refused_when_another_may_write_it(tmp_path):
    parent = tmp_path / "tmp"
    parent.mkdir(mode=0o700)
    store = pc.store_dir(str(parent), "trainer_lock", "k1")
    assert store == str(parent / pc.STORE_NAME / "trainer_lock" / "k1")
    assert os.stat(store).st_mode & 0o777 == 0o700
    os.chmod(parent / pc.STORE_NAME / "trainer_lock", 0o777)
    assert pc.store_dir(str(parent), "trainer_lock", "k1") is None
    os.chmod(parent / pc.STORE_NAME / "trainer_lock", 0o700)
    assert pc.store_dir(str(parent), "trainer_lock", "k1", uid=os.geteuid() + 1) is None
    os.chmod(parent, 0o777)  # the local tmp itself must be private too
    assert pc.store_dir(str(parent), "trainer_lock", "k1") is None


def test_a_link_is_never_taken_for_the_store(tmp_path):
    parent = tmp_path / "tmp"
    parent.mkdir(mode=0o700)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir(mode=0o700)
    os.symlink(elsewhere, parent / pc.STORE_NAME)
    assert pc.store_dir(str(parent), "trainer_lock", "k1") is None
    assert os.listdir(elsewhere) == []


def test_keep_then_restore_carries_the_payload_and_nothing_else(tmp_path):
    parent = tmp_path / "tmp"
    parent.mkdir(mode=0o700)
    run1, run2 = tmp_path / "run1", tmp_path / "run2"
    run1.mkdir()
    for name in (PREFIX + "none", PREFIX + "none.lock", PREFIX + "none-part", "ansible.builtin.ping-x"):
        (run1 / name).write_bytes(b"payload of " + name.encode())
    old = pc.store_dir(str(parent), "trainer_lock", "old")
    (parent / pc.STORE_NAME / "trainer_lock" / "old" / (PREFIX + "none")).write_bytes(b"stale")
    store = pc.store_dir(str(parent), "trainer_lock", "new")
    assert pc.keep(store, str(run1), PREFIX) == [PREFIX + "none"]
    assert not os.path.exists(old)  # the module's other keys go
    assert pc.keep(store, str(run1), PREFIX) == []  # stored once
    assert pc.restore(store, str(run2), PREFIX) == [PREFIX + "none"]
    assert (run2 / (PREFIX + "none")).read_bytes() == b"payload of " + (PREFIX + "none").encode()
    assert sorted(os.listdir(run2)) == [PREFIX + "none"]
    # what the run has already is never replaced
    (run2 / (PREFIX + "none")).write_bytes(b"the run's own")
    assert pc.restore(store, str(run2), PREFIX) == []
    assert (run2 / (PREFIX + "none")).read_bytes() == b"the run's own"


def test_restore_skips_a_link_or_a_file_of_another_user(tmp_path):
    store, run = tmp_path / "store", tmp_path / "run"
    store.mkdir()
    (tmp_path / "target").write_bytes(b"x")
    os.symlink(tmp_path / "target", store / (PREFIX + "none"))
    assert pc.restore(str(store), str(run), PREFIX) == []
    os.unlink(store / (PREFIX + "none"))
    (store / (PREFIX + "none")).write_bytes(b"x")
    assert pc.restore(str(store), str(run), PREFIX, uid=os.geteuid() + 1) == []
    assert os.listdir(run) == []


def test_every_module_run_on_the_target_keeps_its_payload():
    """Each module a task runs on the target has an action plugin with KeptPayload (trainer_validate,
    trainer_group and trainer_doctor send no module - the doctor's container script goes as raw's command does;
    trainer_release's action sends its module itself)."""
    sys.path.insert(0, os.path.join(ROOT, "collections"))
    import importlib

    missing = []
    for name in sorted(n[:-3] for n in os.listdir(MODULES) if n.endswith(".py")):
        if name in ("trainer_validate", "trainer_group", "trainer_doctor"):
            continue
        if not os.path.exists(os.path.join(ACTIONS, name + ".py")):
            missing.append(name)
            continue
        action = importlib.import_module("ansible_collections.dflash.trainer.plugins.action." + name).ActionModule
        if not issubclass(action, pc.KeptPayload):
            missing.append(name)
    assert missing == []


def ansible_lock_call(env):
    """One ad-hoc run of dflash.trainer.trainer_lock on the controller (local connection) -> its debug output."""
    ansible = os.path.join(os.path.dirname(sys.executable), "ansible")
    if not os.path.exists(ansible):
        pytest.skip("ansible is not beside this Python")
    lock = os.path.join(env["ANSIBLE_LOCAL_TEMP"], "..", "test.lock")
    res = subprocess.run(
        [ansible, "localhost", "-c", "local", "-e", "ansible_python_interpreter=%s" % sys.executable,
         "-m", "dflash.trainer.trainer_lock", "-a", "path=%s token=t1 state=absent missing_ok=true" % lock],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=120, check=False)
    assert res.returncode == 0, res.stdout + res.stderr
    return res.stdout


def test_a_second_run_uses_the_payload_the_first_built(tmp_path):
    local = tmp_path / "local"
    local.mkdir(mode=0o700)
    env = dict(os.environ, ANSIBLE_CONFIG=os.path.join(ROOT, "ansible.cfg"), ANSIBLE_LOCAL_TEMP=str(local),
               ANSIBLE_DEBUG="1", ANSIBLE_NOCOLOR="1")
    first = ansible_lock_call(env)
    assert "ANSIBALLZ: Creating module" in first
    stored = list((local / pc.STORE_NAME / "trainer_lock").iterdir())
    assert len(stored) == 1 and os.listdir(stored[0]) == [PREFIX + "none"]
    second = ansible_lock_call(env)
    assert "ANSIBALLZ: using cached module" in second and "ANSIBALLZ: Creating module" not in second


def payload_zip(files):
    import io
    import zipfile
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", compression=zipfile.ZIP_DEFLATED) as zf:
        for name, text in files.items():
            zf.writestr(name, text)
    return out.getvalue()


def import_from(zip_path, name):
    """Import ``name`` from the zip in a new interpreter (as the target imports a payload) -> (value, file)."""
    code = "import sys; sys.path.insert(0, %r); import %s as m; print(m.VALUE, m.__file__)" % (zip_path, name)
    res = subprocess.run([sys.executable, "-I", "-c", code], capture_output=True, text=True, check=True, timeout=60)
    value, path = res.stdout.split()
    return value, path


def test_the_payload_gets_checked_bytecode_that_the_target_imports(tmp_path):
    import zipfile
    files = {"pkg/__init__.py": "", "pkg/mod.py": "from __future__ import annotations\nVALUE = 'from-source'\n",
             "broken.py": "def (:\n"}
    out = pc.with_bytecode(payload_zip(files))
    with zipfile.ZipFile(__import__("io").BytesIO(out)) as zf:
        names = set(zf.namelist())
        assert zf.read("pkg/mod.py") == files["pkg/mod.py"].encode()  # the sources stay
    # a .pyc beside each .py that compiles; one that does not is left to the target
    assert names == set(files) | {"pkg/__init__.pyc", "pkg/mod.pyc"}
    assert pc.with_bytecode(out) == pc.with_bytecode(out) and set(zipfile.ZipFile(
        __import__("io").BytesIO(pc.with_bytecode(out))).namelist()) == names  # never a second .pyc
    path = tmp_path / "payload.zip"
    path.write_bytes(out)
    value, where = import_from(str(path), "pkg.mod")
    assert value == "from-source" and where.endswith("pkg/mod.pyc")  # the bytecode was used


def test_bytecode_whose_source_changed_is_not_used(tmp_path):
    """Checked-hash bytecode: the target compiles the source when it is not the one the .pyc was made from."""
    import io
    import zipfile
    out = pc.with_bytecode(payload_zip({"mod.py": "VALUE = 'old'\n"}))
    changed = io.BytesIO()
    with zipfile.ZipFile(io.BytesIO(out)) as src, zipfile.ZipFile(changed, "w") as dst:
        dst.writestr("mod.pyc", src.read("mod.pyc"))
        dst.writestr("mod.py", "VALUE = 'new'\n")
    path = tmp_path / "payload.zip"
    path.write_bytes(changed.getvalue())
    value, where = import_from(str(path), "mod")
    assert value == "new" and where.endswith("mod.py")


def test_bytecode_of_another_python_is_not_used(tmp_path):
    import io
    import zipfile
    out = pc.with_bytecode(payload_zip({"mod.py": "VALUE = 'src'\n"}))
    other = io.BytesIO()
    with zipfile.ZipFile(io.BytesIO(out)) as src, zipfile.ZipFile(other, "w") as dst:
        pyc = bytearray(src.read("mod.pyc"))
        pyc[0:2] = (int.from_bytes(pyc[0:2], "little") + 1).to_bytes(2, "little")  # another magic number
        dst.writestr("mod.pyc", bytes(pyc))
        dst.writestr("mod.py", src.read("mod.py"))
    path = tmp_path / "payload.zip"
    path.write_bytes(other.getvalue())
    assert import_from(str(path), "mod") == ("src", str(path / "mod.py"))


def test_a_cached_payload_gets_its_bytecode_once(tmp_path):
    import base64
    from ansible.executor.module_common import _CachedModule
    path = str(tmp_path / (PREFIX + "none"))
    zip_bytes = payload_zip({"mod.py": "VALUE = 1\n"})
    _CachedModule(zip_data=base64.b64encode(zip_bytes), metadata=None, source_mapping={"a": "b"}).dump(path)
    assert pc.add_bytecode(path) is True
    loaded = _CachedModule.load(path)
    assert loaded.source_mapping == {"a": "b"}
    assert base64.b64decode(loaded.zip_data) == pc.with_bytecode(zip_bytes)
    assert pc.add_bytecode(path) is False
    assert os.listdir(tmp_path) == [PREFIX + "none"]  # no temp file left


def test_keep_prepares_only_what_it_stores(tmp_path):
    """``prepare`` (the bytecode) runs on a payload this run built, before it is stored; never on one the store
    has already, nor on the run cache's other files."""
    parent = tmp_path / "tmp"
    parent.mkdir(mode=0o700)
    run = tmp_path / "run"
    run.mkdir()
    for name in (PREFIX + "none", PREFIX + "none.lock", "ansible.builtin.ping-x"):
        (run / name).write_bytes(b"built")
    store = pc.store_dir(str(parent), "trainer_lock", "k")
    prepared = []

    def prepare(path):
        prepared.append(os.path.basename(path))
        with open(path, "ab") as fh:
            fh.write(b"+bytecode")

    assert pc.keep(store, str(run), PREFIX, prepare=prepare) == [PREFIX + "none"]
    assert prepared == [PREFIX + "none"]
    assert open(os.path.join(store, PREFIX + "none"), "rb").read() == b"built+bytecode"
    assert pc.keep(store, str(run), PREFIX, prepare=prepare) == [] and prepared == [PREFIX + "none"]
