"""Probe runs as a library verb (`mismatch.probes.runs`): one reference against many candidates, each candidate
the same numbers a direct `mismatch.probe` gives, the isolation map block by block, the rows written as they are
scored, and a configuration refused in one line before any model loads."""

import pytest

import mismatch
from mismatch.errors import InputError
from mismatch.model.generate import teacher_forced
from mismatch.probes.runs import ProbeConfig, rows_of, run_probes
from mismatch.results import read_results, summaries

TEXTS = ("hello world, again", "the quick brown fox", "one two three")


def _direct(spec: str, layers: str) -> dict[str, float]:
    """The same candidate probed directly: the reference pass of the unperturbed model, then the model perturbed."""
    lm = mismatch.load("tiny-llama")
    batch = teacher_forced(lm, list(TEXTS))
    ref = mismatch.reference(lm, batch)
    with mismatch.perturbed(lm.model, spec, layers=layers) as cand:
        return mismatch.probe(ref, cand).summary


def test_each_candidate_is_what_a_direct_probe_gives_and_its_rows_are_written(tmp_path):
    specs = ("noise:0.02", "fp8-e4m3:channel")
    out = tmp_path / "probe.parquet"
    results = run_probes(ProbeConfig(reference="tiny-llama", perturb=specs, layers="mlp", texts=TEXTS), out=out)
    assert [(r.perturb, r.layers) for r in results] == [(s, "mlp") for s in specs]  # one reference, in spec order
    written = summaries(read_results(out)).set_index("perturb")
    for r in results:
        direct = _direct(r.perturb, "mlp")
        assert r.result.summary["kl_fwd_mean"] == direct["kl_fwd_mean"]  # the same computation, bit for bit
        assert r.result.summary["tokens"] == direct["tokens"]
        assert written.loc[r.perturb, "kl_fwd_mean"] == r.result.summary["kl_fwd_mean"]  # the rows are the result
    assert len(rows_of(results[0].result)) > 0


def test_the_isolation_map_perturbs_one_block_at_a_time():
    """`each_layer`: one candidate per decoder block, each the spec on that block alone (`layers="i"`)."""
    results = run_probes(ProbeConfig(reference="tiny-llama", perturb=("noise:0.05",), each_layer=True,
                                     per_layer=False, texts=TEXTS))
    blocks = len(mismatch.load("tiny-llama").model.model.layers)
    assert [r.layers for r in results] == [str(i) for i in range(blocks)]
    for r in results:
        assert r.result.summary["kl_fwd_mean"] == _direct("noise:0.05", r.layers)["kl_fwd_mean"]


def test_max_prompts_takes_the_first_prompts(tmp_path):
    prompts = tmp_path / "p.txt"
    prompts.write_text("\n".join(TEXTS) + "\n")
    one = run_probes(ProbeConfig(reference="tiny-llama", perturb=("noise:0.02",), prompts=str(prompts), max_prompts=1))
    alone = run_probes(ProbeConfig(reference="tiny-llama", perturb=("noise:0.02",), texts=TEXTS[:1]))
    assert one[0].result.summary["tokens"] == alone[0].result.summary["tokens"]
    assert one[0].result.summary["kl_fwd_mean"] == alone[0].result.summary["kl_fwd_mean"]


@pytest.mark.parametrize("fields, message", [
    (dict(texts=TEXTS, prompts="p.txt", perturb=("noise:0.1",)), "exactly one prompt source"),
    (dict(texts=TEXTS, candidate="tiny-qwen3", perturb=("noise:0.1",)), "give no candidate model"),
    (dict(texts=TEXTS), "a candidate model or at least one perturbation spec"),
    (dict(texts=TEXTS, candidate="tiny-qwen3", each_layer=True), "isolation map needs"),
    (dict(texts=TEXTS, perturb=("noise:0.1",), each_layer=True, layers="attn"), "does not combine"),
    (dict(texts=TEXTS, perturb=("fp9",)), "unknown"),
    (dict(texts=TEXTS, perturb=("noise:0.1",), max_prompts=0), "max_prompts must be"),
])
def test_a_bad_configuration_is_one_line_before_anything_loads(fields, message):
    with pytest.raises(InputError, match=message) as info:
        ProbeConfig(reference="tiny-llama", **fields)
    assert "\n" not in str(info.value)
