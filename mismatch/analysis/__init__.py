"""Across runs and seeds, without torch: each OPD run against its clean twin (`twins`), the levels' verdicts
under the sequential design (`tolerance`, `sequential`), the noise floor, and the tolerated mismatch per
response length (`length`). It reads result rows (`mismatch.results`) and nothing that builds a model."""
