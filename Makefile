# ddplab: two commands do all the set-up.
#   make workbook   venv + pinned install, every notebook executed once -> build/, summary table
#   make test       the whole test suite (what CI runs)
#   make test-load  the checkers' tests with a CPU burner beside their runs
#   make test-torch VERSION=x   the engine's tests and a set of lab variants on another torch (own venv)
#   make lab        JupyterLab on notebooks/
#   make classroom  as root: LEARNERS=N accounts and a JupyterHub for them (Ctrl-C stops everything)
#   make test-classroom  the hub with K learners and the gradebook (what CI runs after make test)
#   make notebooks  maintainers: make workbook, then store the execution in course-src/executed/ and the
#                   learner's copies (no output) in notebooks/
#   make assign     maintainers: notebooks/ (learner) and build/instructor/ from course-src/ (otter-grader)
PYTHON ?= python3
VENV   ?= .venv
BIN     = $(VENV)/bin
STAMP   = $(VENV)/.installed
TEST_STAMP = $(VENV)/.installed-test
CLASSROOM_STAMP = $(VENV)/.installed-classroom
# papermill parameters for every notebook that declares them, e.g. WORKBOOK_ARGS="-p quick False"
WORKBOOK_ARGS ?=
# notebooks executed at once by make workbook (a run whose verdicts compare times still has the
# machine alone: ddplab.origins.turns); make notebooks stores outputs, and measures each notebook alone
JOBS ?= 3
PYTEST_ARGS ?=
# Where torch comes from when no local wheel is at hand. Linux: PyTorch's CPU wheel index (PyPI's
# Linux torch pulls several GB of CUDA packages); macOS: PyPI (its wheels are CPU/MPS). A CUDA
# build: make workbook TORCH_INDEX=https://download.pytorch.org/whl/cu128
TORCH_INDEX ?= $(if $(filter Linux,$(shell uname -s)),https://download.pytorch.org/whl/cpu,)

# Installs go in with uv when uv installs (parallel downloads, bytecode compiled in parallel: 17 s ->
# 5 s for the package and its dependencies here), else, or when uv fails, with pip. Where torch
# comes from is pip's answer: pip's own configuration (a local wheel, a mirror) or TORCH_INDEX.
INSTALL = sh -c 'if [ -x "$$0/uv" ] && "$$0/uv" pip install --quiet --python "$$0/python" --compile-bytecode -c constraints.txt "$$@"; then :; \
                 else "$$0/python" -m pip install --quiet -c constraints.txt "$$@"; fi' $(BIN)

# System packages (nftables, iproute2 for lab 09; chromium for the browser test): one script, also
# run by .ci/run. As root with apt-get it installs what is missing; elsewhere (or with
# DDPLAB_SYSTEM_PACKAGES=0) it installs nothing and names each part that will be skipped, and the
# part is skipped: the build and the tests still pass.
SYSTEM = $(PYTHON) src/ddplab/tools/system.py install

.PHONY: workbook notebooks test test-torch test-load test-classroom lab install clean benchmark classroom \
	classroom-benchmark system assign sources

$(STAMP): pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet uv || echo "uv could not be installed: pip installs the rest"
	# torch, pinned by constraints.txt. Where pip already finds a wheel without an index (a local
	# wheel or mirror in pip's configuration, as on the CI machine), pip names it and it goes in
	# with the package in one install (uv unpacks it and compiles bytecode on every core: pip's 17 s
	# for torch alone became 12 s for everything here). Else pip installs it from TORCH_INDEX first
	# (only torch's lookup goes there), then the package.
	url=$$($(BIN)/python -m pip install --quiet --dry-run --no-deps --no-index --ignore-installed \
	        -c constraints.txt --report - torch 2>/dev/null \
	      | $(BIN)/python -c 'import json, sys; print(json.load(sys.stdin)["install"][0]["download_info"]["url"])' 2>/dev/null); \
	if [ -n "$$url" ]; then \
	    $(INSTALL) "torch @ $$url" -e .; \
	else \
	    $(BIN)/python -m pip install --quiet -c constraints.txt $(if $(TORCH_INDEX),--extra-index-url $(TORCH_INDEX)) torch && \
	    $(INSTALL) -e .; \
	fi
	# the package is installed editable: its bytecode is compiled here once, since every rank and
	# torchrun agent imports it and an environment may forbid writing it (PYTHONDONTWRITEBYTECODE)
	$(BIN)/python -m compileall -q src/ddplab
	touch $(STAMP)

# the test extra (pytest, Playwright, JupyterLab) on top: make workbook does not wait for it
$(TEST_STAMP): $(STAMP)
	$(INSTALL) -e ".[test,clients]"
	touch $(TEST_STAMP)

install: $(STAMP)

# Each notebook executes once (papermill); the summary is built from the runs the notebooks made,
# plus one run of any variant no notebook showed.
workbook: $(STAMP)
	@$(SYSTEM) labs
	$(BIN)/python -m ddplab.course.build --out build --jobs $(JOBS) $(WORKBOOK_ARGS)

notebooks: $(STAMP)
	@$(SYSTEM) labs
	$(BIN)/python -m ddplab.course.build --out build --store --jobs 1 $(WORKBOOK_ARGS)
	# the stored notebooks' cells that the build writes (seconds, minutes) reach the sources too
	$(BIN)/python -m ddplab.course.assign sources
	# the learner's copies in notebooks/ as otter's student notebooks (no output; the fix-it cell tagged)
	$(INSTALL) -e ".[assign]"
	$(BIN)/python -m ddplab.course.assign build

# Three workers (pytest-xdist, one file at a time each) on 2 cores: much of a multi-process test is
# waiting (stall windows, timeouts). Each lab's test file executes its notebook once (papermill), checks
# its cells tagged nbval-check-output and asserts on the notebook's own runs (tests/notebook_check.py);
# notebook 00 executes in tests/test_notebooks.py. TEST_WORKERS=2 for two workers.
TEST_WORKERS ?= 3
test: $(TEST_STAMP)
	@$(SYSTEM) labs browser classroom
	$(BIN)/python -m pytest -n $(TEST_WORKERS) --dist loadfile -p no:cacheprovider $(CLASSROOM_TESTS:%=--ignore=%) \
		$(PYTEST_ARGS) tests

# The classroom's own round, alone on the machine (K learners at once are the load it measures): the hub with
# K learners through its API (tests/test_hub.py) and the gradebook (tests/test_gradebook.py), one file per worker.
CLASSROOM_TESTS = tests/test_hub.py tests/test_gradebook.py
test-classroom: $(TEST_STAMP)
	@$(SYSTEM) classroom
	$(BIN)/python -m pytest -n 2 --dist loadfile -p no:cacheprovider $(PYTEST_ARGS) $(CLASSROOM_TESTS)

# One source notebook per lab (course-src/, otter-grader's format: solutions and hidden tests inside) ->
# the learner's notebook in notebooks/ (no solution, no test; a stored notebook whose cell sources are the
# same is left as it is, outputs and all) and the instructor's in build/instructor/ (solutions, and the
# hidden tests in tests/). `make sources` makes course-src/ again from notebooks/, solutions/ and the
# fix-its' reference fixes, while those are still where people edit (DESIGN.md).
assign: $(STAMP)
	$(INSTALL) -e ".[assign]"
	$(BIN)/python -m ddplab.course.assign build

sources: $(STAMP)
	$(BIN)/python -m ddplab.course.assign sources

# The engine's tests and a set of lab variants on another torch, in a venv of its own (never part of
# make test): make test-torch VERSION=2.14.1. torch comes from pip's configuration (PyPI's build for a
# version with no local wheel: 2.14.1's CUDA build, a 6.2 GB venv, runs on a CPU); constraints.txt's
# other pins stay. README's table of torch versions comes from these runs (2.13.0 and 2.14.1); a version
# whose run passes goes into ddplab.engine.torch_support.MEASURED.
TORCH_TESTS ?= tests/test_stacks.py tests/test_signatures.py tests/test_causes.py tests/test_ledger.py \
	tests/test_launch.py tests/test_probe.py tests/test_parity.py tests/test_faults_sample.py
test-torch: $(STAMP)
	@test -n "$(VERSION)" || { echo "make test-torch VERSION=2.14.1: which torch to test"; exit 2; }
	$(PYTHON) -m venv .venv-torch-$(VERSION)
	sed 's/^torch==.*/torch==$(VERSION)/' constraints.txt > .venv-torch-$(VERSION)/constraints.txt
	.venv-torch-$(VERSION)/bin/python -m pip install --quiet -c .venv-torch-$(VERSION)/constraints.txt \
		"torch==$(VERSION)" -e ".[test]"
	.venv-torch-$(VERSION)/bin/python -m pytest -p no:cacheprovider -n $(TEST_WORKERS) --dist loadfile \
		$(PYTEST_ARGS) $(TORCH_TESTS)
	.venv-torch-$(VERSION)/bin/python -m ddplab.tools.torch_variants

# the checkers' tests again with a CPU burner beside their runs (tests/burner.py says why not in make test)
test-load: $(TEST_STAMP)
	DDPLAB_TEST_BURNER=1 $(BIN)/python -m pytest -n $(TEST_WORKERS) --dist loadfile -p no:cacheprovider -k burner \
		$(PYTEST_ARGS) tests

lab: $(STAMP)
	$(INSTALL) -e ".[lab]"
	$(BIN)/jupyter lab notebooks/

benchmark: $(STAMP)
	$(BIN)/python benchmarks/launch_overhead.py
	$(BIN)/python benchmarks/verdict_latency.py

# as root: LEARNERS accounts (learner1 ...), a JupyterHub for them on IP:PORT (classroom/jupyterhub_config.py),
# the URL and the accounts printed; Ctrl-C stops the hub, every learner's server and job
$(CLASSROOM_STAMP): $(STAMP)
	$(INSTALL) -e ".[classroom]"
	touch $(CLASSROOM_STAMP)

classroom: $(CLASSROOM_STAMP)
	@$(SYSTEM) classroom
	$(BIN)/ddplab classroom hub --learners $${LEARNERS:-4} --ip $${IP:-127.0.0.1} --port $${PORT:-8000}

# K learners as processes of one account, without the hub: docs/instructor.md's first table
classroom-benchmark: $(STAMP)
	$(BIN)/ddplab classroom check --learners $${LEARNERS:-20}
	$(BIN)/python benchmarks/classroom.py

system:
	@$(SYSTEM) labs browser

clean:
	rm -rf build runs
