# Two commands on a fresh Debian machine: `make run` and `make test`.
SHELL := /bin/bash
VENV  := .venv
PY    := $(VENV)/bin/python
STAMP := $(VENV)/.installed
FAST  := $(VENV)/.compiled
# The HTTP/1 hot path, compiled with mypyc from the same typed Python source (about 30% fewer
# instructions per request); the pure-Python modules are the fallback when no compiler works.
HOT   := lameduck/http1/wire.py lameduck/http1/upstream.py lameduck/http1/downstream.py

.PHONY: run test lint bench clean fast pure

$(STAMP): pyproject.toml
	python3 -c 'import sys; sys.exit(sys.version_info < (3, 11))' || \
	  { echo "lameduck needs Python >= 3.11 as python3" >&2; exit 1; }
	test -x $(PY) || python3 -m venv $(VENV) || \
	  { rm -rf $(VENV); bash scripts/ensure-debs.sh python3-venv && python3 -m venv $(VENV); }
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[test,fast]'
	touch $(STAMP)

$(FAST): $(STAMP) $(addprefix src/,$(HOT))
	rm -f src/*__mypyc*.so src/lameduck/http1/*.so
	# mypyc relinks only what changed and copies with the old time: stamp the result as new,
	# or the stale-build check in lameduck/http1 would (rightly) refuse a per-module shim.
	cd src && { ../$(VENV)/bin/mypyc $(HOT) > ../$(VENV)/mypyc.log 2>&1 && \
	  touch *__mypyc*.so lameduck/http1/*.so; } || \
	  { echo "mypyc failed (see $(VENV)/mypyc.log): using the pure-Python HTTP/1 path"; \
	    rm -f *__mypyc*.so lameduck/http1/*.so; }
	touch $(FAST)

fast: $(FAST)

pure:
	rm -f src/*__mypyc*.so src/lameduck/http1/*.so $(FAST)

run: $(FAST)
	$(VENV)/bin/lameduck run $(if $(CONFIG),-c $(CONFIG))

lint: $(STAMP)
	$(VENV)/bin/ruff check src tests bench

test: $(FAST)
	bash scripts/ensure-debs.sh curl
	$(VENV)/bin/ruff check src tests bench
	$(PY) -m pytest -q -p no:cacheprovider

bench: $(FAST)
	bash scripts/ensure-debs.sh wrk haproxy nginx-light
	$(PY) bench/run.py

clean: pure
	rm -rf $(VENV) build src/build src/*.egg-info
