"""One instrumented OPD run on sort-gpt2 (study settings unless overridden).

Records per step: the library's metrics plus `step_kl` = full-vocabulary KL(π_before ‖ π_after)
of the student's update, averaged over the step's rollout prefixes. Optional: AdamW β1, rollout
sampling-seed offset (a clean run with other samples: the trajectory-noise control), gradient
diagnostics every `--diag-every` steps (fresh vs 1-step-stale batches, see `diag`).
Writes experiments/stale1/runs/<tag>.json.
"""
import argparse, copy, dataclasses, json, os, time
import torch
torch.set_num_threads(1)
from mismatch.model.generate import response_hidden
from mismatch.opd import trainer as recipe
from mismatch.opd.config import OPDConfig, lr_factor
from mismatch.model.head import Head, logprob_chunks
from mismatch.model.loader import LM

p = argparse.ArgumentParser()
p.add_argument("--tag", required=True)
p.add_argument("--rollout", default="none")
p.add_argument("--loss", default="full-rkl")
p.add_argument("--seed", type=int, default=0)
p.add_argument("--lr", type=float, default=1e-3)
p.add_argument("--warmup", type=int, default=10)
p.add_argument("--decay", default="cosine")
p.add_argument("--steps", type=int, default=120)
p.add_argument("--batch", type=int, default=128)
p.add_argument("--eval-prompts", type=int, default=1024)
p.add_argument("--eval-every", type=int, default=20)
p.add_argument("--beta1", type=float, default=None)
p.add_argument("--sample-offset", type=int, default=0)
p.add_argument("--diag-every", type=int, default=0)
p.add_argument("--diag-batch", type=int, default=512)
p.add_argument("--synthetic", default=None, choices=[None, "lag", "lead", "rand", "lag2x"])  # rollout copy built here from w_{s-1}, w_{s-2}
a = p.parse_args()

cfg = OPDConfig(pair="sort-gpt2", rollout=a.rollout, loss=a.loss, seed=a.seed, lr=a.lr, warmup_steps=a.warmup,
                decay=a.decay, steps=a.steps, batch_size=a.batch, eval_prompts=a.eval_prompts,
                eval_every=a.eval_every)
extra = {"step_kl": {}, "diag": [], "upd_cos": {}, "upd_norm": {}}

def full_logp(model, batch):
    with torch.no_grad():
        h = response_hidden(model, batch)
        return torch.cat([lp for _, lp in logprob_chunks(Head.of(model), h, 4096)])

orig_setup, orig_update, orig_sample = recipe.setup, recipe.update, recipe.sample_rollouts
state = {}

def setup(config, pair=None):
    run = orig_setup(config, pair)
    if a.beta1 is not None:
        run.optimizer = torch.optim.AdamW(run.student.model.parameters(), lr=config.lr,
                                          weight_decay=config.weight_decay, betas=(a.beta1, 0.999))
        run.scheduler = torch.optim.lr_scheduler.LambdaLR(run.optimizer, lambda s: lr_factor(config, s + 1))
    state["prev"] = copy.deepcopy(run.student.model).requires_grad_(False)  # weights one step older
    state["step"] = 0
    import random
    state["diag_rng"] = random.Random(12345 + config.seed)
    return run

def grads(run, batch, t_batch):
    model = run.student.model
    hT = recipe.teacher_hidden(run.pair.teacher.model, t_batch)
    model.zero_grad(set_to_none=True)
    n = batch.response_tokens
    res = recipe.loss_backward(model, run.pair.teacher.model, batch, hT, torch.zeros(n), loss=cfg.loss,
                               tis_cap=None, chunk_tokens=cfg.chunk_tokens)
    g = torch.cat([q.grad.flatten() for q in model.parameters() if q.grad is not None]).clone()
    model.zero_grad(set_to_none=True)
    return res.loss, g

def cos(x, y):
    return float(x @ y / (x.norm() * y.norm()))

def diag(run, step):
    """At weights w_{s-1}: batches F1 (student, seed A), F2 (student, seed B), S (w_{s-2}, seed A),
    S2 (w_{s-2}, seed B); each batch = diag_batch train prompts. Loss of the current student and its
    full-rkl gradient on each."""
    pair = run.pair
    prompts = state["diag_rng"].sample(run.train_pool, a.diag_batch)
    out = {"step": step}
    gs = {}
    for name, model, seed in (("F1", run.student.model, 1), ("F2", run.student.model, 2),
                              ("S1", state["prev"], 1), ("S2", state["prev"], 2)):
        lm = LM(model, pair.student.tokenizer, name)
        ro = recipe.sample(lm, prompts, max_new_tokens=run.max_new_tokens, seed=10_000_000 + 1000 * step + seed,
                           chat=pair.chat, context=pair.student_context)
        rw = recipe.batch_rewards(ro.batch, pair.student.tokenizer, pair.task, prompts)
        loss, g = grads(run, ro.batch, ro.batch)
        gs[name] = g
        out[f"loss_{name}"] = loss
        out[f"acc_{name}"] = sum(rw) / len(rw)
        out[f"len_{name}"] = ro.batch.response_tokens / len(prompts)
    out["cos_F1F2"] = cos(gs["F1"], gs["F2"])
    out["cos_S1S2"] = cos(gs["S1"], gs["S2"])
    out["cos_F2S1"] = cos(gs["F2"], gs["S1"])
    out["cos_F1S2"] = cos(gs["F1"], gs["S2"])
    out["cos_F1S1_sameseed"] = cos(gs["F1"], gs["S1"])
    gF, gS = (gs["F1"] + gs["F2"]) / 2, (gs["S1"] + gs["S2"]) / 2
    out["cos_Fmean_Smean"] = cos(gF, gS)
    out["norm_F"], out["norm_S"] = float(gF.norm()), float(gS.norm())
    # expected-gradient difference relative to sampling noise: |gF-gS| vs |F1-F2|/sqrt(2)... (same scale)
    out["diffFS_over_noise"] = float((gF - gS).norm() / ((gs["F1"] - gs["F2"]).norm() / 1.0))
    extra["diag"].append(out)
    print("diag", json.dumps({k: round(v, 4) if isinstance(v, float) else v for k, v in out.items()}), flush=True)

def synthetic_copy(run, step):
    """lag: w_{s-2} (= stale:1); lead: 2 w_{s-1} - w_{s-2}; rand: w_{s-1} + a random direction with
    the same per-tensor norm as w_{s-1} - w_{s-2}; lag2x: w_{s-1} - 2 (w_{s-1} - w_{s-2})."""
    if "syn" not in state:
        state["syn"] = copy.deepcopy(run.student.model).requires_grad_(False)
        state["gen"] = torch.Generator().manual_seed(777 + a.seed)
    cur = run.student.model.state_dict()
    prev = state["prev"].state_dict()
    new = {}
    for k, w in cur.items():
        d = w - prev[k]
        if a.synthetic == "lag":
            new[k] = prev[k].clone()
        elif a.synthetic == "lead":
            new[k] = w + d
        elif a.synthetic == "lag2x":
            new[k] = w - 2 * d
        else:
            r = torch.randn(w.shape, generator=state["gen"])
            new[k] = w + r * (d.norm() / r.norm())
    # keep the tie: lm_head.weight and wte share storage; load both keys with the same values
    new["lm_head.weight"] = new["transformer.wte.weight"]
    state["syn"].load_state_dict(new)
    return state["syn"]

def sample_rollouts(run, prompts, step):
    if a.diag_every and (step % a.diag_every == 0 or step == 2):
        diag(run, step)
    if a.synthetic:
        keep = run.rollout_copy.model
        run.rollout_copy.model = synthetic_copy(run, step)
        try:
            return orig_sample(run, prompts, step + a.sample_offset * 100_000)
        finally:
            run.rollout_copy.model = keep
    return orig_sample(run, prompts, step + a.sample_offset * 100_000)

def update(run, rollout, hidden_T):
    model = run.student.model
    state["prev"].load_state_dict(model.state_dict())
    before = full_logp(model, rollout.batch)
    out = orig_update(run, rollout, hidden_T)
    after = full_logp(model, rollout.batch)
    state["step"] += 1
    kl = float((before.exp() * (before - after)).sum(-1).mean())
    w_prev = torch.cat([v.flatten() for k, v in state["prev"].state_dict().items() if k != "lm_head.weight"])
    w_now = torch.cat([v.detach().flatten() for k, v in model.state_dict().items() if k != "lm_head.weight"])
    d = w_now - w_prev
    if "last_d" in state:
        extra["upd_cos"][state["step"]] = float(d @ state["last_d"] / (d.norm() * state["last_d"].norm() + 1e-30))
    extra["upd_norm"][state["step"]] = float(d.norm())
    state["last_d"] = d
    extra["step_kl"][state["step"]] = kl
    return out

recipe.setup, recipe.update, recipe.sample_rollouts = setup, update, sample_rollouts
t0 = time.time()
rows = recipe.train(cfg)
wall = time.time() - t0
series = {}
for r in rows:
    series.setdefault(r["metric"], {})[r["step"]] = r["value"]
final = {m: series[m][cfg.steps] for m in ("heldout_accuracy", "heldout_rkl", "heldout_greedy_accuracy")}
mk = list(series["mismatch_kl"].values())
res = {"args": vars(a), "config": dataclasses.asdict(cfg), "final": final, "wall_s": wall,
       "mismatch_kl_mean": sum(mk) / len(mk),
       "acc_curve": series["heldout_accuracy"], "rkl_curve": series["heldout_rkl"],
       "series": {m: series[m] for m in ("loss", "lr", "grad_norm", "mismatch_kl", "tokens")},
       **extra}
os.makedirs("experiments/stale1/runs", exist_ok=True)
json.dump(res, open(f"experiments/stale1/runs/{a.tag}.json", "w"))
print(f"RESULT {a.tag} acc={final['heldout_accuracy']:.4f} rkl={final['heldout_rkl']:.4f} "
      f"greedy={final['heldout_greedy_accuracy']:.4f} mkl={res['mismatch_kl_mean']:.4f} wall={wall:.0f}s")
print("acc curve", {k: round(v, 3) for k, v in series["heldout_accuracy"].items()})
