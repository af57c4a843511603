"""The target guard's judgement (playbooks/target_guard.yml), made in Python (pure, tested) so that the guard
play is one assert on its answer: does the run target at least one host, as its plays would see it."""


from ansible_collections.dflash.trainer.plugins.module_utils.plan.fix import extra_vars, fix_line
from ansible_collections.dflash.trainer.plugins.plugin_utils._preload import preload_connection


def trainer_target_problem(pattern, play_pattern, matched, limit=None, sources=()):
    """Why the run would act on no host ('' when it targets one): ``pattern`` is trainer_target_hosts as a
    task sees it (extra and inventory vars), ``play_pattern`` as a play's ``hosts:`` sees it (extra vars
    only), ``matched`` the hosts of ``pattern`` within the limit (``limit``: ansible_limit, None without
    --limit), ``sources`` the inventory sources."""
    if play_pattern != pattern:
        return ("trainer_target_hosts is '%s' in the inventory, but a play's hosts read only extra vars and would "
                "act on '%s'; nothing was deployed, restarted or read. Drop it from the inventory and pass it on "
                "the command line:%s" % (pattern, play_pattern, fix_line(extra_vars(("trainer_target_hosts", pattern)))))
    if not matched:
        return ("no host matched the pattern '%s'%s in the inventory %s: the playbooks act on the group trainer_hosts "
                "(or -e trainer_target_hosts=PATTERN); nothing was deployed, restarted or read" % (
                    pattern, " within --limit '%s'" % limit if limit is not None else "", ", ".join(sources or ())))
    return ""


def trainer_guard_hosts(targets, others=()):
    """The guard play's hosts: the pattern's hosts (``targets``) first, then every other inventory host
    (``others``), then localhost, each once - --limit leaves it a host to fail on. Templated by
    ansible-playbook itself before any task forks, it also loads the collection's connection plugin there,
    once for every task's worker (plugins/plugin_utils/_preload.py)."""
    preload_connection()
    out = []
    for host in list(targets or ()) + list(others or ()) + ["localhost"]:
        if host not in out:
            out.append(host)
    return out


class FilterModule:
    def filters(self):
        return {"trainer_target_problem": trainer_target_problem, "trainer_guard_hosts": trainer_guard_hosts}
