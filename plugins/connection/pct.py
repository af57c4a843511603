# -*- coding: utf-8 -*-
# Copyright (c) 2026 dflash.trainer contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""dflash.trainer.pct: OpenSSH (with connection reuse) to a Proxmox host, then `pct exec` into a CT."""

from __future__ import annotations

DOCUMENTATION = r"""
name: pct
short_description: Run tasks in a Proxmox LXC container through OpenSSH and C(pct exec)
description:
  - Connects to the Proxmox host with the OpenSSH client (C(ssh) binary, never a local shell),
    reusing one ControlMaster connection per host/port/user, and runs every command inside the
    container as C(pct exec VMID -- /bin/sh -c CMD).
  - Supports pipelining (the module is fed on stdin, no temporary files), so a module task costs
    one round trip on a warm master.
  - File transfers stream in constant memory (C(cat) through C(pct exec)); every upload and
    download is verified by its byte count, because the exit status of C(pct) is not trusted.
    C(put_stream) sends data produced while it goes (a release archive) the same way, without
    a local file.
  - Every remote call is bounded by O(pct_command_timeout); a call that outlives it is killed and
    fails with a clear message.
  - Known failures of the transport become C(AnsibleConnectionFailure) (the host is reported
    UNREACHABLE) with a message naming the container and the host - container not running,
    unknown VMID, container locked by Proxmox (told by the texts of pct at any exit status, since
    a Perl C(die) exits with the errno of the moment), host unreachable, authentication failure,
    host key not accepted, sudo refusing or pct missing on the host. Every call prints a mark on stderr first thing in the container
    (removed from what the task sees); once it has, the exit status and the texts are the
    command's own, whatever they say - 255, an C(ssh) or a C(sudo:) error of a command run in
    the container included - and are returned to the task.
  - A run's first contact (the first read of a deploy, C(trainer_plan), or the read of status, logs and
    history, C(trainer_status)) holds its input back until its call reaches the container; a call
    that has not after 5 s asks the node for the container's freezer state, and a
    frozen container (a suspend-mode backup, C(lxc-freeze)) fails it at once, UNREACHABLE, naming
    the freeze and the remedy (C(pct resume VMID)). Its command never got its input and runs nothing
    when the container thaws.
  - The host key is checked (C(StrictHostKeyChecking=yes)) unless O(host_key_checking=false);
    O(known_hosts_file) names the file that holds it.
  - With O(pct_local=true), Ansible runs on the Proxmox host itself and C(pct) is run directly.
author: dflash.trainer maintainers (@dflash)
version_added: 0.1.0
notes:
  - Authentication is by key or agent only (C(BatchMode=yes)); there is no password prompt.
  - Containers on the same host share one SSH master (ControlPath hashes host, port and user).
    OpenSSH's server limits sessions per connection (C(MaxSessions), default 10), so keep C(forks)
    at or below that for one Proxmox host, or raise C(MaxSessions) there.
  - A timed-out call is killed on the controller at once; in the container it is ended by
    C(timeout) 2 s later (see O(pct_timeout_in_container)), or, without it, runs until it ends.
  - The container needs C(/bin/sh), C(cat) and C(wc) (busybox is enough).
options:
  remote_addr:
    description: Address of the Proxmox host.
    type: string
    default: inventory_hostname
    vars:
      - name: inventory_hostname
      - name: ansible_host
      - name: ansible_ssh_host
  port:
    description: SSH port of the Proxmox host. Unset means the ssh client's own default/config.
    type: int
    ini:
      - section: defaults
        key: remote_port
    env:
      - name: ANSIBLE_REMOTE_PORT
    vars:
      - name: ansible_port
      - name: ansible_ssh_port
    keyword:
      - name: port
  remote_user:
    description:
      - User to log in as on the Proxmox host. Unset means the ssh client's default.
      - A non-root user needs O(pct_sudo=true) and a passwordless sudo rule for C(pct).
    type: string
    ini:
      - section: defaults
        key: remote_user
    env:
      - name: ANSIBLE_REMOTE_USER
    vars:
      - name: ansible_user
      - name: ansible_ssh_user
    keyword:
      - name: remote_user
  private_key_file:
    description: Private key for the Proxmox host (same variables as the ssh and proxmox_pct_remote plugins).
    type: string
    ini:
      - section: defaults
        key: private_key_file
    env:
      - name: ANSIBLE_PRIVATE_KEY_FILE
    vars:
      - name: ansible_private_key_file
      - name: ansible_ssh_private_key_file
    cli:
      - name: private_key_file
        option: '--private-key'
  proxmox_vmid:
    description:
      - ID of the container on the Proxmox host (the same variable proxmox_pct_remote reads).
      - Required; a host without it fails as unreachable with a message saying so.
    type: string
    vars:
      - name: proxmox_vmid
      - name: ansible_pct_vmid
  pct_path:
    description: Path of C(pct) on the Proxmox host.
    type: string
    default: /usr/sbin/pct
    ini:
      - section: pct_connection
        key: pct_path
    env:
      - name: ANSIBLE_PCT_PATH
    vars:
      - name: pct_path
      - name: ansible_pct_path
  ssh_executable:
    description: The ssh client to run.
    type: string
    default: ssh
    ini:
      - section: ssh_connection
        key: ssh_executable
    env:
      - name: ANSIBLE_SSH_EXECUTABLE
    vars:
      - name: ansible_ssh_executable
  ssh_extra_args:
    description:
      - Extra arguments for the ssh client, split like a shell would (no shell runs).
      - They come before the plugin's own C(-o) options, and ssh keeps the first value it sees,
        so they override the plugin's defaults (for example C(-o LogLevel=DEBUG)).
    type: string
    default: ''
    ini:
      - section: ssh_connection
        key: ssh_extra_args
    env:
      - name: ANSIBLE_SSH_EXTRA_ARGS
    vars:
      - name: ansible_ssh_extra_args
    cli:
      - name: ssh_extra_args
  pct_tty:
    description:
      - Request a pty (C(ssh -tt)), so that C(pct exec) gives the command a terminal.
      - Never used for pipelined calls (data on stdin); stdout and stderr are merged on a tty.
    type: boolean
    default: false
    ini:
      - section: pct_connection
        key: tty
    env:
      - name: ANSIBLE_PCT_TTY
    vars:
      - name: pct_tty
      - name: ansible_pct_tty
  pct_local:
    description: Ansible runs on the Proxmox host itself - run C(pct) directly, no ssh.
    type: boolean
    default: false
    ini:
      - section: pct_connection
        key: local
    env:
      - name: ANSIBLE_PCT_LOCAL
    vars:
      - name: pct_local
      - name: ansible_pct_local
  pct_node:
    description:
      - >-
        Run on the Proxmox node itself, not in the container - no C(pct), no C(sudo) - over the same
        ssh connection (or locally with O(pct_local)). For tasks that read the node, e.g.
        P(dflash.trainer.trainer_node_gpus#module) reading the node's nvidia-smi; set it in the task's
        C(vars) (C(ansible_pct_node: true)), with the node's C(ansible_python_interpreter).
    type: boolean
    default: false
    vars:
      - name: pct_node
      - name: ansible_pct_node
  pct_sudo:
    description: Prefix C(sudo -n) to C(pct) on the host (for a non-root O(remote_user)).
    type: boolean
    default: false
    ini:
      - section: pct_connection
        key: sudo
    env:
      - name: ANSIBLE_PCT_SUDO
    vars:
      - name: pct_sudo
      - name: ansible_pct_sudo
      - name: proxmox_become
  control_persist:
    description:
      - Seconds an idle SSH master stays up after the last call (C(ControlPersist)).
      - V(0) or less disables connection reuse (a fresh login per call, about 0.3 s each).
    type: int
    default: 60
    ini:
      - section: pct_connection
        key: control_persist
    env:
      - name: ANSIBLE_PCT_CONTROL_PERSIST
    vars:
      - name: ansible_pct_control_persist
  control_path_dir:
    description: Directory of the master sockets (C(ControlPath=DIR/dflash-%C), short enough for a socket path).
    type: string
    default: ~/.ansible/cp
    ini:
      - section: ssh_connection
        key: control_path_dir
    env:
      - name: ANSIBLE_SSH_CONTROL_PATH_DIR
    vars:
      - name: ansible_control_path_dir
  pct_command_timeout:
    description:
      - Seconds any single remote call (a module run, a put, a fetch) may take, after which its
        process group is killed and the task fails with C(command timed out after N s).
      - The default (1800) leaves room for slow package installs; lower it for fast feedback.
    type: int
    default: 1800
    ini:
      - section: pct_connection
        key: command_timeout
    env:
      - name: ANSIBLE_PCT_COMMAND_TIMEOUT
    vars:
      - name: pct_command_timeout
      - name: ansible_pct_command_timeout
  pct_timeout_in_container:
    description:
      - Also bound each command inside the container with C(timeout -k 5) at
        O(pct_command_timeout) + 2 s, when the container has C(timeout) (coreutils or busybox), so
        a command that timed out does not keep running there. Not used with O(pct_tty).
      - V(false) runs C(pct exec VMID -- /bin/sh -c MARK_THEN_CMD sh CMD), which prints the mark and
        execs C(/bin/sh -c CMD).
    type: boolean
    default: true
    ini:
      - section: pct_connection
        key: timeout_in_container
    env:
      - name: ANSIBLE_PCT_TIMEOUT_IN_CONTAINER
    vars:
      - name: pct_timeout_in_container
      - name: ansible_pct_timeout_in_container
  connect_timeout:
    description: Seconds to wait for the TCP connection to the Proxmox host (C(ConnectTimeout)).
    type: int
    default: 10
    ini:
      - section: defaults
        key: timeout
    env:
      - name: ANSIBLE_TIMEOUT
      - name: ANSIBLE_SSH_TIMEOUT
    vars:
      - name: ansible_ssh_timeout
  host_key_checking:
    description:
      - Check the Proxmox host's key with C(StrictHostKeyChecking=yes). A node whose key is not
        in the known_hosts file, or differs from it, fails as unreachable with
        C(host key of HOST was not accepted). This holds whatever the ssh client's own
        configuration says; only O(ssh_extra_args) can override it.
      - V(false) adds C(StrictHostKeyChecking=no) and C(UserKnownHostsFile=/dev/null). Any key
        is accepted then, so anyone on the path can pose as the node, which is root on every
        container. Only for a throw-away lab; pin the key with O(known_hosts_file) instead.
    type: boolean
    default: true
    ini:
      - section: defaults
        key: host_key_checking
    env:
      - name: ANSIBLE_HOST_KEY_CHECKING
      - name: ANSIBLE_SSH_HOST_KEY_CHECKING
    vars:
      - name: ansible_host_key_checking
      - name: ansible_ssh_host_key_checking
  host_key_accept_new:
    description:
      - With O(host_key_checking), accept and record the key of a node not yet known
        (C(StrictHostKeyChecking=accept-new)); a known node whose key changed still fails.
      - Trust on first use - only when you ask for it.
    type: boolean
    default: false
    ini:
      - section: pct_connection
        key: host_key_accept_new
    env:
      - name: ANSIBLE_PCT_HOST_KEY_ACCEPT_NEW
    vars:
      - name: ansible_pct_host_key_accept_new
  known_hosts_file:
    description:
      - known_hosts file holding the Proxmox host's key (C(UserKnownHostsFile)), instead of
        C(~/.ssh/known_hosts). Entries for a port other than 22 read C([host]:port key).
      - The lab (C(lab/lab.py up)) writes its sshd's key to
        C(/var/lib/dflash-lab/ssh/known_hosts), which C(inventory/lab.yml) names here.
    type: string
    ini:
      - section: pct_connection
        key: known_hosts_file
    env:
      - name: ANSIBLE_PCT_KNOWN_HOSTS_FILE
    vars:
      - name: ansible_pct_known_hosts_file
  pipelining:
    description: Feed modules on stdin instead of copying them (one round trip per module task).
    type: boolean
    default: true
    ini:
      - section: defaults
        key: pipelining
      - section: connection
        key: pipelining
      - section: ssh_connection
        key: pipelining
    env:
      - name: ANSIBLE_PIPELINING
      - name: ANSIBLE_SSH_PIPELINING
    vars:
      - name: ansible_pipelining
      - name: ansible_ssh_pipelining
"""

EXAMPLES = r"""
# inventory (YAML)
# all:
#   hosts:
#     gpu-host:
#       ansible_connection: dflash.trainer.pct
#       ansible_host: pve1.example.org
#       ansible_user: root
#       proxmox_vmid: 200
#       pct_command_timeout: 900
"""

import os
import re
import selectors
import shlex
import signal
import subprocess
import tempfile
import threading
import time
import typing as t

from ansible.errors import AnsibleConnectionFailure, AnsibleError, AnsibleFileNotFound
from ansible.module_utils.common.text.converters import to_bytes, to_text
from ansible.plugins.connection import ConnectionBase
from ansible.utils.display import Display

from ansible_collections.dflash.trainer.plugins.plugin_utils import _freezer

display = Display()

# The first thing every call prints in the container, on stderr: a call whose stderr has this
# line reached the container, so its exit status and texts are the command's own, whatever
# they say (an ssh, sudo or pct inside the container). Removed from stderr before anyone sees it.
STARTED_MARK = 'dflash-pct-started'
_MARK = 'printf "%s\\n" ' + STARTED_MARK + ' >&2; '
_STARTED = re.compile(rb'(?:^|(?<=\n))' + re.escape(STARTED_MARK.encode()) + rb'\r?\n')
# In the container, `$1` is the path: never interpolated into the script.
PUT_SCRIPT = _MARK + 'cat > "$1" && wc -c < "$1"'
# put_stream: the same, or into a fifo, whose reader checks what it got (wc would wait for a writer)
PUT_STREAM_SCRIPT = _MARK + 'if [ -p "$1" ]; then cat > "$1" && echo fifo; else cat > "$1" && wc -c < "$1"; fi'
FETCH_SCRIPT = _MARK + 'n=$(wc -c < "$1") || exit 1; printf "dflash-pct-size %s\\n" "$n" >&2; exec cat < "$1"'
# In the container: run CMD ("$1") after the mark.
RUN_SCRIPT = _MARK + 'exec /bin/sh -c "$1"'
# The same, CMD ("$2") bounded by timeout(1) where the container has it, so a call that timed
# out on the controller does not live on there; timeout(1) signals the whole group.
GUARD_SCRIPT = _MARK + ('command -v timeout >/dev/null 2>&1 && exec timeout -k 5 "$1" /bin/sh -c "$2"; '
                        'exec /bin/sh -c "$2"')
GUARD_GRACE_S = 2
COPY_CHUNK = 1024 * 1024
# how often a waiting call checks that ansible-playbook (the worker's parent) still lives
ORPHAN_CHECK_S = 0.5
SIZE_MARK = re.compile(r"^dflash-pct-size\s+(\d+)\s*$", re.M)
# A first contact (an action that sets Connection.frozen_check) whose call has not reached the container (no
# STARTED_MARK) after this many seconds asks the node whether the container is frozen - pct exec waits in a frozen
# container until it thaws - then again after twice as long, and so on; reading the node is bounded by FROZEN_READ_S.
FROZEN_CHECK_S = 5.0
FROZEN_READ_S = 30

# stderr of `ssh` itself when it cannot reach or log into the host (exit 255).
_SSH_UNREACHABLE = re.compile(
    r"ssh: connect to host .*|ssh: Could not resolve hostname .*|Could not resolve hostname .*"
    r"|Connection timed out.*|Operation timed out.*|No route to host.*|Network is unreachable.*"
    r"|Connection refused.*|kex_exchange_identification: .*|Connection closed by .*"
    r"|Connection reset by .*|ssh_exchange_identification: .*")
_SSH_AUTH = re.compile(r".*Permission denied \(.*|Too many authentication failures.*")
_SSH_HOSTKEY = re.compile(r"Host key verification failed.*|.*REMOTE HOST IDENTIFICATION HAS CHANGED.*")
_SSH_HOSTKEY_CHANGED = re.compile(r".*REMOTE HOST IDENTIFICATION HAS CHANGED.*")
_SSH_HOSTKEY_UNKNOWN = re.compile(r"No \S+ host key is known for .*")
# stderr of Proxmox's pct. pct is Perl and its CLI handler does not catch a `die`: the exit status is
# the errno current at the die (ENOENT = 2 after the failed open of a missing config), 255 only when
# errno is 0 (perlfunc `die`; pve-common CLIHandler run_cli_handler). So these are told by their texts,
# at any exit status, as long as the container never ran the command (no STARTED_MARK).
_PCT_NO_CONFIG = re.compile(r"Configuration file '[^']*' does not exist.*")
_PCT_NOT_RUNNING = re.compile(
    r"(?:Error: )?container '?\d+'? not running!?.*|can only (?:push|pull) files (?:to|from) a running (?:CT|VM).*"
    r"|CT \d+ not running.*")
# a Proxmox config lock (`lock: backup` during vzdump, migrate, snapshot, ...): AbstractConfig check_lock
_PCT_LOCKED = re.compile(r"(?:CT|VM) is locked \((?P<lock>[\w-]+)\).*")
_PCT_BAD_VMID = re.compile(r"400 Parameter verification failed\..*|vmid: invalid format.*")
# stderr of `sudo -n` itself when it refuses to run pct (exit 1), old and new sudo wordings.
_SUDO_REFUSED = re.compile(
    r"(?:sudo: )?(?:a password is required|a terminal is required to read the password.*"
    r"|no tty present and no askpass program specified|sorry, you must have a tty to run sudo"
    r"|Sorry, user \S+ (?:is not allowed to execute .*|may not run sudo on .*)"
    r"|\S+ is not in the sudoers file.*|account validation failure.*|PAM account management error.*"
    r"|\d+ incorrect password attempts?)")
_SUDO_NO_PCT = re.compile(r"sudo: .*: command not found")
# the collection's sudo wrapper for pct (extras/dflash-pct-wrapper) refusing a call: exit 77
_WRAPPER_REFUSED = re.compile(r"\S*pct-wrapper: refused: .*")
# the host's login shell when sudo itself is missing (exit 127): bash, dash
_SUDO_MISSING = re.compile(r".*\bsudo: (?:command )?not found|.*\bsudo: No such file or directory")


def _first(pattern: t.Pattern, text: str) -> str | None:
    for line in text.splitlines():
        line = line.strip()
        if line and pattern.fullmatch(line):
            return line
    return None


def split_started(stderr: bytes) -> tuple[bool, bytes]:
    """(did the call reach the container, stderr without the STARTED_MARK line)."""
    match = _STARTED.search(stderr)
    if not match:
        return False, stderr
    return True, stderr[:match.start()] + stderr[match.end():]


def pct_refusal(stderr: str, where: str, vmid: str) -> str | None:
    """Words for pct refusing the call (no such container, not running, locked, bad id), or None.

    Any exit status: a Perl `die` in pct exits with whatever errno was current (2, 5, 11, ...) and
    255 only when errno was 0, so the status says nothing; the callers only ask before the command
    ran (no STARTED_MARK), when no text can be the command's own."""
    line = _first(_PCT_NO_CONFIG, stderr)
    if line:
        return "no container %s on %s: %s" % (vmid, where, line)
    line = _first(_PCT_NOT_RUNNING, stderr)
    if line:
        return "container %s is not running on %s: %s" % (vmid, where, line)
    line = _first(_PCT_LOCKED, stderr)
    if line:
        return ("container %s is locked by Proxmox (%s) on %s: %s - wait for the %s to end, or "
                "`pct unlock %s` on the node if nothing holds it" % (
                    vmid, _PCT_LOCKED.fullmatch(line).group("lock"), where, line,
                    _PCT_LOCKED.fullmatch(line).group("lock"), vmid))
    line = _first(_PCT_BAD_VMID, stderr)
    if line:
        return "invalid container id %r on %s: %s" % (vmid, where, " ".join(stderr.split()))
    return None


def classify_failure(rc: int, stderr: str, host: str, vmid: str, pct_path: str = "/usr/sbin/pct",
                     local: bool = False, sudo: bool = False, started: bool = False) -> str | None:
    """Message for AnsibleConnectionFailure when (rc, stderr) is a transport failure, else None.

    Pure: the unit test drives it from a table. `started`: the call reached the container (its
    stderr held STARTED_MARK), so nothing is a transport failure - the status and the texts are
    the command's own, even a `sudo: ...` or an ssh error of a command run in the container.
    Before that, pct's refusals are told by their texts at any exit status (pct_refusal: a Perl
    `die` exits with the errno of the moment); ssh exits 255 and is told by its texts; sudo (only when
    `sudo`, i.e. pct_sudo, put it there) exits 1 with its own texts. Anything unrecognised is
    returned to the task as it is.
    """
    if started:
        return None
    where = "this host (local pct)" if local else host
    msg = pct_refusal(stderr, where, vmid)
    if msg:
        return msg
    if rc == 255:
        if not local:
            line = _first(_SSH_AUTH, stderr)
            if line:
                return "authentication to %s failed (ssh): %s" % (host, line)
            if _first(_SSH_HOSTKEY_CHANGED, stderr):
                return ("host key of %s was not accepted (ssh): it CHANGED (REMOTE HOST IDENTIFICATION HAS CHANGED)"
                        " - someone may be posing as the node; compare its fingerprint before fixing known_hosts"
                        % host)
            line = _first(_SSH_HOSTKEY_UNKNOWN, stderr)
            if line:
                return ("host key of %s was not accepted (ssh): %s - add the node's key to known_hosts "
                        "(docs/real-host.md)" % (host, line))
            line = _first(_SSH_HOSTKEY, stderr)
            if line:
                return "host key of %s was not accepted (ssh): %s" % (host, line)
            line = _first(_SSH_UNREACHABLE, stderr)
            if line:
                return "host %s is unreachable (ssh): %s" % (host, line)
    if sudo and rc == 1:
        line = _first(_SUDO_REFUSED, stderr)
        if line:
            return "sudo -n for pct failed on %s: %s" % (where, line)
        line = _first(_SUDO_NO_PCT, stderr)
        if line:
            return "pct (%s) cannot be run on %s: %s" % (pct_path, where, line)
    if sudo and rc == 77:
        line = _first(_WRAPPER_REFUSED, stderr)
        if line:
            return "the pct wrapper on %s refused the call: %s" % (where, line)
    if sudo and rc == 127:
        line = _first(_SUDO_MISSING, stderr)
        if line:
            return "sudo cannot be run on %s (pct_sudo): %s" % (where, line)
    if rc in (126, 127) and pct_path in stderr and re.search(r"not found|No such file|Permission denied", stderr):
        return "pct (%s) cannot be run on %s: %s" % (pct_path, where, stderr.strip().splitlines()[-1])
    return None


def quote_remote(argv: list[str]) -> str:
    """The string ssh hands the host's shell: every element shlex-quoted (shlex.split inverts it)."""
    return " ".join(shlex.quote(a) for a in argv)


class Connection(ConnectionBase):
    """ssh (ControlMaster) -> Proxmox host -> pct exec VMID -> container."""

    transport = 'dflash.trainer.pct'
    has_pipelining = True
    # set by a first contact's action for its own call (plugin_utils/_freezer.frozen_checked): its input is held back
    # until the call has reached the container, and a call that has not after FROZEN_CHECK_S fails when frozen
    frozen_check = False

    # ---- options -------------------------------------------------------------------------
    @property
    def _host(self) -> str:
        return to_text(self.get_option('remote_addr') or self._play_context.remote_addr or '')

    @property
    def _vmid(self) -> str:
        vmid = self.get_option('proxmox_vmid')
        if vmid in (None, ''):
            raise AnsibleConnectionFailure(
                "dflash.trainer.pct: proxmox_vmid is not set for %s" % self._host)
        return to_text(vmid)

    def _control_path(self) -> str:
        cp_dir = os.path.expanduser(to_text(self.get_option('control_path_dir')))
        return os.path.join(cp_dir, 'dflash-%C')

    def _timeout(self) -> int:
        return int(self.get_option('pct_command_timeout'))

    # ---- pure argv builders (unit-tested from a table) ----------------------------------
    def _build_remote_command(self, cmd: str, tty: bool = False) -> list[str]:
        """argv run on the Proxmox host for a shell string `cmd` run in the container.

        `pct exec VMID -- /bin/sh -c RUN_SCRIPT sh CMD` (the mark, then CMD), with the in-container
        guard (pct_timeout_in_container) `pct exec VMID -- /bin/sh -c GUARD_SCRIPT sh SECONDS CMD`,
        on a tty `pct exec VMID -- /bin/sh -c CMD` (no mark: stdout and stderr share the pty).
        """
        if tty:  # stdout and stderr share the pty: no mark (see _run)
            return self._pct_argv(['/bin/sh', '-c', cmd])
        if self.get_option('pct_timeout_in_container'):
            return self._pct_argv(['/bin/sh', '-c', GUARD_SCRIPT, 'sh', str(self._timeout() + GUARD_GRACE_S), cmd])
        return self._pct_argv(['/bin/sh', '-c', RUN_SCRIPT, 'sh', cmd])

    def _pct_argv(self, container_argv: list[str]) -> list[str]:
        if self.get_option('pct_node'):  # on the node itself: the same argv, no pct, no sudo
            return list(container_argv)
        argv = [to_text(self.get_option('pct_path')), 'exec', self._vmid, '--'] + list(container_argv)
        if self.get_option('pct_sudo'):
            argv = ['sudo', '-n'] + argv
        return argv

    def _build_ssh_argv(self, remote_argv: list[str], tty: bool = False, control: list[str] | None = None) -> list[str]:
        """Local argv: `ssh [opts] -- host 'quoted remote argv'` (or remote_argv itself in local mode).

        `control` (e.g. ['-O', 'stop']) builds a master control call instead (no remote command).
        """
        if self.get_option('pct_local') and control is None:
            return list(remote_argv)
        argv = [to_text(self.get_option('ssh_executable'))]
        argv += shlex.split(to_text(self.get_option('ssh_extra_args') or ''))
        if control:
            argv += control
        elif tty:
            argv.append('-tt')
        else:
            argv.append('-T')
        port = self.get_option('port')
        if port:
            argv += ['-p', str(port)]
        user = self.get_option('remote_user')
        if user:
            argv += ['-l', to_text(user)]
        key = self.get_option('private_key_file')
        if key:
            argv += ['-i', os.path.expanduser(to_text(key))]
        opts = ['BatchMode=yes', 'LogLevel=ERROR', 'ConnectTimeout=%d' % int(self.get_option('connect_timeout'))]
        opts += self._host_key_options()
        persist = int(self.get_option('control_persist'))
        if persist > 0:
            opts += ['ControlMaster=auto', 'ControlPersist=%ds' % persist, 'ControlPath=%s' % self._control_path()]
        else:
            opts += ['ControlMaster=no', 'ControlPath=none']
        for opt in opts:
            argv += ['-o', opt]
        argv += ['--', self._host]
        if control is None:
            argv.append(quote_remote(remote_argv))
        return argv

    def _host_key_options(self) -> list[str]:
        """ssh -o options for the host key: checked unless host_key_checking is false."""
        if not self.get_option('host_key_checking'):
            return ['StrictHostKeyChecking=no', 'UserKnownHostsFile=/dev/null']
        opts = ['StrictHostKeyChecking=%s' % ('accept-new' if self.get_option('host_key_accept_new') else 'yes')]
        known_hosts = self.get_option('known_hosts_file')
        if known_hosts:
            opts.append('UserKnownHostsFile=%s' % _ssh_config_quote(os.path.expanduser(to_text(known_hosts))))
        return opts

    # ---- running ----------------------------------------------------------------------------
    def _connect(self):
        if not self._connected:
            if not self.get_option('pct_local') and int(self.get_option('control_persist')) > 0:
                os.makedirs(os.path.dirname(self._control_path()), mode=0o700, exist_ok=True)
            display.vvv("PCT CONNECT vmid=%s via %s" % (
                self.get_option('proxmox_vmid'), 'local pct' if self.get_option('pct_local') else self._host),
                host=self._host)
            self._connected = True
        return self

    def _run(self, argv: list[str], what: str, stdin=None, stdout=subprocess.PIPE, in_data: bytes | None = None,
             frozen_check: bool = False):
        """Run argv in its own process group, bounded by pct_command_timeout. -> (rc, out, err).

        ``frozen_check`` (a call that prints STARTED_MARK): see Connection.frozen_check."""
        timeout = self._timeout()
        display.vvv("PCT EXEC %s" % shlex.join(argv), host=self._host)
        if in_data is not None:
            stdin = subprocess.PIPE
        elif stdin is None:
            stdin = subprocess.DEVNULL
        # pct exec runs lxc-attach, which fchmods regular files given to it as stdio to 0700. In
        # local mode those would be the controller's own files (the source of a put, the target
        # of a fetch): hand pct pipes instead and copy through them in threads (constant memory).
        pumps = []
        if self.get_option('pct_local'):
            if hasattr(stdin, 'fileno'):
                pumps.append(('in', stdin))
                stdin = subprocess.PIPE
            if hasattr(stdout, 'fileno'):
                pumps.append(('out', stdout))
                stdout = subprocess.PIPE
        try:
            proc = subprocess.Popen(argv, stdin=stdin, stdout=stdout, stderr=subprocess.PIPE,
                                    start_new_session=True)
        except OSError as exc:
            raise AnsibleConnectionFailure("cannot run %s for %s: %s" % (argv[0], what, exc)) from exc
        try:
            if pumps:
                out, err = self._pump(proc, pumps, timeout)
            else:
                out, err = self._communicate(proc, in_data, timeout, what, frozen_check)
        except subprocess.TimeoutExpired:
            self._kill(proc)
            raise AnsibleConnectionFailure(
                "command timed out after %d s (pct_command_timeout) in container %s on %s: %s"
                % (timeout, self.get_option('proxmox_vmid'), self._host, what))
        except BaseException:
            self._kill(proc)
            raise
        out = out if out is not None else b''
        started, err = split_started(err or b'')
        rc = proc.returncode
        self._raise_for_transport(rc, err, started)
        return rc, out, err

    def _communicate(self, proc: subprocess.Popen, in_data: bytes | None, timeout: float, what: str,
                     frozen_check: bool = False):
        """proc.communicate(), bounded by ``timeout``, that gives up when the play is gone.

        This runs in an Ansible worker, a child of ansible-playbook in a session of its own: a
        killed ansible-playbook leaves it running, and its ssh mux client's remote command goes on
        (the ControlMaster holds its pipes) - a module renewing the play's deploy lock would keep
        it forever. Once the worker's parent is gone the call is killed and its pipes closed: the
        remote command's output then has no reader, which it notices (job.lock.output_read).

        ``frozen_check``: ``in_data`` is held back until the call has reached the container (its STARTED_MARK on
        stderr), and while it has not, the node is asked after FROZEN_CHECK_S (then twice as long, ...) whether
        the container is frozen: a frozen one fails the call at once (killed; the command, which never got its
        input, runs nothing when the container thaws)."""
        # Popen.communicate() cannot be retried after a timeout while input is still being sent (it
        # stops writing it): one selector loop serves the pipes, in rounds of ORPHAN_CHECK_S. No
        # thread ever blocks on a pipe, so _kill can close them at once.
        parent = os.getppid()
        deadline = time.monotonic() + timeout
        # stdout or stdin may be a file of a put or fetch (then not ours to serve)
        chunks = {pipe: [] for pipe in (proc.stdout, proc.stderr) if pipe is not None}
        pending = memoryview(in_data or b'')
        held, check_s = frozen_check, FROZEN_CHECK_S
        check_at = time.monotonic() + check_s
        with selectors.DefaultSelector() as sel:
            for pipe in chunks:
                sel.register(pipe, selectors.EVENT_READ)
            if proc.stdin is not None:
                if pending:
                    os.set_blocking(proc.stdin.fileno(), False)
                    if not held:
                        sel.register(proc.stdin, selectors.EVENT_WRITE)
                else:
                    proc.stdin.close()
            while sel.get_map():
                left = deadline - time.monotonic()
                if left <= 0:
                    raise subprocess.TimeoutExpired(proc.args, timeout)
                if held and time.monotonic() >= check_at:
                    frozen = self._frozen()
                    if frozen:
                        self._kill(proc)
                        raise AnsibleConnectionFailure(frozen)
                    check_s *= 2
                    check_at = time.monotonic() + check_s
                if os.getppid() != parent:
                    self._kill(proc)
                    raise AnsibleConnectionFailure("ansible-playbook is gone: %s in container %s on %s abandoned"
                                                   % (what, self.get_option('proxmox_vmid'), self._host))
                for key, _events in sel.select(min(ORPHAN_CHECK_S, left)):
                    if key.fileobj is proc.stdin:
                        try:
                            pending = pending[os.write(proc.stdin.fileno(), pending[:COPY_CHUNK]):]
                        except BlockingIOError:
                            continue
                        except OSError:  # the process stopped reading (BrokenPipe): its status tells
                            pending = memoryview(b'')
                        if not pending:
                            sel.unregister(proc.stdin)
                            proc.stdin.close()
                        continue
                    data = os.read(key.fd, COPY_CHUNK)
                    if data:
                        chunks[key.fileobj].append(data)
                        if held and key.fileobj is proc.stderr and _STARTED.search(b''.join(chunks[proc.stderr])):
                            held = False  # in the container: its input goes now
                            if pending:
                                sel.register(proc.stdin, selectors.EVENT_WRITE)
                    else:
                        sel.unregister(key.fileobj)
                        key.fileobj.close()
        if proc.stdin is not None and not proc.stdin.closed:  # held back from a call that ended before the mark
            proc.stdin.close()
        proc.wait(timeout=max(0.1, deadline - time.monotonic()))
        return (b''.join(chunks[proc.stdout]) if proc.stdout is not None else None), b''.join(chunks[proc.stderr])

    @staticmethod
    def _pump(proc: subprocess.Popen, pumps, timeout):
        """Copy files to/from the process's pipes in threads; -> (out, err) like communicate()."""
        def copy(src, dst, close):
            try:
                for chunk in iter(lambda: src.read(COPY_CHUNK), b''):
                    dst.write(chunk)
            except (OSError, ValueError):
                pass  # the process went away; its exit status tells
            finally:
                if close:
                    try:
                        dst.close()
                    except OSError:
                        pass
        err_chunks, out_chunks = [], []
        threads = [threading.Thread(target=lambda: err_chunks.append(proc.stderr.read()), daemon=True)]
        if 'out' not in [direction for direction, _fobj in pumps]:
            threads.append(threading.Thread(target=lambda: out_chunks.append(proc.stdout.read()), daemon=True))
        for direction, fobj in pumps:
            if direction == 'in':
                threads.append(threading.Thread(target=copy, args=(fobj, proc.stdin, True), daemon=True))
            else:
                threads.append(threading.Thread(target=copy, args=(proc.stdout, fobj, False), daemon=True))
        for thread in threads:
            thread.start()
        proc.wait(timeout=timeout)
        for thread in threads:
            thread.join(timeout)
        return (b''.join(out_chunks) if out_chunks else None), b''.join(err_chunks)

    @staticmethod
    def _kill(proc: subprocess.Popen) -> None:
        """Kill the call's process group and stop listening at once.

        Never wait for EOF: an ssh mux client hands its stdio to the ControlMaster (fd passing),
        which keeps our pipes open until the remote command ends on its own.
        """
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except OSError:
            pass
        for pipe in (proc.stdin, proc.stdout, proc.stderr):
            if pipe:
                try:
                    pipe.close()
                except OSError:
                    pass
        proc.wait()

    def _frozen(self) -> str | None:
        """Words for the container frozen, read on the node (its cgroup's freezer state, _freezer), or None: not
        frozen, or the node would not say within FROZEN_READ_S."""
        vmid = self._vmid
        argv = self._build_ssh_argv(_freezer.cgroup_argv(vmid))
        display.vvv("PCT FROZEN? %s" % shlex.join(argv), host=self._host)
        try:
            res = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, timeout=FROZEN_READ_S,
                                 check=False)
        except (OSError, subprocess.SubprocessError):
            return None
        frozen = _freezer.cgroups(to_text(res.stdout, errors='surrogate_or_replace'))[1]
        if not frozen:
            return None
        return ("container %s is frozen on %s (%s): pct exec waits in it until it thaws, so nothing was run in it - %s"
                % (vmid, "this host (local pct)" if self.get_option('pct_local') else self._host, frozen[0],
                   _freezer.remedy(vmid)))

    def _raise_for_transport(self, rc: int, err: bytes, started: bool) -> None:
        if started or rc == 0:
            return
        msg = classify_failure(rc, to_text(err, errors='surrogate_or_replace'), self._host,
                               to_text(self.get_option('proxmox_vmid')), to_text(self.get_option('pct_path')),
                               local=bool(self.get_option('pct_local')), sudo=bool(self.get_option('pct_sudo')))
        if msg:
            raise AnsibleConnectionFailure(msg)

    def exec_command(self, cmd: str, in_data: bytes | None = None, sudoable: bool = True):
        super().exec_command(cmd, in_data=in_data, sudoable=sudoable)
        tty = bool(self.get_option('pct_tty')) and in_data is None
        argv = self._build_ssh_argv(self._build_remote_command(to_text(cmd), tty=tty), tty=tty)
        return self._run(argv, to_text(cmd), in_data=in_data,
                         frozen_check=self.frozen_check and not tty and not self.get_option('pct_node'))

    def put_file(self, in_path: str, out_path: str) -> None:
        super().put_file(in_path, out_path)
        display.vvv("PCT PUT %s TO %s" % (in_path, out_path), host=self._host)
        b_in = to_bytes(in_path, errors='surrogate_or_strict')
        if not os.path.isfile(b_in):
            raise AnsibleFileNotFound("file or module does not exist: %s" % in_path)
        argv = self._build_ssh_argv(self._pct_argv(['/bin/sh', '-c', PUT_SCRIPT, 'sh', to_text(out_path)]))
        with open(b_in, 'rb') as src:
            size = os.fstat(src.fileno()).st_size
            rc, out, err = self._run(argv, "put %s" % out_path, stdin=src)
        lines = to_text(out, errors='surrogate_or_replace').split()
        got = int(lines[-1]) if lines and lines[-1].isdigit() else None
        if rc != 0 or got != size:
            raise AnsibleError("failed to transfer %s to %s in container %s on %s (rc=%s, %s of %d bytes): %s" % (
                in_path, out_path, self._vmid, self._host, rc, got, size, to_text(err).strip()))

    def put_stream(self, src, out_path: str) -> int | None:
        """Stream the binary file object src, read to its end (a pipe: data produced while it
        goes, e.g. a release archive), into out_path in the container, as put_file does with a
        file. Returns the byte count the container wrote (`wc -c`), which the caller compares
        with what it sent: no size is known before the end, so the caller checks it. When
        out_path is a fifo in the container (its reader runs meanwhile, e.g. a module that unpacks
        the stream), returns None: the reader checks what it got."""
        self._connect()
        display.vvv("PCT PUT (stream) TO %s" % out_path, host=self._host)
        argv = self._build_ssh_argv(self._pct_argv(['/bin/sh', '-c', PUT_STREAM_SCRIPT, 'sh', to_text(out_path)]))
        rc, out, err = self._run(argv, "put %s" % out_path, stdin=src)
        lines = to_text(out, errors='surrogate_or_replace').split()
        got = int(lines[-1]) if lines and lines[-1].isdigit() else None
        if rc == 0 and lines == ['fifo']:
            return None
        if rc != 0 or got is None:
            raise AnsibleError("failed to stream to %s in container %s on %s (rc=%s): %s" % (
                out_path, self._vmid, self._host, rc, to_text(err).strip()))
        return got

    def fetch_file(self, in_path: str, out_path: str) -> None:
        super().fetch_file(in_path, out_path)
        display.vvv("PCT FETCH %s TO %s" % (in_path, out_path), host=self._host)
        b_out = to_bytes(out_path, errors='surrogate_or_strict')
        argv = self._build_ssh_argv(self._pct_argv(['/bin/sh', '-c', FETCH_SCRIPT, 'sh', to_text(in_path)]))
        out_dir = os.path.dirname(b_out) or b'.'
        fd, tmp = tempfile.mkstemp(prefix=b'.pct-fetch-', dir=out_dir)
        try:
            with os.fdopen(fd, 'wb') as dst:
                rc, _out, err = self._run(argv, "fetch %s" % in_path, stdout=dst)
                dst.flush()
                got = os.fstat(dst.fileno()).st_size
            text = to_text(err, errors='surrogate_or_replace')
            marks = SIZE_MARK.findall(text)
            want = int(marks[-1]) if marks else None
            if rc != 0 or want != got:
                raise AnsibleError("failed to fetch %s from container %s on %s to %s (rc=%s, %s of %s bytes): %s" % (
                    in_path, self._vmid, self._host, out_path, rc, got, want, SIZE_MARK.sub('', text).strip()))
            os.chmod(tmp, 0o644 & ~_umask())
            os.replace(tmp, b_out)
            tmp = None
        finally:
            if tmp is not None and os.path.exists(tmp):
                os.unlink(tmp)

    def reset(self) -> None:
        """Stop the host's SSH master (meta: reset_connection); the next call logs in afresh.

        `-O stop`, not `-O exit`: the master is shared by every container on that host, and other
        forks may have commands in flight on it; stop refuses new sessions and lets those finish.
        """
        if not self.get_option('pct_local') and int(self.get_option('control_persist')) > 0:
            for op in ('check', 'stop'):
                argv = self._build_ssh_argv([], control=['-O', op])
                display.vvv("PCT CONTROL %s" % shlex.join(argv), host=self._host)
                proc = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, timeout=30, check=False)
                if proc.returncode != 0:
                    display.vvv("PCT no master to %s: %s" % (op, to_text(proc.stderr).strip()), host=self._host)
                    break
        self.close()

    def close(self) -> None:
        """Called after every task: keep the master (ControlPersist ends it), drop our state only."""
        self._connected = False


def _ssh_config_quote(value: str) -> str:
    """A value for `ssh -o KEY=VALUE`: ssh splits it like its config file, so quote spaces."""
    return '"%s"' % value if re.search(r'[\s"]', value) else value


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask
