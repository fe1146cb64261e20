"""Summary table of experiments/stale1/runs/*.json: final held-out sampled accuracy, rKL, mean mismatch_kl,
mean step_kl (steps 1-40), Δ vs the matched clean run (same seed, lr, β1, warm-up)."""
import json, glob, os, statistics as st
runs = {os.path.basename(f)[:-5]: json.load(open(f)) for f in sorted(glob.glob("experiments/stale1/runs/*.json"))}
def key(r):
    a = r["args"]; return (a["seed"], a["lr"], a.get("beta1"), a["warmup"], a["steps"], a["eval_prompts"], a["batch"])
clean = {}
for t, r in runs.items():
    a = r["args"]
    if a["rollout"] == "none" and not a.get("synthetic") and a["sample_offset"] == 0:
        clean[key(r)] = (t, r)
print("| run | rollout | seed | lr | β1 | warm-up | final acc % | final rKL | mean mismatch_kl | mean step_kl 1–40 | clean twin | Δ acc (pts) | rKL ratio |")
print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
for t, r in runs.items():
    a = r["args"]
    if a["steps"] != 120: continue
    ro = a.get("synthetic") or a["rollout"]
    if a["sample_offset"]: ro = f"clean, sampling offset {a['sample_offset']}"
    c = clean.get(key(r))
    acc, rkl = 100 * r["final"]["heldout_accuracy"], r["final"]["heldout_rkl"]
    sk = st.mean(r["step_kl"][str(s)] for s in range(1, 41))
    d = f"{acc - 100 * c[1]['final']['heldout_accuracy']:+.1f}" if c and c[0] != t else ""
    q = f"{rkl / c[1]['final']['heldout_rkl']:.3f}" if c and c[0] != t else ""
    print(f"| {t} | {ro} | {a['seed']} | {a['lr']:g} | {a.get('beta1') if a.get('beta1') is not None else 0.9} | {a['warmup']} | {acc:.1f} | {rkl:.3f} | {r['mismatch_kl_mean']:.4f} | {sk:.4f} | {c[0] if c else ''} | {d} | {q} |")
