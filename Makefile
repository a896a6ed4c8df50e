# Every target bootstraps .venv itself (Python 3.11: the torch 2.13.0 CPU wheel is built for it).
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.texir-installed
PTH := $(VENV)/.texir-torchvision-pth
OPTIMUM := $(VENV)/.texir-optimum

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

# optimum-executorch (tests/test_compat_optimum.py, benchmarks/bench_optimum.py: a real client of
# texir.compat) pins transformers==5.0.0rc1, which conflicts with ours: installed without its pins.
# What it imports is in the test extra already (executorch, transformers, torchao, pytorch-tokenizers,
# huggingface_hub, psutil, pyyaml, safetensors). Its own stamp: an existing .venv gets it too.
$(OPTIMUM): $(STAMP)
	$(PY) -m pip install --quiet --no-deps 'optimum-executorch==1.1.0' 'optimum==2.0.0' 'accelerate==1.15.0'
	$(PY) -c 'import optimum.executorch'
	touch $(OPTIMUM)

# PyPI's torchvision wheel cannot load its native ops beside the CPU torch: a .pth in the .venv's
# site-packages arms texir's import hook at interpreter start, so `import torchvision` works from any
# Python in this .venv with nothing to call (texir._torchvision). Its own stamp: an existing .venv gets it too.
$(PTH): $(OPTIMUM) texir/_torchvision.py
	$(PY) -m texir._torchvision
	touch $(PTH)

demo: $(PTH)
	$(VENV)/bin/texir demo

typecheck: $(PTH)
	$(VENV)/bin/mypy

# The HTML picture is tested in Debian's headless chromium; this installs it when missing (as root).
browser:
	sh tests/browser_setup.sh

# Two workers (CI has 2 cores), each taking whole test files so module/session fixtures (one ExecuTorch
# reference per model) are built once per file; PYTEST_WORKERS=0 runs in one process. The 25 slowest
# tests are listed at the end (where the CI budget goes).
PYTEST_WORKERS ?= 2
pytest: $(PTH) browser
	$(PY) -m pytest -q -n $(PYTEST_WORKERS) --dist loadfile --durations=25

test: typecheck pytest

# The .pte decoder, inspect, show and show --html on 10,400 mutated files (make test runs 600); the
# XNNPACK blob reader on 3,464 mutated native-XNNPACK delegates, allocation measured (make test runs 200);
# the IR text parser on 20,000 mutated texts (make test runs 600, the same ones every run);
# texir against ExecuTorch's to_edge on every op of torch's OpInfo database (make test runs 16) and on
# every real-world model of tests/realworld_models.py (make test runs 2); the XNNPACK bridge on every real
# model (make test: 10 of 18, the native backend on all).
fuzz: $(PTH)
	TEXIR_FUZZ_EXAMPLES=2600 $(PY) -m pytest -q -p no:randomly tests/test_pte_fuzz.py tests/test_xnnpack_reader_fuzz.py
	TEXIR_FUZZ_EXAMPLES=5000 $(PY) -m pytest -q -p no:randomly tests/test_ir_parser_fuzz.py
	TEXIR_OPINFO_ALL=1 $(PY) -m pytest -q -p no:randomly tests/test_opinfo_differential.py
	TEXIR_REALWORLD_ALL=1 $(PY) -m pytest -q -p no:randomly tests/test_realworld_differential.py
	TEXIR_BRIDGE_ALL=1 $(PY) -m pytest -q -p no:randomly tests/test_executorch_backends_real.py tests/test_executorch_backends_real_hf.py

# ExecuTorch 1.5.1's own delegation tests (from the installed wheel) against texir.compat, every module
# texir/compat/conformance.json lists, alone (make test runs them too); see docs/compat.md.
conformance: $(PTH)
	$(PY) -m pytest -q -p no:randomly -n 2 --dist load tests/test_compat_conformance.py

bench: $(PTH)
	$(PY) benchmarks/run_all.py

bench-quick: $(PTH)
	$(PY) benchmarks/run_all.py --quick

clean:
	rm -rf $(VENV) .mypy_cache build *.egg-info
