"""Decoding caches as Python classes: ``KvCache`` (one sequence, every position mode of the fused attention) and
``MemoryKvCache`` (a window kept exact and a retrieval memory behind it). Keyword arguments with defaults, checked
arguments, save / open. They hold ``torch.classes.rotary.KvCache`` / ``MemoryKvCache`` (torch/src/decode_op.cpp,
torch/src/memory_op.cpp; docs/decode.md, docs/memory.md); inference only (no autograd)."""
import os
from typing import Optional, Tuple, Union

import torch

from ._checks import check_float_tensor, check_int_tensor, check_tensor

_DTYPE_NAMES = {torch.float32: "float32", torch.float64: "float64", torch.float16: "float16",
                torch.bfloat16: "bfloat16"}
_MODES = ("none", "rope", "roper", "rerope", "leaky_rerope")
_LAYOUTS = ("half_split", "interleaved")


def _core(method, *args):
    """Calls a method of a TorchScript class; torch 1.13 raises the core's rotary::Error from such methods as a
    RuntimeError (ops and constructors give a ValueError), so it is given back as the ValueError it is."""
    try:
        return method(*args)
    except RuntimeError as e:
        text = str(e)
        at = text.find("rotary:")
        if at < 0:
            raise
        raise ValueError(text[at:].splitlines()[0]) from None


def _check_int(name, value, least):
    if not isinstance(value, int) or isinstance(value, bool):
        raise TypeError(f"{name}: must be an int, got {type(value).__name__}")
    if value < least:
        raise ValueError(f"{name} = {value}: must be >= {least}")
    return value


def _check_choice(name, value, allowed):
    if value not in allowed:
        raise ValueError(f"{name} = {value!r}: allowed {', '.join(allowed)}")
    return value


def _frequencies(inv_freq, rotary_emb, attention_factor):
    """(inv_freq float64, attention_factor) from explicit frequencies or a rotary.RotaryEmbedding."""
    if rotary_emb is not None:
        if inv_freq is not None:
            raise ValueError("inv_freq: give either inv_freq or rotary_emb, not both")
        return rotary_emb.inv_freq, rotary_emb.attention_factor if attention_factor is None else attention_factor
    if inv_freq is not None:
        check_tensor("inv_freq", inv_freq)
        if not inv_freq.is_floating_point() or inv_freq.dim() != 1:
            raise ValueError(f"inv_freq: must be a 1-d float tensor [rotary_dim / 2], got {inv_freq.dtype} "
                             f"{tuple(inv_freq.shape)}")
        inv_freq = inv_freq.to(torch.float64)
    return inv_freq, 1.0 if attention_factor is None else float(attention_factor)


def _next_positions(positions, n, size, last):
    if positions is None:
        if last is None:
            raise ValueError("positions: a cache opened from a file needs explicit positions for its first append")
        start = 0 if size == 0 else last + 1
        return torch.arange(start, start + n, dtype=torch.int64)
    check_int_tensor("positions", positions)
    if positions.dim() != 1 or positions.numel() != n:
        raise ValueError(f"positions.shape = {tuple(positions.shape)}: must be [n] with n = k.shape[0] = {n}")
    return positions.to(torch.int64)


def _append(cache, k, v, positions, dtype):
    """The one append of both classes: dtypes checked, positions defaulting to the next ones, the last remembered."""
    check_float_tensor("k", k, (dtype,))
    check_float_tensor("v", v, (dtype,))
    pos = _next_positions(positions, k.shape[0] if k.dim() else 0, len(cache), cache._last)
    _core(cache._cache.append, k, v, pos)
    if pos.numel():
        cache._last = int(pos[-1])


class KvCache:
    """One sequence's keys and values, decoded one query token at a time by the fused kernels.

    capacity: tokens it can hold; kv_heads, head_dim: the key / value shape; dtype: of every k, v and q.
    mode: "rope", "roper" (RoPER: values and outputs turned too), "rerope" (ReRoPE: distances past ``window`` are
    ``window``), "leaky_rerope" (past ``window`` they grow with slope ``1 / leaky_k``) or "none" (inputs already
    turned, or no positions). The frequencies: ``rotary_emb`` (a rotary.RotaryEmbedding) or ``inv_freq`` (float64
    ``[rotary_dim / 2]``) and ``attention_factor``. logn_train_len > 1: log-n query scaling past that length.
    """

    def __init__(self, capacity: int, kv_heads: int, head_dim: int, *, dtype: torch.dtype = torch.float32,
                 mode: str = "rope", rotary_emb=None, inv_freq: Optional[torch.Tensor] = None,
                 attention_factor: Optional[float] = None, layout: str = "half_split", window: int = 0,
                 leaky_k: float = 1.0, logn_train_len: int = 0):
        _check_int("capacity", capacity, 1)
        _check_int("kv_heads", kv_heads, 1)
        _check_int("head_dim", head_dim, 1)
        if dtype not in _DTYPE_NAMES:
            raise ValueError(f"dtype = {dtype}: allowed {', '.join(str(d) for d in _DTYPE_NAMES)}")
        _check_choice("mode", mode, _MODES)
        _check_choice("layout", layout, _LAYOUTS)
        _check_int("window", window, 0)
        _check_int("logn_train_len", logn_train_len, 0)
        inv, factor = _frequencies(inv_freq, rotary_emb, attention_factor)
        if mode != "none" and inv is None:
            raise ValueError(f"inv_freq: mode {mode!r} needs the frequencies: pass rotary_emb= or inv_freq=")
        if mode in ("rerope", "leaky_rerope") and window < 1:
            raise ValueError(f"window = {window}: mode {mode!r} needs window >= 1")
        roper = mode == "roper"
        core_mode = "rope" if roper else mode
        self.dtype, self.mode = dtype, mode
        self._last = -1
        self._cache = torch.classes.rotary.KvCache(capacity, kv_heads, head_dim, _DTYPE_NAMES[dtype], core_mode,
                                                   inv, float(factor), layout, roper, window, float(leaky_k),
                                                   logn_train_len)

    def append(self, k: torch.Tensor, v: torch.Tensor, positions: Optional[torch.Tensor] = None) -> None:
        """k, v ``[n, kv_heads, head_dim]`` un-turned (as the projections give them); positions ``[n]`` int,
        increasing past the cached ones (default: the next n after the last)."""
        _append(self, k, v, positions, self.dtype)

    def decode(self, q: torch.Tensor, position: Optional[int] = None,
               softmax_scale: Optional[float] = None) -> torch.Tensor:
        """One query token q ``[heads, head_dim]`` at ``position`` (default: the last cached one) against every
        cached token: returns the attention output ``[heads, head_dim]``. softmax_scale: default 1 / sqrt(D)."""
        check_float_tensor("q", q, (self.dtype,))
        if position is not None:
            _check_int("position", position, -(2 ** 53))
        return _core(self._cache.decode, q, position, 0.0 if softmax_scale is None else float(softmax_scale))

    def __len__(self) -> int:
        return self._cache.size()

    @property
    def capacity(self) -> int:
        return self._cache.capacity()

    def clear(self) -> None:
        self._cache.clear()
        self._last = -1

    def save(self, path: Union[str, os.PathLike], fingerprint: int = 0) -> None:
        """Writes the cache to ``path`` atomically (whole or absent). fingerprint: your tag of what made the rows
        (a model's hash); ``open`` must be given it back."""
        _core(self._cache.save, os.fspath(path), _check_int("fingerprint", fingerprint, -(2 ** 63)))

    @classmethod
    def open(cls, path: Union[str, os.PathLike], capacity: int, kv_heads: int, head_dim: int,
             fingerprint: int = 0, **settings) -> "KvCache":
        """The cache saved at ``path``, continued, with room for ``capacity`` more tokens. The other arguments are
        the constructor's and must be those the cache was saved with (a ValueError names what differs)."""
        self = cls(capacity, kv_heads, head_dim, **settings)
        _core(self._cache.load, os.fspath(path), _check_int("fingerprint", fingerprint, -(2 ** 63)))
        self._last = -1 if len(self) == 0 else None  # unknown until the caller appends with positions
        return self


class MemoryKvCache:
    """A decoder's cache whose tokens past a window move to a retrieval memory: each decode step attends to the
    window exactly and to the top-k keys of the memory, merged (docs/memory.md). float32 in and out.

    window: tokens kept exact; the frequencies as for KvCache (rotary_emb= or inv_freq=); policy: "exact",
    "rerope", "none" or "unlimiformer" (where retrieved keys sit); mode: "rope" or "rerope" (with
    ``rerope_window``: the model's ReRoPE w); memory_storage: "f32", "bf16" or "f16" (the memory's keys and values).
    """

    def __init__(self, window: int, kv_heads: int, head_dim: int, *, rotary_emb=None,
                 inv_freq: Optional[torch.Tensor] = None, attention_factor: Optional[float] = None,
                 policy: str = "exact", mode: str = "rope", layout: str = "half_split", rerope_window: int = 0,
                 logn_train_len: int = 0, memory_storage: str = "f32"):
        _check_int("window", window, 1)
        _check_int("kv_heads", kv_heads, 1)
        _check_int("head_dim", head_dim, 1)
        _check_choice("policy", policy, ("exact", "rerope", "none", "unlimiformer"))
        _check_choice("mode", mode, ("rope", "rerope"))
        _check_choice("layout", layout, _LAYOUTS)
        _check_choice("memory_storage", memory_storage, ("f32", "bf16", "f16"))
        _check_int("rerope_window", rerope_window, 0)
        _check_int("logn_train_len", logn_train_len, 0)
        inv, factor = _frequencies(inv_freq, rotary_emb, attention_factor)
        if inv is None:
            raise ValueError("inv_freq: the memory cache needs the frequencies: pass rotary_emb= or inv_freq=")
        self._last = -1
        self._cache = torch.classes.rotary.MemoryKvCache(window, kv_heads, head_dim, policy, mode, inv, float(factor),
                                                         layout, rerope_window, logn_train_len, memory_storage)

    def append(self, k: torch.Tensor, v: torch.Tensor, positions: Optional[torch.Tensor] = None) -> None:
        """k, v ``[n, kv_heads, head_dim]`` float32 un-turned; positions ``[n]`` increasing (default: the next n)."""
        _append(self, k, v, positions, torch.float32)

    def decode(self, q: torch.Tensor, position: int, top_k: int = 32, softmax_scale: Optional[float] = None,
               return_retrieval: bool = False) -> Union[torch.Tensor, Tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
        """One query token q ``[heads, head_dim]`` float32 at ``position``: the output ``[heads, head_dim]``, and
        with return_retrieval also the share of the softmax mass on the memory ``[heads]`` and the memory rows
        retrieved ``[heads, top_k]`` (best first, -1 past what there is). top_k 0: the window alone."""
        check_float_tensor("q", q, (torch.float32,))
        _check_int("position", position, 0)
        _check_int("top_k", top_k, 0)
        out, mass, rows = _core(self._cache.decode, q, position, top_k,
                                0.0 if softmax_scale is None else float(softmax_scale))
        return (out, mass, rows) if return_retrieval else out

    def __len__(self) -> int:
        return self._cache.size()

    @property
    def window_size(self) -> int:
        return self._cache.window_size()

    @property
    def memory_size(self) -> int:
        return self._cache.memory_size()

    def save(self, memory_path: Union[str, os.PathLike], window_path: Union[str, os.PathLike],
             fingerprint: int = 0) -> None:
        """The memory and the window to two files, each written atomically (policy unlimiformer is refused)."""
        _core(self._cache.save, os.fspath(memory_path), os.fspath(window_path),
              _check_int("fingerprint", fingerprint, -(2 ** 63)))

    @classmethod
    def open(cls, memory_path: Union[str, os.PathLike], window_path: Union[str, os.PathLike], window: int,
             kv_heads: int, head_dim: int, fingerprint: int = 0, **settings) -> "MemoryKvCache":
        """The cache saved to those files, continued; the other arguments are the constructor's and must be those
        it was saved with (a ValueError names what differs)."""
        self = cls(window, kv_heads, head_dim, **settings)
        _core(self._cache.load, os.fspath(memory_path), os.fspath(window_path),
              _check_int("fingerprint", fingerprint, -(2 ** 63)))
        self._last = None if len(self) else -1
        return self
