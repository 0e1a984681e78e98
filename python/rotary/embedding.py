"""Rotary embeddings from cos / sin tables: flash-attn's ``apply_rotary_emb`` and transformers' (and Liger's)
``apply_rotary_pos_emb`` contracts, on rotary's fused CPU kernel (``torch.ops.rotary.rope_table``).

Both are one pass over the input (no ``rotate_half`` copy, no ``x * cos`` temporaries); the backward is the same
kernel with the adjoint turn. The cos / sin tables get no gradient (as in flash-attn and Liger): a table that
requires grad is refused rather than silently left without one.
"""
import json
from typing import Optional, Tuple, Union

import torch

from ._checks import check_float_tensor, check_int_tensor, check_tensor, compiling

_FLOAT_TYPES = (torch.float32, torch.float16, torch.bfloat16, torch.float64)


class _TableRotation(torch.autograd.Function):
    """x turned by table rows; the gradient is the transpose turn by the same rows."""

    @staticmethod
    def forward(ctx, x, cos, sin, rows, rotary_dim, layout, width, inplace):
        ctx.save_for_backward(cos, sin, rows)
        ctx.args = (rotary_dim, layout, width)
        if inplace:
            torch.ops.rotary.rope_table_(x, cos, sin, rows, rotary_dim, layout, width, False)
            ctx.mark_dirty(x)
            return x
        return torch.ops.rotary.rope_table(x, cos, sin, rows, rotary_dim, layout, width, False)

    @staticmethod
    def backward(ctx, grad):
        cos, sin, rows = ctx.saved_tensors
        rotary_dim, layout, width = ctx.args
        dx = torch.ops.rotary.rope_table(grad, cos, sin, rows, rotary_dim, layout, width, True)
        return dx, None, None, None, None, None, None, None


def _check_tables(cos, sin):
    check_float_tensor("cos", cos, _FLOAT_TYPES)
    check_float_tensor("sin", sin, _FLOAT_TYPES)
    if sin.shape != cos.shape:
        raise ValueError(f"sin.shape = {tuple(sin.shape)}: must equal cos.shape = {tuple(cos.shape)}")
    for name, t in (("cos", cos), ("sin", sin)):
        if t.requires_grad and torch.is_grad_enabled():
            raise ValueError(f"{name}.requires_grad = True: rotary's rotation gives the cos / sin tables no gradient "
                             f"(as flash-attn and Liger); pass {name}.detach() or compute it under torch.no_grad()")


def _rotate(x4, cos2, sin2, rows, rotary_dim, interleaved, width, inplace):
    layout = "interleaved" if interleaved else "half_split"
    return _TableRotation.apply(x4, cos2, sin2, rows, rotary_dim, layout, width, inplace)


def apply_rotary_emb(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, interleaved: bool = False,
                     inplace: bool = False, seqlen_offsets: Union[int, torch.Tensor] = 0,
                     cu_seqlens: Optional[torch.Tensor] = None, max_seqlen: Optional[int] = None) -> torch.Tensor:
    """flash-attn's ``apply_rotary_emb``: rotate the first ``2 * cos.shape[-1]`` features of each head of x.

    x: ``[batch, seqlen, heads, head_dim]``, or packed ``[total, heads, head_dim]`` with ``cu_seqlens``
    (``[batch + 1]`` int32 / int64 offsets, from 0 to total, non-decreasing).
    cos, sin: ``[seqlen_ro, rotary_dim / 2]``; token s of sequence b uses row ``s + seqlen_offsets[b]``, which must
    be < seqlen_ro. Features past rotary_dim pass through unchanged.
    interleaved: pairs (0, 1), (2, 3), ... (GPT-J); otherwise (i, i + rotary_dim / 2) (GPT-NeoX).
    inplace: write into x and return it (no new tensor); x must then be a view the kernel takes (last dim
    contiguous). seqlen_offsets: an int, or a ``[batch]`` int tensor (e.g. a KV cache's lengths).
    max_seqlen: the longest sequence when packed; optional here (checked when given).
    Arithmetic in float32 (float64 for a float64 x), rounded once to x's dtype. Differentiable in x.
    """
    check_float_tensor("x", x, _FLOAT_TYPES)
    _check_tables(cos, sin)
    if cos.dim() != 2:
        raise ValueError(f"cos.dim() = {cos.dim()}: must be 2 ([seqlen_ro, rotary_dim / 2])")
    rotary_dim = 2 * cos.shape[1]
    if not isinstance(interleaved, bool):
        raise TypeError(f"interleaved: must be a bool, got {type(interleaved).__name__}")
    if not isinstance(inplace, bool):
        raise TypeError(f"inplace: must be a bool, got {type(inplace).__name__}")
    if cu_seqlens is None:
        if x.dim() != 4:
            raise ValueError(f"x.dim() = {x.dim()}: must be 4 ([batch, seqlen, heads, head_dim]), or 3 with "
                             "cu_seqlens")
        if max_seqlen is not None:
            raise ValueError("max_seqlen: only with cu_seqlens (packed sequences)")
        batch, seqlen = x.shape[0], x.shape[1]
        x4 = x
        starts = None
    else:
        if x.dim() != 3:
            raise ValueError(f"x.dim() = {x.dim()}: must be 3 ([total, heads, head_dim]) with cu_seqlens")
        cu = _check_cu_seqlens(cu_seqlens, x.shape[0])
        batch = cu.numel() - 1
        lengths = cu[1:] - cu[:-1]
        longest = int(lengths.max()) if batch > 0 else 0
        if max_seqlen is not None:
            if not isinstance(max_seqlen, int) or isinstance(max_seqlen, bool):
                raise TypeError(f"max_seqlen: must be an int, got {type(max_seqlen).__name__}")
            if max_seqlen < longest:
                raise ValueError(f"max_seqlen = {max_seqlen}: must be >= the longest sequence in cu_seqlens "
                                 f"({longest})")
        seqlen = x.shape[0]
        x4 = x.unsqueeze(0)
        starts = cu
    if rotary_dim > x.shape[-1]:
        raise ValueError(f"cos.shape[-1] = {cos.shape[1]}: 2 * cos.shape[-1] (the rotary dim) must be <= "
                         f"x.shape[-1] = {x.shape[-1]}")
    if x.shape[-1] > 0 and x.stride(-1) != 1:
        if inplace:
            raise ValueError(f"x.stride(-1) = {x.stride(-1)}: in place needs the head_dim elements contiguous "
                             "(stride 1); pass x.contiguous() or inplace=False")
        x4 = x4.contiguous()
    offsets = _offsets(seqlen_offsets, batch)
    if starts is None:
        rows = torch.arange(seqlen, dtype=torch.int64).unsqueeze(0) + offsets.unsqueeze(1)  # [batch, seqlen]
    else:
        sequence = torch.repeat_interleave(torch.arange(batch), starts[1:] - starts[:-1])  # of each token
        rows = (torch.arange(seqlen, dtype=torch.int64) - starts[:-1][sequence] + offsets[sequence]).unsqueeze(0)
    if not compiling() and rows.numel() > 0 and int(rows.max()) >= cos.shape[0]:
        raise ValueError(f"cos.shape[0] = {cos.shape[0]}: the tables have too few rows for seqlen_offsets + seqlen "
                         f"(row {int(rows.max())} is needed)")
    out = _rotate(x4, cos, sin, rows, rotary_dim, interleaved, "pairs", inplace)
    return x if inplace else out.view(x.shape)


def _check_cu_seqlens(cu_seqlens, total):
    check_int_tensor("cu_seqlens", cu_seqlens)
    if cu_seqlens.dim() != 1 or cu_seqlens.numel() < 2:
        raise ValueError(f"cu_seqlens.shape = {tuple(cu_seqlens.shape)}: must be [batch + 1] with batch >= 1")
    cu = cu_seqlens.to(torch.int64)
    if int(cu[0]) != 0:
        raise ValueError(f"cu_seqlens[0] = {int(cu[0])}: must be 0")
    steps = cu[1:] - cu[:-1]
    if bool((steps < 0).any()):
        i = int(torch.nonzero(steps < 0)[0]) + 1
        raise ValueError(f"cu_seqlens[{i}] = {int(cu[i])}: must be >= cu_seqlens[{i - 1}] = {int(cu[i - 1])} "
                         "(non-decreasing)")
    if int(cu[-1]) != total:
        raise ValueError(f"cu_seqlens[-1] = {int(cu[-1])}: must equal the packed tokens x.shape[0] = {total}")
    return cu


def _offsets(seqlen_offsets, batch):
    if isinstance(seqlen_offsets, bool):
        raise TypeError("seqlen_offsets: must be an int or an int tensor [batch], got bool")
    if isinstance(seqlen_offsets, int):
        if seqlen_offsets < 0:
            raise ValueError(f"seqlen_offsets = {seqlen_offsets}: must be >= 0")
        return torch.full((batch,), seqlen_offsets, dtype=torch.int64)
    check_int_tensor("seqlen_offsets", seqlen_offsets)
    if tuple(seqlen_offsets.shape) != (batch,):
        raise ValueError(f"seqlen_offsets.shape = {tuple(seqlen_offsets.shape)}: must be [batch] = ({batch},)")
    if bool((seqlen_offsets < 0).any()):
        raise ValueError("seqlen_offsets: every offset must be >= 0")
    return seqlen_offsets.to(torch.int64)


def apply_rotary_pos_emb(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                         position_ids: Optional[torch.Tensor] = None,
                         unsqueeze_dim: int = 1) -> Tuple[torch.Tensor, torch.Tensor]:
    """transformers' (and Liger's) ``apply_rotary_pos_emb``: ``q * cos + rotate_half(q) * sin``, same for k.

    q ``[batch, heads, seqlen, head_dim]`` (unsqueeze_dim=1) or ``[batch, seqlen, heads, head_dim]``
    (unsqueeze_dim=2); k likewise, with its own head count. cos, sin: ``[batch or 1, seqlen, rotary_dim]`` as a
    transformers rotary embedding returns them, or ``[positions, rotary_dim]`` with ``position_ids``
    ``[batch, seqlen]`` (the older transformers form) or without (rows 0..seqlen-1). rotary_dim <= head_dim; features
    past it pass through. The formula is applied as written for any table (halves that differ included).
    Returns (q_embed, k_embed) in q's and k's dtypes and shapes (transformers would promote a bf16 q with float32
    tables to float32; here the tables are applied in float32 and the result keeps q's dtype).
    """
    check_float_tensor("q", q, _FLOAT_TYPES)
    check_float_tensor("k", k, _FLOAT_TYPES)
    _check_tables(cos, sin)
    if unsqueeze_dim not in (1, 2) or isinstance(unsqueeze_dim, bool):
        raise ValueError(f"unsqueeze_dim = {unsqueeze_dim!r}: must be 1 (q [batch, heads, seqlen, head_dim]) or 2 "
                         "(q [batch, seqlen, heads, head_dim])")
    for name, t in (("q", q), ("k", k)):
        if t.dim() != 4:
            raise ValueError(f"{name}.dim() = {t.dim()}: must be 4")
    seq_dim = 3 - unsqueeze_dim  # 2 for [B, H, S, D], 1 for [B, S, H, D]
    batch, seqlen = q.shape[0], q.shape[seq_dim]
    if k.shape[0] != batch or k.shape[seq_dim] != seqlen:
        raise ValueError(f"k.shape = {tuple(k.shape)}: batch and seqlen must match q.shape = {tuple(q.shape)}")
    rotary_dim = cos.shape[-1]
    for name, t in (("q", q), ("k", k)):
        if rotary_dim > t.shape[-1] or rotary_dim % 2:
            raise ValueError(f"cos.shape[-1] = {rotary_dim}: must be even and <= {name}.shape[-1] = {t.shape[-1]}")
    if cos.dim() == 3:
        if position_ids is not None:
            raise ValueError("position_ids: only with 2-d cos / sin [positions, rotary_dim]; 3-d tables are "
                             "already per token")
        if cos.shape[0] not in (1, batch) or cos.shape[1] != seqlen:
            raise ValueError(f"cos.shape = {tuple(cos.shape)}: must be [batch or 1, seqlen, rotary_dim] with "
                             f"batch = {batch}, seqlen = {seqlen}")
        per_row = torch.arange(seqlen, dtype=torch.int64).unsqueeze(0)
        rows = per_row + (torch.arange(batch, dtype=torch.int64).unsqueeze(1) * seqlen if cos.shape[0] > 1 else 0)
        rows = rows.expand(batch, seqlen)
        table_c, table_s = cos.reshape(-1, rotary_dim), sin.reshape(-1, rotary_dim)
    elif cos.dim() == 2:
        if position_ids is None:
            rows = torch.arange(seqlen, dtype=torch.int64).unsqueeze(0).expand(batch, seqlen)
        else:
            check_int_tensor("position_ids", position_ids)
            if position_ids.dim() == 1:
                position_ids = position_ids.unsqueeze(0)
            if position_ids.dim() != 2 or position_ids.shape[1] != seqlen or position_ids.shape[0] not in (1, batch):
                raise ValueError(f"position_ids.shape = {tuple(position_ids.shape)}: must be [batch or 1, seqlen] "
                                 f"with batch = {batch}, seqlen = {seqlen}")
            rows = position_ids.to(torch.int64).expand(batch, seqlen)
            if not compiling() and rows.numel() and (int(rows.min()) < 0 or int(rows.max()) >= cos.shape[0]):
                raise ValueError(f"position_ids: every id must be in [0, cos.shape[0] = {cos.shape[0]})")
        table_c, table_s = cos, sin
    else:
        raise ValueError(f"cos.dim() = {cos.dim()}: must be 3 ([batch or 1, seqlen, rotary_dim]) or 2 "
                         "([positions, rotary_dim])")
    rows = rows.contiguous()
    out = []
    for t in (q, k):
        t4 = t.transpose(1, 2) if unsqueeze_dim == 1 else t  # [B, S, H, D], a view
        y = _rotate(t4, table_c, table_s, rows, rotary_dim, False, "features", False)
        out.append(y.transpose(1, 2) if unsqueeze_dim == 1 else y)
    return out[0], out[1]


class RotaryEmbedding(torch.nn.Module):
    """The cos / sin tables of a rotary embedding, with every scaling rotary's core reads (transformers' rope
    types: default, linear, dynamic, yarn, llama3, longrope; and ntk / ntk_mixed), computed in float64.

    dim: the rotated features (rotary_dim). base: rope_theta. rope_scaling: None, or the ``rope_scaling`` dict of a
    config.json (e.g. ``{"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 4096}``);
    max_position_embeddings: the model's context, which dynamic, yarn and longrope read. A whole config.json (its
    head_dim, partial_rotary_factor, rope_theta, rope_scaling / rope_parameters): ``RotaryEmbedding.from_config``.
    interleaved: the pair layout of the tables ``forward`` returns ((0, 1), (2, 3), ... instead of (i, i + dim / 2)).

    Attributes: ``inv_freq`` (float64 ``[dim / 2]``, a buffer), ``attention_factor`` (multiplies cos and sin:
    yarn's and longrope's), ``rotary_dim``. The same frequencies feed ``rotary.attention`` (``inv_freq=``).
    """

    def __init__(self, dim: int, base: float = 10000.0, rope_scaling: Optional[dict] = None,
                 interleaved: bool = False, max_position_embeddings: Optional[int] = None):
        super().__init__()
        if not isinstance(dim, int) or isinstance(dim, bool):
            raise TypeError(f"dim: must be an int, got {type(dim).__name__}")
        if dim < 2 or dim % 2:
            raise ValueError(f"dim = {dim}: must be an even number >= 2")
        if not isinstance(base, (int, float)) or isinstance(base, bool):
            raise TypeError(f"base: must be a number, got {type(base).__name__}")
        if rope_scaling is not None and not isinstance(rope_scaling, dict):
            raise TypeError(f"rope_scaling: must be None or a dict (a config.json's rope_scaling), got "
                            f"{type(rope_scaling).__name__}")
        config = {"head_dim": dim, "rope_theta": float(base), "rope_scaling": rope_scaling}
        if max_position_embeddings is not None:
            config["max_position_embeddings"] = max_position_embeddings
        self._init_from(config, interleaved)

    @classmethod
    def from_config(cls, config: Union[dict, str], interleaved: bool = False) -> "RotaryEmbedding":
        """From a whole config.json: a dict, or the path of the file or of its model directory."""
        if isinstance(config, str):
            import os
            path = os.path.join(config, "config.json") if os.path.isdir(config) else config
            with open(path, encoding="utf-8") as f:
                config = json.load(f)
        if not isinstance(config, dict):
            raise TypeError(f"config: must be a dict or a path, got {type(config).__name__}")
        self = cls.__new__(cls)
        torch.nn.Module.__init__(self)
        self._init_from(config, interleaved)
        return self

    def _init_from(self, config, interleaved):
        if not isinstance(interleaved, bool):
            raise TypeError(f"interleaved: must be a bool, got {type(interleaved).__name__}")
        self._config_json = json.dumps(config)
        inv_freq, factor = torch.ops.rotary.rope_freqs(self._config_json, 0)
        self.register_buffer("inv_freq", inv_freq, persistent=False)
        self.attention_factor = float(factor)
        self.rotary_dim = 2 * inv_freq.numel()
        self.interleaved = interleaved
        self.max_position_embeddings = config.get("max_position_embeddings")
        self._by_length = {}  # seq_len -> (inv_freq, attention_factor) of the length-dependent scalings

    def freqs(self, seq_len: int = 0) -> Tuple[torch.Tensor, float]:
        """(inv_freq, attention_factor) for a sequence of seq_len tokens: only dynamic and longrope differ from
        the attributes, past max_position_embeddings."""
        if not seq_len or self.max_position_embeddings is None or seq_len <= self.max_position_embeddings:
            return self.inv_freq, self.attention_factor
        if seq_len not in self._by_length:
            inv, a = torch.ops.rotary.rope_freqs(self._config_json, int(seq_len))
            self._by_length[seq_len] = (inv, float(a))
        return self._by_length[seq_len]

    def cos_sin(self, positions: Union[int, torch.Tensor], dtype: torch.dtype = torch.float32,
                seq_len: Optional[int] = None) -> Tuple[torch.Tensor, torch.Tensor]:
        """flash-attn's tables: cos, sin ``[..., rotary_dim / 2]`` for int64 positions (or ``range(positions)``),
        the attention factor folded in; angles in float64, rounded once to dtype. seq_len: the length the
        frequencies are for (default: the largest position + 1)."""
        if isinstance(positions, int) and not isinstance(positions, bool):
            if positions < 0:
                raise ValueError(f"positions = {positions}: must be >= 0 (a count) or an int tensor")
            positions = torch.arange(positions, dtype=torch.int64)
        check_int_tensor("positions", positions)
        if positions.numel() and int(positions.min()) < 0:
            raise ValueError("positions: every position must be >= 0")
        if seq_len is None:
            seq_len = int(positions.max()) + 1 if positions.numel() else 0
        inv_freq, factor = self.freqs(seq_len)
        angles = positions.to(torch.float64).unsqueeze(-1) * inv_freq
        return (angles.cos() * factor).to(dtype), (angles.sin() * factor).to(dtype)

    def forward(self, x: torch.Tensor, position_ids: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        """transformers' tables: cos, sin ``[batch, seqlen, rotary_dim]`` in x's dtype for position_ids
        ``[batch, seqlen]``, each pair's value on both of its features (for ``apply_rotary_pos_emb``)."""
        check_tensor("x", x)
        cos, sin = self.cos_sin(position_ids, dtype=torch.float64)
        if self.interleaved:
            cos, sin = cos.repeat_interleave(2, dim=-1), sin.repeat_interleave(2, dim=-1)
        else:
            cos, sin = torch.cat([cos, cos], dim=-1), torch.cat([sin, sin], dim=-1)
        return cos.to(x.dtype), sin.to(x.dtype)
