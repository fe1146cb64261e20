"""Student–teacher pairs: registry and loading (`registry`), tasks (`tasks`), offline builder
(`build`), held-out accuracy (`evaluate`)."""

from mismatch.pairs.registry import (
    PAIRS,
    SYNTHETIC_RECIPES,
    BuildReport,
    Pair,
    PairSpec,
    build_and_compare,
    build_targets,
    describe_pairs,
    list_pairs,
    load_pair,
    synthetic_recipe,
)

__all__ = ["PAIRS", "SYNTHETIC_RECIPES", "BuildReport", "Pair", "PairSpec", "build_and_compare", "build_targets",
           "describe_pairs",
           "list_pairs", "load_pair", "synthetic_recipe"]
