# trialbed: the user's entry points. Every target sets up what it needs first.
SHELL := /bin/bash
VENV := .venv
ANSIBLE_PLAYBOOK := $(VENV)/bin/ansible-playbook
PYTHON := $(VENV)/bin/python
# The command line (trials/__main__.py), installed into the venv by make setup; run with this
# checkout first on the path, so that a .venv linked from another checkout runs this one's code.
TRIALBED := PYTHONPATH="$(CURDIR)$${PYTHONPATH:+:$$PYTHONPATH}" $(VENV)/bin/trialbed
EXPERIMENT ?= experiments/smoke.yml
TOPOLOGY ?= dumbbell
# Where the rack's hosts live: namespaces (on this machine), vm (the same namespaces inside a
# qemu VM with Debian's stock kernel: netem, H-TCP, RED/GRED, fq_codel, pie, cake), or auto
# (trial: namespaces when this machine's kernel has what the experiment needs, else vm;
# rack-up: namespaces).
RACK ?= auto
# A rack beside another checkout's: its own namespace prefix (default tb-) and management subnet
# 198.19.RACK_SUBNET.0/24 (its bridges become <prefix><segment>). trial and batch use them too.
RACK_PREFIX ?=
RACK_SUBNET ?=
export TRIALBED_RACK_PREFIX := $(RACK_PREFIX)
export TRIALBED_RACK_SUBNET := $(RACK_SUBNET)
RACK_VARS = $(if $(RACK_PREFIX),-e virtual_rack_namespace_prefix=$(RACK_PREFIX)) \
  $(if $(RACK_SUBNET),-e virtual_rack_management_subnet=$(RACK_SUBNET))
export ANSIBLE_CONFIG := $(CURDIR)/ansible.cfg

.PHONY: help docs setup lock rack-up rack-down configure teardown status trial preflight batch validate-htcp validate-rio nightly-install nightly-remove nightly-status nightly-run test test-long lint bench bench-marker

help:  ## every target, with what it does (the default)
	@awk 'BEGIN {FS = ":.*## "} /^[a-z][a-z-]*:.*## / {printf "  make %-16s %s\n", $$1, $$2}' $(MAKEFILE_LIST)

setup:  ## install Debian packages, the pinned Python environment and Ansible collections
	@scripts/setup.sh

lock: setup  ## requirements.txt again from pyproject.toml's dependencies: every package pinned with its hashes (uv pip compile)
	@$(VENV)/bin/uv pip compile pyproject.toml --extra dev --generate-hashes --python $(PYTHON) \
	  --custom-compile-command "make lock" --quiet -o requirements.txt

rack-up: setup  ## build the virtual rack of inventory/virtual/topologies/$(TOPOLOGY).yml (RACK=vm: inside the VM; a rack of another topology or kind goes first) and write inventory/virtual/hosts.yml
	@$(ANSIBLE_PLAYBOOK) playbooks/rack.yml -e virtual_rack_topology_name=$(TOPOLOGY) \
	  -e virtual_rack_kind=$(if $(filter vm,$(RACK)),vm,namespaces) $(RACK_VARS)

rack-down: setup  ## remove the virtual rack that is up, whatever its topology or kind: every namespace, link, bridge and process (the VM: qemu, its tap and files)
	@$(ANSIBLE_PLAYBOOK) playbooks/rack.yml -e virtual_rack_state=absent $(RACK_VARS)

# A lab rack instead of the virtual one: INVENTORY=inventory/lab/hosts.yml (see inventory/lab.example).
INVENTORY ?=
RACK_INVENTORY = $(or $(INVENTORY),inventory/virtual/hosts.yml)
# Stop on a file the user named that is not there (ansible-playbook would only warn and run on
# no host at all): $(call need_file,PATH,WHAT,HINT).
need_file = test -e "$(1)" || { echo "$(2) $(1): no such file$(if $(3),; $(3))" >&2; exit 2; }
INVENTORY_HINT = $(if $(INVENTORY),check INVENTORY=,no virtual rack is up: make rack-up)
trial: setup  ## bring up the rack $(EXPERIMENT) names (topology:; RACK=auto|namespaces|vm), run it, print its results; INVENTORY=: on that rack
	@$(TRIALBED) run $(EXPERIMENT) --rack-kind $(RACK) $(if $(INVENTORY),-i $(INVENTORY))

preflight: setup  ## can the rack run $(EXPERIMENT)? SSH, tools, CC, qdiscs, interfaces and link speed, disk for the captures on the hosts and under results/ (BATCH=: its directory), clock offsets, Ansible versions (reads only; the virtual rack is brought up if needed); INVENTORY=: that rack
	@$(TRIALBED) preflight $(EXPERIMENT) --rack-kind $(RACK) $(if $(INVENTORY),-i $(INVENTORY)) \
	  $(if $(BATCH),--results $(dir $(BATCH)))

# BATCH=results/NAME resumes that batch (or starts it there); RACKS="inv/a inv/b" shares the
# plan between racks (one worker each; INVENTORY= alone is one such rack); RETRIES: runs after
# a failed attempt.
BATCH ?=
RACKS ?= $(INVENTORY)
# One shell word per SET item: items hold brackets, braces and quotes (factors.KEY=[a,b]).
shell_word = '$(subst ','\'',$(1))'
# A value for another make's command line (the nightly run's): `$` doubled, one shell word.
make_arg = $(call shell_word,$(subst $$,$$$$,$(1)))

RETRIES ?= 2
batch: setup  ## run $(EXPERIMENT) unattended: plan, progress and ETA, resumable (BATCH=), several racks (RACKS=)
	@$(TRIALBED) batch $(EXPERIMENT) --rack-kind $(RACK) $(if $(BATCH),--batch $(BATCH)) \
	  $(foreach r,$(RACKS),--rack $(r)) --retries $(RETRIES) $(foreach s,$(SET),--set $(call shell_word,$(s))) \
	  $(if $(ONLY),$(foreach o,$(ONLY),--only '$(o)'))

# REPETITIONS: trials of each implementation; BATCH=results/NAME resumes (or only compares) that
# batch; RACK: the VM rack unless given (this machine's kernel has no tcp_htcp module).
REPETITIONS ?= 5
validate-htcp: setup  ## H-TCP's kernel module against its BPF implementation (hostside/bpf_cc/htcp) on the VM rack: $(REPETITIONS) trials of each as one batch, then goodput, UDP median OWD, congestion-epoch length and cwnd shape per implementation; exit 1 when one differs by more than 2 pooled sd
	@$(TRIALBED) validate-htcp --repetitions $(REPETITIONS) $(if $(BATCH),--batch $(BATCH)) \
	  --rack-kind $(if $(filter auto,$(RACK)),vm,$(RACK)) $(foreach r,$(RACKS),--rack $(r)) --retries $(RETRIES)

# The same for RIO (GRED has no module on this machine's kernel: the VM rack unless RACK is given).
validate-rio: setup  ## RIO as GRED in RIO mode against its BPF implementation (hostside/bpf_tc/rio) on the VM rack: $(REPETITIONS) trials of each (experiments/rio_validation.yml) as one batch, then IN and OUT drop %, the queue's mean and quantiles, goodput and transit per implementation; exit 1 when one differs by more than 2 pooled sd
	@$(TRIALBED) validate-rio --repetitions $(REPETITIONS) $(if $(BATCH),--batch $(BATCH)) \
	  --rack-kind $(if $(filter auto,$(RACK)),vm,$(RACK)) $(foreach r,$(RACKS),--rack $(r)) --retries $(RETRIES)

# Nightly: AT=HH:MM, KEEP_CAPTURES=days a batch keeps its captures (its tables stay);
# NIGHTLY_VARS: the make variables the nightly run gets (default: SET, RACKS and RACK as given now).
AT ?= 02:00
KEEP_CAPTURES ?= 14
NIGHTLY_VARS ?= $(if $(SET),SET=$(call make_arg,$(SET))) $(if $(RACKS),RACKS=$(call make_arg,$(RACKS))) $(if $(filter command line environment,$(origin RACK)),RACK=$(call make_arg,$(RACK)))
nightly-install: setup  ## run $(EXPERIMENT) every day at $(AT) into results/nightly/<name>/<date> (systemd timer, else cron)
	@$(TRIALBED) nightly install $(EXPERIMENT) --at $(AT) --keep-captures $(KEEP_CAPTURES) \
	  --make-vars $(call shell_word,$(NIGHTLY_VARS))

nightly-remove: setup  ## remove the nightly schedule of $(EXPERIMENT) (every trialbed schedule when EXPERIMENT is not given)
	@$(TRIALBED) nightly remove $(if $(filter command line environment,$(origin EXPERIMENT)),$(EXPERIMENT))

nightly-status: setup  ## the installed schedules and the last nightly batches
	@$(TRIALBED) nightly status

# The regressions' baseline: NIGHTS earlier batches of the experiment in the results catalog, or
# BASELINE=results/<batch> (make nightly-run, make report).
NIGHTS ?= 7
BASELINE ?=
nightly-run: setup  ## what the schedule runs: today's batch of $(EXPERIMENT) (resumed if begun), its report and the test against the last $(NIGHTS) nights (exit 3: ran, a metric changed), retention
	@$(TRIALBED) nightly run $(EXPERIMENT) --keep-captures $(KEEP_CAPTURES) --retries $(RETRIES) \
	  --rack-kind $(RACK) $(foreach r,$(RACKS),--rack $(r)) $(foreach s,$(SET),--set $(call shell_word,$(s))) \
	  --baseline-nights $(NIGHTS) $(if $(BASELINE),--baseline $(BASELINE))

# By hand: VARS=an inventory overlay with the hosts' variables (playbooks/examples/), CHECK=1
# shows what would change (--check --diff) and changes nothing.
VARS ?=
CHECK ?=
configure: setup  ## apply $(VARS) (inventory overlays, e.g. playbooks/examples/dumbbell_bottleneck.yml; several: "a.yml b.yml") to the rack: they describe its whole state; CHECK=1: only show the diff
	@test -n "$(VARS)" || { echo "usage: make configure VARS=\"playbooks/examples/<file>.yml [...]\" [CHECK=1]"; exit 2; }
	@$(call need_file,$(RACK_INVENTORY),inventory,$(INVENTORY_HINT))
	@$(foreach overlay,$(VARS),$(call need_file,$(overlay),VARS);)
	@$(ANSIBLE_PLAYBOOK) playbooks/configure.yml -i $(RACK_INVENTORY) $(foreach overlay,$(VARS),-i $(overlay)) $(if $(CHECK),--check --diff)

teardown: setup  ## give every rack host back what configure changed there, from its own records (no variables needed); CHECK=1: only show
	@$(call need_file,$(RACK_INVENTORY),inventory,$(INVENTORY_HINT))
	@$(ANSIBLE_PLAYBOOK) playbooks/teardown.yml -i $(RACK_INVENTORY) $(if $(CHECK),--check --diff)

docs: setup  ## write each role's README.md from its meta/argument_specs.yml and defaults, and docs/experiment-schema.md (every key, its range) from the experiment schema
	@$(PYTHON) scripts/role_docs.py
	@$(PYTHON) scripts/schema_docs.py

status: setup  ## what every host of the rack is doing now: shaping, delay, counters, CC, offloads, running daemons, leftovers (reads only)
	@$(TRIALBED) status $(if $(INVENTORY),-i $(INVENTORY))

test: setup lint  ## lint, unit tests, then end-to-end tests on a virtual rack the tests build and remove (under 45 minutes; the long ones are test-long's)
	@$(PYTHON) -m pytest -m "not long"

test-long: setup  ## the end-to-end tests too long for make test: the VM rack (RACK=vm: its kernel's netem, GRED/RIO, fq) and three nights of the results catalog, about 20 minutes
	@$(PYTHON) -m pytest -m long

lint: setup  ## ruff, the import contracts of the layers (lint-imports: pyproject.toml), ansible-lint (production profile, yamllint included; .ansible-lint), and a syntax check of every playbook
	@$(VENV)/bin/ruff check .
	@$(VENV)/bin/ruff format --check .
	@$(VENV)/bin/lint-imports --no-cache
	@$(VENV)/bin/ansible-lint -q playbooks roles

bench: setup  ## the transaction generator's own overhead on loopback; a grouped query over the results catalog at 1 000 and 100 000 rows; then what trials report costs on a generated trial (fresh process, warm, a batch) against tcptrace, tshark and cat (BENCH_ARGS="--packets N --no-tshark"), ending with its one comparable line; writes docs/analysis-performance.md
	@nice -n 10 $(PYTHON) tests/bench/bench_transact.py
	@nice -n 10 $(PYTHON) tests/bench/bench_catalog.py
	@nice -n 10 $(PYTHON) tests/bench/bench_analysis.py $(BENCH_ARGS)

# On the rack that is up (the virtual one, namespaces or VM: its topology must be chain2, which
# experiments/diffserv.yml runs on; INVENTORY=: a lab rack), after a trial has shipped the hosts'
# programs; BENCH_ARGS: the script's options (--implementations none python bpf, --seconds S).
bench-marker: setup  ## the packets/s each edge-marker implementation carries on the rack (tests/bench/bench_marker.py): clears trials' shaping (make teardown), doubles a rate of full-size TCP segments through diffserv.yml's marker until it is not carried, prints the inventory lines preflight reads (trialbed_marker_max_pps; the VM rack: trialbed_vm_marker_max_pps)
	@$(call need_file,$(RACK_INVENTORY),inventory,$(INVENTORY_HINT))
	@$(ANSIBLE_PLAYBOOK) playbooks/teardown.yml -i $(RACK_INVENTORY)
	@PYTHONPATH="$(CURDIR)" nice -n 10 $(PYTHON) tests/bench/bench_marker.py -i $(RACK_INVENTORY) $(BENCH_ARGS)

.PHONY: trends
trends: setup  ## write the nightly trends of $(EXPERIMENT) from the results catalog: each key metric per cell over the nights, the commit of each, the nights the test flagged, the night a shift holds from (results/catalog/trends/<name>/index.html)
	@$(TRIALBED) results trends $(EXPERIMENT) --nights $(NIGHTS)

# BATCH=results/<batch>; PREVIOUS=results/<other> to compare with that batch (default: the
# previous batch of the same experiment in the same directory; PREVIOUS=none: no comparison);
# REANALYSE=1 analyses every trial again from its captures first (else only unanalysed ones).
# Several batches in one report (e.g. diffserv.yml, diffserv_wpm.yml and diffserv_mpm.yml run
# as three batches: every marker's frontier in one figure): BATCH="results/a results/b" OUT=dir.
PREVIOUS ?=
REANALYSE ?=
OUT ?=
.PHONY: report
report: setup  ## write $(BATCH)/report/: index.html (self-contained: tables, figures, comparison, provenance), PNG and CSV
	@test -n "$(BATCH)" || { echo "usage: make report BATCH=results/<batch> [PREVIOUS=results/<other>] (several: BATCH=\"results/a results/b\" OUT=dir)"; exit 2; }
	@$(PYTHON) -m analysis.html_report $(BATCH) $(if $(PREVIOUS),--previous $(PREVIOUS)) \
	  $(if $(OUT),--out $(OUT)) $(if $(REANALYSE),--reanalyse) --nights $(NIGHTS) \
	  $(if $(BASELINE),--baseline $(BASELINE))

# A reproduction record to commit: BATCH=results/<batch> RECORD=docs/reproductions/<family>.
# Several batches in one record (seed 004's three files): BATCH="results/a results/b results/c".
RECORD ?=
.PHONY: record
record: setup  ## write $(RECORD)/ from $(BATCH) (one batch or several): the report (standalone), summary.csv (a row per planned trial), provenance.json, a README with the command; reads the batches only
	@test -n "$(BATCH)" -a -n "$(RECORD)" || { echo "usage: make record BATCH=results/<batch> RECORD=docs/reproductions/<family> (several: BATCH=\"results/a results/b\")"; exit 2; }
	@$(TRIALBED) record $(foreach b,$(BATCH),$(call shell_word,$(b))) $(call shell_word,$(RECORD))
