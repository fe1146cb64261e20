"""Real TRL runs for the tests: `MismatchDistillationTrainer` (TRL's own DistillationTrainer) on the sort-gpt2 pair."""

from __future__ import annotations

import copy
from pathlib import Path


def trl_trainer(pair, out_dir: Path, *, steps: int = 2, batch: int = 16, lr: float = 1e-3, bf16: bool = False,
                report_to: str = "none", config: dict | None = None, **kwargs):
    """TRL's trainer on `pair` (a fresh copy of its student), `steps` optimizer steps of `batch` prompts, logging
    every step; fp32 (`bf16=False`) unless asked, so the tests' slow computations are exact. `config` overrides
    `trl.DistillationConfig` fields (a None value: TRL's own default); `kwargs` go to
    `MismatchDistillationTrainer` (rollout, thresholds, gate_every, on_violation, callbacks, peft_config)."""
    import trl
    from datasets import Dataset

    from mismatch.integrations.trl import MismatchDistillationTrainer

    fields = dict(output_dir=str(out_dir), per_device_train_batch_size=batch, max_steps=steps, logging_steps=1,
                  max_completion_length=pair.max_new_tokens, learning_rate=lr, report_to=report_to,
                  save_strategy="no", disable_dropout=True, seed=0, use_cpu=True, disable_tqdm=True, bf16=bf16)
    fields.update(config or {})
    args = trl.DistillationConfig(**{k: v for k, v in fields.items() if v is not None})
    prompts = Dataset.from_dict({"prompt": pair.prompts("train", 64, seed=0)})
    return MismatchDistillationTrainer(model=copy.deepcopy(pair.student.model), teacher_model=pair.teacher.model,
                                       args=args, train_dataset=prompts, processing_class=pair.student.tokenizer,
                                       **kwargs)
