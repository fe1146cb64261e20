"""llama.cpp as a mismatch source: a GGUF file run by llama.cpp's own CPU kernels.

llama.cpp quantizes activations for its quantized dot products, accumulates in its own order and
keeps its KV cache in F16 by default: a real engine, not a simulation. `LlamaCpp` gives what the
probes and rollouts need from it:

* `sequence_logits(ids)`: its fp32 logits at every position of one sequence (teacher forcing, one
  evaluation from an empty cache), which the probes score with their own metric code;
* `sample(prompt_ids, ...)`: one response sampled by llama.cpp's own sampler at temperature 1 (no
  truncation), with the log-probability of each sampled token under the logits it was sampled from.

`open_engine(lm, config)` exports `lm` to GGUF (`mismatch.rollout.gguf_export`) with the spec's weight
type, or takes the file the model was loaded from (`gguf`, SmolLM2's own Q4_1 file), and opens it.
Needs the optional extra `llama-cpp-python` (`make engines`); without it, a one-line error.
"""

from __future__ import annotations

import hashlib
import os
from contextlib import redirect_stderr
from pathlib import Path

import numpy as np
import torch

from mismatch.rollout.gguf_export import write_gguf
from mismatch.errors import InputError, ModelNotAvailableError
from mismatch.files import cache_dir
from mismatch.model.loader import LM, context_length
from mismatch.model.smollm2 import smollm2_gguf_path
from mismatch.rollout.spec import LLAMA_CPP_MISSING
from mismatch.model.external import ExternalLM
from mismatch.model.generate import Samples, encode, with_responses

KV_TYPES = {"f16": 1, "f32": 0}  # GGML type ids of the KV cache


def llama_cpp_module():
    """The `llama_cpp` module, or a one-line error saying how to install it."""
    try:
        import llama_cpp
    except ImportError:
        raise ModelNotAvailableError(LLAMA_CPP_MISSING) from None
    return llama_cpp


class LlamaCpp(ExternalLM):
    """A GGUF model run by llama.cpp on the CPU (one sequence at a time).

    Args:
        path: the GGUF file.
        name: how results name it.
        n_ctx: context to allocate (tokens).
        kv: KV cache type, `f16` (llama.cpp's default) or `f32`.
        threads: CPU threads (default: torch's intra-op thread count).
    """

    def __init__(self, path: str | Path, *, name: str, n_ctx: int, kv: str = "f16", threads: int | None = None):
        llama_cpp = llama_cpp_module()
        if kv not in KV_TYPES:
            raise InputError(f"unknown KV cache type {kv!r}; one of {', '.join(KV_TYPES)}")
        n = threads or torch.get_num_threads()
        with open(os.devnull, "w") as devnull, redirect_stderr(devnull):  # llama.cpp's load log
            self.llm = llama_cpp.Llama(model_path=str(path), n_ctx=n_ctx, n_batch=min(n_ctx, 512), logits_all=True,
                                       n_threads=n, n_threads_batch=n, type_k=KV_TYPES[kv], type_v=KV_TYPES[kv],
                                       verbose=False)
        self.name, self.path, self.kv = name, Path(path), kv
        self.vocab_size = int(self.llm.n_vocab())
        self.context_length = int(n_ctx)

    def close(self) -> None:
        """Free llama.cpp's model and context."""
        self.llm.close()

    def sequence_logits(self, ids: list[int]) -> torch.Tensor:
        """`[len(ids), V]` fp32 logits at every position of `ids`, from an empty KV cache."""
        if len(ids) > self.context_length:
            raise InputError(f"sequence of {len(ids)} tokens is longer than {self.name}'s context of {self.context_length}")
        self.llm.reset()
        self.llm.eval(list(ids))
        return torch.from_numpy(np.array(self.llm.scores[:len(ids)], dtype=np.float32))

    def sample(self, prompt_ids: list[int], max_new_tokens: int, *, seed: int, eos_id: int | None
               ) -> tuple[list[int], list[float]]:
        """One response sampled by llama.cpp (temperature 1, no top-k/top-p/min-p, no penalties),
        ending at its first `eos_id` (kept) or after `max_new_tokens`; with each token's log-prob
        (nats, float64 log-softmax of the fp32 logits it was sampled from)."""
        if len(prompt_ids) + max_new_tokens > self.context_length:
            raise InputError(f"{len(prompt_ids)} prompt + {max_new_tokens} new tokens exceed {self.name}'s context "
                             f"of {self.context_length}")
        self.llm.reset()
        self.llm.set_seed(seed)
        out: list[int] = []
        for token in self.llm.generate(list(prompt_ids), top_k=0, top_p=1.0, min_p=0.0, typical_p=1.0, temp=1.0,
                                       repeat_penalty=1.0, reset=True):
            out.append(int(token))
            if len(out) == max_new_tokens or token == eos_id:
                break
        first = len(prompt_ids) - 1
        logits = torch.from_numpy(np.array(self.llm.scores[first:first + len(out)], dtype=np.float32))
        logp = logits.double().log_softmax(-1).gather(-1, torch.tensor(out)[:, None]).squeeze(-1)
        return out, logp.tolist()


def gguf_file(lm: LM, weights: str) -> Path:
    """The GGUF file of `lm` with `weights` (`gguf`: the file it was loaded from; else an export
    cached by the weights' content, so an unchanged model is exported once)."""
    if weights == "gguf":
        if lm.source != "smollm2-135m":
            raise InputError(f"{lm.name} was not loaded from a GGUF file; choose a weight type (f32, f16, q8_0, …)")
        return smollm2_gguf_path()  # its fp32 weights are this file's, de-quantized (as long as nobody trains them)
    digest = hashlib.sha256()
    for name, tensor in lm.model.state_dict().items():
        digest.update(name.encode())
        digest.update(tensor.detach().to(torch.float32).contiguous().numpy().tobytes())
    path = cache_dir() / "gguf" / f"{lm.name.replace('/', '_').replace(':', '_')}-{digest.hexdigest()[:16]}-{weights}.gguf"
    if not path.is_file():
        path.parent.mkdir(parents=True, exist_ok=True)
        write_gguf(lm, path, weights)
    return path


def open_engine(lm: LM, weights: str = "f32", kv: str = "f16", n_ctx: int | None = None, *,
                path: str | Path | None = None) -> LlamaCpp:
    """llama.cpp running `lm`'s current weights as `weights` (see `gguf_file`), named like the spec.
    With `path`, the export is written there instead of the cache (a rollout copy re-exported at
    every step overwrites one file)."""
    llama_cpp_module()
    if path is not None and weights != "gguf":
        write_gguf(lm, path, weights)
    else:
        path = gguf_file(lm, weights)
    ctx = n_ctx or min(context_length(lm.model) or 2048, 2048)
    return LlamaCpp(path, name=f"{lm.name} in llama.cpp ({weights}, kv {kv})", n_ctx=ctx, kv=kv)


def engine_rollout(engine: LlamaCpp, tokenizer, prompts: list[str], *, max_new_tokens: int, seed: int,
                   chat: bool = False, context: tuple[tuple[str, str], ...] = ()) -> Samples:
    """One response per prompt sampled by llama.cpp, as `Samples` laid out like `mismatch.model.generate.sample`'s
    (prompts left-padded, responses right-padded, up to and including the first EOS) with llama.cpp's
    own log-prob of each response token. Prompt `i` is sampled with seed `seed + i` (mod 2³²)."""
    encoded = encode(tokenizer, prompts, chat=chat, context=context)  # unpadded, as the model reads them
    samples = [engine.sample(ids, max_new_tokens, seed=(seed + i) % 2**32, eos_id=tokenizer.eos_token_id)
               for i, ids in enumerate(encoded)]
    batch = with_responses(tokenizer, prompts, [tokens for tokens, _ in samples], chat=chat, context=context)
    width = max(len(tokens) for tokens, _ in samples)
    start = batch.input_ids.shape[1] - width  # where the responses begin
    logp = torch.zeros(batch.input_ids.shape, dtype=torch.float32)
    for row, (tokens, lps) in enumerate(samples):
        logp[row, start:start + len(tokens)] = torch.tensor(lps, dtype=torch.float32)
    return Samples(batch, logp)
