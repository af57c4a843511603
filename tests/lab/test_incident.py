"""The incident, reproduced on the real path ssh -> pct exec -> container (lab container 212).

- `nohup CMD & disown` inside `pct exec` under a pty races the session's hangup: a child that has not
  reached nohup when the session ends is killed; one that has lives on, owned by no unit;
- the same process owned by a systemd unit survives the session;
- the incident's literal restart command kills its own shell (`pkill -9 -f` matches the
  `bash -c '...'` that runs it): exit 137, no output, no log, no trainer.
"""
import subprocess

from labkit import wait_for


def ssh(lab, remote, tty=False, timeout=60):
    argv = lab.ssh_argv(*(["-tt"] if tty else [])) + [remote]
    return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL, check=False)


def alive(lab, ct, pid):
    return lab.ct(ct, "kill", "-0", str(pid)).returncode == 0


def test_nohup_under_pct_exec_with_pty_is_killed_by_the_hangup_when_it_has_not_yet_run(lab, scratch_ct):
    """`nohup X & disown` under a pty is a race between the child reaching nohup and the session's
    hangup (the field saw 0 of 5 survive; a loaded machine lets the child win). The losing side, made
    certain: the child is held at its own redirection (a FIFO nobody opens yet, as a log on a slow
    disk) when the session ends, so the hangup reaches it before nohup ever ran."""
    lab.ct(scratch_ct, "sh", "-c", "rm -f /tmp/nohup.pid /tmp/nohup.fifo && mkfifo /tmp/nohup.fifo")
    res = ssh(lab, "pct exec %s -- bash -c 'nohup sleep 4201 >/tmp/nohup.fifo 2>&1 & echo $! >/tmp/nohup.pid; disown'"
              % scratch_ct, tty=True)
    assert res.returncode == 0, res.stderr
    pid = lab.ct(scratch_ct, "cat", "/tmp/nohup.pid").stdout.strip()
    assert pid.isdigit(), "the nohup'd process was never started"
    try:
        # polled: the session's teardown takes longer on a loaded machine; without a hangup the child
        # waits at its open() for ever
        gone = wait_for(lambda: not alive(lab, scratch_ct, pid), timeout=60)
        assert gone, "the child %s outlived the pct exec session that never let it reach nohup" % pid
    finally:
        lab.ct(scratch_ct, "kill", "-9", pid)
        lab.ct(scratch_ct, "rm", "-f", "/tmp/nohup.fifo")


def test_nohup_that_won_the_race_belongs_to_no_unit(lab, scratch_ct):
    """The winning side: the session ends only once the child runs as `sleep` (nohup has run). It
    lives on, but nothing owns it: no unit restarts it, records its exit or stops it."""
    lab.ct(scratch_ct, "rm", "-f", "/tmp/nohup.pid", "/tmp/nohup.log")
    res = ssh(lab, "pct exec %s -- bash -c 'nohup sleep 4204 >/tmp/nohup.log 2>&1 & p=$!; echo $p >/tmp/nohup.pid; "
              "until [ \"$(cat /proc/$p/comm)\" = sleep ]; do :; done; disown'" % scratch_ct, tty=True)
    assert res.returncode == 0, res.stderr
    pid = lab.ct(scratch_ct, "cat", "/tmp/nohup.pid").stdout.strip()
    assert pid.isdigit(), "the nohup'd process was never started"
    try:
        assert alive(lab, scratch_ct, pid)
        owner = lab.ct(scratch_ct, "systemctl", "status", pid, "--no-pager")
        assert owner.returncode != 0 and "does not belong to any loaded unit" in owner.stdout + owner.stderr, owner
    finally:
        lab.ct(scratch_ct, "kill", "-9", pid)


def test_systemd_unit_survives_the_session(lab, scratch_ct):
    unit = "incident-survivor"
    lab.ct(scratch_ct, "systemctl", "stop", unit)
    res = ssh(lab, "pct exec %s -- systemd-run --unit=%s sleep 4202" % (scratch_ct, unit), tty=True)
    assert res.returncode == 0, res.stderr
    try:
        first = lab.ct(scratch_ct, "systemctl", "show", unit, "-p", "MainPID", "--value").stdout.strip()
        assert first not in ("", "0")
        # a new session, after the first one ended: the same process is still there
        res = ssh(lab, "pct exec %s -- systemctl show %s -p ActiveState -p MainPID -p NRestarts" % (scratch_ct, unit))
        props = dict(line.split("=", 1) for line in res.stdout.split())
        assert props == {"ActiveState": "active", "MainPID": first, "NRestarts": "0"}
        assert alive(lab, scratch_ct, first)
    finally:
        lab.ct(scratch_ct, "systemctl", "stop", unit)


def test_incident_restart_command_kills_itself(lab, scratch_ct):
    lab.ct(scratch_ct, "rm", "-f", "/tmp/incident.log")
    cmd = ("pct exec %s -- /bin/bash -c 'pkill -9 -f sleep.4203; rm -rf /tmp/torchinductor_root; "
           "nohup sleep 4203 >/tmp/incident.log 2>&1 & disown; ps aux | grep sleep.4203 | grep -v grep | wc -l'"
           % scratch_ct)
    res = ssh(lab, cmd)
    assert res.returncode == 137, (res.returncode, res.stdout, res.stderr)
    assert res.stdout == ""
    assert lab.ct(scratch_ct, "test", "-e", "/tmp/incident.log").returncode == 1
    assert lab.ct(scratch_ct, "pgrep", "-f", "sleep 4203").returncode == 1
