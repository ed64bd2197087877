# trialbed: the user's entry points. Every target sets up what it needs first.
SHELL := /bin/bash
VENV := .venv
ANSIBLE_PLAYBOOK := $(VENV)/bin/ansible-playbook
PYTHON := $(VENV)/bin/python
EXPERIMENT ?= experiments/smoke.yml
TOPOLOGY ?= dumbbell
export ANSIBLE_CONFIG := $(CURDIR)/ansible.cfg

.PHONY: setup rack-up rack-down trial test lint bench

setup:  ## install Debian packages, the pinned Python environment and Ansible collections
	@scripts/setup.sh

rack-up: setup  ## build the virtual rack of inventory/virtual/topologies/$(TOPOLOGY).yml (a rack of another topology goes first) and write inventory/virtual/hosts.yml
	@$(ANSIBLE_PLAYBOOK) playbooks/rack.yml -e virtual_rack_topology_name=$(TOPOLOGY)

rack-down: setup  ## remove the virtual rack that is up, whatever its topology: every namespace, link, bridge and process
	@$(ANSIBLE_PLAYBOOK) playbooks/rack.yml -e virtual_rack_state=absent

trial: setup  ## bring up the rack $(EXPERIMENT) names (topology:), run it, print its results
	@$(PYTHON) -m trials run $(EXPERIMENT)

test: setup  ## unit tests, then end-to-end tests on a virtual rack the tests build and remove
	@$(PYTHON) -m pytest

lint: setup  ## ruff, ansible-lint, and a syntax check of every playbook
	@$(VENV)/bin/ruff check .
	@$(VENV)/bin/ruff format --check .
	@$(VENV)/bin/ansible-lint --offline -q playbooks roles

bench: setup  ## analysis of a generated trial against tcptrace, tshark, tcpdump -w and cat (BENCH_ARGS="--packets N,M --no-tshark")
	@nice -n 10 $(PYTHON) tests/bench/bench_analysis.py $(BENCH_ARGS)
