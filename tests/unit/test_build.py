"""The collection as users, AWX and Automation Controller get it (issue 9 item 7): the tarball of
`ansible-galaxy collection build` holds the collection and nothing of the project around it,
installs offline into a fresh collections path, and every module and plugin (filters included)
and the role render with ansible-doc from that copy - with Ansible's configuration, cwd and
collections path all outside this checkout. execution-environment.yml yields an ansible-builder
context that installs that tarball. `pip install` of the package gives the API and the CLI,
which find the installed collection and need nothing from the checkout.
(The deploy from the installed copy is tests/lab/test_installed_lab.py.)"""
import glob
import hashlib
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import types

import pytest
import yaml

from dflash_trainer import api

ROOT = api.REPO_ROOT
GALAXY = yaml.safe_load(open(os.path.join(ROOT, "galaxy.yml")))
TARBALL = "%s-%s-%s.tar.gz" % (GALAXY["namespace"], GALAXY["name"], GALAXY["version"])
BIN = os.path.dirname(sys.executable)
# the collection alone is ≈ 400 KiB; what must never ride in it (the venv, the lab, bench results) is megabytes
MAX_TARBALL_BYTES = 512 * 1024


def clean_env(tmp, **extra):
    """An environment that points Ansible at nothing of the checkout: its own empty
    configuration, ANSIBLE_HOME and collections path under TMP, no PYTHONPATH."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("ANSIBLE_") and k != "PYTHONPATH"}
    cfg = os.path.join(tmp, "ansible.cfg")
    if not os.path.exists(cfg):
        with open(cfg, "w") as fh:
            fh.write("[defaults]\n")
    env.update(ANSIBLE_CONFIG=cfg, ANSIBLE_HOME=os.path.join(tmp, "home"), ANSIBLE_NOCOLOR="1",
               ANSIBLE_COLLECTIONS_PATH=os.path.join(tmp, "colls"), PATH=BIN + os.pathsep + env.get("PATH", ""))
    env.update(extra)
    return env


def run(argv, cwd, env, timeout=120):
    res = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout, check=False)
    assert res.returncode == 0, "%s: rc %s\n%s\n%s" % (" ".join(argv), res.returncode, res.stdout[-3000:], res.stderr[-3000:])
    return res


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """.tmp (a dir), .tarball, .root (the installed collection): built from the checkout, installed
    from the tarball alone (dependencies: none; no galaxy server is asked)."""
    tmp = str(tmp_path_factory.mktemp("collection"))
    env = clean_env(tmp)
    run([os.path.join(BIN, "ansible-galaxy"), "collection", "build", "--output-path", tmp, ROOT], tmp, env)
    tarball = os.path.join(tmp, TARBALL)
    run([os.path.join(BIN, "ansible-galaxy"), "collection", "install", "--offline", tarball, "-p",
         os.path.join(tmp, "colls")], tmp, env)
    root = os.path.join(tmp, "colls", "ansible_collections", GALAXY["namespace"], GALAXY["name"])
    assert os.path.isfile(os.path.join(root, "MANIFEST.json"))
    return types.SimpleNamespace(tmp=tmp, tarball=tarball, root=root)


def checkout_files():
    """What git would commit: tracked files plus untracked ones it does not ignore."""
    out = subprocess.run(["git", "-C", ROOT, "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                         capture_output=True, text=True, check=True).stdout
    return {p for p in out.split("\0") if p}


def test_tarball_is_small_and_holds_the_collection_only(installed):
    tarball = installed.tarball
    size = os.path.getsize(tarball)
    assert size < MAX_TARBALL_BYTES, "%s is %d bytes" % (tarball, size)
    with tarfile.open(tarball) as tar:
        names = {m.name for m in tar.getmembers() if m.isfile()}
    for needed in ("MANIFEST.json", "FILES.json", "meta/runtime.yml", "playbooks/deploy.yml", "playbooks/status.yml",
                   "roles/trainer/tasks/main.yml", "roles/trainer/meta/argument_specs.yml",
                   "plugins/connection/pct.py", "plugins/filter/systemd_quote.py",
                   "plugins/filter/systemd_exec_argv.yml", "plugins/filter/systemd_env_file.yml",
                   "execution-environment.yml", "README.md"):
        assert needed in names, needed
    modules = {os.path.relpath(p, ROOT) for p in glob.glob(os.path.join(ROOT, "plugins", "modules", "*.py"))}
    assert modules and modules <= names
    leaked = sorted(n for n in names if re.match(
        r"(\.|collections/|lab/|molecule/|bench/|dflash_trainer/|tests/(unit|lab)/|context/|build/|dist/)"
        r"|.*(__pycache__|\.pyc$|\.tar\.gz$|\.egg-info)|(ansible\.cfg|Makefile|pyproject\.toml|conftest\.py)$", n))
    assert leaked == []
    # nothing that git ignores (venv, caches, lab state, results) and nothing outside the checkout's files
    assert names - {"MANIFEST.json", "FILES.json"} <= checkout_files()


def plugin_names():
    """{ansible-doc type: FQCNs} for every module, connection and filter of the checkout, and the role."""
    prefix = "%s.%s." % (GALAXY["namespace"], GALAXY["name"])
    found = {"role": [prefix + "trainer"]}
    for kind, folder in (("module", "modules"), ("connection", "connection")):
        found[kind] = sorted(prefix + os.path.basename(p)[:-3]
                             for p in glob.glob(os.path.join(ROOT, "plugins", folder, "*.py"))
                             if not os.path.basename(p).startswith("_"))
    filters = []
    for path in glob.glob(os.path.join(ROOT, "plugins", "filter", "*.py")):
        spec = importlib.util.spec_from_file_location("_filters_" + os.path.basename(path)[:-3], path)
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        filters.extend(mod.FilterModule().filters())
    found["filter"] = sorted(prefix + f for f in filters)
    assert len(found["module"]) >= 8 and found["connection"] and len(found["filter"]) >= 2
    return found


@pytest.mark.parametrize("kind", ["module", "connection", "filter", "role"])
def test_ansible_doc_renders_every_plugin_from_the_installed_copy(installed, kind):
    tmp, root = installed.tmp, installed.root
    names = plugin_names()[kind]
    res = run([os.path.join(BIN, "ansible-doc"), "-t", kind, *names], tmp, clean_env(tmp))
    assert "[WARNING]" not in res.stderr and "[ERROR]" not in res.stderr, res.stderr
    headers = dict(re.findall(r"^> %s:? \*?([\w.]+)\*? \((.+?)\)" % kind.upper(), res.stdout, re.M))
    assert sorted(headers) == names, res.stdout[:2000]
    for name, path in headers.items():
        assert path.startswith(root + os.sep) or path == root, (name, path)
    # and documented, not just found: every one has a description and options in the JSON form
    docs = json.loads(run([os.path.join(BIN, "ansible-doc"), "--json", "-t", kind, *names], tmp, clean_env(tmp)).stdout)
    for name in names:
        doc = docs[name]["doc"] if kind != "role" else docs[name]["entry_points"]["main"]
        assert doc.get("short_description") and (doc.get("options") or kind == "connection"), name


def test_installed_collection_runs_its_playbooks_by_fqcn(installed):
    tmp, root = installed.tmp, installed.root
    with open(os.path.join(tmp, "hosts.yml"), "w") as fh:
        fh.write("trainer_hosts:\n  hosts:\n    ct: {proxmox_vmid: 223}\n")
    for play in ("deploy", "status", "restart", "rollback", "history"):
        res = run([os.path.join(BIN, "ansible-playbook"), "-i", "hosts.yml", "dflash.trainer." + play, "--syntax-check"],
                  tmp, clean_env(tmp))
        assert "playbook: %s" % os.path.join(root, "playbooks", play + ".yml") in res.stdout, res.stdout


def test_execution_environment_context_installs_the_collection(installed, tmp_path):
    tmp, tarball = installed.tmp, installed.tarball
    shutil.copy(os.path.join(ROOT, "execution-environment.yml"), tmp_path)
    shutil.copy(tarball, tmp_path)  # where `ansible-galaxy collection build` in the root puts it
    ctx = tmp_path / "context"
    run([os.path.join(BIN, "ansible-builder"), "create", "-f", "execution-environment.yml", "-c", str(ctx),
         "--output-filename", "Containerfile"], str(tmp_path), clean_env(tmp))
    build = ctx / "_build"
    reqs = yaml.safe_load((build / "requirements.yml").read_text())
    assert reqs["collections"] == [{"name": "collections/" + TARBALL, "type": "file"}]
    copied = build / "collections" / TARBALL
    assert hashlib.sha256(copied.read_bytes()).digest() == hashlib.sha256(open(tarball, "rb").read()).digest()
    containerfile = (ctx / "Containerfile").read_text()
    assert "ansible-galaxy collection install" in containerfile and "ansible-core>=2.19,<2.20" in containerfile
    assert "openssh-clients" in (build / "bindep.txt").read_text()
    # the requirement resolves from the context alone, as the image build's galaxy stage runs it
    run([os.path.join(BIN, "ansible-galaxy"), "collection", "install", "--offline", "-r", "requirements.yml",
         "-p", str(tmp_path / "ee-colls")], str(build), clean_env(tmp, ANSIBLE_COLLECTIONS_PATH=str(tmp_path / "ee-colls")))
    assert (tmp_path / "ee-colls" / "ansible_collections" / "dflash" / "trainer" / "playbooks" / "deploy.yml").is_file()


def test_pip_install_gives_the_api_and_cli_that_use_the_installed_collection(installed, tmp_path):
    tmp, root = installed.tmp, installed.root
    src = tmp_path / "src"  # pyproject + package only: the build sees nothing else of the checkout
    shutil.copytree(os.path.join(ROOT, "dflash_trainer"), src / "dflash_trainer",
                    ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(os.path.join(ROOT, "pyproject.toml"), src)
    venv = tmp_path / "venv"
    env = clean_env(tmp)
    run([sys.executable, "-m", "venv", str(venv)], str(tmp_path), env)
    run([str(venv / "bin" / "pip"), "install", "-q", str(src)], str(tmp_path), env, timeout=300)
    shutil.rmtree(src)
    env["PATH"] = str(venv / "bin") + os.pathsep + os.environ.get("PATH", "")
    res = run([str(venv / "bin" / "dflash-trainer"), "--help"], tmp, env)
    assert "deploy" in res.stdout and "status" in res.stdout
    probe = ("import json, dflash_trainer.api as a; k = a.runner_kwargs('status', private_data_dir='/tmp/pdd'); "
             "print(json.dumps([a.__file__, k['playbook'], k['project_dir'], k['envvars']]))")
    where, playbook, project_dir, envvars = json.loads(run([str(venv / "bin" / "python"), "-c", probe], tmp, env).stdout)
    assert where.startswith(str(venv)) and not where.startswith(ROOT)
    assert playbook == os.path.join(root, "playbooks", "status.yml")
    assert project_dir == tmp
    assert envvars["ANSIBLE_COLLECTIONS_PATH"].split(os.pathsep)[0] == os.path.join(tmp, "colls")
    assert envvars["ANSIBLE_CONFIG"] == os.path.join(tmp, "ansible.cfg")
    # without the collection installed it says what to do instead of running something else
    res = subprocess.run([str(venv / "bin" / "python"), "-c", probe], cwd=tmp, capture_output=True, text=True,
                         env=dict(env, ANSIBLE_COLLECTIONS_PATH=str(tmp_path / "empty")), timeout=60, check=False)
    assert res.returncode != 0 and "ansible-galaxy collection install" in res.stderr, res.stderr[-2000:]


# --- the API's lookup of the collection, in process ---------------------------------------------

def fake_install(base):
    root = base / "ansible_collections" / "dflash" / "trainer"
    (root / "playbooks").mkdir(parents=True)
    (root / "roles").mkdir()
    (root / "MANIFEST.json").write_text("{}")
    for rel in api.PLAYBOOKS.values():
        (root / rel).write_text("---\n")
    return str(root)


@pytest.fixture
def not_a_checkout(tmp_path, monkeypatch):
    """The package as pip installs it: REPO_ROOT is site-packages, the checkout is nowhere on sys.path."""
    site = tmp_path / "site-packages"
    site.mkdir()
    monkeypatch.setattr(api, "REPO_ROOT", str(site))
    monkeypatch.setattr(sys, "path", [p for p in sys.path if not os.path.abspath(p or ".").startswith(ROOT)])
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    return tmp_path


def test_the_checkout_is_the_collection_when_the_package_runs_from_it():
    assert api.is_collection_root(ROOT)
    kw = api.runner_kwargs("deploy", private_data_dir="/tmp/pdd", environ={})
    assert kw["playbook"] == os.path.join(ROOT, api.PLAYBOOKS["deploy"]) and kw["project_dir"] == ROOT


def test_installed_collection_on_the_collections_path_is_found(not_a_checkout):
    root = fake_install(not_a_checkout / "colls")
    environ = {"ANSIBLE_COLLECTIONS_PATH": "/nowhere:" + str(not_a_checkout / "colls"), "HOME": str(not_a_checkout)}
    kw = api.runner_kwargs("rollback", private_data_dir="/tmp/pdd", environ=environ)
    assert kw["playbook"] == os.path.join(root, "playbooks", "rollback.yml")
    assert kw["project_dir"] == str(not_a_checkout / "work")  # the caller's, as ansible-playbook
    assert kw["envvars"]["ANSIBLE_COLLECTIONS_PATH"] == os.pathsep.join([str(not_a_checkout / "colls"), "/nowhere"])
    assert "ANSIBLE_CONFIG" not in kw["envvars"]  # none found: Ansible's defaults, as ansible-playbook there
    # a path that names ansible_collections itself counts too; a playbook path stays the caller's
    environ["ANSIBLE_COLLECTIONS_PATH"] = str(not_a_checkout / "colls" / "ansible_collections")
    kw = api.runner_kwargs("site.yml", private_data_dir="/tmp/pdd", environ=environ)
    assert kw["playbook"] == str(not_a_checkout / "work" / "site.yml")


def test_installed_collection_on_sys_path_and_the_callers_configuration(not_a_checkout, monkeypatch):
    root = fake_install(not_a_checkout / "site-packages")
    monkeypatch.setattr(sys, "path", sys.path + [str(not_a_checkout / "site-packages")])
    (not_a_checkout / "work" / "ansible.cfg").write_text("[defaults]\nhost_key_checking = False\n")
    kw = api.runner_kwargs("status", private_data_dir="/tmp/pdd",
                           environ={"HOME": str(not_a_checkout), "ANSIBLE_HOME": str(not_a_checkout / "home")})
    assert kw["playbook"] == os.path.join(root, "playbooks", "status.yml")
    assert kw["envvars"]["ANSIBLE_CONFIG"] == str(not_a_checkout / "work" / "ansible.cfg")
    assert kw["envvars"]["ANSIBLE_HOST_KEY_CHECKING"] == "False"
    assert kw["envvars"]["ANSIBLE_COLLECTIONS_PATH"].split(os.pathsep)[0] == str(not_a_checkout / "site-packages")


def test_no_collection_anywhere_says_how_to_install_it(not_a_checkout):
    with pytest.raises(FileNotFoundError, match="ansible-galaxy collection install"):
        api.runner_kwargs("deploy", private_data_dir="/tmp/pdd",
                          environ={"ANSIBLE_COLLECTIONS_PATH": str(not_a_checkout / "empty"), "HOME": str(not_a_checkout)})
