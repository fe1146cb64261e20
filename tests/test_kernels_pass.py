"""CI's scalar-kernel pass (`ATEN_CPU_CAPABILITY=default make test`) on CPUs with AMX: torch 2.13's CPU flash
attention refuses bf16 there (`tests/conftest.py`, `flash_attention_refuses`), so the pass runs half-precision
attention on the math kernel (fp32 attention stays on torch's choice, as in the subprocesses tests compare with). Both halves are pinned where they apply: the refusal is real (not a workaround for nothing), and
the math kernel gives the attention a bf16 computation should."""

import math
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F

from tests.conftest import cpu_flags, flash_attention_refuses

REFUSES = flash_attention_refuses(torch.backends.cpu.get_cpu_capability(), cpu_flags())
PROBE = """
import torch, torch.nn.functional as F
q = torch.randn(1, 4, {T}, 64, generator=torch.Generator().manual_seed(0)).bfloat16()
try:
    F.scaled_dot_product_attention(q, q, q, is_causal=True)
    print("ran")
except RuntimeError as exc:
    print("refused:", str(exc).splitlines()[0])
"""


def test_the_condition_is_amx_with_torch_forced_below_avx512():
    amx = frozenset({"avx512f", "amx_tile", "amx_bf16"})
    assert flash_attention_refuses("DEFAULT", amx) and flash_attention_refuses("AVX2", amx)
    assert not flash_attention_refuses("AVX512", amx)  # torch's own choice on such a CPU: flash works
    assert not flash_attention_refuses("DEFAULT", frozenset({"avx512f", "avx2"}))  # no AMX: no packing


@pytest.mark.skipif(not REFUSES, reason="not a forced-capability run on an AMX CPU: flash attention works here")
def test_on_this_cpu_flash_attention_refuses_bf16_from_64_tokens_without_the_switch():
    """In a fresh interpreter (without the session's routing) at this run's forced capability: 20 tokens run,
    64 are refused with torch's pack_vnni2 error. Should a later torch accept them, this fails, and the
    switch can go."""
    outcome = {T: subprocess.run([sys.executable, "-c", PROBE.format(T=T)], capture_output=True, text=True,
                                 timeout=120).stdout.strip() for T in (20, 64)}
    assert outcome[20] == "ran"
    assert outcome[64] == "refused: pack_vnni2 is only supported when avx512 is supported"


def test_attention_in_this_session_gives_bf16_accuracy_at_64_tokens(_attention_on_math_kernel):
    """bf16 causal attention of 64 tokens (head dim 64) runs in this session, switch or not, and lies within
    bf16's rounding of an fp64 reference on the same (bf16) inputs. Bound: a kernel may round each score s to
    bf16 (|δs| ≤ eps·|s|), which moves every softmax weight by a factor within exp(±2 eps max|s|); the weights
    sum to 1, so each output, a convex mix of values, moves by ≤ (exp(2 eps max|s|) − 1)·max|v|; rounding the
    weights, the products' sums (fp32 or better) and the output to bf16 adds ≤ 3 eps·max|v|."""
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 4, 64, 64, generator=gen).bfloat16() for _ in range(3))
    out = F.scaled_dot_product_attention(q, k, v, is_causal=True).double()
    qd, kd, vd = q.double(), k.double(), v.double()
    scores = qd @ kd.transpose(-1, -2) / math.sqrt(64)
    scores = scores.masked_fill(torch.ones(64, 64, dtype=torch.bool).triu(1), -math.inf)
    ref = scores.softmax(-1) @ vd
    eps = 2.0 ** -8  # bf16's unit roundoff (8 bits of significand, round to nearest)
    s_max = scores.masked_fill(scores == -math.inf, 0).abs().max()
    bound = (math.expm1(2 * eps * s_max) + 3 * eps) * vd.abs().max()
    assert (out - ref).abs().max() <= bound


def test_fp32_attention_is_left_to_torch():
    """Only half-precision calls are routed: an fp32 call gives exactly the bits of torch's own function (the
    builtin a subprocess — a CLI run, a Ray worker — calls), so rows compared across processes stay equal."""
    q = torch.randn(1, 2, 70, 16, generator=torch.Generator().manual_seed(1))
    assert torch.equal(F.scaled_dot_product_attention(q, q, q, is_causal=True),
                       torch._C._nn.scaled_dot_product_attention(q, q, q, is_causal=True))
