"""The role's task lists for the unit tests that read them: every task, blocks opened."""


def tasks(items):
    """Every task in a task list, the tasks of its blocks, rescues and always sections too."""
    for task in items or []:
        if isinstance(task, dict):
            yield task
            for key in ("block", "rescue", "always"):
                yield from tasks(task.get(key))
