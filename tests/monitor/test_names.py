"""Each framework name `mismatch monitor` maps, checked in the mode (config setting) it is mapped under:
verl's against verl 0.9.1's own rollout-correction code and file logger, run on tensors; slime's, NeMo RL's
and prime-rl's against a recomputation that follows their source line by line (file:line cited at each),
written to a log the way each framework writes one. Each is compared with the toolkit's own statistic of
the same tokens (`mismatch.metrics.sampled_token_metrics`), and each mode that changes a name's meaning,
or leaves it unknown, is checked to keep it from being judged."""

from __future__ import annotations

import json
import math
import subprocess
import sys

import pytest
import torch

from mismatch.errors import InputError
from mismatch.metrics import ROLLOUT_STATS_CONFIG, sampled_token_metrics
from mismatch.monitor import MonitorSettings, monitor
from mismatch.defaults import DEFAULT_CLIP as CLIP

U = 2.0 ** -53  # float64 unit roundoff
F32 = 2.0 ** -24  # TensorBoard stores each scalar as float32: a relative rounding of at most 2^-24


def _tol(n: int, extra_rel: float = 0.0) -> float:
    """Relative bound for a mean of n float64 terms computed in two summation orders (≤ n·u each, for
    terms of one sign), plus `extra_rel` (a framework's `/ (n + 1e-8)`, a float32 store)."""
    return 2 * n * U + extra_rel


def _batch(seed: int, n_seq: int = 12, sigma: float = 0.5):
    """Padded `[B, T]` float64 log-probs under training and rollout and a response mask, log r ~ N(0, σ²)
    per token (σ = 0.5 puts about 17% of tokens outside [½, 2]), lengths 1–20."""
    gen = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, 21, (n_seq,), generator=gen)
    T = int(lengths.max())
    mask = (torch.arange(T)[None, :] < lengths[:, None]).double()
    lr = -torch.rand(n_seq, T, generator=gen, dtype=torch.float64) * 4 - 0.01
    lt = (lr + sigma * torch.randn(n_seq, T, generator=gen, dtype=torch.float64)).clamp(max=0.0)
    return lt * mask, lr * mask, mask


def _ours(lt, lr, mask) -> dict[str, float]:
    keep = mask.bool()
    return sampled_token_metrics(lt[keep], lr[keep], CLIP)


def test_the_calibrated_clip_is_the_checks_and_the_opd_loops():
    import inspect

    from mismatch.opd.config import OPDConfig

    assert CLIP == OPDConfig.__dataclass_fields__["clip"].default
    assert CLIP == inspect.signature(sampled_token_metrics).parameters["clip"].default


# ---------------------------------------------------------------- verl: its own code on tensors

_VERL = """
import dataclasses, json, os, sys, torch
from omegaconf import OmegaConf
from verl import DataProto
from verl.trainer.config.algorithm import RolloutCorrectionConfig
from verl.trainer.ppo import rollout_corr_helper as helper
from verl.utils.tracking import FileLogger
import verl

job = json.loads(sys.stdin.read())
out = {"version": verl.__version__, "bounds": {}}
for spec in job["specs"]:
    upper, lower = helper._parse_rollout_is_threshold(spec)
    out["bounds"][str(spec)] = [1.0 / upper if lower is None else lower, upper]
for run in job["runs"]:
    cfg = RolloutCorrectionConfig(**run["config"])  # verl's own config class and its defaults
    os.environ["VERL_FILE_LOGGER_PATH"] = run["log"]
    logger = FileLogger("project", "experiment")
    for step, (lt, lr, mask) in enumerate(job["batches"], 1):
        batch = DataProto.from_dict(tensors={"old_log_probs": torch.tensor(lt, dtype=torch.float64),
                                             "rollout_log_probs": torch.tensor(lr, dtype=torch.float64),
                                             "response_mask": torch.tensor(mask, dtype=torch.float64)})
        # ray_trainer.py:1658-1660 and 1802: these metrics, logged per global step
        logger.log(helper.compute_rollout_correction_and_add_to_batch(batch, cfg)[1], step=step)
    logger.finish()
    # the run's hydra config, as verl's trainer config holds it (trainer/config/_generated_ppo_trainer.yaml)
    full = OmegaConf.load(os.path.join(os.path.dirname(verl.__file__), "trainer/config/_generated_ppo_trainer.yaml"))
    full.algorithm.rollout_correction = {k: v for k, v in dataclasses.asdict(cfg).items() if k != "_target_"}
    OmegaConf.save(full, run["config_file"])
print(json.dumps(out))
"""


def _verl(tmp_path, configs: dict[str, dict], specs=()) -> dict:
    """verl's own metrics of `BATCHES`, logged by its own file logger, per named `RolloutCorrectionConfig`;
    in a subprocess (importing verl configures logging and sets environment variables)."""
    runs = [{"config": cfg, "log": str(tmp_path / f"{name}.jsonl"), "config_file": str(tmp_path / f"{name}.yaml")}
            for name, cfg in configs.items()]
    job = {"batches": [[t.tolist() for t in b] for b in BATCHES], "runs": runs, "specs": list(specs)}
    done = subprocess.run([sys.executable, "-c", _VERL], input=json.dumps(job), capture_output=True, text=True,
                          check=True)
    return json.loads(done.stdout.splitlines()[-1])


BATCHES = [_batch(seed) for seed in range(4)]
SPECS = [2.0, 3, "2.0", "0.5_2.0", "0.25_4"]


@pytest.fixture(scope="module")
def verl_runs(tmp_path_factory):
    """One subprocess for every verl run here: token level at 2, verl's defaults, and the toolkit's own mode."""
    folder = tmp_path_factory.mktemp("verl")
    out = _verl(folder, {"token": {"rollout_is": "token", "rollout_is_threshold": 2.0}, "default": {},
                         "ours": dict(ROLLOUT_STATS_CONFIG["algorithm"]["rollout_correction"])}, SPECS)
    return folder, out


def test_verl_token_level_is_the_checks_statistics(verl_runs):
    """rollout_is="token", threshold 2: the high + low shares are mismatch_is_ratio_outside_frac, and kl,
    k3_kl, chi2_token the check's (no |log r| > 20 here). Bound: verl's masked means divide by n + 1e-8."""
    tmp_path, _ = verl_runs
    report = monitor(tmp_path / "token.jsonl", framework_config=tmp_path / "token.yaml",
                     settings=MonitorSettings(patience=1))
    stats = {s.name: s for s in (report.gating, *report.others)}
    assert set(stats) == {"mismatch_kl", "mismatch_k3", "mismatch_chi2_token", "mismatch_is_ratio_outside_frac"}
    assert stats["mismatch_is_ratio_outside_frac"].logged_as == ("rollout_corr/rollout_is_ratio_fraction_high + "
                                                               "rollout_corr/rollout_is_ratio_fraction_low")
    assert "rollout_is = token" in stats["mismatch_is_ratio_outside_frac"].mode
    assert report.framework_settings["algorithm.rollout_correction.rollout_is"] == ("token",
                                                                                  str(tmp_path / "token.yaml"))
    for step, (lt, lr, mask) in enumerate(BATCHES, 1):
        n = int(mask.sum())
        ours = _ours(lt, lr, mask)
        for name, stat in stats.items():
            expected = ours[name.removeprefix("mismatch_")]
            scale = 1.0 + abs(expected) if name == "mismatch_chi2_token" else abs(expected)  # E[r²] − 1
            assert abs(stat.values[step] - expected) <= scale * _tol(n, 1e-8 / n) + 1e-300, (name, step)


def test_verl_sequence_level_shares_are_not_comparable(verl_runs):
    """verl's dataclass default rollout_is="sequence": the shares are of sequences whose ∏ r lies outside
    [½, 2] (rollout_corr_helper.py:704-718), another number than the token share, so not judged."""
    tmp_path, out = verl_runs
    report = monitor(tmp_path / "default.jsonl", framework_config=tmp_path / "default.yaml")
    framework, why, high = report.not_comparable["rollout_corr/rollout_is_ratio_fraction_high"]
    assert framework == "verl" and "sequence" in why
    assert "mismatch_is_ratio_outside_frac" not in {s.name for s in report.others}
    low = report.not_comparable["rollout_corr/rollout_is_ratio_fraction_low"][2]
    for step, (lt, lr, mask) in enumerate(BATCHES, 1):
        seq_log_r = ((lt - lr) * mask).sum(-1)
        outside = ((seq_log_r > math.log(2.0)) | (seq_log_r < math.log(0.5))).double().mean().item()
        assert high[step] + low[step] == pytest.approx(outside, rel=1e-6)  # verl's float32 .float().mean()
        assert abs(high[step] + low[step] - _ours(lt, lr, mask)["is_ratio_outside_frac"]) > 0.05
    assert out["version"] == "0.9.1"


@pytest.mark.parametrize("config, says", [
    (None, "mode unknown"),  # verl's file logger does not log its config
    ({"algorithm": {"rollout_correction": {"rollout_is": "token", "rollout_is_threshold": 3.0}}}, "[0.333, 3]"),
    ({"algorithm": {"rollout_correction": {"rollout_is": "token", "rollout_is_threshold": "0.25_2.0"}}}, "[0.25, 2]"),
])
def test_verl_shares_are_judged_only_at_the_calibrated_mode(verl_runs, config, says):
    tmp_path, _ = verl_runs
    report = monitor(tmp_path / "token.jsonl", framework_config=config)
    why = report.not_comparable["rollout_corr/rollout_is_ratio_fraction_high"][1]
    assert says in why
    if config is None:
        assert "algorithm.rollout_correction.rollout_is" in why and "--framework-config" in why
    assert report.gating.logged_as == "rollout_corr/kl"  # the mode-free names are judged all the same


def test_verl_threshold_specs_parse_as_verl_parses_them(verl_runs):
    from mismatch.monitor.names import verl_is_bounds

    _, out = verl_runs
    for spec in SPECS:
        assert list(verl_is_bounds(spec)) == out["bounds"][str(spec)], spec


def test_rollout_stats_follows_the_config_it_states(verl_runs):
    """`mismatch.metrics.ROLLOUT_STATS_CONFIG` is the verl mode `rollout_stats` computes verl's names in:
    verl's own code under that config gives the same shares (rel: verl's n + 1e-8)."""
    from mismatch.metrics import rollout_stats

    tmp_path, _ = verl_runs
    logged = [json.loads(line)["data"] for line in (tmp_path / "ours.jsonl").read_text().splitlines()]
    for (lt, lr, mask), theirs in zip(BATCHES, logged):
        keep = mask.bool()
        seq = torch.arange(len(mask))[:, None].expand_as(mask)[keep]
        ours = rollout_stats(lt[keep], lr[keep], seq)
        for name in ("rollout_is_ratio_fraction_high", "rollout_is_ratio_fraction_low",
                     "rollout_rs_seq_masked_fraction"):
            key = "rollout_corr/" + name
            assert ours[key] == pytest.approx(theirs[key], rel=3e-8, abs=1e-12), key


def test_the_toolkits_own_log_carries_its_framework_names_mode(tmp_path):
    """A log holding the toolkit's own statistics (`judge.statistics`: its names and `rollout_stats`') has
    its verl shares in `ROLLOUT_STATS_CONFIG`'s mode: read as a second copy, not as unknown."""
    from mismatch.admission.decision import statistics

    path = tmp_path / "own.jsonl"
    with path.open("w") as f:
        for step, (lt, lr, mask) in enumerate(BATCHES, 1):
            keep = mask.bool()
            seq = torch.arange(len(mask))[:, None].expand_as(mask)[keep]
            f.write(json.dumps({"step": step, **statistics(lt[keep], lr[keep], seq)}) + "\n")
    report = monitor(path)
    outside = {s.name: s for s in report.others}["mismatch_is_ratio_outside_frac"]
    assert outside.logged_as == "mismatch_is_ratio_outside_frac"
    assert ("rollout_corr/rollout_is_ratio_fraction_high + rollout_corr/rollout_is_ratio_fraction_low"
            in outside.also_logged_as)
    assert "rollout_corr/rollout_is_ratio_fraction_high" not in report.not_comparable


# ---------------------------------------------------------------- slime: its reduction, line by line

def _slime_samples(seed: int, removed: bool):
    """slime's per-sample 1-D log-probs (training, rollout) and loss masks; a multi-turn sample's tool
    tokens masked out and, if `removed`, one sample masked entirely (`remove_sample`, rollout.py:680-681)."""
    lt, lr, mask = _batch(seed, n_seq=6)
    samples = []
    for i in range(len(mask)):
        n = int(mask[i].sum())
        m = torch.ones(n, dtype=torch.float64)
        if i == 1:
            m[n // 3: 2 * n // 3] = 0  # tool response tokens: loss_mask 0
        samples.append((lt[i, :n], lr[i, :n], m))
    if removed:
        samples.append((lt[0, :3], lr[0, :3], torch.zeros(3, dtype=torch.float64)))
    return samples


def _slime_metric(x: list[torch.Tensor], masks: list[torch.Tensor], per_token_loss: bool) -> float:
    """One reported train metric of slime 624b824, one rank, no context parallelism:
    loss_function builds `get_sum_of_sample_mean(…, batch["loss_masks"], batch["rollout_mask_sums"],
    args.calculate_per_token_loss)` (megatron_utils/loss.py:1319-1325); it returns `sum_of_token` =
    Σ_i (x_i·m_i).sum() with the per-token loss, else `sum_of_sample_mean` = Σ_i (x_i·m_i).sum() /
    clamp_min(denom_i, 1) (cp_utils.py:73-91, 124), denom_i = rollout_mask_sums[i], the mask total of sample
    i's rollout (ray/rollout.py:695-700), every sample its own rollout by default (rollout.py:647-655).
    values[0] = num_tokens = Σ_i clamp_min(m_i.sum(), 1) with the per-token loss (loss.py:1317, 1375-1378),
    and reduce_train_step_metrics divides by it, else by step_global_batch_size, the sample count
    (observability/train_metric_utils.py:53-59)."""
    if per_token_loss:
        total = sum((xi * mi).sum() for xi, mi in zip(x, masks))
        return float(total / sum(torch.clamp_min(mi.sum(), 1) for mi in masks))
    total = sum((xi * mi).sum() / torch.clamp_min(mi.sum(), 1) for xi, mi in zip(x, masks))
    return float(total / len(masks))


def _slime_log(tmp_path, per_token_loss: bool, removed: bool = False) -> tuple:
    """slime's train metrics per step written as its TensorBoard adapter writes them: `add_scalar(key,
    value, step)` per key, the key `train/{key}` (tensorboard_utils.py:49-57, logging_utils.py:46-51,
    megatron_utils/model.py:882-897). The mis.py metrics, `kl` = log q − log p and `k3_kl` = r − log r − 1
    per token (examples/train_infer_mismatch_helper/mis.py:407-415), are reported as `mis_kl`, `mis_k3_kl`
    (mis.py:376) through the pre-RS reducer (loss.py:1156-1163); `train_rollout_logprob_abs_diff` =
    reducer(|log p − log q|) (loss.py:1136-1151)."""
    from torch.utils.tensorboard import SummaryWriter

    writer = SummaryWriter(str(tmp_path / "tb"))
    expected = []
    for step in range(1, 4):
        samples = _slime_samples(step, removed)
        lt, lr, masks = (list(c) for c in zip(*samples))
        per_token = {"train_rollout_logprob_abs_diff": [(a - b).abs() for a, b in zip(lt, lr)],
                     "mis_kl": [b - a for a, b in zip(lt, lr)],
                     "mis_k3_kl": [torch.exp(a - b) - (a - b) - 1 for a, b in zip(lt, lr)]}
        for key, x in per_token.items():
            writer.add_scalar(f"train/{key}", _slime_metric(x, masks, per_token_loss), step)
        keep = torch.cat(masks).bool()
        expected.append((sum(int(m.sum()) for m in masks), sampled_token_metrics(torch.cat(lt)[keep],
                                                                                 torch.cat(lr)[keep], CLIP)))
    writer.close()
    return tmp_path / "tb", expected


def _wandb_config(path, args: dict):
    """slime logs `deepcopy(args.__dict__)` as the W&B run's config (observability/wandb_utils.py:58,
    82-100); W&B keeps it as `files/config.yaml`: `wandb_version: 1` and `{key: {value: …}}`."""
    import yaml

    path.write_text(yaml.safe_dump({"wandb_version": 1, **{k: {"desc": None, "value": v} for k, v in args.items()}}))
    return path


SLIME_ARGS = {"calculate_per_token_loss": True, "use_tis": False, "get_mismatch_metrics": True,
              # as slime's own example scripts name it (examples/train_infer_mismatch_helper/run-qwen3-4b-mis.sh:125)
              "custom_tis_function_path": "examples.train_infer_mismatch_helper.mis.compute_mis_weights_with_cp",
              "use_rollout_logprobs": False, "lr": 1e-6}


@pytest.mark.parametrize("removed", [False, True])
def test_slime_per_token_loss_is_the_checks_token_means(tmp_path, removed):
    """Exact while every sample has a loss-masked token; a sample without one counts as one token in slime's
    denominator, which scales the logged means by N/(N+1) (the definition names.py states)."""
    tb, expected = _slime_log(tmp_path, per_token_loss=True, removed=removed)
    report = monitor(tb, framework_config=_wandb_config(tmp_path / "config.yaml", SLIME_ARGS))
    stats = {s.name: s for s in (report.gating, *report.others)}
    assert {name: s.logged_as for name, s in stats.items()} == {
        "mismatch_kl": "train/mis_kl", "mismatch_k3": "train/mis_k3_kl",
        "mismatch_logp_abs_diff_mean": "train/train_rollout_logprob_abs_diff"}
    assert "N/(N+k)" in stats["mismatch_kl"].how
    for step, (n, ours) in enumerate(expected, 1):
        for name, stat in stats.items():
            expected_value = ours[name.removeprefix("mismatch_")] * (n / (n + 1) if removed else 1.0)
            bound = _tol(n, F32) * abs(expected_value)
            if name == "mismatch_kl":  # a signed mean: its rounding scales with the mean of |log r|
                bound = _tol(n, F32) * ours["logp_abs_diff_mean"]
            assert abs(stat.values[step] - expected_value) <= bound, (name, step)


def test_slime_default_reduction_is_not_comparable(tmp_path):
    """Without --calculate-per-token-loss each sample's token mean is averaged over samples: a sequence-
    weighted number, and here not the token mean (the masked-out sample counts as a 0)."""
    tb, expected = _slime_log(tmp_path, per_token_loss=False, removed=True)
    args = {**SLIME_ARGS, "calculate_per_token_loss": False}
    with pytest.raises(InputError, match="no statistic a calibrated limit applies to") as err:
        monitor(tb, framework_config=_wandb_config(tmp_path / "config.yaml", args))
    assert "train/mis_kl (slime: " in str(err.value) and "per-rollout" in str(err.value)
    from mismatch.monitor.logs import read_log

    logged = read_log(tb).values["train/train_rollout_logprob_abs_diff"]
    assert all(abs(logged[s] - ours["logp_abs_diff_mean"]) > 1e-3 for s, (_, ours) in enumerate(expected, 1))


@pytest.mark.parametrize("changes, comparable", [
    ({}, True),  # mis.py without --use-tis returns the loss masks as they are (mis.py:208-209)
    ({"use_tis": True, "custom_tis_function_path": None}, True),  # vanilla TIS returns them too (loss.py:884-905)
    ({"use_tis": True, "use_rs": True}, False),  # mis.py's rejection sampling zeroes tokens (mis.py:244-262)
    ({"use_tis": True, "custom_tis_function_path": "my.module:tis"}, False),  # a function we cannot see
    ({"custom_tis_function_path": "examples/train_infer_mismatch_helper/mis.py:compute_mis_weights_with_cp"}, True),
])
def test_slime_abs_diff_needs_the_loss_masks_in_its_numerator(tmp_path, changes, comparable):
    """With --use-tis or --get-mismatch-metrics the numerator is reduced over the TIS function's returned
    masks, the denominator over the original ones (loss.py:1080-1091, 1136-1140)."""
    tb, _ = _slime_log(tmp_path, per_token_loss=True)
    args = {**SLIME_ARGS, "tis_mode": "truncate", "use_rs": False, **changes}
    report = monitor(tb, framework_config=_wandb_config(tmp_path / "config.yaml", args))
    names = {s.logged_as for s in (report.gating, *report.others)}
    assert ("train/train_rollout_logprob_abs_diff" in names) is comparable
    assert "train/mis_kl" in names  # reduced with the pre-RS masks in every mode (loss.py:1156-1163)
    if not comparable:
        assert "masks" in report.not_comparable["train/train_rollout_logprob_abs_diff"][1]


# ---------------------------------------------------------------- NeMo RL: its loss metrics, line by line

def _calculate_kl(logprobs, logprobs_reference, kl_type):
    """nemo_rl/algorithms/utils.py:42-101 (NeMo RL 7ea279a) with input_clamp_value=None and
    output_clamp_value=None, as ClippedPGLossFn calls it for these metrics (loss_functions.py:416-437)."""
    logr = logprobs_reference - logprobs
    return {"k1": -logr, "k2": logr.square() / 2, "k3": torch.exp(logr) - 1 - logr}[kl_type]


def _nemo_metrics(gen, prev, token_mask, sample_mask, kl_type):
    """ClippedPGLossFn.__call__'s mismatch metrics of one microbatch holding the whole batch (global_valid_toks =
    its token count): loss_functions.py:383-397 (the [:, 1:] shift, mask = token_mask · sample_mask),
    404-465, with masked_mean = Σ values·mask / (N + 1e-8) (utils.py:212-224); and the sequence-level
    error of compute_and_apply_seq_logprob_error_masking (grpo.py:2538-2566)."""
    token_mask, prev, gen = token_mask[:, 1:], prev[:, 1:], gen[:, 1:]
    mask = token_mask * sample_mask.unsqueeze(-1)
    n = mask.sum()
    mean = lambda v: float(torch.sum(v * mask) / (n + 1e-8))  # noqa: E731
    lp_error = torch.abs(gen - prev)
    log_mixture = torch.log(0.5 * torch.exp(prev) + 0.5 * torch.exp(gen))
    js = 0.5 * (torch.exp(prev - log_mixture) - (prev - log_mixture) - 1) + 0.5 * (
        torch.exp(gen - log_mixture) - (gen - log_mixture) - 1)
    denom = mask.sum(-1)
    seq = (torch.exp(lp_error * mask) * mask).sum(-1)[denom > 0] / denom[denom > 0].clamp(min=1)
    return {"token_mult_prob_error": mean(torch.exp(lp_error * mask)),
            "gen_kl_error": mean(_calculate_kl(gen, prev, kl_type)),
            "policy_kl_error": mean(_calculate_kl(prev, gen, kl_type)),
            "js_divergence_error": mean(js),
            "max_seq_mult_prob_error": float(seq.max()), "mean_seq_mult_prob_error": float(seq.mean()),
            "min_seq_mult_prob_error": float(seq.min())}


def _nemo_log(tmp_path, master_config: dict | None, keys=None) -> tuple:
    """Logged as NeMo RL's TensorboardLogger does: `add_scalar(f"train/{name}", value, step)`
    (utils/logger.py:174-187; grpo.py:3762) and, at start, `add_hparams(flatten_dict(config), {})`
    (logger.py:196-203, flatten_dict with "." at 1324-1372; grpo.py:545)."""
    from torch.utils.tensorboard import SummaryWriter

    writer = SummaryWriter(str(tmp_path / "tb"))
    if master_config is not None:
        flat = {f"{section}.{k}": v for section, values in master_config.items() for k, v in values.items()}
        writer.add_hparams(flat, {})
    kl_type = (master_config or {}).get("loss_fn", {}).get("reference_policy_kl_type", "k3")
    expected = []
    for step in range(1, 5):
        lt, lr, mask = _batch(10 + step, sigma=0.05 * step)
        full = torch.cat([torch.zeros(len(mask), 1, dtype=torch.float64), mask], 1)  # position 0: the prompt's
        prev, gen = (torch.cat([torch.zeros(len(mask), 1, dtype=torch.float64), x], 1) for x in (lt, lr))
        sample_mask = torch.ones(len(mask), dtype=torch.float64)
        sample_mask[-1] = 0.0  # a sample the loss leaves out
        metrics = _nemo_metrics(gen, prev, full, sample_mask, kl_type)
        for name, value in metrics.items():
            if keys is None or name in keys:
                writer.add_scalar(f"train/{name}", value, step)
        keep = (mask * sample_mask[:, None]).bool()
        expected.append((int(keep.sum()), metrics, sampled_token_metrics(lt[keep], lr[keep], CLIP)))
    writer.close()
    return tmp_path / "tb", expected


def test_nemo_gen_kl_error_under_its_default_k3_is_mismatch_k3_from_the_logged_config(tmp_path):
    tb, expected = _nemo_log(tmp_path, {"loss_fn": {"reference_policy_kl_type": "k3"}, "grpo": {"seed": 42}})
    report = monitor(tb, settings=MonitorSettings(patience=1))
    assert report.gating.name == "mismatch_k3" and report.gating.logged_as == "train/gen_kl_error"
    assert report.framework_settings["loss_fn.reference_policy_kl_type"][0] == "k3"
    for step, (n, _, ours) in enumerate(expected, 1):
        assert abs(report.gating.values[step] - ours["k3"]) <= _tol(n, F32 + 1e-8 / n) * ours["k3"], step
    for name in ("train/policy_kl_error", "train/js_divergence_error", "train/token_mult_prob_error",
                 "train/max_seq_mult_prob_error", "train/mean_seq_mult_prob_error", "train/min_seq_mult_prob_error"):
        assert report.not_comparable[name][0] == "NeMo RL", name


def test_nemo_under_k1_gen_and_policy_kl_error_are_mismatch_kl(tmp_path):
    """k1: gen_kl_error = mean(−log r) = mismatch_kl; policy_kl_error = mean(log r) = −mismatch_kl, read
    negated (the exact conversion)."""
    tb, expected = _nemo_log(tmp_path, {"loss_fn": {"reference_policy_kl_type": "k1"}}, keys={"policy_kl_error"})
    report = monitor(tb)
    assert report.gating.name == "mismatch_kl" and report.gating.logged_as == "train/policy_kl_error"
    for step, (n, metrics, ours) in enumerate(expected, 1):
        assert report.gating.values[step] == -float(torch.tensor(metrics["policy_kl_error"], dtype=torch.float32))
        bound = _tol(n, F32 + 1e-8 / n) * ours["logp_abs_diff_mean"]
        assert abs(report.gating.values[step] - ours["kl"]) <= bound, step
    both = monitor(_nemo_log(tmp_path / "both", {"loss_fn": {"reference_policy_kl_type": "k1"}})[0])
    assert both.gating.logged_as == "train/gen_kl_error" and both.gating.also_logged_as == ["train/policy_kl_error"]


def test_nemo_under_k2_and_without_its_config_gen_kl_error_is_not_judged(tmp_path):
    tb, _ = _nemo_log(tmp_path / "k2", {"loss_fn": {"reference_policy_kl_type": "k2"}}, keys={"gen_kl_error"})
    with pytest.raises(InputError, match=r"train/gen_kl_error \(NeMo RL: .*\(log r\)²/2"):
        monitor(tb)
    tb, _ = _nemo_log(tmp_path / "none", None, keys={"gen_kl_error"})  # a log without its hparams
    with pytest.raises(InputError, match=r"mode unknown.*loss_fn\.reference_policy_kl_type"):
        monitor(tb)
    report = monitor(tb, framework_config={"loss_fn": {"reference_policy_kl_type": "k3"}})
    assert report.gating.name == "mismatch_k3"


def test_nemo_rls_own_gate_is_shown_beside_ours(tmp_path):
    """grpo.seq_logprob_error_threshold masks each sequence whose mean exp|log r| exceeds it (grpo.py:
    2581-2611): a step whose max_seq_mult_prob_error is above it masked at least one sequence."""
    threshold = 1.15  # between the steps' largest sequence errors (1.07, 1.12, 1.18, 1.26)
    tb, expected = _nemo_log(tmp_path, {"loss_fn": {"reference_policy_kl_type": "k3"},
                                        "grpo": {"seq_logprob_error_threshold": threshold}})
    report = monitor(tb)
    (gate,) = report.framework_gates
    assert gate.name == "grpo.seq_logprob_error_threshold" and gate.limit == threshold
    assert gate.logged_as == "train/max_seq_mult_prob_error" and gate.framework == "NeMo RL"
    above = [s for s, (_, metrics, _) in enumerate(expected, 1) if metrics["max_seq_mult_prob_error"] > threshold]
    assert gate.crossed_steps == above and 0 < len(above) < len(expected)
    off = monitor(_nemo_log(tmp_path / "off", {"loss_fn": {"reference_policy_kl_type": "k3"}})[0])
    assert off.framework_gates == [] and any("seq_logprob_error_threshold" in note for note in off.notes)


# ---------------------------------------------------------------- prime-rl: mismatch_kl/all/mean

def _prime_log(path, steps: int = 3):
    """prime-rl's trainer: per micro-batch `mismatch_kl = ratio − log ratio − 1` of trainer vs inference
    log-probs (trainer/rl/loss.py:100-106) over the loss-masked tokens (trainer/rl/train.py:499-512),
    `mismatch_kl/all/mean` their mean over the step (trainer/utils.py:245-272); written by its FileMonitor
    (monitors/file.py:33-41)."""
    expected = []
    with path.open("w") as f:
        for step in range(1, steps + 1):
            lt, lr, mask = _batch(20 + step)
            keep = mask.bool()
            log_ratio = lt - lr
            mismatch_kl = (torch.exp(log_ratio) - log_ratio - 1)[keep]
            f.write(json.dumps({"step": step, "time": 0.0, "mismatch_kl/all/mean": mismatch_kl.mean().item()}) + "\n")
            expected.append((int(keep.sum()), float(torch.exp(log_ratio)[keep].mean()), _ours(lt, lr, mask)))
    return expected


@pytest.mark.parametrize("config, caveat", [
    (None, "up to 8"),  # unknown: prime-rl's default max_off_policy_steps
    ("[orchestrator]\nmax_off_policy_steps = 2\n", "up to 2"),
    ("[orchestrator]\nmax_off_policy_steps = 0\n", None),
])
def test_prime_rls_mismatch_kl_is_k3_and_says_when_it_mixes_staleness(tmp_path, config, caveat):
    expected = _prime_log(tmp_path / "metrics.jsonl")
    if config is not None:
        (tmp_path / "rl.toml").write_text(config)
    report = monitor(tmp_path / "metrics.jsonl", framework_config=None if config is None else tmp_path / "rl.toml")
    gate = report.gating
    assert gate.name == "mismatch_k3" and gate.framework == "prime-rl"
    for step, (n, mean_r, ours) in enumerate(expected, 1):
        # exp(x) − 1 − x against the check's expm1(x) − x: each token's exp rounds by ≤ u·r (then cancels)
        assert abs(gate.values[step] - ours["k3"]) <= _tol(n) * ours["k3"] + 2 * U * mean_r, step
    if caveat is None:
        assert gate.caveat is None
    else:
        assert "staleness" in gate.caveat and caveat in gate.caveat


# ---------------------------------------------------------------- the config file itself

def test_framework_config_on_the_command_line(verl_runs, tmp_path):
    from typer.testing import CliRunner

    from mismatch.cli.app import app

    folder, _ = verl_runs
    runner = CliRunner()
    log, config = str(folder / "token.jsonl"), str(folder / "token.yaml")
    res = runner.invoke(app, ["monitor", log, "--framework-config", config])
    assert res.exit_code == 0, res.output
    assert "mismatch_is_ratio_outside_frac" in res.output and "rollout_is = token" in res.output
    (tmp_path / "bad.yaml").write_text("algorithm: [unclosed\n")
    (tmp_path / "config.ini").write_text("x=1\n")
    for bad, says in (("missing.yaml", "no framework config"), ("bad.yaml", "cannot read"), ("config.ini", "YAML")):
        res = runner.invoke(app, ["monitor", log, "--framework-config", str(tmp_path / bad)])
        assert res.exit_code == 2 and res.output.count("\n") == 1 and says in res.output, (bad, res.output)
