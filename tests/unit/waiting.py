"""Polling for the unit tests: wait for a condition, never a bare sleep (the collection's one
waiter, module_utils/job/wait.poll_until, on the real clock: these waits are for real processes)."""
from ansible_collections.dflash.trainer.plugins.module_utils.job.wait import done, poll_until, waiting


def poll(predicate, timeout=10.0, interval=0.02, what="condition"):
    """Return predicate()'s first truthy value; fail the test if none comes within timeout."""
    out = poll_until(predicate, lambda value, _elapsed: done(value) if value else waiting(), timeout, interval)
    if not out.ok:
        raise AssertionError("%s not met within %.1f s" % (what, timeout))
    return out.value
