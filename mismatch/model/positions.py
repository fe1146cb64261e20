"""Positions of a token batch: which tokens are scored, where each is predicted from, and the
position ids that make padding invisible.

One rule, used by probes, rollouts and OPD alike (docs/design.md): token `t` of a sequence can be
scored when it and its predecessor are both attended; its next-token distribution comes from the
logits at `t - 1`; positions count from each sequence's first attended token, so left or right
padding changes no number.
"""

from __future__ import annotations

import torch


def scorable(attention_mask_BT: torch.Tensor) -> torch.Tensor:
    """`[B, T]` bool: the token and its predecessor are both attended (the first token never is)."""
    attn_BT = attention_mask_BT.bool()
    valid_BT = torch.zeros_like(attn_BT)
    valid_BT[:, 1:] = attn_BT[:, 1:] & attn_BT[:, :-1]
    return valid_BT


def position_ids(attention_mask_BT: torch.Tensor) -> torch.Tensor:
    """`[B, T]` positions counted from each sequence's first attended token (left padding)."""
    return (attention_mask_BT.long().cumsum(-1) - 1).clamp(min=0)


def response_index(response_mask_BT: torch.Tensor) -> torch.Tensor:
    """Flat `[N]` indices into `[B*T]` of the positions whose logits predict each marked token
    (row-major order, the order of `response_mask_BT.nonzero()`)."""
    seq_N, t_N = response_mask_BT.bool().nonzero(as_tuple=True)
    return seq_N * response_mask_BT.shape[1] + t_N - 1
