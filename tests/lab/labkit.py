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


def holds(predicate, seconds, interval=0.1):
    """Poll predicate() for ``seconds`` (an absence check: nothing to wait for, only a window to
    watch); return False as soon as it fails, True when it held throughout."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if not predicate():
            return False
        time.sleep(interval)
    return bool(predicate())
