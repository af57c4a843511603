"""trainer_env values stay secret (module_utils/target/secrets.py): read back from the environment file
the role writes, masked as *** in every text that leaves the target."""
from hypothesis import given
from hypothesis import strategies as st

from ansible_collections.dflash.trainer.plugins.filter.systemd_quote import systemd_env_file
from ansible_collections.dflash.trainer.plugins.module_utils.target import secrets as s
from ansible_collections.dflash.trainer.plugins.module_utils.target.install import masked_env
from ansible_collections.dflash.trainer.plugins.module_utils.target.ownership import ENV_MARK

printable = st.text(alphabet=st.characters(min_codepoint=32, max_codepoint=0x2FFF, blacklist_characters="\x7f"),
                    max_size=40)


@given(st.dictionaries(st.from_regex(r"\A[A-Za-z_][A-Za-z0-9_]{0,10}\Z"), printable, max_size=6))
def test_the_env_file_reads_back_what_the_filter_wrote(env):
    text = ENV_MARK + "\n" + systemd_env_file(env)
    assert s.parse_env_file(text) == env


def test_role_entries_and_short_values_are_not_secrets():
    env = {"HF_TOKEN": "hf_abcdef", "PYTHONUNBUFFERED": "1", "TORCHINDUCTOR_CACHE_DIR": "/tmp/torchinductor_root",
           "N": "1", "KEY": "abc", "SUB": "abcdef"}
    assert s.secret_values(env) == ["hf_abcdef", "abcdef", "abc"]


def test_mask_reaches_every_string_in_nested_data():
    secrets = s.secret_values({"HF_TOKEN": "hf_s3cr3t", "PART": "s3cr3t"})
    data = {"msg": "using token hf_s3cr3t", "tail": ["a", "auth hf_s3cr3t failed", ("s3cr3t",)],
            "n": 3, "hf_s3cr3t": None}
    got = s.mask(data, secrets)
    assert got == {"msg": "using token ***", "tail": ["a", "auth *** failed", ("***",)], "n": 3, "***": None}
    assert "s3cr3t" not in repr(got)


@given(st.text(alphabet="abcxyz -", min_size=3, max_size=12), st.text(alphabet="abcxyz -:\n", max_size=60))
def test_no_secret_survives_masking(secret, text):
    secrets = s.secret_values({"T": secret})
    if secrets:
        assert secret not in s.mask(text + secret + text, secrets)


def test_a_number_is_masked_where_it_stands_alone_never_inside_another():
    """trainer_env {"FAKE_TRAINER_STARTUP_S": "0.3", "NCCL_TIMEOUT": "1800"}: the figures the proof reports keep their
    digits (40.3K tok/s, 21800 steps), the values themselves are masked."""
    secrets = s.secret_values({"STARTUP_S": "0.3", "NCCL_TIMEOUT": "1800", "TOKEN": "hf_x0.3y"})
    text = "40.3K tok/s at step 21800; startup 0.3 s, timeout=1800, 0.3. 1800s 0.35 hf_x0.3y"
    assert s.mask(text, secrets) == "40.3K tok/s at step 21800; startup *** s, timeout=***, ***. ***s 0.35 ***"


def test_read_secrets(tmp_path):
    path = tmp_path / "trainer.env"
    path.write_text(ENV_MARK + "\n" + systemd_env_file({"HF_TOKEN": 'a"b$c', "PYTHONUNBUFFERED": "1"}))
    assert s.read_secrets(str(path)) == ['a"b$c']
    assert s.read_secrets(str(tmp_path / "missing")) == []
    assert s.read_secrets(None) == []


def test_diff_masks_every_line_of_an_env_file():
    text = ENV_MARK + '\nHF_TOKEN="hunter2"\nstray line hunter2\n# comment hunter2\n'
    got = masked_env(text)
    assert "hunter2" not in got
    assert got == ENV_MARK + "\nHF_TOKEN=********\n********\n********\n"
