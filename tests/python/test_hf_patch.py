"""rotary.hf.patch on a stand-in of a transformers Llama: the modules, attribute names, forward contract
(transformers >= 4.48: position_embeddings, a 4-d causal mask, a cache object with update / get_seq_length,
cache_position) and greedy generation written out here in plain PyTorch, float64, because transformers is not
installable on these machines (the accelerator machine's check runs the real one). Checks: patched with the window
past the prompt, prefill and cached decode equal the unpatched model; with a small window, every step's logits
equal a float64 ReRoPE model (seed 004: distances past w count as w) recomputed from scratch; what is not supported
is refused by name."""
import math
import unittest

import torch

import rotary
import rotary.hf


class Config:
    model_type = "llama"

    def __init__(self, **kw):
        self.__dict__.update(kw)

    def to_dict(self):
        return dict(self.__dict__, model_type=self.model_type)


def rotate_half(x):
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


class Cache:  # transformers' DynamicCache, reduced to what the attention uses
    def __init__(self):
        self.keys, self.values = {}, {}

    def update(self, k, v, layer_idx, cache_kwargs=None):
        if layer_idx in self.keys:
            k = torch.cat([self.keys[layer_idx], k], dim=-2)
            v = torch.cat([self.values[layer_idx], v], dim=-2)
        self.keys[layer_idx], self.values[layer_idx] = k, v
        return k, v

    def get_seq_length(self, layer_idx=0):
        return self.keys[layer_idx].shape[-2] if layer_idx in self.keys else 0


class LlamaAttention(torch.nn.Module):
    def __init__(self, config, layer_idx, rerope_window=0):
        super().__init__()
        self.config, self.layer_idx, self.rerope_window = config, layer_idx, rerope_window
        self.head_dim = config.hidden_size // config.num_attention_heads
        H, Hkv, D = config.num_attention_heads, config.num_key_value_heads, self.head_dim
        self.q_proj = torch.nn.Linear(config.hidden_size, H * D, bias=False, dtype=torch.float64)
        self.k_proj = torch.nn.Linear(config.hidden_size, Hkv * D, bias=False, dtype=torch.float64)
        self.v_proj = torch.nn.Linear(config.hidden_size, Hkv * D, bias=False, dtype=torch.float64)
        self.o_proj = torch.nn.Linear(H * D, config.hidden_size, bias=False, dtype=torch.float64)

    def forward(self, hidden_states, position_embeddings, attention_mask, past_key_values=None, cache_position=None,
                **kwargs):
        B, S, _ = hidden_states.shape
        shape = (B, S, -1, self.head_dim)
        q = self.q_proj(hidden_states).view(shape).transpose(1, 2)
        k = self.k_proj(hidden_states).view(shape).transpose(1, 2)
        v = self.v_proj(hidden_states).view(shape).transpose(1, 2)
        cos, sin = position_embeddings
        if self.rerope_window:  # the float64 ReRoPE reference: no cache, distances clipped at w
            return self.o_proj(self.rerope(q, k, v, cos.shape[1]).transpose(1, 2).reshape(B, S, -1)), None
        q = q * cos.unsqueeze(1) + rotate_half(q) * sin.unsqueeze(1)
        k = k * cos.unsqueeze(1) + rotate_half(k) * sin.unsqueeze(1)
        if past_key_values is not None:
            k, v = past_key_values.update(k, v, self.layer_idx, {"cache_position": cache_position})
        groups = q.shape[1] // k.shape[1]
        k, v = k.repeat_interleave(groups, 1), v.repeat_interleave(groups, 1)
        scores = q @ k.transpose(-1, -2) / math.sqrt(self.head_dim) + attention_mask
        return self.o_proj((scores.softmax(-1) @ v).transpose(1, 2).reshape(B, S, -1)), None

    def rerope(self, q, k, v, S):
        inv = 1.0 / (self.config.rope_theta ** (torch.arange(0, self.head_dim, 2, dtype=torch.float64)
                                                / self.head_dim))
        groups = q.shape[1] // k.shape[1]
        k, v = k.repeat_interleave(groups, 1), v.repeat_interleave(groups, 1)
        out = torch.zeros_like(q)
        for i in range(S):
            d = (i - torch.arange(i + 1)).clamp(max=self.rerope_window).double()  # distances to keys 0..i
            ang = d[:, None] * inv
            c, s = torch.cat([ang.cos()] * 2, -1), torch.cat([ang.sin()] * 2, -1)
            qi = q[:, :, i:i + 1]  # turned by each distance: q . R(d) k = (R(-d)... ) written as R(d) on q
            q_turned = qi * c + rotate_half(qi) * s  # [B, H, i+1, D]
            scores = (q_turned * k[:, :, :i + 1]).sum(-1) / math.sqrt(self.head_dim)
            out[:, :, i] = (scores.softmax(-1).unsqueeze(-1) * v[:, :, :i + 1]).sum(-2)
        return out


class TinyLlama(torch.nn.Module):
    def __init__(self, rerope_window=0, seed=0):
        super().__init__()
        torch.manual_seed(seed)
        self.config = Config(hidden_size=64, num_attention_heads=4, num_key_value_heads=2, num_hidden_layers=2,
                             rope_theta=10000.0, max_position_embeddings=64, vocab_size=50)
        c = self.config
        self.embed = torch.nn.Embedding(c.vocab_size, c.hidden_size, dtype=torch.float64)
        self.layers = torch.nn.ModuleList(LlamaAttention(c, i, rerope_window) for i in range(c.num_hidden_layers))
        self.head = torch.nn.Linear(c.hidden_size, c.vocab_size, bias=False, dtype=torch.float64)

    def forward(self, tokens, past_key_values=None, cache_position=None):
        S = tokens.shape[1]
        if cache_position is None:
            cache_position = torch.arange(S)
        D = self.config.hidden_size // self.config.num_attention_heads
        inv = 1.0 / (self.config.rope_theta ** (torch.arange(0, D, 2, dtype=torch.float64) / D))
        if self.layers[0].rerope_window:
            cache_position = torch.arange(S)  # the reference recomputes the whole sequence
        f = cache_position.double()[:, None] * inv
        emb = torch.cat([f, f], -1)
        pe = (emb.cos()[None], emb.sin()[None])
        k_len = int(cache_position[-1]) + 1
        mask = torch.full((S, k_len), float("-inf"), dtype=torch.float64)
        mask = torch.triu(mask, diagonal=k_len - S + 1)[None, None]
        h = self.embed(tokens)
        for layer in self.layers:
            h = h + layer(torch.tanh(h), pe, mask, past_key_values=past_key_values, cache_position=cache_position)[0]
        return self.head(h)


def greedy(model, prompt, steps):
    """Logits of the prompt's last token and of each generated one, with a cache as transformers' generate does."""
    cache = Cache()
    logits = model(prompt, cache, torch.arange(prompt.shape[1]))[:, -1]
    out, tokens = [logits], prompt
    for _ in range(steps):
        nxt = logits.argmax(-1, keepdim=True)
        tokens = torch.cat([tokens, nxt], 1)
        logits = model(nxt, cache, torch.tensor([tokens.shape[1] - 1]))[:, -1]
        out.append(logits)
    return torch.stack(out, 1), tokens


def reference_steps(model, tokens, prompt_len):
    """The reference model recomputed from scratch at each step (no cache)."""
    return torch.stack([model(tokens[:, :n])[:, -1] for n in range(prompt_len, tokens.shape[1] + 1)], 1)


class HfPatchTest(unittest.TestCase):
    def test_window_past_the_sequence_equals_the_unpatched_model(self):
        prompt = torch.randint(0, 50, (2, 9), generator=torch.Generator().manual_seed(1))
        want, tokens = greedy(TinyLlama(), prompt, 5)
        for method in ("rerope", "leaky_rerope", "rope"):
            patched = rotary.hf.patch(TinyLlama(), method=method, window=64)
            got, got_tokens = greedy(patched, prompt, 5)
            self.assertTrue(torch.equal(got_tokens, tokens), method)
            self.assertLess((got - want).abs().max().item(), 1e-10, method)

    def test_rerope_logits_equal_a_float64_rerope_model(self):
        prompt = torch.randint(0, 50, (1, 12), generator=torch.Generator().manual_seed(2))
        patched = rotary.hf.patch(TinyLlama(), method="rerope", window=3)
        got, tokens = greedy(patched, prompt, 6)
        reference = TinyLlama(rerope_window=3)  # the same weights (same seed)
        want = reference_steps(reference, tokens, prompt.shape[1])
        self.assertLess((got - want).abs().max().item(), 1e-10)
        plain, _ = greedy(TinyLlama(), prompt, 6)
        self.assertGreater((got - plain).abs().max().item(), 1e-3)  # ReRoPE differs from RoPE past the window

    def test_what_is_not_supported_is_refused_by_name(self):
        class Other(TinyLlama):
            pass
        other = Other()
        other.config.model_type = "gpt2"
        with self.assertRaises(ValueError) as caught:
            rotary.hf.patch(other)
        self.assertIn("model_type", str(caught.exception))
        with self.assertRaises(ValueError) as caught:
            rotary.hf.patch(TinyLlama(), method="alibi")
        self.assertIn("method", str(caught.exception))
        patched = rotary.hf.patch(TinyLlama(), window=4)
        layer = patched.layers[0]
        h = torch.randn(1, 3, 64, dtype=torch.float64)
        with self.assertRaises(ValueError) as caught:
            layer(h, None, torch.tensor([[1, 1, 0]]), past_key_values=None, cache_position=torch.arange(3))
        self.assertIn("attention_mask", str(caught.exception))
        with self.assertRaises(ValueError) as caught:
            layer(h, None, None, past_key_values=Cache(), cache_position=torch.arange(5, 8))
        self.assertIn("cache_position", str(caught.exception))


if __name__ == "__main__":
    unittest.main()
