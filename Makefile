# lmforge developer targets. Everything a target needs is installed by `make install`
# into .venv (torch is pinned to the CPU wheel the CI machines carry locally).
PY      ?= python3
VENV    ?= .venv
BIN     := $(VENV)/bin
STAMP   := $(VENV)/.installed-stamp
# vLLM: the CUDA build where an NVIDIA driver is present, else the CPU build.
VLLM_EXTRA ?= $(shell command -v nvidia-smi >/dev/null 2>&1 && echo vllm-cuda || echo vllm)
EXTRAS  ?= server,lmi-dist,models,local,$(VLLM_EXTRA),bench,dev
# `make demo` needs only what the demo runs: the server, LMI-Dist, the SmolLM2 conversion and the
# local SageMaker (no vLLM, no lm-eval, pytest or the other test and bench extras)
DEMO_EXTRAS ?= server,lmi-dist,models,local
DEMO_STAMP := $(VENV)/.installed-demo-stamp
DEMO_DIR ?= .demo

.PHONY: install install-demo test test-fast test-unit test-integration test-vllm test-image test-docker lint fmt demo demo-image host-setup bench bench-real bench-images bench-report clean

# setup.py builds LMI-Dist's C library (src/lmforge/engines/lmi_dist/lora_kernel.c) into src/ with a C
# compiler when there is one
$(STAMP): pyproject.toml setup.py src/lmforge/engines/lmi_dist/lora_kernel.c src/lmforge/engines/lmi_dist/int8_kernel.c src/lmforge/engines/lmi_dist/int4_kernel.c src/lmforge/engines/lmi_dist/attention_kernel.c
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[$(EXTRAS)]'
	@# vLLM pulls PyPI's torchvision/torchaudio/torchcodec, which fail to import beside the pinned torch
	@# (and make transformers fail); text-only serving never needs them.
	$(BIN)/python -m pip uninstall -q -y torchvision torchaudio torchcodec 2>/dev/null || true
	@# Packages no lmforge process uses that transformers or torch import wherever they are installed,
	@# in every process that loads a model (each engine core, vLLM's processes, the test workers):
	@# scikit-learn and scipy, which lm-eval (dev) pulls for metrics the tests never ask for (f1, mcc:
	@# imported only then), 1.4 + 0.7 CPU-s an import; triton, which xgrammar pulls and CPU serving never
	@# runs, 0.2 CPU-s. ~140 CPU-s of a `make test` in all. The images do not have them either.
	$(BIN)/python -m pip uninstall -q -y scikit-learn scipy triton 2>/dev/null || true
	@# everything includes the demo's set
	touch $(STAMP) $(DEMO_STAMP)

install: $(STAMP)

# the demo's set alone (where `make install` ran, its stamp is already there)
$(DEMO_STAMP): pyproject.toml setup.py src/lmforge/engines/lmi_dist/lora_kernel.c src/lmforge/engines/lmi_dist/int8_kernel.c src/lmforge/engines/lmi_dist/int4_kernel.c src/lmforge/engines/lmi_dist/attention_kernel.c
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[$(DEMO_EXTRAS)]'
	@# triton: xgrammar pulls it, CPU serving never runs it (as in the full install above)
	$(BIN)/python -m pip uninstall -q -y triton 2>/dev/null || true
	touch $(DEMO_STAMP)

install-demo: $(DEMO_STAMP)

# everything; the image tests (marker `image`) run where podman or docker answers (`make host-setup`).
# pytest-xdist workers: tests that share a server (or a module's fixtures) carry the same
# `xdist_group` mark and stay on one worker (xdist's `--dist loadgroup`; tests/conftest.py completes
# its node ids on pytest 9.2, pytest-dev/pytest-xdist#1386); unmarked tests are spread one by one.
TEST_WORKERS ?= 3
test: install sdk3
	$(BIN)/python -m pytest -q -n $(TEST_WORKERS) --dist loadgroup

# the inner loop (about 50 s on 2 cores, two workers): unit tests and the in-process HTTP contract; no server processes,
# no vLLM engine, no load tests, no image builds
test-fast: install
	$(BIN)/python -m pytest -q -n 2 --dist loadgroup -m "not integration and not vllm and not load and not image and not gpu"

test-unit: install
	$(BIN)/python -m pytest -q tests/unit

test-integration: install sdk3
	$(BIN)/python -m pytest -q -m integration

test-vllm: install
	$(BIN)/python -m pytest -q -m vllm

test-image: install host-setup
	$(BIN)/python -m pytest -q -m image

# the image tests once more with Docker (`make test` runs them with podman where podman is installed):
# the cold cpu build, the container contract inside the image, the push to the local ECR, SDK v2 and
# v3 deploys streaming from the container, the failing-image and memory-limit cases. It needs a Docker
# daemon that answers ($$DOCKER_HOST; `containers/dockerd.sh start` starts one as CI does) and fails,
# never skips, without one. The two test modules run side by side once the image is built.
test-docker: install sdk3
	LMFORGE_CONTAINER_ENGINE=docker LMFORGE_REQUIRE_IMAGE_TESTS=1 \
		$(BIN)/python -m pytest -q -m image -n 2 --dist loadscope

# podman (or docker), mmdebstrap and a registry server: apt as root on Debian/Ubuntu, else a hint
host-setup:
	@bash containers/host-setup.sh

lint: install
	$(BIN)/ruff check src tests examples bench
	$(BIN)/ruff format --check src tests examples bench
	$(BIN)/mypy

fmt: install
	$(BIN)/ruff format src tests examples bench
	$(BIN)/ruff check --fix src tests examples bench

demo: install-demo
	@PY=$(BIN)/python DEMO_DIR=$(DEMO_DIR) bash examples/demo.sh

# lmforge's own cpu image: build -> local ECR -> SageMaker SDK deploy -> boto3 stream -> delete
demo-image: install host-setup
	@PY=$(BIN)/python bash examples/demo_image.sh

bench: install
	OMP_NUM_THREADS=1 $(BIN)/python -m bench.serving_throughput
	OMP_NUM_THREADS=1 $(BIN)/python -m bench.streaming_ceiling
	OMP_NUM_THREADS=1 $(BIN)/python -m bench.batching
	OMP_NUM_THREADS=1 $(BIN)/python -m bench.cold_start
	OMP_NUM_THREADS=1 $(BIN)/python -m bench.lora
	OMP_NUM_THREADS=1 $(BIN)/python -m bench.routing
	@# both compare against vLLM's own engine / server: only where vLLM is installed
	@if $(BIN)/python -c 'import importlib.util as u, sys; sys.exit(u.find_spec("vllm") is None)'; then \
		OMP_NUM_THREADS=1 $(BIN)/python -m bench.frontend_overhead && \
		OMP_NUM_THREADS=1 $(BIN)/python -m bench.frontend_overhead --api openai && \
		OMP_NUM_THREADS=1 $(BIN)/python -m bench.frontend_overhead --api openai-chat && \
		OMP_NUM_THREADS=1 $(BIN)/python -m bench.vllm_bench_parity && \
		OMP_NUM_THREADS=1 $(BIN)/python -m bench.engines && \
		OMP_NUM_THREADS=1 $(BIN)/python -m bench.soak; \
	else echo "vLLM is not installed: bench/frontend_overhead.py and bench/engines.py skipped"; fi
	$(BIN)/python -m bench.report

# the engines, frontend-overhead, batching, sticky-session, LoRA and cold-start scenarios on SmolLM2-135M (real
# weights, about 35 min):
# bench/results/*-smollm2-135m.json, side by side with the tiny model's in docs/performance.md
bench-real: install
	OMP_NUM_THREADS=1 $(BIN)/python -m bench.batching --model smollm2-135m --repeats 1
	OMP_NUM_THREADS=1 $(BIN)/python -m bench.sessions --engine lmi-dist
	OMP_NUM_THREADS=1 $(BIN)/python -m bench.lora --model smollm2-135m
	OMP_NUM_THREADS=1 $(BIN)/python -m bench.lora_step
	OMP_NUM_THREADS=1 $(BIN)/python -m bench.cold_start --model smollm2-135m
	@if $(BIN)/python -c 'import importlib.util as u, sys; sys.exit(u.find_spec("vllm") is None)'; then \
		OMP_NUM_THREADS=1 $(BIN)/python -m bench.frontend_overhead --model smollm2-135m --rounds 3 && \
		OMP_NUM_THREADS=1 $(BIN)/python -m bench.engines --model smollm2-135m && \
		OMP_NUM_THREADS=1 $(BIN)/python -m bench.sessions --engine vllm; \
	else echo "vLLM is not installed: bench/frontend_overhead.py and bench/engines.py skipped"; fi
	$(BIN)/python -m bench.report

# docs/performance.md again from bench/results/*.json, nothing measured
bench-report:
	$(BIN)/python -m bench.report

# image sizes, cold and incremental build times, container vs host-process start (bench/results/images.json)
bench-images: install host-setup
	$(BIN)/python -m bench.images
	$(BIN)/python -m bench.report

clean:
	rm -rf $(VENV) $(DEMO_DIR) .demo-image .pytest_cache .mypy_cache .ruff_cache

# The SageMaker Python SDK v3 beside v2 (both are the top-level package `sagemaker`; .venv has v2):
# v3's three packages, pinned, without their dependencies, in .venv/sdk3, which
# tests/integration/test_sdk_v3.py puts first on the PYTHONPATH of the processes it runs (and shows
# them v3 only). What v3 imports comes from .venv: boto3, pydantic, pandas, ... (that test checks
# their versions against v3's requirements). Left out: mlflow and sagemaker-mlflow (sagemaker-train
# requires them; building and deploying never import them: 0.5 GB and minutes of install less),
# scipy, paramiko, nest-asyncio, deepdiff, sagemaker-schema-inference-artifacts (likewise).
SDK3_DIR  := $(VENV)/sdk3
SDK3_PINS := sagemaker-core==2.27.0 sagemaker-serve==1.27.0 sagemaker-train==1.27.0

$(SDK3_DIR)/.installed-stamp: Makefile
	@test -x $(BIN)/python || { echo "no $(BIN)/python: run make install first" >&2; exit 1; }
	rm -rf $(SDK3_DIR)
	$(BIN)/python -m pip install -q --no-deps --target $(SDK3_DIR) $(SDK3_PINS)
	touch $@

.PHONY: sdk3
sdk3: $(SDK3_DIR)/.installed-stamp
