"""systemd quoting filters: data in, systemd syntax out (the real parser is exercised in tests/lab)."""
import pytest
from ansible.errors import AnsibleFilterError

from ansible_collections.dflash.trainer.plugins.filter.systemd_quote import systemd_env_file, systemd_exec_argv

EXEC_CASES = [
    (["/usr/bin/x"], '"/usr/bin/x"'),
    (["./run.sh", "--lr", "3e-4"], '"./run.sh" "--lr" "3e-4"'),
    (["a b", 'say "hi"'], '"a b" "say \\"hi\\""'),
    (["100%", "$HOME", "${X}"], '"100%%" "$$HOME" "$${X}"'),
    (["back\\slash"], '"back\\\\slash"'),
    ([7, "ü"], '"7" "ü"'),
]


@pytest.mark.parametrize("argv,expected", EXEC_CASES)
def test_exec_argv(argv, expected):
    assert systemd_exec_argv(argv) == expected


@pytest.mark.parametrize("bad", ["./run.sh", [], None, ["a\nb"], ["tab\there"]])
def test_exec_argv_rejects(bad):
    with pytest.raises(AnsibleFilterError):
        systemd_exec_argv(bad)


ENV_CASES = [
    ({}, ""),
    ({"B": "2", "A": "1"}, 'A="1"\nB="2"\n'),
    ({"TOKEN": 'p"a$s`w\\d'}, 'TOKEN="p\\"a\\$s\\`w\\\\d"\n'),
    ({"EMPTY": None, "SPACE": "a b"}, 'EMPTY=""\nSPACE="a b"\n'),
    ({"N": 5, "_X1": "ü"}, 'N="5"\n_X1="ü"\n'),
]


@pytest.mark.parametrize("env,expected", ENV_CASES)
def test_env_file(env, expected):
    assert systemd_env_file(env) == expected


@pytest.mark.parametrize("bad", [{"BAD-NAME": "x"}, {"1X": "x"}, {"": "x"}, ["A=1"]])
def test_env_file_rejects(bad):
    with pytest.raises(AnsibleFilterError):
        systemd_env_file(bad)


def test_env_file_error_never_echoes_the_value():
    with pytest.raises(AnsibleFilterError) as err:
        systemd_env_file({"TOKEN": "s3cret\nvalue"})
    assert "s3cret" not in str(err.value) and "TOKEN" in str(err.value)
