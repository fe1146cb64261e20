"""The OPD recipe: exact identities under no mismatch, learning on a synthetic pair, bad input."""

import dataclasses
import math
import statistics

import pytest
import torch
from typer.testing import CliRunner

import mismatch
from mismatch.errors import InputError
from mismatch.cli.app import app
from mismatch.opd import OPDConfig, train
from mismatch.opd.losses import tis_weights
from mismatch.opd.config import lr_factor
from mismatch.opd.trainer import loss_backward, teacher_hidden
from mismatch.results import read_results
from mismatch.model.generate import sample

runner = CliRunner()
TIMING = {"rollout_s", "teacher_s", "update_s", "metrics_s", "refresh_s", "wall_s", "tokens_per_s"}  # wall-clock rows


def strip(rows):
    """A run's rows without the ones that measure time."""
    return [r for r in rows if r["metric"] not in TIMING]


SHORT = dict(pair="reverse-qwen3", steps=3, batch_size=8, eval_every=3, eval_prompts=16, train_prompts=256)


def _by(rows, metric):
    return {r["step"]: r["value"] for r in rows if r["metric"] == metric}


def test_identical_policies_give_unit_tis_weights_and_zero_mismatch():
    pair = mismatch.load_pair("reverse-qwen3")
    rollout = sample(pair.student, pair.prompts("train", 16), max_new_tokens=13, seed=2)
    batch = rollout.batch
    logp_r = rollout.logprobs[batch.response_mask.bool()]
    res = loss_backward(pair.student.model, pair.teacher.model, batch, teacher_hidden(pair.teacher.model, batch),
                        logp_r, loss="pg-rkl", tis_cap=2.0, chunk_tokens=1024)
    assert torch.equal(res.logp_student, logp_r)  # bit for bit: one code path for both policies
    assert torch.equal(tis_weights(res.logp_student, logp_r, 2.0), torch.ones_like(logp_r))
    rows = train(OPDConfig(**SHORT, tis_cap=2.0))
    assert _by(rows, "diverged") == {SHORT["steps"]: 0.0}  # marked once, at the last step
    for metric in ("mismatch_kl", "mismatch_k3", "mismatch_logp_abs_diff_mean", "mismatch_logp_abs_diff_max",
                   "mismatch_is_ratio_outside_frac", "mismatch_chi2_token"):
        assert set(_by(rows, metric).values()) == {0.0}, metric


@pytest.mark.slow
def test_stale_zero_reproduces_the_clean_run_bit_for_bit():
    clean = train(OPDConfig(**SHORT))
    stale0 = train(OPDConfig(**SHORT, rollout="stale:0"))
    assert strip(clean) == strip(stale0)
    assert strip(train(OPDConfig(**SHORT, rollout="reuse:1"))) == strip(clean)
    assert strip(train(OPDConfig(**SHORT, rollout="resample:0"))) == strip(clean)
    again = train(OPDConfig(**SHORT))
    assert strip(again) == strip(clean)  # same config and seed, same numbers


def test_the_aa_control_changes_only_the_rollout_samples():
    """`resample:1`: the same prompts and initial weights as clean, other samples of the same policy
    (so zero mismatch every step), the same step-0 evaluation, and another trajectory."""
    from mismatch.opd.trainer import sample_rollouts, setup

    clean_cfg, aa_cfg = OPDConfig(**SHORT), OPDConfig(**SHORT, rollout="resample:1")
    assert not aa_cfg.is_clean and aa_cfg.rollout_spec.source == "A/A" and aa_cfg.clean() == clean_cfg
    clean_run, aa_run = setup(clean_cfg), setup(aa_cfg)
    prompts = clean_run.rng.sample(clean_run.train_pool, 8)
    assert aa_run.rng.sample(aa_run.train_pool, 8) == prompts  # the same prompt stream
    a, _ = sample_rollouts(clean_run, prompts, 1)
    b, _ = sample_rollouts(aa_run, prompts, 1)
    assert not torch.equal(a.batch.input_ids, b.batch.input_ids)  # other samples
    clean, aa = train(clean_cfg), train(aa_cfg)
    for metric in ("mismatch_kl", "mismatch_logp_abs_diff_max"):
        assert set(_by(aa, metric).values()) == {0.0}, metric
    assert _by(aa, "heldout_rkl")[0] == _by(clean, "heldout_rkl")[0]  # the same initial student, same eval samples
    assert _by(aa, "loss")[SHORT["steps"]] != _by(clean, "loss")[SHORT["steps"]]


def test_stale_run_serves_old_weights_and_differs():
    rows = train(OPDConfig(**{**SHORT, "steps": 4}, rollout="stale:2"))
    # step s samples with the weights of optimizer step s − 1 − K (the initial ones until then)
    assert _by(rows, "served_version") == {1: 0, 2: 0, 3: 0, 4: 1}
    assert _by(rows, "mismatch_logp_abs_diff_max")[1] == 0.0  # step 1: still the same weights
    assert _by(rows, "mismatch_logp_abs_diff_max")[3] > 0.0


def test_reuse_trains_on_one_batch_for_r_steps():
    clean = train(OPDConfig(**{**SHORT, "steps": 4}))
    rows = train(OPDConfig(**{**SHORT, "steps": 4}, rollout="reuse:2"))
    assert _by(rows, "rollouts") == {1: 8, 2: 0, 3: 8, 4: 0} and _by(clean, "rollouts") == {s: 8 for s in range(1, 5)}
    assert _by(rows, "batch_age") == {1: 0, 2: 1, 3: 0, 4: 1}
    tokens = _by(rows, "tokens")
    assert tokens[1] == tokens[2] and tokens[3] == tokens[4]  # the same responses twice
    assert _by(rows, "loss")[1] == _by(clean, "loss")[1]  # step 1: the same batch and weights as clean
    diff = _by(rows, "mismatch_logp_abs_diff_max")
    assert diff[1] == diff[3] == 0.0 and diff[2] > 0 and diff[4] > 0  # fresh: on-policy; reused: one update old
    assert _by(rows, "rollout_s")[2] == 0.0 and _by(rows, "rollout_s")[3] > 0


def test_bad_input_is_a_clear_error(tmp_path):
    with pytest.raises(ValueError, match="staleness must be ≥ 0"):
        OPDConfig(pair="sort-gpt2", staleness=-1)
    with pytest.raises(ValueError, match="unknown loss 'kl'"):
        OPDConfig(pair="sort-gpt2", loss="kl")
    with pytest.raises(ValueError, match="unknown perturbation kind"):
        OPDConfig(pair="sort-gpt2", rollout="fp9")
    with pytest.raises(InputError, match="reuse needs ≥ 1"):
        OPDConfig(pair="sort-gpt2", rollout="reuse:0")
    res = runner.invoke(app, ["opd", "--pair", "sort-gpt2", "--staleness", "-1"])
    assert res.exit_code == 2 and res.output.startswith("error: staleness must be ≥ 0")
    res = runner.invoke(app, ["opd", "--pair", "sort-gpt2", "--loss", "kl"])
    assert res.exit_code == 2 and "unknown loss" in res.output and res.output.count("\n") == 1
    # a rollout copy that cannot be built on this model: the scope selects no layer of it
    res = runner.invoke(app, ["opd", "--pair", "sort-gpt2", "--rollout", "int4:group128", "--layers", "blocks.99",
                              "--steps", "1", "--out", str(tmp_path / "bad")])
    assert res.exit_code == 2 and "selects no linear module" in res.output
    assert res.output.strip().count("\n") == 0  # one line (after the progress bar's blank one)
    assert not list(tmp_path.glob("bad/*.parquet"))


def test_interrupted_run_keeps_its_rows(tmp_path, monkeypatch):
    from mismatch.opd import trainer as recipe

    calls = {"n": 0}
    real = recipe.loss_backward

    def failing(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 3:
            raise KeyboardInterrupt
        return real(*args, **kwargs)

    monkeypatch.setattr(recipe, "loss_backward", failing)
    out = tmp_path / "run"
    res = runner.invoke(app, ["opd", "--pair", "reverse-qwen3", "--steps", "5", "--batch-size", "4",
                              "--eval-prompts", "8", "--out", str(out)])
    assert res.exit_code != 0
    rows = read_results(out)
    assert sorted(rows["step"].unique()) == [0, 1, 2]  # the evaluation at 0 and two finished steps
    assert set(rows["pair"]) == {"reverse-qwen3"} and rows["git_sha"].notna().all()


@pytest.mark.slow
def test_clean_run_lowers_kl_and_raises_accuracy():
    """Measured (seed 0, 256 held-out prompts): reverse KL 2.433 → 1.794 nats (× 0.737) and exact
    match of the temperature-1 samples 25.0% → 36.7% (+11.7 points) after 40 steps of full-rkl at
    lr 1e-3 (cosine), 64 prompts per step; seeds 1 and 2 gave × 0.789 / × 0.721 and +8.6 / +8.2.
    Asserted with about half of seed 0's margins."""
    rows = train(OPDConfig(pair="sort-gpt2", loss="full-rkl", lr=1e-3, steps=40, batch_size=64,
                           eval_every=40, eval_prompts=256))
    kl, acc = _by(rows, "heldout_rkl"), _by(rows, "heldout_accuracy")
    assert set(kl) == set(acc) == {0, 40}
    assert kl[40] <= 0.87 * kl[0]
    assert acc[40] >= acc[0] + 0.06
    se = _by(rows, "heldout_accuracy_se")  # 0/1 rewards: the binomial standard error, by its formula
    assert all(se[s] == pytest.approx(math.sqrt(acc[s] * (1 - acc[s]) / 255), rel=1e-9) for s in (0, 40))
    assert all(r["value"] > 0 for r in rows if r["metric"] == "grad_norm")


def test_mean_se_is_the_standard_error_of_the_mean():
    from mismatch.opd.evaluate import mean_se

    values = [0.0, 1.0, 1.0, 0.25, 0.5]
    mean, se = mean_se(values)
    assert mean == pytest.approx(statistics.fmean(values))
    assert se == pytest.approx(statistics.stdev(values) / math.sqrt(len(values)), rel=1e-12)
    assert math.isnan(mean_se([1.0])[1])


def test_learning_rate_schedule():
    """Linear warm-up over 10 steps, then cosine from lr to 0.1·lr at the last step (by hand), and the
    optimizer really steps with it (the `lr` rows)."""
    import math

    cfg = OPDConfig(pair="sort-gpt2", steps=120, warmup_steps=10)
    assert lr_factor(cfg, 1) == pytest.approx(1 / 11) and lr_factor(cfg, 10) == pytest.approx(10 / 11)
    assert lr_factor(cfg, 65) == pytest.approx(0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * 55 / 110)))
    assert lr_factor(cfg, 120) == pytest.approx(0.1)
    assert all(lr_factor(cfg, s + 1) <= lr_factor(cfg, s) for s in range(11, 120))
    flat = dataclasses.replace(cfg, decay="constant")
    assert [lr_factor(flat, s) for s in (5, 11, 120)] == [pytest.approx(5 / 11), 1.0, 1.0]
    rows = train(OPDConfig(**{**SHORT, "steps": 4}, warmup_steps=1, lr=2e-3))
    expected = {s: 2e-3 * lr_factor(OPDConfig(**{**SHORT, "steps": 4}, warmup_steps=1), s) for s in range(1, 5)}
    assert _by(rows, "lr") == pytest.approx(expected)
    with pytest.raises(ValueError, match="decay must be"):
        OPDConfig(pair="sort-gpt2", decay="linear")


def test_saved_student_reloads_with_the_same_logits(tmp_path):
    """`train(save_to=DIR)` writes a Hugging Face directory: `mismatch.load` and `transformers` load the
    trained weights back (the same logits, bit for bit) with the same tokenizer."""
    from transformers import AutoModelForCausalLM

    pair = mismatch.load_pair("reverse-qwen3")
    before = {k: v.clone() for k, v in pair.student.model.state_dict().items()}
    train(OPDConfig(**{**SHORT, "steps": 2}), pair=pair, save_to=tmp_path / "student")
    assert any(not torch.equal(before[k], v) for k, v in pair.student.model.state_dict().items())  # it trained
    text = pair.prompts("held_out", 2)
    ids = torch.tensor([pair.student.tokenizer(t)["input_ids"] for t in text[:1]])
    with torch.no_grad():
        trained = pair.student.model(input_ids=ids).logits
        loaded = mismatch.load(str(tmp_path / "student"))
        hf = AutoModelForCausalLM.from_pretrained(tmp_path / "student").eval()
        assert torch.equal(loaded.model(input_ids=ids).logits, trained)
        assert torch.equal(hf(input_ids=ids).logits, trained)
    assert [loaded.tokenizer(t)["input_ids"] for t in text] == [pair.student.tokenizer(t)["input_ids"] for t in text]


def test_without_the_greedy_evaluation_every_other_number_is_the_same():
    """`eval_greedy=False` drops one metric and its generation; the run's RNG never sees it."""
    with_greedy = train(OPDConfig(**SHORT))
    without = train(OPDConfig(**SHORT, eval_greedy=False))
    assert {r["step"] for r in with_greedy if r["metric"] == "heldout_greedy_accuracy"} == {0, 3}
    assert not any(r["metric"] == "heldout_greedy_accuracy" for r in without)
    keep = [r for r in with_greedy if r["metric"] not in TIMING | {"heldout_greedy_accuracy"}]
    assert keep == strip(without)


def test_steps_log_the_framework_named_statistics_of_their_own_rollout_tokens():
    rows = train(OPDConfig(**{**SHORT, "steps": 2}, rollout="int4:group128"))
    kl, verl_kl = _by(rows, "mismatch_kl"), _by(rows, "rollout_corr/kl")
    assert verl_kl == kl and all(v != 0.0 for v in kl.values())  # the same k1 estimate, bit for bit
    assert all(v >= 1.0 for v in _by(rows, "train/token_mult_prob_error").values())
    assert set(_by(rows, "train/train_rollout_logprob_abs_diff")) == {1, 2}


@pytest.mark.parametrize("temperature,top_p", [(0.7, None), (1.0, 0.9), (0.7, 0.9)])
def test_a_clean_run_at_another_temperature_or_top_p_has_zero_mismatch(temperature, top_p):
    """The rollout's log-probs are those of the warped sampling distribution; the student's are
    scored under the same warp, so a clean run measures exactly no mismatch (scored at temperature 1
    they would differ by the warp itself)."""
    rows = train(OPDConfig(**{**SHORT, "steps": 2}, temperature=temperature, top_p=top_p))
    for metric in ("mismatch_kl", "mismatch_logp_abs_diff_max", "mismatch_chi2_token"):
        assert set(_by(rows, metric).values()) == {0.0}, metric


def test_the_heldout_kl_is_the_reverse_kl_on_the_students_samples():
    """`heldout_rkl` against a direct computation: the same samples (same seed), full logits of both
    models in float64, Σ_v π_S (log π_S − log π_T) per response token, averaged. The forward KL on
    the same tokens is far from it, so the test tells the two apart."""
    from mismatch.opd.evaluate import heldout_rkl
    from mismatch.model.positions import position_ids
    from mismatch.model.generate import generate

    pair = mismatch.load_pair("sort-gpt2")
    assert pair.student_context == pair.teacher_context  # the teacher scores the same batch
    prompts = pair.prompts("held_out", 12)
    kw = dict(chat=pair.chat, max_new_tokens=pair.max_new_tokens, seed=4)
    got, se, _ = heldout_rkl(pair.student, pair.teacher, prompts, student_context=pair.student_context,
                             teacher_context=pair.teacher_context, chunk_tokens=5, **kw)
    batch = generate(pair.student, prompts, temperature=1.0, context=pair.student_context, **kw)
    pos = position_ids(batch.attention_mask)
    with torch.no_grad():
        ls, lt = (torch.log_softmax(m.model(batch.input_ids, attention_mask=batch.attention_mask,
                                            position_ids=pos).logits.double(), -1) for m in (pair.student, pair.teacher))
    rows = [(b, t - 1) for b, t in batch.response_mask.nonzero().tolist()]
    rkl = sum(float((ls[b, t].exp() * (ls[b, t] - lt[b, t])).sum()) for b, t in rows) / len(rows)
    fkl = sum(float((lt[b, t].exp() * (lt[b, t] - ls[b, t])).sum()) for b, t in rows) / len(rows)
    # fp32 log-probs against float64: ~1e-6 nats per term, well inside rel 1e-5 of a ~1-nat mean
    assert got == pytest.approx(rkl, rel=1e-5)
    assert abs(fkl - rkl) > 0.01 * rkl
    # its standard error over prompts: the delete-one jackknife of the ratio estimator (another formula,
    # the same first-order error: (m−1)/m · Σ (R_(i) − R̄_(.))² ≈ the linearised variance, to O(1/m))
    sums = [sum(float((ls[b, t].exp() * (ls[b, t] - lt[b, t])).sum()) for b, t in rows if b == i) for i in range(len(prompts))]
    counts = [sum(1 for b, _ in rows if b == i) for i in range(len(prompts))]
    m = len(prompts)
    loo = [(sum(sums) - sums[i]) / (sum(counts) - counts[i]) for i in range(m)]
    jack = math.sqrt((m - 1) / m * sum((x - sum(loo) / m) ** 2 for x in loo))
    assert 0 < se and se == pytest.approx(jack, rel=0.25)  # O(1/m) apart at m = 12 prompts


def test_step_zero_is_evaluated_once_per_seed_and_read_back_bit_for_bit(tmp_path, monkeypatch):
    """Twins of one seed (another rollout, another lr) share step 0's evaluation through the cache; the
    rows are the same as without it, and a damaged entry is computed again."""
    from mismatch.opd import evaluate as evaluation, trainer

    calls = []
    real = evaluation.evaluate
    spy = lambda run: calls.append(run.config.rollout) or real(run)  # noqa: E731
    monkeypatch.setattr(evaluation, "evaluate", spy)  # step 0's, through `initial_evaluation`
    monkeypatch.setattr(trainer, "evaluate", spy)  # the later steps'

    cache = tmp_path / "cache"
    clean = train(OPDConfig(**SHORT), eval_cache=cache)
    noisy_cfg = OPDConfig(**SHORT, rollout="noise:0.1", lr=3e-3)
    noisy = train(noisy_cfg, eval_cache=cache)
    assert calls == ["none", "none", "noise:0.1"]  # step 0 once, then each run's final evaluation
    shared = lambda rows: [r for r in rows if r["step"] == 0 and not r["metric"].startswith("copy_")]  # noqa: E731
    assert shared(noisy) == shared(clean)  # the copy's own probe is the run's, not shared
    assert strip(noisy) == strip(train(noisy_cfg))  # without the cache: the same rows, bit for bit
    (entry,) = cache.glob("*.json")
    entry.write_text("{not json")
    assert strip(train(noisy_cfg, eval_cache=cache)) == strip(noisy)
    other_seed = train(OPDConfig(**{**SHORT, "seed": 1}), eval_cache=cache)
    assert len(list(cache.glob("*.json"))) == 2 and other_seed[0] != clean[0]


def test_every_evaluation_probes_the_rollout_copy_as_a_static_probe_would():
    """Step 0 of an int4 run: the copy's probe metrics are those of `mismatch.probe` of the same spec on
    the same held-out samples; a stale copy is the student at step 0 (exactly 0) and not after updates;
    a clean run (the copy is the student) and `eval_probe = 0` record none."""
    from mismatch.model.generate import generate as gen
    from mismatch.opd.evaluate import EVAL_SEED_OFFSET
    from mismatch.opd.trainer import setup
    from mismatch.perturb import perturbed

    cfg = OPDConfig(**{**SHORT, "eval_probe": 8}, rollout="int4:group128")
    rows = train(cfg)
    run = setup(cfg)
    pair = run.pair
    samples = gen(pair.student, run.eval_set[:8], max_new_tokens=run.max_new_tokens, temperature=1.0,
                  seed=cfg.seed + EVAL_SEED_OFFSET + 1, chat=pair.chat, context=pair.student_context)
    reference = mismatch.reference(pair.student.model, samples.input_ids, samples.attention_mask, samples.response_mask)
    with perturbed(pair.student.model, "int4:group128", seed=cfg.seed):
        want = mismatch.probe(reference, pair.student.model)
    assert _by(rows, "copy_kl_fwd_mean")[0] == pytest.approx(want.summary["kl_fwd_mean"], rel=1e-9)
    assert _by(rows, "copy_top1_agree")[0] == pytest.approx(want.summary["top1_agree"], rel=1e-9)
    assert _by(rows, "copy_rel_l2_final")[0] == pytest.approx(float(want.per_layer["rel_l2"].iloc[-1]), rel=1e-9)
    assert _by(rows, "copy_kl_fwd_mean")[0] > 0 and set(_by(rows, "copy_kl_fwd_mean")) == {0, SHORT["steps"]}
    stale = train(OPDConfig(**{**SHORT, "eval_probe": 8}, rollout="stale:1"))
    assert _by(stale, "copy_kl_fwd_mean")[0] == 0.0 and _by(stale, "copy_top1_agree")[0] == 1.0
    assert _by(stale, "copy_kl_fwd_mean")[SHORT["steps"]] > 0  # one update behind
    for quiet in (OPDConfig(**{**SHORT, "eval_probe": 8}), OPDConfig(**{**SHORT, "eval_probe": 0}, rollout="int4:group128")):
        assert not any(r["metric"].startswith("copy_") for r in train(quiet))
    assert "copy_heldout_rkl" not in {r["metric"] for r in stale}  # equal to the student at step 0: gap 0


def test_the_copys_heldout_kl_is_the_students_evaluation_run_on_the_perturbed_weights():
    """`copy_heldout_rkl` at step 0 (and only there) is `heldout_rkl` of the perturbed initial student,
    same prompts and seed; measuring it (and probing the copy) changes no other row of the run."""
    from mismatch.opd.evaluate import EVAL_SEED_OFFSET, heldout_rkl
    from mismatch.opd.trainer import setup
    from mismatch.perturb import perturbed

    cfg = OPDConfig(**{**SHORT, "eval_probe": 8}, rollout="noise:0.05")
    rows = train(cfg)
    run = setup(cfg)
    pair = run.pair
    with perturbed(pair.student.model, "noise:0.05", seed=cfg.seed):
        want, want_se, _ = heldout_rkl(pair.student, pair.teacher, run.eval_set, chat=pair.chat,
                                       student_context=pair.student_context, teacher_context=pair.teacher_context,
                                       max_new_tokens=run.max_new_tokens, seed=cfg.seed + EVAL_SEED_OFFSET,
                                       chunk_tokens=cfg.chunk_tokens)
    assert _by(rows, "copy_heldout_rkl") == {0: pytest.approx(want, rel=1e-9)}
    assert _by(rows, "copy_heldout_rkl_se") == {0: pytest.approx(want_se, rel=1e-9)}
    assert want != _by(rows, "heldout_rkl")[0]  # the copy's own samples and log-probs, not the student's
    quiet = train(dataclasses.replace(cfg, eval_probe=0))
    assert strip(quiet) == [r for r in strip(rows) if not r["metric"].startswith("copy_")]
