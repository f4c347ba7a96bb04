# The course in two commands: `make run` executes it, `make test` checks it.
PROFILE ?= auto
ONLY ?=
BIN := .venv/bin
# The venv's tools come first for every target: one ninja (the venv's) builds DeepSpeed's CPU kernel in
# set-up, tests and notebooks alike; with two ninja versions each switch rebuilds it (about 30 s).
export PATH := $(CURDIR)/$(BIN):$(PATH)
LAB_PORT ?= 8888
KEEP ?=
DRY ?=
NPROC ?=
SHAPE_ON_CPU ?=
PRETEND ?=
# the python of `make gpu-check` on a GPU: the venv's, which `COURSE_KEEP_TORCH=1 make setup` builds beside a
# CUDA torch (docs/gpu.md); another python that has the course's packages and a CUDA torch works too
GPU_PYTHON ?= $(BIN)/python

.PHONY: help check setup run test lint print hub-collect hub-remove hub-progress unit unit-main unit-long unit-scripts unit-hub notebooks lab refresh clean prune gpu-check lock zh book webui-shot student hub \
	gpu-shape-1 gpu-shape-2 stream-units stream-notebooks

help:
	@echo "make check    before set-up: one line per thing the course needs from this machine (ok or NO, and what to do)"
	@echo "make run      set up .venv if needed, then execute every notebook into build/ (PROFILE=auto|cpu|gpu|smoke)"
	@echo "make test     lint, unit tests then notebook tests, the longest unit tests beside them; the tree must stay clean"
	@echo "make lab      JupyterLab on http://127.0.0.1:$(LAB_PORT) (token printed)"
	@echo "make refresh  re-execute the notebooks and keep their outputs in notebooks/"
	@echo "make clean    remove run outputs in build/; keeps build/models, build/outputs (your trainings), build/scripts"
	@echo "make gpu-check  the gpu profile of 03-06, 09-12 on a tiny Qwen2 (needs CUDA; DRY=1 prints the commands;"
	@echo "               SHAPE_ON_CPU=1 NPROC=1 runs the same in its gpu shape on the CPU; PRETEND=t4|v100|rtx3090|h100"
	@echo "               there: torch believes that card is present, and any real CUDA call fails at once)"
	@echo "make prune KEEP=N  delete all but the newest N versions of each run in build/outputs (never the latest)"
	@echo "make lock     re-resolve requirements.txt and requirements-dev.txt into their locks (setup only installs a lock)"
	@echo "make zh       update the Chinese catalogs (locale/zh_CN) and build notebooks/zh/ from them"
	@echo "make book     the executed course as a site, English and Chinese, in build/book/html/"
	@echo "make print    the run sheet (WORKSHOP.md) and the cheat sheet (docs/cheatsheet.md) as PDFs in build/print/"
	@echo "make student  the notebooks to hand out, without solutions or outputs, in build/student/ (and zh/)"
	@echo "make webui-shot  photograph SWIFT's Web-UI (headless Chromium) into notebook 09, section 8"
	@echo "make hub USERS=\"alice bob\"  JupyterHub for a room (as root): a system user, password, notebooks, cores and GPU"
	@echo "               each; on http://127.0.0.1:8000 (HUB_IP, HUB_PORT; TLS: a reverse proxy in front); Ctrl-C stops all"
	@echo "make hub-progress  the room's exercises, one row per learner; make hub-collect: every learner's notebooks and"
	@echo "               build/ into build/hub/collected/; make hub-remove: their accounts, once their work is collected"
	@echo "make setup    create .venv with the learner's locked packages (every target does it first; GROUP=dev, as test,"
	@echo "              lint, book, zh, hub and student do: the tests', linters', site's and hub's as well)"
	@echo "make lint     ruff over the helpers, the tooling, the tests and the notebooks; vulture for dead code"
	@echo "make unit     the unit tests, the longest beside them; make notebooks: every notebook on smoke under nbval"
	@echo "              (SKIP=\"03 04\" leaves those out)"
	@echo "Parts of make test: unit-main, unit-heavy, unit-long, unit-scripts, unit-hub, gpu-shape-1, gpu-shape-2,"
	@echo "                    stream-units, stream-notebooks"

# Set-up's group: the learner's packages (requirements-lock.txt) for run, lab and the targets that only run
# notebooks; the development group as well (requirements-lock-dev.txt) where tests, linters, the site, the
# Chinese edition or the hub need it. A .venv keeps the dev group once it has it (scripts/setup.sh).
GROUP = learner
test lint unit notebooks book zh hub student webui-shot: GROUP = dev
setup:
	@bash scripts/setup.sh $(GROUP)

# before anything is installed, by the system's python3 (course/machine.py: the standard library only)
check:
	@command -v python3 >/dev/null || { echo "NO  Python 3.11: there is no python3 on PATH; install Python 3.11."; exit 1; }
	@python3 -m course.machine

run: setup
	@$(BIN)/python -m course.runner run --profile $(PROFILE) $(if $(ONLY),--only $(ONLY))

lint: setup
	$(BIN)/ruff check --no-cache conftest.py helpers course tests notebooks book scripts
	$(BIN)/python scripts/deadcode.py

# The longest tests run beside the others, each pytest session in its own build/test folder: `make gpu-check
# SHAPE_ON_CPU=1` for 1 process and for 2 (tests/test_gpu_shape.py, one make run each, the notebooks of
# GPU_CHECK as a GPU runs them), the site crawled in Chromium, the GPU-image install path, two learners on
# `make hub` in Chromium. Each stream's output follows when it ends.
unit: setup
	@echo "unit tests, the longest beside the others (each stream's output follows when it ends) ..."
	@$(MAKE) --no-print-directory -j2 --output-sync=target unit-main unit-heavy unit-long unit-scripts unit-hub

SHAPE := tests/test_gpu_shape.py
LONG := tests/test_book.py tests/test_install.py
SCRIPTS_TEST := tests/test_scripts.py
HUB_TEST := tests/test_hub.py
# the unit tests that start the most processes (every exercise's checker, on real ranks where it runs there; the
# runner's own notebook runs; 11's ZeRO-2 pitfall through SWIFT): about half of the unit tests' time, so that
# make test can put one half in each stream
HEAVY := tests/test_exercises.py tests/test_notebooks.py tests/test_zero_pitfall.py
unit-main:
	$(BIN)/python -m pytest tests -ra --durations=10 $(addprefix --ignore=,$(SHAPE) $(LONG) $(SCRIPTS_TEST) $(HUB_TEST) $(HEAVY))

unit-heavy:
	COURSE_TEST_BUILD=$(CURDIR)/build/test/heavy $(BIN)/python -m pytest -p no:cacheprovider -ra --durations=5 $(HEAVY)

# the scripts a learner can take away, each under plain torchrun: a launch apiece, so beside the units
unit-scripts:
	COURSE_TEST_BUILD=$(CURDIR)/build/test/scripts $(BIN)/python -m pytest -p no:cacheprovider -ra $(SCRIPTS_TEST)

# two learners on `make hub` in Chromium (about a minute): last in make test's notebooks stream, the shorter one
unit-hub:
	COURSE_TEST_BUILD=$(CURDIR)/build/test/hub $(BIN)/python -m pytest -p no:cacheprovider -ra $(HUB_TEST)

unit-long:
	COURSE_TEST_BUILD=$(CURDIR)/build/test/long $(BIN)/python -m pytest -p no:cacheprovider -ra $(LONG)

# A glyph a plot's font lacks (Chinese in a figure) fails the cell, in the notebooks stage and in the gpu shape.
GLYPHS_FAIL := PYTHONWARNINGS=error:Glyph:UserWarning
# the 1-process shape runs only the notebooks whose gpu path on one GPU differs from two's (gpu_check.ONE_GPU_PATHS)
gpu-shape-1 gpu-shape-2:
	COURSE_TEST_BUILD=$(CURDIR)/build/test/$@ $(GLYPHS_FAIL) $(BIN)/python -m pytest -p no:cacheprovider -ra $(SHAPE) \
		-k "$(subst gpu-shape-,,$@)-process"

# 03-06 run whole in the 2-process gpu shape: their lesson on two CPU ranks, as on every machine, their GPU cell
# besides, their checked outputs compared (tests/test_gpu_shape.py). The notebooks stage leaves them to it
# (tests/test_gpu_check.py holds this list to the notebooks that call profiles.ranks_on_cpu).
WHOLE_IN_SHAPE := 03 04 05 06

# make test's two streams, about equally long on 2 cores (the unit tests split in two, one half in each); each
# runs all its parts even when one fails
stream-units:
	@status=0; for part in unit-heavy gpu-shape-2 unit-long; do $(MAKE) --no-print-directory $$part || status=1; done; exit $$status

stream-notebooks:
	@status=0; $(MAKE) --no-print-directory gpu-shape-1 || status=1; \
		$(MAKE) --no-print-directory notebooks SKIP="$(WHOLE_IN_SHAPE)" || status=1; \
		for part in unit-scripts unit-main unit-hub; do $(MAKE) --no-print-directory $$part || status=1; done; exit $$status

# Every English notebook on smoke but those SKIP names, and one Chinese one as a spot check (their code is the
# English code, tests/test_translation.py).
SKIP ?=
notebooks: setup
	COURSE_TEST_BUILD=$(CURDIR)/build/test/notebooks COURSE_PROFILE=smoke $(GLYPHS_FAIL) \
		$(BIN)/python -m pytest -p no:cacheprovider --durations=10 --nbval-lax --nbval-current-env \
		--nbval-cell-timeout=600 $(filter-out $(foreach n,$(SKIP),notebooks/$(n)_%),$(wildcard notebooks/[0-9]*.ipynb)) \
		notebooks/zh/01_*.ipynb

# make test: lint, then two streams side by side, one per core: the heavy half of the unit tests, then make
# gpu-check in its gpu shape for 2 processes, then LONG; and the same for 1 process, then the notebooks (but
# WHOLE_IN_SHAPE), the scripts, the other half of the unit tests and the hub.
test: lint
	@echo "two streams side by side: half the unit tests, gpu-check NPROC=2, the longest unit tests; gpu-check NPROC=1, the notebooks but 03-06 (whole in NPROC=2), the scripts, the other half, the hub (each stream's output follows when it ends) ..."
	@$(MAKE) --no-print-directory -j2 --output-sync=target stream-units stream-notebooks
	@echo "What make gpu-check would run on 1 and on 8 GPUs (no GPU here):"
	@$(BIN)/python -m course.runner gpu-check --dry
	@if [ -n "$$(git status --porcelain)" ]; then \
		echo "make test left the git tree dirty:"; git status --porcelain; exit 1; \
	else echo "git tree clean after the tests."; fi

lab: setup
	$(BIN)/jupyter lab --ip 127.0.0.1 --port $(LAB_PORT) --no-browser $(if $(filter 0,$(shell id -u)),--allow-root) \
		--ServerApp.root_dir=$(CURDIR) --ServerApp.token=$$($(BIN)/python -c "import secrets; print(secrets.token_hex(16))")

refresh: setup
	@$(BIN)/python -m course.runner refresh $(if $(ONLY),--only $(ONLY))

clean:
	rm -rf build/executed build/logs build/launches build/refresh \
		build/report.md build/report.json
	@echo "Removed the run outputs in build/. Kept build/models (converted models), build/outputs"
	@echo "(adapters, checkpoints, merged models you trained) and build/scripts (the scripts the notebooks"
	@echo "write, and yours: 06.3's my_ddp_train.py): delete those by hand if you mean to."

prune: setup
	@$(BIN)/python -m course.runner prune --keep "$(KEEP)"

# On a GPU machine GPU_PYTHON (the venv's python, with a CUDA torch: docs/gpu.md) runs it, without set-up: in a
# fresh clone that would build .venv with the lock's CPU torch (`COURSE_KEEP_TORCH=1 make setup` comes first,
# and a venv it made keeps its torch at every later set-up). DRY=1 prints the commands and needs no GPU;
# SHAPE_ON_CPU=1 runs exactly those commands in the gpu shape on the CPU (make test runs NPROC=1 and NPROC=2).
# PRETEND=rtx3090|h100|t4|v100 (with SHAPE_ON_CPU=1): torch believes NPROC such cards are there, in the kernel and
# in every process meant for the CPU, and fails at once on any real CUDA call (course/pretend/). ONLY="09 11":
# those notebooks of the check alone, printed and run
GPU_CHECK_ARGS = $(if $(NPROC),--nproc $(NPROC)) $(if $(filter 1,$(SHAPE_ON_CPU)),--shape-on-cpu) $(if $(PRETEND),--pretend $(PRETEND)) \
                 $(if $(ONLY),--only $(ONLY))
gpu-check:
ifeq ($(DRY),1)
	@$(MAKE) --no-print-directory setup
	@$(BIN)/python -m course.runner gpu-check --dry $(GPU_CHECK_ARGS)
else ifeq ($(SHAPE_ON_CPU),1)
	@$(MAKE) --no-print-directory setup
	@$(BIN)/python -m course.runner gpu-check $(GPU_CHECK_ARGS)
else
	PYTHONPATH=$(CURDIR) $(GPU_PYTHON) -m course.runner gpu-check $(GPU_CHECK_ARGS)
endif

lock:
	@python3 scripts/lock.py

zh: setup
	@$(BIN)/python -m course.translation

book: setup
	@$(BIN)/python -m course.book

student: setup
	@$(BIN)/python -m course.student

print: setup
	@$(BIN)/python -m course.printable

webui-shot: setup
	@$(BIN)/python -m course.webui_shot

# USERS, HUB_IP, HUB_PORT, HUB_CROWDED and PROFILE reach course.hub through the environment (a
# name with a quote in it is refused there, not run by the shell); exec: Ctrl-C and a `kill` of make reach
# JupyterHub itself, which stops its proxy and every learner's server.
hub: setup
	@exec $(BIN)/python -m course.hub

# as root: the room's progress, one row per learner, each exercise answered (✅, or ❌ and the tries); after the day,
# each learner's ~/course and ~/build into build/hub/collected/ (USERS: some of them); then their accounts and
# homes removed, refused while anyone's work changed since their last archive
hub-progress hub-collect hub-remove: setup
	@$(BIN)/python -m course.hub $(subst hub-,,$@)
