"""Polling for the unit tests: wait for a condition, never a bare sleep."""
import time


def poll(predicate, timeout=10.0, interval=0.02, what="condition"):
    """Return predicate()'s first truthy value; fail the test if none comes within timeout."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError("%s not met within %.1f s" % (what, timeout))
        time.sleep(interval)
