"""Student–teacher pairs: what each pair is (`catalog`, no torch), loading them (`load`), their tasks
(`tasks`), the offline builder of the synthetic ones (`build`), held-out accuracy (`evaluate`). Names load
on first use."""

from mismatch.lazy import lazy

__getattr__, __dir__ = lazy(globals(), {
    "PAIRS": "mismatch.pairs.catalog", "SYNTHETIC_RECIPES": "mismatch.pairs.catalog",
    "PairSpec": "mismatch.pairs.catalog", "list_pairs": "mismatch.pairs.catalog",
    "synthetic_recipe": "mismatch.pairs.catalog",
    "Pair": "mismatch.pairs.load", "load_pair": "mismatch.pairs.load", "describe_pairs": "mismatch.pairs.load",
    "BuildReport": "mismatch.pairs.build", "build_and_compare": "mismatch.pairs.build",
    "build_targets": "mismatch.pairs.build",
})
__all__ = ["PAIRS", "SYNTHETIC_RECIPES", "BuildReport", "Pair", "PairSpec", "build_and_compare", "build_targets",
           "describe_pairs", "list_pairs", "load_pair", "synthetic_recipe"]
