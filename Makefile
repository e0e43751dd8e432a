# Two commands for everyone: `make lab` and `make test`. Everything else is for instructors and CI.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
# The stamp is keyed on the dependency files: installing twice does nothing the second time. pip installs without
# byte-compiling (it compiles 13,000 files in one process) and compileall compiles every file on every core afterwards,
# as pip would have (a sandboxed grading kernel runs as a user that cannot write .pyc files into .venv): 106 s instead
# of 121 s from a fresh clone on 2 cores. As with pip, a file written for a newer Python (torch ships a few) is skipped.
DEPS_HASH := $(shell cat pyproject.toml constraints.txt | sha256sum | cut -c1-16)
STAMP  := $(VENV)/.installed-$(DEPS_HASH)
PYTEST_ARGS ?=
# More pytest arguments for `make test-install` alone, e.g. INSTALL_ARGS="-k 04-amp".
INSTALL_ARGS ?=
# pytest-xdist workers for `make test`: auto is two more than the cores (see tests/conftest.py, which also orders the
# groups, costliest first; each file runs whole on one worker).
TEST_WORKERS ?= auto
# One group per worker at a time (a file, unless its tests name a group: tests/conftest.py), in the order conftest
# gives (costliest first); needs pytest-xdist >= 3.8.
XDIST_ARGS := -n $(TEST_WORKERS) --dist loadgroup --no-loadscope-reorder
# The GPU targets need no `make install` (a GPU machine may have only torch, numpy and pytest, and no network):
# they use .venv's python when there is one, else $(PYTHON).
GPU_PY := $(if $(wildcard $(PY)),$(PY),$(PYTHON))
# Where `make gpu-check` records: one <gpu>-<date>.jsonl and .md per GPU model and date (a CPU-only machine writes
# its dry run to a scratch folder instead, never here).
GPU_CHECK_OUT ?= reference
# Jupyter refuses to run as root unless told to (containers, cloud machines).
LAB_ARGS ?= $(if $(filter 0,$(shell id -u)),--allow-root)

.PHONY: lab test test-quick test-install test-gpu gpu-check install sandbox browser lint release check grade bench mutants clean

install: $(STAMP)

$(STAMP): pyproject.toml constraints.txt
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --progress-bar off --no-compile -c constraints.txt -e '.[dev]' > $(VENV)/pip.log 2>&1 \
	  || { grep -v '^WARNING: Location' $(VENV)/pip.log | tail -40; exit 1; }
	$(PY) -c 'import compileall, sysconfig; compileall.compile_dir(sysconfig.get_paths()["purelib"], quiet=2, workers=0)'
	$(PY) -c 'import torch, torchvision, nbgrader, course'
	@rm -f $(VENV)/.installed-*
	@touch $@

# bubblewrap isolates grading kernels on Linux (grader/sandbox/). Without it grading still works, unisolated,
# with a loud warning, and the sandbox tests are skipped with that reason.
sandbox:
	@command -v bwrap >/dev/null 2>&1 || { command -v apt-get >/dev/null 2>&1 && [ "$$(id -u)" = 0 ] && \
	  { apt-get install -y -qq bubblewrap >/dev/null 2>&1 || { apt-get update -qq && apt-get install -y -qq bubblewrap; }; }; } || \
	  echo "bubblewrap is not installed: grading will NOT be isolated (see grader/sandbox/)"

# Chromium for tests/test_browser.py, which drives JupyterLab with Playwright (installed by the dev extra) through the
# system browser: Playwright's own browser download cannot work offline. Without it those tests are skipped.
browser:
	@command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1 || \
	  { command -v apt-get >/dev/null 2>&1 && [ "$$(id -u)" = 0 ] && \
	  { apt-get install -y -qq chromium >/dev/null 2>&1 || { apt-get update -qq && apt-get install -y -qq chromium; }; }; } || \
	  echo "chromium is not installed: the browser tests (tests/test_browser.py) will be skipped"

# .venv/bin goes first on PATH: Formgrader runs `alembic` (its gradebook migrations) by name.
lab: install
	PATH="$(CURDIR)/$(VENV)/bin:$$PATH" JUPYTER_CONFIG_PATH=$(CURDIR)/grader $(VENV)/bin/jupyter lab --notebook-dir=. --LabApp.default_url=/lab/tree/exercises $(LAB_ARGS)

# The whole proof, in one pytest session over every core (CI runs this); at its end, what each test file cost.
test: install sandbox browser lint
	$(PY) -m pytest $(XDIST_ARGS) -rs --durations=10 $(PYTEST_ARGS)

# The inner loop (at most 5 minutes on 2 cores): the linter, the library and visible-check tests and one smoke case
# of real grading; its last lines name every file it leaves out (tests/tiers.py). Not a substitute for `make test`.
test-quick: install sandbox lint
	$(PY) -m pytest $(XDIST_ARGS) -rs --durations=5 --quick $(PYTEST_ARGS)

# The course as learners and instructors install it (tests/test_install.py, also a part of `make test`), alone: the
# learner edition installed by its Colab cell into a fresh environment with another torch release (COURSE_OTHER_TORCH:
# a wheel or a folder of them, default /opt/wheels; without one, the project's torch, and the run says why), every
# solution and two exercises run there (COURSE_INSTALL_EXERCISES=all: every exercise); the instructor's wheel
# installed and grading one student. The environment is built
# once into .test-venvs/ (git-ignored) while its inputs stay the same.
test-install: install
	$(PY) -m pytest -n 0 -rs --durations=5 tests/test_install.py $(INSTALL_ARGS)

# Machine-made mutants of every solution (tests/mutants.py, #34): the kill rate of the hidden tests and of the visible
# checks per module, and every survivor. Minutes per module; MUTANTS="profiling --limit 10" narrows it.
MUTANTS ?=
mutants: install
	$(PY) -m tests.mutants $(MUTANTS)

# The linter runs first: style findings fail `make test` before the slow part starts (config in pyproject.toml).
lint: install
	$(VENV)/bin/ruff check

test-gpu:
	$(GPU_PY) -m pytest -m gpu -rs $(PYTEST_ARGS)

# One command on a lent GPU (under 8 minutes, torch and numpy only): reference data for reference/ (bench/gpu_check.py).
gpu-check:
	$(GPU_PY) bench/gpu_check.py $(GPU_CHECK_OUT)

# The repository URL of pyproject.toml goes into the notebooks first, then nbgrader makes exercises/ from them.
release: install
	$(PY) -m grader stamp
	$(PY) -m grader release

check: install
	$(PY) -m grader check

grade: install sandbox
	@test -n "$(SUBMISSIONS)" || { echo "usage: make grade SUBMISSIONS=<dir of <student>/<assignment>/<notebook>.ipynb>"; exit 2; }
	$(PY) -m grader all $(SUBMISSIONS)

bench: install
	@for f in bench/*.py; do echo "== $$f"; $(PY) $$f || exit 1; done

clean:
	rm -rf $(VENV) .test-venvs .pytest_cache browser-shots
