"""The model side: loading (`loader`), tokenizer, positions, where modules live (`layout`), the head and
every log-prob (`head`), generation (`generate`), packed decoding (`packed_linear`) and MoE blocks (`moe`).

Import the modules themselves (`from mismatch.model.loader import LM`): this package imports nothing.
"""
