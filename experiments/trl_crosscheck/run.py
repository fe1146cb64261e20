"""TRL's DistillationTrainer against mismatch's own OPD loop, on sort-gpt2 with matched settings.

Both engines train the same student against the same teacher with reverse KL over the full vocabulary
(TRL `beta=1.0`, mismatch `full-rkl`) on the student's own temperature-1 samples: 64 prompts per step, 80
steps, AdamW (β 0.9/0.999, no weight decay) at lr 1e-3 with 10 warm-up steps then cosine to 1e-4, gradient
norm clipped at 1, fp32. Both are evaluated by the same function (`mismatch.pairs.evaluate.expected_accuracy`:
the exact expected exact match on the seed's 1,024 held-out prompts) at steps 0, 40 and 80, and by the
held-out reverse KL of the toolkit's evaluation. TRL runs twice: as shipped (`trl`: `trl.DistillationTrainer`
itself, whose training forward passes no position_ids, so GPT-2's left-padded rows train at shifted positions;
the omission huggingface/trl#6800 reports in Online DPO) and with the positions the samples were generated at
(`trl-fixed`: `MismatchDistillationTrainer`, its default). One process per run, one thread each:

    python experiments/trl_crosscheck/run.py --engine trl --seed 0 >> experiments/trl_crosscheck/runs.jsonl
    python experiments/trl_crosscheck/run.py --summarize --plot docs/assets/trl-crosscheck.png
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import time
from importlib.metadata import version
from pathlib import Path

import torch

HERE = Path(__file__).parent
STEPS, BATCH, LR, WARMUP, MIN_LR, EVAL_AT, EVAL_PROMPTS = 80, 64, 1e-3, 10, 1e-4, (0, 40, 80), 1024
PAIR = "sort-gpt2"


def evaluate(pair, model, seed: int) -> dict[str, float]:
    """The toolkit's evaluation of `model` as the student: expected exact match (exact) and held-out reverse KL."""
    from mismatch.model.loader import LM
    from mismatch.opd.evaluate import EVAL_SEED_OFFSET, heldout_rkl
    from mismatch.pairs.evaluate import expected_accuracy

    was = model.training
    model.eval()
    student = LM(model, pair.student.tokenizer, "student")
    prompts = pair.prompts("held_out", EVAL_PROMPTS, seed=seed)
    acc = expected_accuracy(student, pair.task, prompts, max_new_tokens=pair.max_new_tokens)
    rkl, _ = heldout_rkl(student, pair.teacher, prompts, chat=pair.chat, student_context=pair.student_context,
                         teacher_context=pair.teacher_context, max_new_tokens=pair.max_new_tokens,
                         seed=seed + EVAL_SEED_OFFSET, chunk_tokens=1024, task=pair.task)
    model.train(was)
    return {"expected_accuracy": acc, "heldout_rkl": rkl}


def run_trl(seed: int, fix_positions: bool) -> dict:
    """One TRL run: `trl.DistillationTrainer` as shipped, or with `fix_positions` the integration's trainer."""
    import trl
    from datasets import Dataset
    from transformers import TrainerCallback

    import mismatch
    from mismatch.integrations.trl import MismatchDistillationTrainer

    pair = mismatch.load_pair(PAIR)
    curve = {}

    class Evaluate(TrainerCallback):
        def on_train_begin(self, args, state, control, model=None, **kwargs):
            curve[0] = evaluate(pair, model, seed)

        def on_step_end(self, args, state, control, model=None, **kwargs):
            if state.global_step in EVAL_AT:
                curve[state.global_step] = evaluate(pair, model, seed)

    args = trl.DistillationConfig(
        output_dir=f"/tmp/trl-crosscheck-{seed}", per_device_train_batch_size=BATCH, max_steps=STEPS, learning_rate=LR,
        lr_scheduler_type="cosine_with_min_lr", lr_scheduler_kwargs={"min_lr": MIN_LR}, warmup_steps=WARMUP,
        weight_decay=0.0, adam_beta1=0.9, adam_beta2=0.999, max_grad_norm=1.0, beta=1.0, temperature=1.0,
        max_completion_length=pair.max_new_tokens, bf16=False, disable_dropout=True, seed=seed, use_cpu=True,
        report_to="none", save_strategy="no", logging_steps=10, disable_tqdm=True)
    from mismatch.opd import OPDConfig

    # the OPD loop's prompt pool for this seed (`mismatch.opd.trainer.setup`)
    train_pool = pair.prompts("train", min(OPDConfig(pair=PAIR).train_prompts, pair.prompt_source.count("train")),
                              seed=seed)
    trainer_class = MismatchDistillationTrainer if fix_positions else trl.DistillationTrainer
    trainer = trainer_class(model=pair.student.model, teacher_model=pair.teacher.model, args=args,
                            train_dataset=Dataset.from_dict({"prompt": train_pool}),
                            processing_class=pair.student.tokenizer, callbacks=[Evaluate()])
    start = time.perf_counter()
    trainer.train()
    wall = time.perf_counter() - start
    return {"curve": curve, "wall_s": wall, "lr_first_steps": [r.get("learning_rate") for r in trainer.state.log_history[:2]]}


def run_opd(seed: int) -> dict:
    from mismatch.opd import OPDConfig, train

    config = OPDConfig(pair=PAIR, loss="full-rkl", steps=STEPS, batch_size=BATCH, lr=LR, warmup_steps=WARMUP,
                       final_lr_frac=MIN_LR / LR, eval_every=40, eval_prompts=EVAL_PROMPTS, eval_greedy=False,
                       eval_probe=0, seed=seed)
    start = time.perf_counter()
    rows = train(config)
    wall = time.perf_counter() - start
    curve = {}
    for r in rows:
        if r["metric"] in ("heldout_expected_accuracy", "heldout_rkl") and r["step"] in EVAL_AT:
            key = "expected_accuracy" if r["metric"] == "heldout_expected_accuracy" else "heldout_rkl"
            curve.setdefault(int(r["step"]), {})[key] = r["value"]
    return {"curve": curve, "wall_s": wall}


def summarize() -> None:
    import numpy as np

    from mismatch.analysis.tolerance import t_interval

    runs = [json.loads(line) for line in (HERE / "runs.jsonl").read_text().splitlines() if line.strip()]
    print("| engine | seeds | step | expected EM (%) mean ± 95% CI | held-out rKL (nats) mean ± 95% CI | wall s/run |")
    print("|---|---|---|---|---|---|")
    for engine in ("opd", "trl", "trl-fixed"):
        mine = [r for r in runs if r["engine"] == engine]
        for step in EVAL_AT:
            acc = t_interval([100 * r["curve"][str(step)]["expected_accuracy"] for r in mine])
            rkl = t_interval([r["curve"][str(step)]["heldout_rkl"] for r in mine])
            print(f"| {engine} | {len(mine)} | {step} | {acc[0]:.1f} ± {acc[1]:.1f} | {rkl[0]:.3f} ± {rkl[1]:.3f} "
                  f"| {np.mean([r['wall_s'] for r in mine]):.0f} |")


def plot(path: Path) -> None:
    """Both engines' curves (mean and 95% seed interval of expected EM and held-out rKL at each evaluation)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from mismatch.analysis.tolerance import t_interval

    runs = [json.loads(line) for line in (HERE / "runs.jsonl").read_text().splitlines() if line.strip()]
    labels = {"opd": "mismatch's OPD loop", "trl-fixed": "TRL, generation's positions (default here)",
              "trl": "TRL 1.16 as shipped"}
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.6))
    for engine, color in (("opd", "black"), ("trl-fixed", "tab:blue"), ("trl", "tab:red")):
        mine = [r for r in runs if r["engine"] == engine]
        for ax, key, scale in ((axes[0], "expected_accuracy", 100), (axes[1], "heldout_rkl", 1)):
            stats = [t_interval([scale * r["curve"][str(step)][key] for r in mine]) for step in EVAL_AT]
            mean = [m for m, _ in stats]
            half = [h for _, h in stats]
            ax.errorbar(EVAL_AT, mean, yerr=half, marker="o", capsize=3, color=color,
                        label=f"{labels[engine]} ({len(mine)} seeds)")
    axes[0].set(xlabel="step", ylabel="expected exact match (%)", title="held-out accuracy (exact)")
    axes[1].set(xlabel="step", ylabel="nats/token", title="held-out reverse KL to the teacher")
    for ax in axes:
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    fig.text(0.01, 0.01, "sort-gpt2, full-vocabulary reverse KL, 64 prompts × 80 steps, lr 1e-3 (10 warm-up, cosine "
                         "to 1e-4), fp32; 95% t-intervals over seeds", fontsize=7)
    fig.tight_layout(rect=(0, 0.04, 1, 1))
    fig.savefig(path, dpi=120)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--engine", choices=("trl", "trl-fixed", "opd"))
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--summarize", action="store_true")
    parser.add_argument("--plot", type=Path, help="with --summarize: also draw the curves there")
    a = parser.parse_args()
    if a.summarize:
        summarize()
        if a.plot:
            plot(a.plot)
        return
    torch.set_num_threads(1)
    with contextlib.redirect_stdout(sys.stderr):  # transformers prints TRL's logs: stdout is the run's one JSON line
        out = run_opd(a.seed) if a.engine == "opd" else run_trl(a.seed, fix_positions=a.engine == "trl-fixed")
    print(json.dumps({"engine": a.engine, "seed": a.seed, "trl_version": version("trl"), **out}))
    sys.stdout.flush()


if __name__ == "__main__":
    main()
