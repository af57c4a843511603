"""The collection's connection plugin is loaded once, in ansible-playbook's own process, by the guard play's
hosts filter (plugins/plugin_utils/_preload.py): every task's worker, forked after it, inherits it."""
import os
import subprocess
import sys
import textwrap

from ansible_collections.dflash.trainer.plugins.plugin_utils import _preload


class Loader:
    def __init__(self, fail=False):
        self.fail, self.asked = fail, []

    def get(self, name, class_only=False):
        self.asked.append((name, class_only))
        if self.fail:
            raise ValueError("broken plugin")
        return object


def test_preload_asks_the_loader_for_the_collection_connection_class_only():
    loader = Loader()
    assert _preload.preload_connection(loader) is True
    assert loader.asked == [("dflash.trainer.pct", True)]


def test_a_preload_that_fails_never_fails_the_run():
    assert _preload.preload_connection(Loader(fail=True)) is False


def test_the_guard_filter_leaves_the_connection_and_its_options_loaded_in_its_process():
    """In a fresh interpreter (nothing loaded yet): after the guard play's hosts filter ran, the process holds the
    connection's module and its options' definitions - what a forked worker would otherwise load again."""
    code = textwrap.dedent("""
        import os
        import sys
        from ansible import constants as C
        from ansible.plugins.loader import init_plugin_loader
        init_plugin_loader([os.path.abspath("collections")])
        mod = "ansible_collections.dflash.trainer.plugins.connection.pct"
        assert mod not in sys.modules
        from ansible_collections.dflash.trainer.plugins.filter.target_guard import trainer_guard_hosts
        assert trainer_guard_hosts(["a"], ["b", "a"]) == ["a", "b", "localhost"]
        assert mod in sys.modules
        assert C.config.has_configuration_definition("connection", mod)
        print("ok")
    """)
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False, timeout=120,
                         cwd=_root())
    assert res.returncode == 0 and res.stdout.strip() == "ok", res.stderr


def _root():
    return os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
