"""Defaults several layers share, written once where reading them needs no torch (a config, a report
and the kernels that use them import these)."""

DEFAULT_CLIP = 2.0  # is_ratio_outside_frac counts importance ratios outside [1/clip, clip] (verdicts, gates, probes)
DEFAULT_CHUNK_TOKENS = 1024  # rows per head matmul: the head weights are streamed once per chunk
