#!/bin/bash
# The container's own interpreter; torch comes from PYTHONPATH (the lab: /opt/dflash-lab-torch/venv/...).
exec /usr/bin/python3 "$(dirname "$(readlink -f "$0")")/train.py" "$@"
