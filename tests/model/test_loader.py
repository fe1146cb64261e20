"""Offline model loading: built-ins, tiny deterministic models, local dirs, hub cache, SmolLM2."""


import pytest
import torch

import mismatch
from mismatch.errors import InputError, ModelNotAvailableError
from tests.conftest import FAMILIES, MOE_FAMILIES


def test_list_models_names_the_builtins():
    assert set(mismatch.list_models()) == {"smollm2-135m", *FAMILIES, *MOE_FAMILIES}


@pytest.mark.parametrize("spec,cls", [("tiny-llama", "LlamaForCausalLM"), ("tiny-qwen3", "Qwen3ForCausalLM"),
                                      ("tiny-gpt2", "GPT2LMHeadModel"), ("tiny-qwen3-moe", "Qwen3MoeForCausalLM"),
                                      ("tiny-mixtral", "MixtralForCausalLM")])
def test_tiny_models_are_real_and_deterministic_per_seed(spec, cls):
    a, b, c = mismatch.load(spec, seed=0), mismatch.load(spec, seed=0), mismatch.load(spec, seed=1)
    assert type(a.model).__name__ == cls and not a.model.training
    sa, sb, sc = a.model.state_dict(), b.model.state_dict(), c.model.state_dict()
    assert all(torch.equal(sa[k], sb[k]) for k in sa)
    assert any(not torch.equal(sa[k], sc[k]) for k in sa)
    assert a.model.get_output_embeddings().out_features == len(a.tokenizer) == 259


def test_tiny_model_init_leaves_global_rng_alone():
    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    mismatch.load("tiny-qwen3", seed=7)
    assert torch.equal(torch.rand(3), expected)


def test_dtype_option():
    lm = mismatch.load("tiny-llama", dtype="bf16")
    assert all(p.dtype == torch.bfloat16 for p in lm.model.parameters())
    with pytest.raises(InputError, match="unknown dtype"):
        mismatch.load("tiny-llama", dtype="fp7")


def test_local_directory_round_trip(tmp_path):
    lm = mismatch.load("tiny-gpt2", seed=3)
    lm.model.save_pretrained(tmp_path)
    lm.tokenizer.save_pretrained(tmp_path)
    again = mismatch.load(str(tmp_path))
    sa, sb = lm.model.state_dict(), again.model.state_dict()
    assert sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)
    assert again.tokenizer.decode(again.tokenizer("abc ü")["input_ids"]) == "abc ü"


def test_directory_without_checkpoint_is_a_clear_error(tmp_path):
    with pytest.raises(ModelNotAvailableError, match="no config.json"):
        mismatch.load(str(tmp_path))


def test_hub_id_missing_from_local_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HOME", str(tmp_path))
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    with pytest.raises(ModelNotAvailableError, match="Qwen/Qwen3-0.6B.*local Hugging Face cache"):
        mismatch.load("Qwen/Qwen3-0.6B")


def test_unknown_spec():
    with pytest.raises(ModelNotAvailableError, match="unknown model 'not-a-model'.*tiny-llama"):
        mismatch.load("not-a-model")


def test_vocab_fingerprint_is_remembered_until_the_vocabulary_grows():
    import hashlib
    import json

    from mismatch.model.tokenizer import byte_tokenizer, vocab_fingerprint

    tok = byte_tokenizer()
    direct = lambda t: hashlib.sha256(json.dumps(sorted(t.get_vocab().items(), key=lambda kv: kv[1]),  # noqa: E731
                                                  ensure_ascii=False).encode()).hexdigest()
    first = vocab_fingerprint(tok)
    assert first == direct(tok) == vocab_fingerprint(tok) == vocab_fingerprint(byte_tokenizer())
    tok.add_tokens(["<extra>"])
    assert vocab_fingerprint(tok) == direct(tok) != first


def test_the_public_loader_takes_what_the_cli_takes():
    """`mismatch.load("PAIR:student")` works as the CLI's specs do (one loader for both)."""
    lm = mismatch.load("sort-gpt2:student")
    pair = mismatch.load_pair("sort-gpt2")
    assert lm.name == "sort-gpt2:student"
    assert all(torch.equal(a, b) for a, b in zip(lm.model.state_dict().values(), pair.student.model.state_dict().values()))
    assert mismatch.load("tiny-llama").name == "tiny-llama"


def test_loading_and_saving_print_no_progress_bars_and_leave_the_callers_settings(tmp_path, capfd):
    """transformers' "Loading weights" / "Writing model shards" bars stay off inside the library, and the
    caller's own progress-bar setting is as it was afterwards."""
    from transformers.utils import logging as hf_logging

    from mismatch.opd.trainer import save_student

    hf_logging.enable_progress_bar()
    lm = mismatch.load("sort-gpt2:student")
    save_student(lm, tmp_path / "s")
    mismatch.load(str(tmp_path / "s"))
    err = capfd.readouterr().err
    assert "Loading weights" not in err and "Writing" not in err and "%|" not in err, err[:200]
    assert hf_logging.is_progress_bar_enabled()


@pytest.mark.parametrize("call, message", [
    (lambda: __import__("mismatch").load(123), "a model spec must be str or PathLike, got int '123'"),
    (lambda: __import__("mismatch").load_pair(5), "a pair name must be str or PathLike, got int '5'"),
    (lambda: __import__("mismatch").check("tiny-llama", rollout=123), "rollout must be str or None, got int '123'"),
    (lambda: __import__("mismatch").check(123, rollout="int8:channel"),
     "model must be str or PathLike or LM, got int '123'"),
])
def test_a_wrong_argument_type_is_an_input_error_not_an_attribute_error(call, message):
    """The API's answer to `load(123)` was `AttributeError: 'int' object has no attribute 'rpartition'`."""
    with pytest.raises(InputError) as info:
        call()
    assert str(info.value) == message


def test_a_truncated_weights_file_is_one_line_not_a_safetensors_traceback(tmp_path):
    """A checkpoint copied short (or written onto a full disk): safetensors raised its own SafetensorError, which
    the CLI printed as a traceback with exit 1 — `check`'s "reject"."""
    import mismatch

    lm = mismatch.load("tiny-llama")
    lm.model.save_pretrained(tmp_path)
    lm.tokenizer.save_pretrained(tmp_path)
    weights = tmp_path / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    with pytest.raises(ModelNotAvailableError, match=r"a weights file is truncated or corrupt \(safetensors: "):
        mismatch.load(str(tmp_path))
    from typer.testing import CliRunner
    from mismatch.cli.app import app

    res = CliRunner().invoke(app, ["check", str(tmp_path), "--rollout", "int8:channel"])
    last = res.stderr.strip().splitlines()[-1]  # after the check's stage lines
    assert res.exit_code == 2 and last.startswith("error: cannot load the model in") and "truncated" in last
    assert "Traceback" not in res.stderr
