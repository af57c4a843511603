# dflash.trainer — the two Quick start commands are `make lab && .venv/bin/ansible-playbook
# deploy.yml -l gpu-host` and `make test`. Everything runs as root on a Debian bookworm host.
SHELL := /bin/bash
VENV := .venv
export PATH := $(CURDIR)/$(VENV)/bin:$(PATH)
export ANSIBLE_CONFIG := $(CURDIR)/ansible.cfg
# Python keeps its bytecode (and pytest its rewritten test modules) in __pycache__ (git ignores them),
# whatever the environment says: without it every process - each test worker, each ansible-playbook -
# compiles the same code again (collecting the lab tests: about 5 s with it, 30 s without).
unexport PYTHONDONTWRITEBYTECODE
LAB_IDS ?= 200 201

.PHONY: setup lab deploy test test-unit test-lab lint sanity molecule bench clean-lab collection ee

# The project itself is installed too, editable (-e .): .venv/bin/dflash-trainer (the CLI) and the
# API run this checkout's code right after the Quick start (tests/unit/test_quickstart_clone.py).
$(VENV)/.installed: requirements-dev.txt pyproject.toml
	bash .ci/host-packages
	python3 -m venv $(VENV) || { apt-get install -y -qq python3-venv && python3 -m venv $(VENV); }
	$(VENV)/bin/pip install -q --upgrade pip
	$(VENV)/bin/pip install -q -r requirements-dev.txt -e .
	touch $@

setup: $(VENV)/.installed

lab: setup
	python3 lab/lab.py up --ids $(LAB_IDS)

deploy: lab
	ansible-playbook deploy.yml -l gpu-host

# Every stage runs, whatever the ones before it ended with; one summary line per stage (result, wall
# time) at the end, and the exit is non-zero when any stage failed (.ci/stages). Stages joined by "+"
# run at the same time: the lab tests wait on trainers' holds and containers' boots most of their time,
# and lint, sanity and Molecule run in that time; the unit tests, all CPU, run before, alone.
TEST_STAGES := lab test-unit test-lab+ee+lint+sanity+molecule
test:
	@MAKE="$(MAKE)" bash .ci/stages $(TEST_STAGES)

# Unit tests two at a time (pytest-xdist); lab tests four files at a time: most of a lab test's time is a
# trainer's hold or a container's boot, not CPU, so four share two cores (docs/development.md).
UNIT_WORKERS ?= 2
LAB_WORKERS ?= 4
test-unit: setup
	python -m pytest -q --durations=10 -n $(UNIT_WORKERS) tests/unit

# The inner loop: the unit tests and ansible-lint, no lab (about 3 min on 2 cores)
.PHONY: check
check: test-unit lint

test-lab: lab
	python -m pytest -q --durations=20 -n $(LAB_WORKERS) --dist loadfile tests/lab

# The lab tests beside a busy loop on every core (.ci/under-load): a test that needs an idle machine
# fails here, not in CI. LOAD_TESTS narrows it (a file, or file::test), LOAD_COUNT repeats it.
LOAD_TESTS ?= tests/lab
LOAD_COUNT ?= 1
.PHONY: test-lab-load
test-lab-load: lab
	bash .ci/under-load --count $(LOAD_COUNT) -- python -m pytest -q --durations=20 -n $(LAB_WORKERS) --dist loadfile $(LOAD_TESTS)

# Real PyTorch (issue 15 item 4): tests/lab/test_torch_lab.py alone, its figures printed (-s). test-lab
# runs it too: ≈ 3.3 min on 2 shared cores, ≤ 4.5 min when it first builds the torch venv and container
# 300, more on a loaded machine (README "Real PyTorch in the lab").
.PHONY: test-torch
test-torch: lab
	python -m pytest -q -s tests/lab/test_torch_lab.py

# collections/ansible_collections/dflash/trainer links back to this checkout: ansible-lint's walk has
# no loop guard and, past 40 nested links, fails with ELOOP on some paths (seen on a clean clone)
lint: setup
	ansible-lint --profile production --exclude collections

sanity: setup
	bash .ci/sanity

# default + faults over dflash.trainer.pct, then default again over community.proxmox's
# proxmox_pct_remote: both connections are proved usable. faults makes the lab node's GPUs its
# container's (lab.py node-gpus), lab-wide state: it holds the lab's shared-state lock for its run, as
# every lab test file outside OWN_CONTAINERS does (tests/lab/conftest.py), so it never overlaps one
# of them when it runs beside the lab tests (make test).
LAB_SHARED_LOCK := /var/lib/dflash-lab/tests-shared.lock
molecule: lab
	molecule test -s default
	flock $(LAB_SHARED_LOCK) molecule test -s faults
	DFLASH_CONNECTION=community.proxmox.proxmox_pct_remote molecule test -s default

# The collection tarball, as `ansible-galaxy collection build` makes it for users (galaxy.yml's
# build_ignore keeps the project out; tests/unit/test_build.py installs it and runs ansible-doc).
COLLECTION_TARBALL := dflash-trainer-$(shell sed -n 's/^version: *//p' galaxy.yml).tar.gz

collection: setup
	ansible-galaxy collection build --force .

# The execution environment's build context (`ansible-builder create`: no container engine):
# it must install the tarball just built.
ee: collection
	ctx=$$(mktemp -d) && trap 'rm -rf "$$ctx"' EXIT && \
	ansible-builder create -f execution-environment.yml -c "$$ctx" && \
	grep -qx -- '- name: collections/$(COLLECTION_TARBALL)' "$$ctx/_build/requirements.yml" && \
	cmp $(COLLECTION_TARBALL) "$$ctx/_build/collections/$(COLLECTION_TARBALL)" && \
	echo "execution environment context installs $(COLLECTION_TARBALL)"

bench: lab
	python bench/run.py

# Soak and fleet under fault (issue 7 items 8, 9; bench/README.md): SOAK_CYCLES deploy cycles of good
# and faulty releases on lab container 240, then a faulty rollout over 240-247 with trainer_serial
# 1 and 8. Minutes, not seconds: not part of `make test`.
SOAK_CYCLES ?= 100
.PHONY: soak
soak: setup
	python bench/soak.py --cycles $(SOAK_CYCLES)
	python bench/fleet_fault.py

clean-lab:
	python3 lab/lab.py down
