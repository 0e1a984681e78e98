"""Documented wrappers over torch.ops.rotary.*."""
import torch


def rope(x: torch.Tensor, positions: torch.Tensor, inv_freq: torch.Tensor, attention_factor: float = 1.0,
         layout: str = "half_split") -> torch.Tensor:
    """Rotate x [..., heads, head_dim] by per-token positions [...] (int64).

    inv_freq: [rotary_dim / 2] inverse frequencies (float64 preferred; e.g. from `rotary freqs`); features past
    rotary_dim pass through. layout: "half_split" (GPT-NeoX / HF Llama) or "interleaved" (RoFormer / GPT-J).
    attention_factor multiplies cos and sin (YaRN, LongRoPE). Differentiable in x.
    """
    return torch.ops.rotary.rope(x, positions, inv_freq, float(attention_factor), layout, "forward")


def rope_inverse(x: torch.Tensor, positions: torch.Tensor, inv_freq: torch.Tensor, attention_factor: float = 1.0,
                 layout: str = "half_split") -> torch.Tensor:
    """The inverse of `rope` (R(-p) / attention_factor). Differentiable in x."""
    return torch.ops.rotary.rope(x, positions, inv_freq, float(attention_factor), layout, "inverse")


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, positions: torch.Tensor = None,
              cu_seqlens: torch.Tensor = None, causal: bool = True, softmax_scale: float = 0.0, mode: str = "rope",
              inv_freq: torch.Tensor = None, attention_factor: float = 1.0, layout: str = "half_split",
              roper: bool = False, window: int = 0, leaky_k: float = 1.0, logn_train_len: int = 0):
    """Fused attention with a rotary position mode; returns (out, lse). Differentiable in q, k, v.

    q [B, S, Hq, D] or packed [T, Hq, D] (then cu_seqlens [batch+1] int64 marks the sequences); k, v [..., Hkv, D]
    with Hq % Hkv == 0. positions: int64 [B, S] / [T] (default: index inside the sequence).
    mode: "none" (inputs already rotated), "rope", "rerope" (window w: distances >= w are clipped to w),
    "leaky_rerope" (beyond w the distance grows with slope 1/leaky_k). roper: RoPER value/output rotation.
    logn_train_len > 1: log-n query scaling q *= max(1, ln(pos + 1) / ln(logn_train_len)).
    softmax_scale 0 means 1/sqrt(D). lse [tokens, Hq] is the log-sum-exp of the scaled scores.
    """
    return torch.ops.rotary.attention(q, k, v, positions, cu_seqlens, causal, float(softmax_scale), mode, inv_freq,
                                      float(attention_factor), layout, roper, int(window), float(leaky_k),
                                      int(logn_train_len))


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
    return torch.ops.rotary.linear_attention(q, k, v, positions, cu_seqlens, causal, inv_freq,
                                             float(attention_factor), layout)
