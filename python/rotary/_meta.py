"""Meta kernels of the rotary ops: the shapes, dtypes and strides of their outputs without running them, so that
tensors on the "meta" device (and torch.compile's fake tensors, which fall back to meta kernels) go through every
op. Registered on import through torch.library (torch >= 1.13); each mirrors the CPU kernel's allocation
(torch/src/*_op.cpp). tests/python/test_meta.py checks them against the CPU kernels' outputs."""
import torch

_lib = torch.library.Library("rotary", "IMPL")


def _register(name):
    def wrap(fn):
        _lib.impl(name, fn, "Meta")
        return fn
    return wrap


def _lse_dtype(q):
    return torch.float64 if q.dtype == torch.float64 else torch.float32


def _tokens(q):
    n = 1
    for s in q.shape[:-2]:
        n *= s
    return n


@_register("rope")
def _rope(x, positions, inv_freq, attention_factor, layout, direction):
    return torch.empty(x.shape, dtype=x.dtype, device="meta")


@_register("rope_table")
def _rope_table(x, cos, sin, rows, rotary_dim, layout, width, transpose):
    return torch.empty_like(x)  # the CPU kernel keeps x's strides (empty_like)


@_register("rope_table_")
def _rope_table_inplace(x, cos, sin, rows, rotary_dim, layout, width, transpose):
    return x


@_register("attention")
def _attention(q, k, v, positions, cu_seqlens, causal, softmax_scale, mode, inv_freq, attention_factor, layout,
               roper, window, leaky_k, logn_train_len, bias="none", alibi_slopes=None, t5_table=None,
               t5_num_buckets=32, t5_max_distance=128, t5_bidirectional=False):
    out = torch.empty(q.shape, dtype=q.dtype, device="meta")
    lse = torch.empty((_tokens(q), q.shape[-2]), dtype=_lse_dtype(q), device="meta")
    return out, lse


@_register("attention_backward")
def _attention_backward(dout, q, k, v, out, lse, positions, cu_seqlens, causal, softmax_scale, mode, inv_freq,
                        attention_factor, layout, roper, window, leaky_k, logn_train_len, bias="none",
                        alibi_slopes=None, t5_table=None, t5_num_buckets=32, t5_max_distance=128,
                        t5_bidirectional=False):
    dt5 = torch.empty_like(t5_table) if t5_table is not None else torch.empty((0,), dtype=q.dtype, device="meta")
    return (torch.empty(q.shape, dtype=q.dtype, device="meta"), torch.empty(k.shape, dtype=k.dtype, device="meta"),
            torch.empty(v.shape, dtype=v.dtype, device="meta"), dt5)


@_register("linear_attention")
def _linear_attention(q, k, v, positions, cu_seqlens, causal, inv_freq, attention_factor, layout,
                      feature_map="elu_plus_one"):
    return torch.empty((*q.shape[:-1], v.shape[-1]), dtype=q.dtype, device="meta")


@_register("linear_attention_backward")
def _linear_attention_backward(dout, q, k, v, positions, cu_seqlens, causal, inv_freq, attention_factor, layout,
                               feature_map="elu_plus_one"):
    return tuple(torch.empty(t.shape, dtype=t.dtype, device="meta") for t in (q, k, v))
