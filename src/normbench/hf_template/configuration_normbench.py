"""Configuration of a normbench decoder exported for Hugging Face transformers.

Written into the export directory by ``python -m normbench export``; it needs only
``transformers`` (never normbench). Every field is read from the trained model, not
from normbench's defaults: ``norm`` says which norm layer sits wherever ``blocks``
places one, ``blocks`` lists each block's placement (see modeling_normbench.py).
"""

from __future__ import annotations

from transformers import PretrainedConfig


class NormbenchConfig(PretrainedConfig):
    model_type = "normbench"

    def __init__(
        self,
        vocab_size: int = 256,
        hidden_size: int = 64,
        num_hidden_layers: int = 2,
        num_attention_heads: int = 4,
        intermediate_size: int = 192,
        max_position_embeddings: int = 64,
        position: str = "rope",  # rope | learned
        rope_theta: float = 10000.0,
        mlp: str = "swiglu",  # swiglu | gelu | relu
        bias: bool = False,  # biases of every Linear but the LM head
        dropout: float = 0.0,
        arch: str = "pre_ln",  # the normbench placement name (informational; `blocks` is what runs)
        norm: dict | None = None,  # {"kind" (norms_normbench.NORM_KINDS or none), "eps", "affine", "bias", ...}
        blocks: list | None = None,  # per block: {"attn", "mlp": sublayer, "qk_norm", "qk_width", "v_norm", ...}
        final_norm: bool = True,
        final_norm_spec: dict | None = None,  # the final norm where it differs from `norm` (else None)
        fixnorm: bool = False,  # unit-L2 embedding rows times sqrt(d); a tied head uses the unit rows
        norm_free: dict | None = None,  # rezero/fixup/tfixup: {"kind", "embed_mult"}; blocks without norms
        embed_norm: bool = False,
        embed_scale: bool = False,  # a learnable scalar times the embedding (DyT/Derf recipe)
        ngpt: dict | None = None,  # nGPT only: {"eps", "blocks": [{name: multiplier}], "sz": multiplier}
        tie_word_embeddings: bool = True,
        use_cache: bool = True,
        **kwargs,
    ):
        self.vocab_size = vocab_size
        self.hidden_size = hidden_size
        self.num_hidden_layers = num_hidden_layers
        self.num_attention_heads = num_attention_heads
        self.intermediate_size = intermediate_size
        self.max_position_embeddings = max_position_embeddings
        self.position = position
        self.rope_theta = rope_theta
        self.mlp = mlp
        self.bias = bias
        self.dropout = dropout
        self.arch = arch
        self.norm = norm or {"kind": "rmsnorm", "eps": 1e-6, "affine": True, "bias": False}
        sub = {"in_norm": True, "out_norm": False, "post_norm": False, "residual_after_norm": False, "alpha": 1.0}
        self.blocks = blocks or [{"attn": sub, "mlp": sub, "qk_norm": False, "v_norm": False}] * num_hidden_layers
        self.final_norm = final_norm
        self.final_norm_spec = final_norm_spec
        self.fixnorm = fixnorm
        self.norm_free = norm_free
        self.embed_norm = embed_norm
        self.embed_scale = embed_scale
        self.ngpt = ngpt
        self.tie_word_embeddings = tie_word_embeddings
        self.use_cache = use_cache
        super().__init__(**kwargs)
