# -*- coding: utf-8 -*-
# Copyright: dflash.trainer maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The role's argument spec checked inside trainer_validate's task (controller side).

Ansible prepends a task to every role entry point that has an argument spec
(``ansible.builtin.validate_argument_spec``): one more forked worker per run, and the spec file parsed
by Ansible's own YAML loader when the role loads. A playbook of the collection that imports the role with
``rolespec_validate: false`` has trainer_validate (``spec: true``) run the same check first, in its own
task: the same ``ArgumentSpecValidator`` over the entry point's options, with the same values (the
variables the spec names, templated) and the same message, so a refusal reads as Ansible's would.
"""
from __future__ import annotations

import os

import yaml

from ansible.module_utils.common.arg_spec import ArgumentSpecValidator

try:  # libyaml when it is there (as Ansible itself prefers it)
    from yaml import CSafeLoader as _Loader
except ImportError:  # pragma: no cover - pure-Python PyYAML
    from yaml import SafeLoader as _Loader


def entry_options(role_path, entry):
    """The ``options`` of entry point ``entry`` in ``role_path``/meta/argument_specs.yml ({} without one)."""
    path = os.path.join(role_path, "meta", "argument_specs.yml")
    if not os.path.exists(path):
        return {}
    with open(path) as fh:
        specs = (yaml.load(fh, Loader=_Loader) or {}).get("argument_specs") or {}
    return (specs.get(entry) or {}).get("options") or {}


def spec_failure(options, provided):
    """None when ``provided`` (the variables the spec names, templated) passes ``options``, else the failed
    result Ansible's validate_argument_spec gives: its msg, argument_errors and argument_spec_data."""
    errors = ArgumentSpecValidator(options).validate(provided, validate_role_argument_spec=True).error_messages
    if not errors:
        return None
    return dict(failed=True, msg="Validation of arguments failed:\n%s" % "\n".join(errors),
                argument_errors=errors, argument_spec_data=options)
