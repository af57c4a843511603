"""Is this a torchinductor cache? (module_utils/target/inductor_cache.py): every entry at every depth is
judged by inductor's real layout - a tree real torch wrote passes; a corpus of two-character
directories, a project's model.py and eval_results.json, 201 json shards beside a checkpoint are
refused, and the purge then deletes nothing; after a purge the cache directory is ours, 0700."""
import os
import stat

import pytest

from ansible_collections.dflash.trainer.plugins.module_utils.target import inductor_cache as ic
from ansible_collections.dflash.trainer.plugins.module_utils.target import ownership as _ownership
from ansible_collections.dflash.trainer.plugins.module_utils.target.inductor_cache import CacheRefused, purge

HERE = os.path.dirname(os.path.abspath(__file__))
REAL = os.path.join(HERE, "fixtures", "inductor_cache_torch_2.13_cpu.txt")
KEY = "c3bm7qpgiyjpkp7if2jwvf7dvibbkcxzvaxvrwcbwndsspltizml"  # a real key (3b/ holds it)


def real_tree():
    with open(REAL, encoding="utf-8") as fh:
        lines = [line.rstrip("\n") for line in fh if line.strip() and not line.startswith("#")]
    return [(line.rstrip("/"), "dir" if line.endswith("/") else "file") for line in lines]


def make(root, names):
    """Build a tree: names ending in / are directories; the rest files (parents made)."""
    for name in names:
        path = os.path.join(str(root), name.rstrip("/"))
        if name.endswith("/"):
            os.makedirs(path, exist_ok=True)
        else:
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(path, "w") as fh:
                fh.write("x")
    return str(root)


def snapshot(root):
    out = {}
    for base, dirs, files in os.walk(str(root)):
        for name in dirs + files:
            p = os.path.join(base, name)
            st = os.lstat(p)
            out[os.path.relpath(p, str(root))] = (st.st_mode, st.st_size, st.st_mtime_ns)
    return out


def test_the_tree_real_torch_wrote_is_a_cache():
    tree = real_tree()
    assert len(tree) > 90 and any(p.startswith("fxgraph/") for p, _k in tree)
    assert ic.tree_problem(tree) is None
    # and on disk, through observe + the purge: everything goes, the directory comes back empty, 0700
    assert ic.cache_problem({"exists": True, "type": "dir", "tree": tree}) is None


def test_purge_deletes_a_real_layout_and_makes_the_directory_ours_0700(tmp_path):
    path = make(tmp_path / "torchinductor_root", [p + ("/" if k == "dir" else "") for p, k in real_tree()])
    os.chmod(path, 0o777)
    assert purge(path) is True
    st = os.lstat(path)
    assert stat.S_ISDIR(st.st_mode) and os.listdir(path) == []
    assert stat.S_IMODE(st.st_mode) == 0o700 and st.st_uid == os.geteuid()


def test_purge_of_an_absent_cache_makes_it_0700_and_a_symlink_is_never_followed(tmp_path):
    path = str(tmp_path / "absent")
    assert purge(path) is False and stat.S_IMODE(os.lstat(path).st_mode) == 0o700
    keep = make(tmp_path / "keep", ["f.txt"])
    link = tmp_path / "link"
    link.symlink_to(keep)
    assert purge(str(link)) is True
    assert os.path.exists(os.path.join(keep, "f.txt")) and not os.path.islink(str(link))
    assert stat.S_IMODE(os.lstat(str(link)).st_mode) == 0o700


@pytest.mark.parametrize("names, shown", [
    # the findings: a corpus of language directories, a project, shards beside a checkpoint
    (["en/train.txt", "de/train.txt", "fr/valid.txt"], "de/train.txt"),
    (["en/", "de/", "fr/", "en/shard-00001.arrow"], "en/shard-00001.arrow"),
    (["model.py", "eval_results.json"], "eval_results.json"),
    (["shard_%03d.json" % i for i in range(201)] + ["model.safetensors"], "model.safetensors"),
    # a hash directory whose files are not named by its hash
    (["3b/%s.so" % KEY.replace("3b", "zz", 1)], "a file not named by a hash of its directory 3b/"),
    (["3b/%s.so" % KEY, "3b/notes.md"], "3b/notes.md"),
    # deep: inductor's own directories holding something else
    (["fxgraph/gi/model.py"], "fxgraph/gi/model.py"),
    (["locks/%s.lock" % KEY, "locks/passwords.txt"], "locks/passwords.txt"),
    (["aotautograd/%s/checkpoint.pt" % ("a" + KEY[1:])], "checkpoint.pt"),
    (["triton/0/%s/train.csv" % KEY], "train.csv"),
    (["precompiled_headers/data.bin"], "precompiled_headers/data.bin"),
    (["dynamo/notes.txt"], "dynamo/notes.txt"),
    (["tmpabcdef12/en/train.txt"], "tmpabcdef12/en/train.txt"),  # a nested cache is judged as the top
])
def test_anything_else_at_any_depth_refuses_and_the_purge_deletes_nothing(tmp_path, names, shown):
    path = make(tmp_path / "c", names)
    why = ic.cache_problem(ic.observe(path))
    assert why and "does not look like a torchinductor cache" in why and shown in why, why
    before = snapshot(path)
    with pytest.raises(CacheRefused) as exc:
        purge(path)
    assert "nothing was deleted" in exc.value.msg and shown in exc.value.msg
    assert snapshot(path) == before


def test_no_cut_off_the_201st_name_is_judged_too(tmp_path):
    names = ["%s/%s.so" % (KEY[1:3], KEY)] * 1 + ["%02x/" % i for i in range(230)] + ["zz_model.safetensors"]
    path = make(tmp_path / "c", names)
    why = ic.cache_problem(ic.observe(path))
    assert why and "zz_model.safetensors" in why


def test_links_mounts_and_special_files_are_never_inductors(tmp_path):
    assert ic.entry_problem(("3b",), "symlink") == "a symlink"
    assert "mount point" in ic.entry_problem(("3b",), "mount")
    assert "special file" in ic.entry_problem(("locks", "x.lock"), "other")
    path = make(tmp_path / "c", ["3b/%s.so" % KEY])
    os.symlink("/etc", os.path.join(path, "3b", KEY + ".py"))
    why = ic.cache_problem(ic.observe(path))
    assert why and "a symlink" in why and os.path.exists("/etc/passwd")
    os.mkfifo(os.path.join(path, "locks_fifo"))
    assert "locks_fifo" in ic.cache_problem(ic.observe(path))


def test_the_shown_names_are_few_and_the_rest_counted(tmp_path):
    path = make(tmp_path / "c", ["doc%d.txt" % i for i in range(12)])
    why = ic.cache_problem(ic.observe(path))
    assert "and 7 more entries like them" in why and why.count(".txt") == 6  # five shown, the first one explained


def test_what_inductor_writes_beside_hash_directories():
    for rel, kind in [("memoizer_cache.json", "file"), ("memoizer_cache.lock", "file"), ("tmpa1b2c3d4.py", "file"),
                      ("configs_sm90_3.9_default.json", "file"), ("tmpa1b2c3d4", "dir"),
                      ("3b/.1234.140211.tmp", "file"), ("3b/%s.so.load_ok" % KEY, "file"),
                      ("3b/%s.main.cpp" % KEY, "file"), ("3b/%s" % KEY, "dir"), ("3b/%s/%s.o" % (KEY, KEY), "file"),
                      ("precompiled_headers/locks", "dir"), ("precompiled_headers/locks/x.h.lock", "file"),
                      ("precompiled_headers/%s.h" % KEY, "file"), ("precompiled_headers/%s.h.gch" % KEY, "file"),
                      ("triton/0/%s/triton_poi_fused_add_0.cubin" % KEY, "file"),
                      ("triton/0/%s/__grp__triton_poi_fused_add_0.json" % KEY, "file"),
                      ("cache/" + "0123456789abcdef" * 4, "file"),
                      ("dynamo/code_state_%s.pkl" % KEY, "file"), ("gcc/libx.so", "file")]:
        assert ic.entry_problem(tuple(rel.split("/")), kind) is None, rel


def test_top_level_facts_of_ownership_observe_are_judged_by_the_same_rules(tmp_path):
    path = make(tmp_path / "c", ["3b/%s.so" % KEY, "locks/", "model.py"])
    facts = _ownership.observe(path, "cache")
    assert "model.py" in ic.cache_problem(facts)
    assert _ownership.cache_problem is ic.cache_problem
    os.unlink(os.path.join(path, "model.py"))
    assert ic.cache_problem(_ownership.observe(path, "cache")) is None


def test_a_file_or_nothing_at_the_path(tmp_path):
    (tmp_path / "f").write_text("x")
    assert "not a torchinductor cache directory" in ic.cache_problem(ic.observe(str(tmp_path / "f")))
    assert ic.cache_problem(ic.observe(str(tmp_path / "none"))) is None
