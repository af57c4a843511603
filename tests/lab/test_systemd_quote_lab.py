"""systemd itself reads what the quoting filters write (lab container 212)."""
import json
import uuid

from labkit import wait_for

from ansible_collections.dflash.trainer.plugins.filter.systemd_quote import systemd_env_file, systemd_exec_argv

TRICKY = ["plain", "with space", 'quote"d', "100%", "$HOME", "back\\slash", "ü", ";rm -rf /;"]


def test_systemd_parses_exec_argv_and_env_file_back(lab, scratch_ct):
    env = {"A_%d" % i: v for i, v in enumerate(TRICKY)}
    run_id = uuid.uuid4().hex  # this run's line, not one an earlier run left in the container's journal
    script = ("import json, os, sys; print(json.dumps([sys.argv[1:], {k: v for k, v in os.environ.items() "
              "if k.startswith('A_')}, %r]))" % run_id)
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

    def line():
        out = lab.ct(scratch_ct, "journalctl", "-u", "quote-test", "-o", "cat", "--no-pager", "-n", "20").stdout
        return ([ln for ln in out.splitlines() if ln.startswith("[[") and run_id in ln] or [None])[-1]

    # polled: journald reads the service's output stream on its own time, maybe after `systemctl start` returned
    found = wait_for(line, timeout=30)
    assert found, "no output line of this run in the journal"
    argv, seen, _run_id = json.loads(found)
    assert argv == TRICKY
    assert seen == env
