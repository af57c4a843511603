"""Make the checkout importable as ansible_collections.dflash.trainer for pytest.

The repository root is the collection; collections/ansible_collections/dflash/trainer is a
symlink back to it, so adding collections/ to sys.path is all the "install" there is.
"""
import os
import sys

_ROOT = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(_ROOT, "collections"))
sys.path.insert(0, _ROOT)
