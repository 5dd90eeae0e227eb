# Two commands on a fresh Debian machine: `make run` and `make test`.
SHELL := /bin/bash
VENV  := .venv
PY    := $(VENV)/bin/python
STAMP := $(VENV)/.installed
FAST  := $(VENV)/.compiled
# The per-request path compiled with mypyc: the modules listed in src/lameduck/hot.txt (the one
# list: setup.py compiles the same for the wheel, and `lameduck --version` checks it; why these
# modules go together is said there). `make fast` compiles them in place, for this tree.
HOT_LIST := src/lameduck/hot.txt
HOT   := $(shell sed -e 's/\#.*//' $(HOT_LIST))
# Every compiled module (also those of an older HOT list).
BUILT := src/*__mypyc*.so $$(find src/lameduck -name '*.so')

.PHONY: run test lint bench bench-resources bench-exit bench-leave clean fast pure install wheel fuzz

$(STAMP): pyproject.toml
	python3 -c 'import sys; sys.exit(sys.version_info < (3, 11))' || \
	  { echo "lameduck needs Python >= 3.11 as python3" >&2; exit 1; }
	test -x $(PY) || python3 -m venv $(VENV) || \
	  { rm -rf $(VENV); bash scripts/ensure-debs.sh python3-venv && python3 -m venv $(VENV); }
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[test,fast,resume,client,report,sim,http3]'
	touch $(STAMP)

$(FAST): $(STAMP) Makefile $(HOT_LIST) $(addprefix src/,$(HOT))
	rm -f $(BUILT)
	# mypyc relinks only what changed and copies with the old time: stamp the result as new,
	# or the stale-build check in lameduck/__init__.py would (rightly) refuse a module's shim.
	(cd src && ../$(VENV)/bin/mypyc $(HOT) > ../$(VENV)/mypyc.log 2>&1) && touch $(BUILT) || \
	  { echo "mypyc failed (see $(VENV)/mypyc.log): using the pure-Python hot path"; \
	    rm -f $(BUILT); }
	touch $(FAST)

fast: $(FAST)

pure:
	rm -f $(BUILT) $(FAST)

run: $(FAST)
	$(VENV)/bin/lameduck run $(if $(CONFIG),-c $(CONFIG))

# A wheel of this tree for the venv's Python: dist/lameduck-<version>-cp3XX-cp3XX-<platform>.whl
# with the hot path compiled by mypyc (setup.py, from src/lameduck/hot.txt), as mypy and black
# ship theirs; dist/lameduck-<version>-py3-none-any.whl when it cannot be (no C compiler or
# Python headers: setup.py warns; LAMEDUCK_MYPYC=1 fails instead, =0 never compiles). Built
# from the sdist (python -m build), so nothing of this tree's in-place build (src/*.so) gets in.
wheel: $(STAMP)
	rm -rf dist
	$(PY) -m build --outdir dist .
	@ls dist/*.whl

# The installed command the systemd unit runs (deploy/systemd/lameduck.service: ExecStart=
# /usr/local/bin/lameduck): a venv of its own under $(PREFIX)/lib/lameduck with lameduck's wheel
# built by that venv's Python (the hot path compiled, as `make wheel`) and its dependencies from
# the package index, and a symlink $(PREFIX)/bin/lameduck to its entry point. Run again to
# upgrade in place (the wheel installed with its dependencies, then once more forced: pip keeps
# an installed lameduck of the same version otherwise, and rolls a failed replacement back). No DESTDIR: a venv records its own path, so it must be built where it runs.
# PYTHON: the interpreter the venv links to; the unit's ProtectHome=yes hides /root and /home,
# so under systemd it must live elsewhere (Debian's /usr/bin/python3, not a pyenv shim). For
# Debian's own python3 the compiler and headers come from its packages (gcc, python3-dev) when
# missing; without them (not root, another interpreter without headers) the wheel is pure
# Python: the last line, `lameduck --version`, says which was installed. WHEEL: install that
# wheel (`make wheel`'s, built elsewhere for the same Python and platform) instead of building.
PREFIX ?= /usr/local
PYTHON ?= python3
WHEEL  ?=
LIBDIR  = $(PREFIX)/lib/lameduck
WHEELS  = build/install-wheel

install:
	$(PYTHON) -c 'import sys; sys.exit(sys.version_info < (3, 11))' || \
	  { echo "lameduck needs Python >= 3.11 as $(PYTHON)" >&2; exit 1; }
	$(PYTHON) -m venv $(LIBDIR) || \
	  { bash scripts/ensure-debs.sh python3-venv && $(PYTHON) -m venv $(LIBDIR); }
	$(LIBDIR)/bin/python -m pip install -q --upgrade pip
ifeq ($(WHEEL),)
	case "$$(readlink -f "$$(command -v $(PYTHON))")" in /usr/bin/python3*) \
	  bash scripts/ensure-debs.sh gcc libc6-dev python3-dev || true;; esac
	rm -rf build
	$(LIBDIR)/bin/python -m pip wheel -q --no-deps -w $(WHEELS) .
endif
	$(LIBDIR)/bin/python -m pip install -q $(or $(WHEEL),$(WHEELS)/lameduck-*.whl)
	$(LIBDIR)/bin/python -m pip install -q --force-reinstall --no-deps \
	  $(or $(WHEEL),$(WHEELS)/lameduck-*.whl)
ifeq ($(WHEEL),)
	rm -rf build
endif
	mkdir -p $(PREFIX)/bin
	ln -sfn $(abspath $(LIBDIR))/bin/lameduck $(PREFIX)/bin/lameduck
	$(PREFIX)/bin/lameduck validate >/dev/null
	@echo "installed $(PREFIX)/bin/lameduck -> $(abspath $(LIBDIR)):" \
	  "$$($(PREFIX)/bin/lameduck --version)"

lint: $(STAMP)
	$(VENV)/bin/ruff check src tests bench examples

# Tests run in parallel, two pytest-xdist workers more than cores (most of a test's time is
# spent waiting on a drain's timers, not on a CPU; TEST_JOBS=1: one worker): every
# server a test starts binds port 0 and the test reads the port back, so none contend for a
# port; the two that run the embedded default on its fixed ports take a lock (test_cli.py).
# --dist loadfile: a module's tests share one worker, so a module-scoped fixture (a shared
# lameduck, a pool of origins) starts once. Not loadgroup: with pytest 9.2 xdist cannot tag
# node ids any more and silently ignores xdist_group. The Debian packages the tests use are
# installed first: two workers running apt-get at once would fail on dpkg's lock. pytest's
# exit code 5 (no test ran) fails the target like any other.
TEST_JOBS ?= $(shell echo $$(( $$(nproc) + 2 )))

test: $(FAST)
	bash scripts/ensure-debs.sh curl haproxy redis-server tmux prometheus
	$(VENV)/bin/ruff check src tests bench examples
	$(PY) -m pytest -q -p no:cacheprovider -n $(TEST_JOBS) --dist loadfile

# Coverage-guided fuzzing (atheris) of the HTTP/1.1 codec, the HTTP/2 frame layer and the
# WebSocket frame tracker, FUZZ_MINUTES each: exec/s and edge coverage per target; new inputs
# land in tests/fuzz/corpus/<target>/, a crashing one in tests/fuzz/crashes/<target>/.
FUZZ_MINUTES ?= 5

fuzz: $(STAMP)
	rc=0; for t in h1 h2 ws; do \
	  $(PY) -m tests.fuzz.run $$t --seconds $$(( $(FUZZ_MINUTES) * 60 )) || rc=1; \
	done; exit $$rc

# BENCH_ARGS: passed to bench/run.py, e.g. make bench BENCH_ARGS='--workers 2' (bench/README.md).
BENCH_ARGS ?=
bench: $(FAST)
	bash scripts/ensure-debs.sh wrk haproxy nginx-light nghttp2-client
	$(PY) bench/run.py $(BENCH_ARGS)

# SIGTERM -> exit at a 150 ms deadline with a request held (cut), 10 runs: the median and the
# lag behind the last log line (bench/README.md, Exit). BENCH_EXIT_ARGS: e.g. --lameduck CMD.
BENCH_EXIT_ARGS ?=
bench-exit: $(FAST)
	$(PY) bench/exit.py $(BENCH_EXIT_ARGS)

# One instance out of a fleet behind HAProxy under load: lameduck prestop with a short and a
# long --lb-buffer and with --leave confirm, then SIGTERM; how long CLOSING lasted,
# when HAProxy marked the server DOWN, and the failed requests (bench/README.md, Leave).
# BENCH_LEAVE_ARGS: e.g. --runs 5.
BENCH_LEAVE_ARGS ?=
bench-leave: $(FAST)
	bash scripts/ensure-debs.sh haproxy
	$(PY) bench/leave.py $(BENCH_LEAVE_ARGS)

# RSS per idle keep-alive connection, a client that reads nothing of a 100 MB response, and
# a soak (SOAK=minutes, 0 = none): lameduck, HAProxy and nginx in one run (bench/README.md).
SOAK ?= 2
bench-resources: $(FAST)
	bash scripts/ensure-debs.sh wrk haproxy nginx-light
	$(PY) bench/resources.py --soak $(SOAK)

clean: pure
	rm -rf $(VENV) build dist src/build src/*.egg-info
