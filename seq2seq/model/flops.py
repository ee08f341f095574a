"""Model FLOPs of a train step (for MFU) and a matmul peak measured on this machine."""

from __future__ import annotations

import time

import jax
import jax.numpy as jnp

from seq2seq.model.config import ModelConfig


def forward_flops(cfg: ModelConfig, batch: int, src_len: int, tgt_len: int) -> float:
  """Matmul FLOPs (2 per multiply-add) of one forward pass on a padded [batch, len] batch."""
  d, hd, f, v = cfg.d_model, cfg.num_heads * cfg.head_size, cfg.d_ff, cfg.vocab_size
  ffn_mats = 3 if cfg.activation in ("glu", "reglu", "geglu", "swiglu") else 2  # gated: three matrices
  s, t = batch * src_len, batch * tgt_len
  proj = lambda tokens, n_mats: 2 * tokens * d * hd * n_mats
  scores = lambda q_len, k_len: 2 * 2 * batch * q_len * k_len * hd  # q k^T and weights v
  ffn = lambda tokens: 2 * tokens * d * f * ffn_mats
  encoder = cfg.num_encoder_layers * (proj(s, 4) + scores(src_len, src_len) + ffn(s))
  decoder = cfg.num_decoder_layers * (proj(t, 4) + scores(tgt_len, tgt_len) + proj(t, 2) + proj(s, 2)
                                      + scores(tgt_len, src_len) + ffn(t))
  return float(encoder + decoder + 2 * t * d * v)


def train_step_flops(cfg: ModelConfig, batch: int, src_len: int, tgt_len: int) -> float:
  """Forward plus backward (twice the forward): 3x the forward FLOPs."""
  return 3.0 * forward_flops(cfg, batch, src_len, tgt_len)


def measure_matmul_peak(n: int = 2048, repeats: int = 10) -> float:
  """FLOP/s of a plain f32 [n, n] x [n, n] matmul on the default device (best of `repeats`)."""
  a = jax.random.normal(jax.random.key(0), (n, n), jnp.float32)
  b = jax.random.normal(jax.random.key(1), (n, n), jnp.float32)
  matmul = jax.jit(lambda a, b: a @ b)
  matmul(a, b).block_until_ready()
  best = float("inf")
  for _ in range(repeats):
    start = time.perf_counter()
    matmul(a, b).block_until_ready()
    best = min(best, time.perf_counter() - start)
  return 2.0 * n**3 / best
