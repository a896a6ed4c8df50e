# Every target bootstraps .venv itself (Python 3.11: the torch 2.13.0 CPU wheel is built for it).
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.texir-installed

.PHONY: demo test bench bench-quick fuzz conformance typecheck pytest browser clean

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[test]'
	# tosa-tools (Arm's TOSA serializer, ExecuTorch's ethos-u extra) pins flatbuffers 25.2.10, whose
	# builder lays out ExecuTorch's own .pte/.bpte files differently from 25.12.19: installed
	# without its pin so the oracle keeps the layout every byte-equality test was made against.
	$(PY) -m pip install --quiet --no-deps 'tosa-tools==2026.5.0'
	touch $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/texir demo

typecheck: $(STAMP)
	$(VENV)/bin/mypy

# The HTML picture is tested in Debian's headless chromium; this installs it when missing (as root).
browser:
	sh tests/browser_setup.sh

# Two workers (CI has 2 cores), each taking whole test files so module/session fixtures (one ExecuTorch
# reference per model) are built once per file; PYTEST_WORKERS=0 runs in one process. The 25 slowest
# tests are listed at the end (where the CI budget goes).
PYTEST_WORKERS ?= 2
pytest: $(STAMP) browser
	$(PY) -m pytest -q -n $(PYTEST_WORKERS) --dist loadfile --durations=25

test: typecheck pytest

# The .pte decoder, inspect, show and show --html on 10,400 mutated files (make test runs 600);
# texir against ExecuTorch's to_edge on every op of torch's OpInfo database (make test runs 16) and on
# every real-world model of tests/realworld_models.py (make test runs 2); the XNNPACK bridge on every real
# model (make test: 10 of 18, the native backend on all).
fuzz: $(STAMP)
	TEXIR_FUZZ_EXAMPLES=2600 $(PY) -m pytest -q -p no:randomly tests/test_pte_fuzz.py
	TEXIR_OPINFO_ALL=1 $(PY) -m pytest -q -p no:randomly tests/test_opinfo_differential.py
	TEXIR_REALWORLD_ALL=1 $(PY) -m pytest -q -p no:randomly tests/test_realworld_differential.py
	TEXIR_BRIDGE_ALL=1 $(PY) -m pytest -q -p no:randomly tests/test_executorch_backends_real.py tests/test_executorch_backends_real_hf.py

# ExecuTorch 1.5.1's own delegation tests (from the installed wheel) against texir.compat, every module
# texir/compat/conformance.json lists (make test runs two); see docs/compat.md.
conformance: $(STAMP)
	TEXIR_CONFORMANCE_ALL=1 $(PY) -m pytest -q -p no:randomly tests/test_compat_conformance.py

bench: $(STAMP)
	$(PY) benchmarks/run_all.py

bench-quick: $(STAMP)
	$(PY) benchmarks/run_all.py --quick

clean:
	rm -rf $(VENV) .mypy_cache build *.egg-info
