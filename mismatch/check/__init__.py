"""The admission check: is a cheaper rollout configuration safe for a model, and if not, which
layers must stay in high precision (recipes, exported to vLLM / llm-compressor), at what cost."""
