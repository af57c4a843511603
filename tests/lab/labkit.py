"""Helpers shared by the lab tests."""
import time


def wait_for(predicate, timeout=10.0, interval=0.1):
    """Poll predicate() until it returns a truthy value or timeout; return the last value."""
    deadline = time.monotonic() + timeout
    value = predicate()
    while not value and time.monotonic() < deadline:
        time.sleep(interval)
        value = predicate()
    return value
