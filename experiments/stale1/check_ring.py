"""Defect checks: (a) the rollout copy at sampling time of step s holds bit-exactly the student's
weights after s-1-K updates; tie intact, buffers equal, eval mode, generation config equal.
(b) stale:0 with share=False reproduces clean bit for bit (rows)."""
import dataclasses, torch
torch.set_num_threads(1)
import mismatch
from mismatch.opd import trainer as recipe
from mismatch.opd.config import OPDConfig
from mismatch.rollout.copy import RolloutCopy

STEPS = 8
base = OPDConfig(pair="sort-gpt2", steps=STEPS, batch_size=32, eval_prompts=64, eval_every=4)

def run_checked(cfg, share=None):
    pair = mismatch.load_pair("sort-gpt2")
    hist = {}  # version -> student state after `version` updates
    problems = []
    orig_sample = recipe.sample_rollouts
    orig_setup_copy = recipe.RolloutCopy
    if share is not None:
        class RC(RolloutCopy):
            def __init__(self, *a, **k):
                k["share"] = share
                super().__init__(*a, **k)
        recipe.RolloutCopy = RC
    def sample_rollouts(run, prompts, step):
        st = run.student.model
        if step == 1:
            hist[0] = {k: v.detach().clone() for k, v in st.state_dict().items()}
        hist[step - 1] = {k: v.detach().clone() for k, v in st.state_dict().items()}
        m = run.rollout_copy.model
        K = cfg.rollout_staleness
        want = hist[max(0, step - 1 - K)]
        sd = m.state_dict()
        bad = [k for k in want if not torch.equal(sd[k], want[k])]
        extra = set(sd) ^ set(want)
        tied_copy = m.lm_head.weight.data_ptr() == m.transformer.wte.weight.data_ptr()
        tied_st = st.lm_head.weight.data_ptr() == st.transformer.wte.weight.data_ptr()
        bufs_ok = all(torch.equal(a, b) for (na, a), (nb, b) in zip(m.named_buffers(), st.named_buffers()))
        nbuf = len(list(m.named_buffers()))
        mode = (m.training, st.training)
        gc = m.generation_config.to_dict() == st.generation_config.to_dict()
        cf = m.config.to_dict() == st.config.to_dict()
        served = run.rollout_copy.served_version
        print(f"step {step}: served_version={served} want={max(0, step-1-K)} mismatched_keys={bad} extra={extra} "
              f"tied copy/student={tied_copy}/{tied_st} buffers_equal={bufs_ok}(n={nbuf}) training={mode} "
              f"genconf_equal={gc} config_equal={cf} is_student={m is st}", flush=True)
        if bad or extra or not bufs_ok or served != max(0, step - 1 - K) or tied_copy != tied_st or not gc:
            problems.append(step)
        return orig_sample(run, prompts, step)
    recipe.sample_rollouts = sample_rollouts
    try:
        rows = recipe.train(cfg, pair=pair)
    finally:
        recipe.sample_rollouts = orig_sample
        recipe.RolloutCopy = orig_setup_copy
    return rows, problems

def key(rows):
    return [(r["step"], r["metric"], r["value"]) for r in rows if not r["metric"].endswith("_s") and r["metric"] not in ("tokens_per_s", "served_version")]

for K in (1, 2):
    print(f"== stale:{K}")
    _, p = run_checked(dataclasses.replace(base, rollout=f"stale:{K}"))
    print("problems:", p)
print("== clean (share)")
clean, _ = run_checked(base)
print("== stale:0 share=False")
s0, p = run_checked(base, share=False)
print("problems:", p)
a, b = key(clean), key(s0)
diff = [(x, y) for x, y in zip(a, b) if x != y]
print("stale:0 share=False vs clean: rows", len(a), len(b), "differing:", len(diff), diff[:5])
print("mismatch_kl stale0:", [r["value"] for r in s0 if r["metric"] == "mismatch_kl"])
