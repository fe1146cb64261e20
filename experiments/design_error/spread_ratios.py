"""How much more variable the study's levels are than their A/A levels: each level's own sd (recovered from the
pooled one where it was pooled) over its A/A level's, per statistic and pair, from reports/tolerance_levels.csv.

    .venv/bin/python experiments/design_error/spread_ratios.py
"""

import numpy as np
import pandas as pd

levels = pd.read_csv("reports/tolerance_levels.csv")
aa = levels[levels["source"] == "A/A"].set_index(["pair", "settings"])
out = []
for _, r in levels[levels["source"] != "A/A"].iterrows():
    if (r["pair"], r["settings"]) not in aa.index:
        continue
    a = aa.loc[(r["pair"], r["settings"])]
    for stat in ("kl_ratio", "acc_delta"):
        if not (np.isfinite(r[f"{stat}_sd"]) and np.isfinite(a[f"{stat}_sd"])) or r["seeds"] < 2:
            continue
        ref, ref_df, own_df = a[f"{stat}_sd"], a[f"{stat}_df"], r["seeds"] - 1
        if str(r[f"{stat}_basis"]).startswith("pooled"):  # pooled² · (df + ref_df) = own² · df + ref² · ref_df
            own = np.sqrt(max((r[f"{stat}_sd"] ** 2 * r[f"{stat}_df"] - ref_df * ref ** 2) / own_df, 0.0))
        else:
            own = r[f"{stat}_sd"]
        out.append({"pair": r["pair"], "statistic": stat, "ratio": own / ref})
frame = pd.DataFrame(out)
print(frame.groupby(["statistic", "pair"])["ratio"].agg(["median", "count"]).round(2).to_string())
