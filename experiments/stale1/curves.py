import json, sys, statistics as st
for tag in sys.argv[1:]:
    r = json.load(open(f"experiments/stale1/runs/{tag}.json"))
    acc = r["acc_curve"]; rkl = r["rkl_curve"]; sk = r["step_kl"]; mk = r["series"]["mismatch_kl"]
    def win(d, lo, hi): 
        v = [d[str(s)] for s in range(lo, hi + 1) if str(s) in d]; return st.mean(v)
    print(f"{tag:22s} acc " + " ".join(f"{acc[k]*100:5.1f}" for k in acc) + "  | rkl " + " ".join(f"{rkl[k]:.2f}" for k in rkl))
    print(f"{'':22s} step_kl by 20-step window " + " ".join(f"{win(sk, lo, lo+19):.4f}" for lo in range(1, 121, 20))
          + "  mismatch_kl " + " ".join(f"{win(mk, lo, lo+19):.4f}" for lo in range(1, 121, 20)))
