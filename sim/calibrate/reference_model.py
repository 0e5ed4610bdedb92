"""The reference GPT that ``trainsim validate`` trains for real and ``trainsim calibrate``
times at a tiny shape for the framework's per-kernel cost: plain PyTorch modules with the
kernels trainsim's workload lists for a GPT (``sim.program.workload``).
"""

from __future__ import annotations

from sim.inputs.model import ModelSpec


def reference_gpt(torch, model: ModelSpec, first: bool, last: bool, layers: int):
    """One pipeline stage of the reference GPT as a ``torch.nn.Module``: ``layers``
    pre-norm blocks (LayerNorm, QKV, causal ``scaled_dot_product_attention``, output
    projection, LayerNorm, GeLU MLP, residuals), the token and position embeddings on
    the ``first`` stage, the final norm and logit layer on the ``last``. Its forward
    takes token ids (first stage) or activations and returns activations or logits."""
    nn, F = torch.nn, torch.nn.functional
    h, bias = model.hidden_size, model.bias

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.ln1, self.ln2 = nn.LayerNorm(h), nn.LayerNorm(h)
            self.qkv = nn.Linear(h, 3 * h, bias=bias)
            self.proj = nn.Linear(h, h, bias=bias)
            self.up = nn.Linear(h, model.ffn_hidden_size, bias=bias)
            self.down = nn.Linear(model.ffn_hidden_size, h, bias=bias)

        def forward(self, x):
            b, s, _ = x.shape
            a, d = model.num_attention_heads, model.head_dim
            q, k, v = self.qkv(self.ln1(x)).view(b, s, 3, a, d).permute(2, 0, 3, 1, 4)
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            x = x + self.proj(y.transpose(1, 2).reshape(b, s, h))
            return x + self.down(F.gelu(self.up(self.ln2(x))))

    class Stage(nn.Module):
        def __init__(self):
            super().__init__()
            if first:
                self.tok = nn.Embedding(model.vocab_size, h)
                self.pos = nn.Embedding(model.max_position_embeddings, h)
            self.blocks = nn.ModuleList(Block() for _ in range(layers))
            if last:
                self.ln_f = nn.LayerNorm(h)
                self.out = nn.Linear(h, model.vocab_size, bias=False)

        def forward(self, x):
            if first:
                x = self.tok(x) + self.pos.weight[: x.shape[1]]
            for blk in self.blocks:
                x = blk(x)
            return self.out(self.ln_f(x)) if last else x

    return Stage()
