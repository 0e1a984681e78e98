"""ReRoPE (and Leaky ReRoPE, log-n, plain RoPE) patched into a transformers Llama, Mistral or Qwen2 model, as seed
004's code does for Llama: every decoder layer's attention computes its prefill with rotary's fused attention and
its cached decode with rotary's one-cache decoder (``rotary.KvCache``: un-rotated keys, each step's positions
applied inside the kernel), so a model runs past its trained context.

    import rotary.hf
    rotary.hf.patch(model, method="rerope", window=512, logn=4096)
    model.generate(...)

What changes and what does not: the projections, norms, MLPs and the model's own rope frequencies (read from its
config, every rope type transformers has, in float64) stay; the attention's position handling is replaced. The
attention modules' ``forward`` follows transformers' (>= 4.48) contract: ``forward(hidden_states,
position_embeddings, attention_mask, past_key_values | past_key_value, cache_position, **kwargs)`` returning
``(output, None)``; ``position_embeddings`` is ignored (the kernels turn by the positions themselves).

The rows live in rotary's caches (one per layer and batch row, sized ``max_tokens``; untouched rows take no
memory). transformers' cache object is still given each step's tokens so that its length - which ``generate``
reads - stays right, but as rows of width 0 (no memory) where it accepts them (``DynamicCache``), the rows
themselves otherwise. A prefill (the first call of a sequence: ``cache_position`` starting at 0) starts the caches
again. Not supported (a ValueError says so): padding in ``attention_mask`` (batches of unequal lengths), a
multi-token step after the prefill (chunked prefill, speculative decoding), output_attentions.
"""
from typing import Optional

import torch

from .caches import KvCache
from .embedding import RotaryEmbedding
from .ops import attention

_FAMILIES = ("llama", "mistral", "qwen2")
_METHODS = ("rope", "rerope", "leaky_rerope")


class _Patch:
    """The settings of a patched model, shared by its attention modules, and each module's caches."""

    def __init__(self, rotary_emb, method, window, leaky_k, logn, max_tokens):
        self.rotary_emb, self.method, self.window, self.leaky_k = rotary_emb, method, window, leaky_k
        self.logn, self.max_tokens = logn, max_tokens


def patch(model, method: str = "rerope", window: int = 512, leaky_k: float = 16.0, logn: int = 0,
          max_tokens: int = 131072):
    """Replaces the attention of every decoder layer of a transformers Llama / Mistral / Qwen2 model (in place;
    returns the model). method: "rerope" (distances >= window count as window), "leaky_rerope" (past window they
    grow with slope 1 / leaky_k) or "rope" (the model as it was, on rotary's kernels). logn: the training length
    for log-n query scaling (0: off; seed 004 uses it without training, as "log n dagger"). max_tokens: the most
    tokens one sequence reaches (prompt and generated)."""
    if method not in _METHODS:
        raise ValueError(f"method = {method!r}: allowed {', '.join(_METHODS)}")
    for name, value, least in (("window", window, 1 if method != "rope" else 0), ("logn", logn, 0),
                               ("max_tokens", max_tokens, 1)):
        if not isinstance(value, int) or isinstance(value, bool):
            raise TypeError(f"{name}: must be an int, got {type(value).__name__}")
        if value < least:
            raise ValueError(f"{name} = {value}: must be >= {least}")
    config = getattr(model, "config", None)
    model_type = getattr(config, "model_type", None)
    if model_type not in _FAMILIES:
        raise ValueError(f"model.config.model_type = {model_type!r}: rotary.hf.patch supports "
                         f"{', '.join(_FAMILIES)}")
    config_dict = config.to_dict()
    if config_dict.get("sliding_window") and config_dict.get("use_sliding_window", model_type == "mistral"):
        raise ValueError(f"model.config.sliding_window = {config_dict['sliding_window']}: a sliding-window model "
                         "is not patched (rotary's attention here attends to every earlier token)")
    settings = _Patch(RotaryEmbedding.from_config(config_dict), method, window, float(leaky_k), logn, max_tokens)
    patched = 0
    for module in model.modules():
        if all(hasattr(module, p) for p in ("q_proj", "k_proj", "v_proj", "o_proj")) and \
                type(module).__name__.endswith("Attention"):
            module._rotary_patch = settings
            module._rotary_caches = None
            module.forward = _patched_forward.__get__(module, type(module))
            patched += 1
    if patched == 0:
        raise ValueError("model: no attention module with q_proj, k_proj, v_proj and o_proj was found")
    return model


def _head_dim(module):
    config = module.config
    return getattr(module, "head_dim", None) or config.hidden_size // config.num_attention_heads


def _patched_forward(self, hidden_states: torch.Tensor, position_embeddings=None,
                     attention_mask: Optional[torch.Tensor] = None, past_key_values=None, cache_position=None,
                     **kwargs):
    s = self._rotary_patch
    past = past_key_values if past_key_values is not None else kwargs.get("past_key_value")
    if kwargs.get("output_attentions"):
        raise ValueError("output_attentions: a patched model's fused attention gives no attention weights")
    B, S, _ = hidden_states.shape
    D = _head_dim(self)
    q = self.q_proj(hidden_states).view(B, S, -1, D)
    k = self.k_proj(hidden_states).view(B, S, -1, D)
    v = self.v_proj(hidden_states).view(B, S, -1, D)
    _check_no_padding(attention_mask)
    positions = _positions(cache_position, kwargs.get("position_ids"), past, self, B, S)
    first = int(positions[0, 0]) == 0
    mode = s.method
    inv, factor = s.rotary_emb.inv_freq, s.rotary_emb.attention_factor
    if first:
        out = attention(q, k, v, mode, inv_freq=inv, attention_factor=factor, window=s.window, leaky_k=s.leaky_k,
                        logn=s.logn, positions=positions)
        if past is not None:
            self._rotary_caches = []
            for b in range(B):
                cache = KvCache(s.max_tokens, k.shape[2], D, dtype=k.dtype, mode=mode, inv_freq=inv,
                                attention_factor=factor, window=s.window, leaky_k=s.leaky_k,
                                logn_train_len=s.logn)
                cache.append(k[b], v[b], positions[b])
                self._rotary_caches.append(cache)
    else:
        if self._rotary_caches is None or len(self._rotary_caches) != B:
            raise ValueError(f"cache_position = {int(positions[0, 0])}: a patched model continues a sequence only "
                             "after its prefill (cache_position 0) in the same batch")
        if S != 1:
            raise ValueError(f"hidden_states.shape[1] = {S}: after the prefill a patched model takes one token a "
                             "step (no chunked prefill or speculative decoding)")
        out = torch.empty_like(q)
        for b, cache in enumerate(self._rotary_caches):
            cache.append(k[b], v[b], positions[b])
            out[b, 0] = cache.decode(q[b, 0], int(positions[b, 0]))
    if past is not None:
        _count_in(past, k, v, self.layer_idx, cache_position)
    return self.o_proj(out.reshape(B, S, -1)), None


def _check_no_padding(mask):
    if mask is None:
        return
    if mask.dim() == 2 and bool((mask == 0).any()):
        raise ValueError("attention_mask: padding (a 0 in the mask) is not supported by a patched model; run "
                         "sequences of unequal length one at a time")
    if mask.dim() == 4:
        # transformers' 4-d causal mask: 0 where attended, a large negative number (or False) elsewhere. Only the
        # causal pattern itself is supported: each query attends to every key up to its own position.
        allowed = (mask == 0) if mask.dtype != torch.bool else mask
        q_len, k_len = allowed.shape[-2], allowed.shape[-1]
        expected = torch.ones(q_len, k_len, dtype=torch.bool).tril(k_len - q_len)
        if not bool((allowed == expected).all()):
            raise ValueError("attention_mask: only the causal mask of unpadded sequences is supported by a patched "
                             "model (padding or a custom mask was given)")


def _positions(cache_position, position_ids, past, module, B, S):
    if position_ids is not None:
        return position_ids.to(torch.int64).expand(B, S).contiguous()
    if cache_position is not None:
        return cache_position.to(torch.int64).view(1, S).expand(B, S).contiguous()
    start = past.get_seq_length(module.layer_idx) if past is not None else 0
    return torch.arange(start, start + S, dtype=torch.int64).view(1, S).expand(B, S).contiguous()


def _count_in(past, k, v, layer_idx, cache_position):
    """Keeps transformers' cache length right: rows of width 0 where the cache takes them, else the rows."""
    kwargs = {"cache_position": cache_position}
    k_t, v_t = k.transpose(1, 2), v.transpose(1, 2)  # [B, H, S, D], transformers' layout
    try:
        past.update(k_t[..., :0], v_t[..., :0], layer_idx, kwargs)
    except (RuntimeError, IndexError, ValueError):
        past.update(k_t, v_t, layer_idx, kwargs)
