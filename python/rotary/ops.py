"""Documented wrappers over torch.ops.rotary.*."""
from typing import Optional, Tuple, Union

import torch

from ._checks import check_tensor


def _check_tensors(**tensors):
    """A TypeError naming the argument that is not a tensor (the op would raise a RuntimeError)."""
    for name, t in tensors.items():
        check_tensor(name, t)


def rope(x: torch.Tensor, positions: torch.Tensor, inv_freq: torch.Tensor, attention_factor: float = 1.0,
         layout: str = "half_split") -> torch.Tensor:
    """Rotate x [..., heads, head_dim] by per-token positions [...] (int64).

    inv_freq: [rotary_dim / 2] inverse frequencies (float64 preferred; e.g. from `rotary freqs`); features past
    rotary_dim pass through. layout: "half_split" (GPT-NeoX / HF Llama) or "interleaved" (RoFormer / GPT-J).
    attention_factor multiplies cos and sin (YaRN, LongRoPE). Differentiable in x.
    """
    _check_tensors(x=x, positions=positions, inv_freq=inv_freq)
    return torch.ops.rotary.rope(x, positions, inv_freq, float(attention_factor), layout, "forward")


def rope_inverse(x: torch.Tensor, positions: torch.Tensor, inv_freq: torch.Tensor, attention_factor: float = 1.0,
                 layout: str = "half_split") -> torch.Tensor:
    """The inverse of `rope` (R(-p) / attention_factor). Differentiable in x."""
    _check_tensors(x=x, positions=positions, inv_freq=inv_freq)
    return torch.ops.rotary.rope(x, positions, inv_freq, float(attention_factor), layout, "inverse")


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mode: str = "rope", *, rotary_emb=None,
              inv_freq: Optional[torch.Tensor] = None, attention_factor: Optional[float] = None, window: int = 0,
              leaky_k: float = 1.0, logn: int = 0, causal: bool = True, positions: Optional[torch.Tensor] = None,
              cu_seqlens: Optional[torch.Tensor] = None, softmax_scale: Optional[float] = None,
              layout: str = "half_split",
              return_lse: bool = False) -> Union[torch.Tensor, Tuple[torch.Tensor, torch.Tensor]]:
    """Fused softmax attention with a rotary position mode; differentiable in q, k, v.

    q ``[batch, seqlen, heads, head_dim]`` or packed ``[total, heads, head_dim]`` (then cu_seqlens ``[batch + 1]``
    marks the sequences); k, v ``[..., kv_heads, head_dim]`` with heads % kv_heads == 0 (GQA / MQA).
    mode: "rope"; "roper" (RoPER: values and outputs turned too); "rerope" (ReRoPE: distances >= window count as
    window); "leaky_rerope" (past window the distance grows with slope 1 / leaky_k); "none" (inputs already turned).
    The frequencies: rotary_emb (a rotary.RotaryEmbedding, its layout and attention factor with it) or inv_freq
    (float64 ``[rotary_dim / 2]``) with attention_factor and layout ("half_split" or "interleaved").
    logn > 1: log-n query scaling, q *= max(1, ln(pos + 1) / ln(logn)) (logn = the training length).
    positions: int64 ``[batch, seqlen]`` / ``[total]`` (default: the index inside each sequence).
    softmax_scale: default 1 / sqrt(head_dim). Returns the output ``[..., heads, head_dim]``, and with return_lse
    also the log-sum-exp of the scaled scores ``[tokens, heads]``.
    """
    _check_tensors(q=q, k=k, v=v)
    if mode not in ("none", "rope", "roper", "rerope", "leaky_rerope"):
        raise ValueError(f"mode = {mode!r}: allowed none, rope, roper, rerope, leaky_rerope")
    for name, value in (("window", window), ("logn", logn)):
        if not isinstance(value, int) or isinstance(value, bool):
            raise TypeError(f"{name}: must be an int, got {type(value).__name__}")
    if mode in ("rerope", "leaky_rerope") and window < 1:
        raise ValueError(f"window = {window}: mode {mode!r} needs window >= 1")
    if not isinstance(return_lse, bool):
        raise TypeError(f"return_lse: must be a bool, got {type(return_lse).__name__}")
    if rotary_emb is not None:
        if inv_freq is not None:
            raise ValueError("inv_freq: give either inv_freq or rotary_emb, not both")
        inv_freq = rotary_emb.inv_freq
        attention_factor = rotary_emb.attention_factor if attention_factor is None else attention_factor
        layout = "interleaved" if rotary_emb.interleaved else "half_split"
    if mode != "none" and inv_freq is None:
        raise ValueError(f"inv_freq: mode {mode!r} needs the frequencies: pass rotary_emb= or inv_freq=")
    out, lse = torch.ops.rotary.attention(
        q, k, v, positions, cu_seqlens, causal, 0.0 if softmax_scale is None else float(softmax_scale),
        "rope" if mode == "roper" else mode, inv_freq, 1.0 if attention_factor is None else float(attention_factor),
        layout, mode == "roper", int(window), float(leaky_k), int(logn))
    return (out, lse) if return_lse else out


def linear_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, positions: torch.Tensor = None,
                     cu_seqlens: torch.Tensor = None, causal: bool = True, inv_freq: torch.Tensor = None,
                     attention_factor: float = 1.0, layout: str = "half_split") -> torch.Tensor:
    """RoFormer (eq. 19) linear attention with RoPE; returns out [..., H, Dv]. Differentiable in q, k, v.

    phi = elu + 1 and a = attention_factor:
    o_m = sum_n (a R(pos_m) phi(q_m)) . (a R(pos_n) phi(k_n)) v_n / sum_n phi(q_m) . phi(k_n),
    the rotation in the numerator only; n runs over n <= m (causal, by index inside the sequence) or the whole
    sequence. Cost O(S D Dv) per head (running state, no S x S matrix), forward and backward.
    q, k [B, S, H, D] or packed [T, H, D] (then cu_seqlens [batch+1] int64 marks the sequences); v [..., H, Dv].
    One key head per query head (repeat k, v for grouped-query attention). positions: int64 [B, S] / [T]
    (default: index inside the sequence). inv_freq: [rotary_dim / 2] inverse frequencies (float64 preferred;
    features past rotary_dim are not rotated), or None for plain linear attention (attention_factor and layout
    unused). layout: "half_split" or "interleaved". Arithmetic in float32 (float64 for float64 inputs).
    """
    _check_tensors(q=q, k=k, v=v)
    return torch.ops.rotary.linear_attention(q, k, v, positions, cu_seqlens, causal, inv_freq,
                                             float(attention_factor), layout)
