#!/usr/bin/env bash
# The docs' `mismatch monitor` figures (docs/trainers.md): a TRL run and a run of the toolkit's own OPD loop,
# each with noisy rollouts (noise:0.3 on sort-gpt2), judged by `mismatch monitor`. Run from the repository root.
set -euo pipefail
out=${OUT:-/tmp/monitor-figures}
rm -rf "$out" && mkdir -p "$out"
.venv/bin/python - "$out" <<'PY'
import sys
import torch
from datasets import Dataset
from trl import DistillationConfig
import mismatch
from mismatch.integrations.trl import MismatchDistillationTrainer

torch.set_num_threads(1)
out = sys.argv[1]
pair = mismatch.load_pair("sort-gpt2")
args = DistillationConfig(output_dir=f"{out}/trl", per_device_train_batch_size=64, max_steps=40, learning_rate=1e-3,
                          beta=1.0, max_completion_length=pair.max_new_tokens, logging_steps=1, save_strategy="no",
                          report_to="tensorboard", bf16=False, use_cpu=True, disable_tqdm=True, seed=0)
trainer = MismatchDistillationTrainer(model=pair.student.model, teacher_model=pair.teacher.model, args=args,
                                      train_dataset=Dataset.from_dict({"prompt": pair.prompts("train", 4096, seed=0)}),
                                      processing_class=pair.student.tokenizer, rollout="noise:0.3")
trainer.train()
trainer.save_state()
PY
.venv/bin/mismatch opd --pair sort-gpt2 --rollout noise:0.3 --steps 40 --batch-size 64 --eval-every 40 \
    --eval-prompts 128 --out "$out/opd" > /dev/null
.venv/bin/mismatch monitor "$out/trl" --out "$out/monitor-trl" || true
.venv/bin/mismatch monitor "$out/opd" --out "$out/monitor-opd" || true
cp "$out/monitor-trl/monitor.png" docs/assets/monitor-trl.png
cp "$out/monitor-opd/monitor.png" docs/assets/monitor-opd.png
cp "$out/monitor-trl/monitor.json" experiments/trl_crosscheck/monitor_trl.json  # the numbers docs/trainers.md quotes
cp "$out/monitor-opd/monitor.json" experiments/trl_crosscheck/monitor_opd.json
