"""systemd itself reads what the quoting filters write (lab container 212)."""
import json

from ansible_collections.dflash.trainer.plugins.filter.systemd_quote import systemd_env_file, systemd_exec_argv

TRICKY = ["plain", "with space", 'quote"d', "100%", "$HOME", "back\\slash", "ü", ";rm -rf /;"]


def test_systemd_parses_exec_argv_and_env_file_back(lab, scratch_ct):
    env = {"A_%d" % i: v for i, v in enumerate(TRICKY)}
    script = "import json, os, sys; print(json.dumps([sys.argv[1:], {k: v for k, v in os.environ.items() if k.startswith('A_')}]))"
    unit = "\n".join([
        "[Service]",
        "Type=oneshot",
        "EnvironmentFile=/tmp/quote-test.env",
        "ExecStart=" + systemd_exec_argv(["/usr/bin/python3", "-c", script] + TRICKY),
        "",
    ])
    assert lab.ct(scratch_ct, "sh", "-c", 'cat > /etc/systemd/system/quote-test.service', input=unit).returncode == 0
    assert lab.ct(scratch_ct, "sh", "-c", "cat > /tmp/quote-test.env", input=systemd_env_file(env)).returncode == 0
    assert lab.ct(scratch_ct, "systemctl", "daemon-reload").returncode == 0
    res = lab.ct(scratch_ct, "systemctl", "start", "quote-test")
    assert res.returncode == 0, res.stderr
    out = lab.ct(scratch_ct, "journalctl", "-u", "quote-test", "-o", "cat", "--no-pager", "-n", "20").stdout
    argv, seen = json.loads([line for line in out.splitlines() if line.startswith("[[")][-1])
    assert argv == TRICKY
    assert seen == env
