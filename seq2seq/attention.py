"""Multi-head scaled dot-product attention: masks, the attention core, and the module
used for encoder self-attention, causal (cached) decoder self-attention and
cross-attention.

Shapes: b=batch, t=query length, s=key length, n=heads, h=head dim, d=d_model.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from seq2seq.layers import dense, dropout, param, rope, xavier


def attention_mask(q_segments_bt: jax.Array, k_segments_bs: jax.Array, *, causal: bool = False) -> jax.Array:
  """Boolean mask [b, 1, t, s]: True where query t may attend to key s.

  Segment ids mark which sentence a token belongs to (0 = padding). Without packing
  they are simply `tokens != pad`. A query attends to non-pad keys of its own segment
  and, when `causal`, only to keys at or before its own index.
  """
  mask_bts = (q_segments_bt[:, :, None] == k_segments_bs[:, None, :]) & (k_segments_bs[:, None, :] != 0)
  if causal:
    t, s = q_segments_bt.shape[1], k_segments_bs.shape[1]
    mask_bts = mask_bts & (jnp.arange(t)[:, None] >= jnp.arange(s)[None, :])
  return mask_bts[:, None, :, :]


def explicit_attention(q_btnh: jax.Array, k_bsnh: jax.Array, v_bsnh: jax.Array, mask_b1ts: jax.Array,
                       *, dropout_rate: float = 0.0, rng: jax.Array | None = None, return_weights: bool = False):
  """softmax(q k^T / sqrt(h) + mask) v written out, with dropout on the attention weights
  (and the weights [b, n, t, s] themselves with `return_weights`)."""
  scale = q_btnh.shape[-1] ** -0.5
  softmax_dtype = jnp.promote_types(q_btnh.dtype, jnp.float32)  # f32 for bf16 inputs
  logits_bnts = jnp.einsum("btnh,bsnh->bnts", q_btnh, k_bsnh, preferred_element_type=softmax_dtype) * scale
  logits_bnts = jnp.where(mask_b1ts, logits_bnts, jnp.finfo(logits_bnts.dtype).min)
  weights_bnts = jax.nn.softmax(logits_bnts, axis=-1).astype(v_bsnh.dtype)
  dropped_bnts = dropout(weights_bnts, dropout_rate, rng)
  out_btnh = jnp.einsum("bnts,bsnh->btnh", dropped_bnts, v_bsnh)
  return (out_btnh, weights_bnts) if return_weights else out_btnh


def dot_product_attention(q_btnh: jax.Array, k_bsnh: jax.Array, v_bsnh: jax.Array, mask_b1ts: jax.Array,
                          *, dropout_rate: float = 0.0, rng: jax.Array | None = None) -> jax.Array:
  """softmax(q k^T / sqrt(h) + mask) v, per head: [b, t, n, h].

  Without attention dropout this is `jax.nn.dot_product_attention` (a fused kernel on
  GPU). Dropout on the attention weights needs the weights themselves, so it takes
  `explicit_attention`; both paths agree when no dropout is applied.
  """
  if rng is None or dropout_rate == 0.0:
    return jax.nn.dot_product_attention(q_btnh, k_bsnh, v_bsnh, mask=mask_b1ts)
  return explicit_attention(q_btnh, k_bsnh, v_bsnh, mask_b1ts, dropout_rate=dropout_rate, rng=rng)


def single_query_attention(q_bnh: jax.Array, k_cnsh: jax.Array, v_cnsh: jax.Array, mask_cns: jax.Array) -> jax.Array:
  """Attention of one query per row over cached keys/values stored heads-first ([c, n, s, h]):
  the layout a batched product reads without transposing the cache. The b = c * g query
  rows may share keys in groups of g consecutive rows (the beams of one sentence share its
  cross-attention keys), so shared keys are read once per group. Returns [b, n, h]."""
  (b, n, h), c = q_bnh.shape, k_cnsh.shape[0]
  q_cgnh = q_bnh.reshape(c, b // c, n, h)
  softmax_dtype = jnp.promote_types(q_bnh.dtype, jnp.float32)
  logits_cgns = jnp.einsum("cgnh,cnsh->cgns", q_cgnh, k_cnsh, preferred_element_type=softmax_dtype)
  logits_cgns = jnp.where(mask_cns[:, None], logits_cgns * h ** -0.5, jnp.finfo(softmax_dtype).min)
  weights_cgns = jax.nn.softmax(logits_cgns, axis=-1).astype(v_cnsh.dtype)
  return jnp.einsum("cgns,cnsh->cgnh", weights_cgns, v_cnsh).reshape(b, n, h)


class MultiHeadAttention(nnx.Module):
  """Projections to heads, optional rotary positions, attention, output projection.

  `query`, `key_value` and `attend` are exposed separately so the decoder can cache
  keys/values (self-attention) or compute them once per source (cross-attention).
  Keys get no bias: it would add the same q.b to every score of a query, which the
  softmax cancels, so its gradient is zero and Adam would only amplify rounding noise.
  """

  def __init__(self, d_model: int, num_heads: int, head_dim: int, *, use_bias: bool, dropout_rate: float,
               use_rope: bool = False, rope_base: float = 10000.0, rngs: nnx.Rngs):
    in_init, out_init = xavier(0, (1, 2)), xavier((0, 1), 2)
    shape_dnh, axes_dnh = (d_model, num_heads, head_dim), ("embed", "heads", "kv")
    self.wq_dnh = param(rngs, in_init, shape_dnh, axes_dnh)
    self.wk_dnh = param(rngs, in_init, shape_dnh, axes_dnh)
    self.wv_dnh = param(rngs, in_init, shape_dnh, axes_dnh)
    self.wo_nhd = param(rngs, out_init, (num_heads, head_dim, d_model), ("heads", "kv", "embed"))
    self.use_bias = use_bias
    if use_bias:
      zeros = nnx.initializers.zeros
      self.bq_nh = param(rngs, zeros, (num_heads, head_dim), ("heads", "kv"))
      self.bv_nh = param(rngs, zeros, (num_heads, head_dim), ("heads", "kv"))
      self.bo_d = param(rngs, zeros, (d_model,), ("embed",))
    self.dropout_rate, self.use_rope, self.rope_base = dropout_rate, use_rope, rope_base
    self.record_weights = False  # True: keep the attention weights of each call (for plots)

  def _project(self, x_btd, w, b):
    y_btnh = dense(x_btd, w[...])
    return y_btnh if b is None else y_btnh + b[...].astype(x_btd.dtype)

  def query(self, x_btd: jax.Array, positions_bt: jax.Array | None = None) -> jax.Array:
    q_btnh = self._project(x_btd, self.wq_dnh, self.bq_nh if self.use_bias else None)
    return rope(q_btnh, positions_bt, self.rope_base) if self.use_rope else q_btnh

  def key_value(self, x_bsd: jax.Array, positions_bs: jax.Array | None = None) -> tuple[jax.Array, jax.Array]:
    k_bsnh = self._project(x_bsd, self.wk_dnh, None)
    v_bsnh = self._project(x_bsd, self.wv_dnh, self.bv_nh if self.use_bias else None)
    if self.use_rope:
      k_bsnh = rope(k_bsnh, positions_bs, self.rope_base)
    return k_bsnh, v_bsnh

  def attend(self, q_btnh, k_bsnh, v_bsnh, mask_b1ts, rng: jax.Array | None = None) -> jax.Array:
    if self.record_weights:  # kept as an nnx.Intermediate; see Transformer.cross_attention_weights
      ctx_btnh, weights_bnts = explicit_attention(q_btnh, k_bsnh, v_bsnh, mask_b1ts, dropout_rate=self.dropout_rate,
                                                  rng=rng, return_weights=True)
      self.weights_bnts = nnx.Intermediate(weights_bnts)
    else:
      ctx_btnh = dot_product_attention(q_btnh, k_bsnh, v_bsnh, mask_b1ts, dropout_rate=self.dropout_rate, rng=rng)
    y_btd = dense(ctx_btnh, self.wo_nhd[...], contract=2)
    return y_btd + self.bo_d[...].astype(y_btd.dtype) if self.use_bias else y_btd

  def attend_cached(self, q_bnh, k_bnsh, v_bnsh, mask_bns) -> jax.Array:
    """`attend` for one decoding position over a heads-first cache: [b, d]."""
    ctx_bnh = single_query_attention(q_bnh, k_bnsh, v_bnsh, mask_bns)
    y_bd = dense(ctx_bnh, self.wo_nhd[...], contract=2)
    return y_bd + self.bo_d[...].astype(y_bd.dtype) if self.use_bias else y_bd

  def __call__(self, x_btd: jax.Array, context_bsd: jax.Array, mask_b1ts: jax.Array, *,
               positions_bt: jax.Array | None = None, context_positions_bs: jax.Array | None = None,
               rng: jax.Array | None = None) -> jax.Array:
    """Attention of `x` over `context` (pass x itself for self-attention)."""
    q_btnh = self.query(x_btd, positions_bt)
    k_bsnh, v_bsnh = self.key_value(context_bsd, context_positions_bs)
    return self.attend(q_btnh, k_bsnh, v_bsnh, mask_b1ts, rng)
