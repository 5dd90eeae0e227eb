# Two commands on a fresh Debian machine: `make run` and `make test`.
SHELL := /bin/bash
VENV  := .venv
PY    := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: run test lint bench clean

$(STAMP): pyproject.toml
	python3 -c 'import sys; sys.exit(sys.version_info < (3, 11))' || \
	  { echo "lameduck needs Python >= 3.11 as python3" >&2; exit 1; }
	test -x $(PY) || python3 -m venv $(VENV) || \
	  { rm -rf $(VENV); bash scripts/ensure-debs.sh python3-venv && python3 -m venv $(VENV); }
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[test]'
	touch $(STAMP)

run: $(STAMP)
	$(VENV)/bin/lameduck run $(if $(CONFIG),-c $(CONFIG))

lint: $(STAMP)
	$(VENV)/bin/ruff check src tests bench

test: $(STAMP)
	bash scripts/ensure-debs.sh curl
	$(VENV)/bin/ruff check src tests bench
	$(PY) -m pytest -q -p no:cacheprovider

bench: $(STAMP)
	bash scripts/ensure-debs.sh wrk haproxy nginx-light
	$(PY) bench/run.py

clean:
	rm -rf $(VENV) build src/*.egg-info
