# ddplab: two commands do all the set-up.
#   make workbook   venv + pinned install, every lab variant, every notebook -> build/, summary table
#   make test       the whole test suite (what CI runs)
#   make lab        JupyterLab on notebooks/
PYTHON ?= python3
VENV   ?= .venv
BIN     = $(VENV)/bin
STAMP   = $(VENV)/.installed

.PHONY: workbook test lab install clean benchmark

$(STAMP): pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	# -c constraints.txt pins torch to the CPU wheel (an unpinned torch pulls GBs of CUDA packages)
	$(BIN)/python -m pip install --quiet -c constraints.txt -e ".[test]"
	touch $(STAMP)

install: $(STAMP)

workbook: $(STAMP)
	$(BIN)/python -m ddplab.workbook.build --out build

# Two workers (pytest-xdist, one file or notebook each at a time): most of a multi-process test is
# waiting (torch imports, hangs until their deadline), so this halves CI time on 2 cores.
test: $(STAMP)
	$(BIN)/python -m pytest -n 2 --dist loadfile --nbval-lax -p no:cacheprovider tests notebooks

lab: $(STAMP)
	$(BIN)/python -m pip install --quiet -c constraints.txt -e ".[lab]"
	$(BIN)/jupyter lab notebooks/

benchmark: $(STAMP)
	$(BIN)/python benchmarks/launch_overhead.py
	$(BIN)/python benchmarks/verdict_latency.py

clean:
	rm -rf build runs
