"""The model's settings as a frozen dataclass, checked and built from `config.model`."""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar

from seq2seq.errors import ConfigError
from seq2seq.special_tokens import SPECIAL

CHOICES = {
    "positions": ("sinusoidal", "learned", "rope", "relative"),
    "norm": ("layernorm", "rmsnorm", "adanorm"),
    "norm_position": ("pre", "post"),
    "activation": ("relu", "gelu", "swish", "glu", "reglu", "geglu", "swiglu"),  # see model/layers.py
    "dtype": ("float32", "bfloat16"),
    "logits_dtype": ("float32", "bfloat16"),
    "attention_impl": ("auto", "xla", "explicit", "cudnn", "flash", "splash"),  # see seq2seq/model/attention.py
    "norm_impl": ("auto", "xla", "pallas"),  # see seq2seq/model/norm_kernels.py
}


@dataclasses.dataclass(frozen=True)
class ModelConfig:
  """Hyper-parameters of the encoder-decoder Transformer (defaults: Vaswani et al. base)."""

  vocab_size: int
  d_model: int = 512
  num_heads: int = 8
  head_dim: int = 0  # 0: d_model // num_heads
  num_encoder_layers: int = 6
  num_decoder_layers: int = 6
  d_ff: int = 2048
  activation: str = "relu"
  norm: str = "layernorm"
  norm_position: str = "post"
  norm_eps: float = 1e-6
  adanorm_k: float = 0.1
  adanorm_c: float = 1.0
  positions: str = "sinusoidal"
  max_len: int = 256  # size of the learned position table
  rope_base: float = 10000.0
  relative_buckets: int = 32  # relative: buckets of key - query distances (T5's), per attention stack
  relative_max_distance: int = 128  # relative: distances from this on share the last bucket
  dropout_rate: float = 0.1  # residual branches and embeddings
  attention_dropout_rate: float = 0.0  # attention weights
  ffn_dropout_rate: float = 0.0  # feed-forward hidden layer
  share_embeddings: bool = True  # one embedding for source and target
  tie_output: bool = True  # output projection = target embedding^T
  use_bias: bool = True
  dtype: str = "float32"  # compute dtype; parameters are always float32
  # The teacher-forced logits' dtype (training, validation, scoring): bfloat16 halves the
  # traffic of the [tokens, vocab] logits and their gradient; the loss still sums in f32.
  # Decoding steps keep float32.
  logits_dtype: str = "float32"
  attention_impl: str = "auto"  # auto: cuDNN (GPU) / splash (TPU) where they apply, else XLA
  norm_impl: str = "auto"  # auto: the Pallas LayerNorm/RMSNorm kernels on GPUs where they apply, else XLA
  # Settings that are fields no more, with the one value they may still have: the tokenizer
  # fixes them. Runs written before have them in config.json and in their checkpoints' identity.
  RETIRED: ClassVar[dict[str, Any]] = {"pad_id": SPECIAL.pad}

  def __post_init__(self):
    for key, allowed in CHOICES.items():
      if getattr(self, key) not in allowed:
        raise ConfigError(f"config.model.{key} must be one of {allowed}, got {getattr(self, key)!r}")
    for key in ("vocab_size", "d_model", "num_heads", "d_ff", "max_len"):
      if getattr(self, key) <= 0:
        raise ConfigError(f"config.model.{key} must be positive, got {getattr(self, key)}")
    if self.relative_buckets < 4 or self.relative_max_distance <= self.relative_buckets // 2:
      raise ConfigError(f"config.model.relative_buckets must be at least 4 and config.model.relative_max_distance "
                        f"more than half of it (the exact buckets), got {self.relative_buckets} and "
                        f"{self.relative_max_distance}")
    if self.positions == "relative" and self.attention_impl in ("cudnn", "flash", "splash"):
      raise ConfigError(f"config.model.attention_impl={self.attention_impl!r} takes no additive attention bias, which "
                        "config.model.positions='relative' adds to the scores: use 'auto', 'xla' or 'explicit'")
    if self.norm_impl == "pallas" and self.norm == "adanorm":
      raise ConfigError("config.model.norm_impl='pallas' computes layernorm and rmsnorm, not adanorm: use 'auto' or 'xla'")
    if self.head_dim == 0 and self.d_model % self.num_heads:
      raise ConfigError(f"config.model.d_model={self.d_model} is not divisible by num_heads={self.num_heads};"
                       " set config.model.head_dim")
    if self.positions == "rope" and self.head_size % 2:
      raise ConfigError(f"rope needs an even head dimension, got {self.head_size}")
    for key in ("dropout_rate", "attention_dropout_rate", "ffn_dropout_rate"):
      if not 0.0 <= getattr(self, key) < 1.0:
        raise ConfigError(f"config.model.{key} must be in [0, 1), got {getattr(self, key)}")

  @property
  def head_size(self) -> int:
    return self.head_dim or self.d_model // self.num_heads

  @property
  def compute_dtype(self):
    import jax.numpy as jnp  # here: the settings themselves load without JAX (a command's --help)

    return jnp.dtype(self.dtype)

  @classmethod
  def from_config(cls, model_cfg: Any, vocab_size: int) -> ModelConfig:
    """Builds from the `config.model` section (a ConfigDict or dict); unknown keys are errors,
    and so are retired ones (RETIRED) with another value than the one they must have."""
    values = dict(model_cfg.items())
    for key, fixed in cls.RETIRED.items():
      if key in values and values.pop(key) != fixed:
        raise ConfigError(f"config.model.{key} is not a setting any more: the tokenizer fixes it at {fixed} "
                          "(seq2seq/special_tokens.py); remove it from the config")
    known = {f.name for f in dataclasses.fields(cls)} - {"vocab_size"}
    unknown = sorted(set(values) - known)
    if unknown:
      raise ConfigError(f"unknown key(s) config.model.{', config.model.'.join(unknown)}; known: {sorted(known)}")
    return cls(vocab_size=vocab_size, **values)
