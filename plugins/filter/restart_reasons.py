"""The restart_reasons filter: the role's restart decision, made by a pure, tested function
(module_utils/_restart_reasons.py) instead of Jinja."""
from ansible_collections.dflash.trainer.plugins.module_utils._restart_reasons import restart_reasons


class FilterModule:
    def filters(self):
        return {"restart_reasons": restart_reasons}
