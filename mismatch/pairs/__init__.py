"""Student–teacher pairs: registry and loading (`registry`), tasks (`tasks`), offline builder
(`build`), held-out accuracy (`evaluate`)."""

from mismatch.pairs.registry import PAIRS, Pair, PairSpec, list_pairs, load_pair

__all__ = ["PAIRS", "Pair", "PairSpec", "list_pairs", "load_pair"]
