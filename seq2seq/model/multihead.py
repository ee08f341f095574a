"""The multi-head attention layer: projections to heads, rotary positions, attention
(seq2seq.model.attention) and the output projection.

A self-attention layer holds one weight for its queries, keys and values, `wqkv_dn3h`,
and projects them in one matrix product; a cross-attention layer holds `wq_dnh` and one
weight for keys and values, `wkv_dn2h` (one product per source). Checkpoints and exports
of the earlier layout (`wq_dnh`, `wk_dnh`, `wv_dnh` in every layer) are converted when
they are read (seq2seq.model.upgrade).

Shapes: b=batch, t=query length, s=key length, n=heads, h=head dim, d=d_model; a 3 or 2
in a name is the axis of the projections fused (q, k, v or k, v).
"""

from __future__ import annotations

import jax
from flax import nnx

from seq2seq.errors import ConfigError
from seq2seq.model import flash
from seq2seq.model.attention import (
  FUSED_HEADS,
  HEADS,
  IMPLEMENTATIONS,
  SegmentMask,
  _zero_padding_queries,
  attention,
  explicit_attention,
  fused_flash_attention,
  implementation,
  single_query_attention,
)
from seq2seq.model.layers import biased, dense, param, rope, weight, xavier
from seq2seq.sharding import constrain

# A fused weight is [d, n, p, h] (p = 3: q, k, v; p = 2: k, v), heads before the projection
# axis. The tensor mesh axis splits heads, so each device holds whole q, k and v of its own
# heads; and `dense` flattens the output axes to one of n*p*h with heads major, which the same
# split divides into contiguous blocks. A [d, p, n, h] weight would leave q, k and v each in
# pieces across that flattened axis, for XLA to regather.
FUSED_AXES = ("embed", "heads", None, "kv")


class MultiHeadAttention(nnx.Module):
  """Projections to heads, optional rotary positions, attention, output projection.

  `query_key_value` (self-attention), `query` and `key_value` (cross-attention) and
  `attend` are exposed separately so the decoder can cache keys/values (self-attention)
  or compute them once per source (cross-attention).
  Keys get no bias: it would add the same q.b to every score of a query, which the
  softmax cancels, so its gradient is zero and Adam would only amplify rounding noise.
  `impl` is `config.model.attention_impl` (see `seq2seq.model.attention.attention`).
  A bias added to the scores (`bias_bnts`: relative positions, `RelativePositionBias`) is
  the caller's, held by the attention stack, not by the layer.
  """

  def __init__(self, d_model: int, num_heads: int, head_dim: int, *, use_bias: bool, dropout_rate: float,
               self_attention: bool = True, use_rope: bool = False, rope_base: float = 10000.0, impl: str = "auto",
               rngs: nnx.Rngs):
    if impl not in IMPLEMENTATIONS:
      raise ConfigError(f"config.model.attention_impl must be one of {IMPLEMENTATIONS}, got {impl!r}")
    # Each projection of a fused weight is initialised as a matrix of its own: fan-in d, fan-out n*h.
    fused = lambda p: param(rngs, xavier(0, (1, 3), batch_axis=2), (d_model, num_heads, p, head_dim), FUSED_AXES)
    shape_nh, axes_nh = (num_heads, head_dim), ("heads", "kv")
    self.self_attention, self.use_bias = self_attention, use_bias
    if self_attention:
      self.wqkv_dn3h = fused(3)
    else:
      self.wq_dnh = param(rngs, xavier(0, (1, 2)), (d_model, *shape_nh), ("embed", *axes_nh))
      self.wkv_dn2h = fused(2)
    self.wo_nhd = param(rngs, xavier((0, 1), 2), (*shape_nh, d_model), (*axes_nh, "embed"))
    if use_bias:
      zeros = nnx.initializers.zeros
      if self_attention:  # queries and values; keys have none
        self.bqv_n2h = param(rngs, zeros, (num_heads, 2, head_dim), ("heads", None, "kv"))
      else:
        self.bq_nh = param(rngs, zeros, shape_nh, axes_nh)
        self.bv_nh = param(rngs, zeros, shape_nh, axes_nh)
      self.bo_d = param(rngs, zeros, (d_model,), ("embed",))
    self.dropout_rate, self.use_rope, self.rope_base, self.impl = dropout_rate, use_rope, rope_base, impl
    self.record_weights = False  # True: keep the attention weights of each call (for plots)

  def _rope(self, x_btnh: jax.Array, positions_bt: jax.Array | None) -> jax.Array:
    return rope(x_btnh, positions_bt, self.rope_base) if self.use_rope else x_btnh

  def project_q(self, x_btd: jax.Array) -> jax.Array:
    """A cross-attention layer's queries [b, t, n, h] before their bias."""
    return constrain(dense(x_btd, weight(self.wq_dnh)), HEADS)

  def project_kv(self, x_bsd: jax.Array) -> jax.Array:
    """A cross-attention layer's keys and values [b, s, n, 2, h] before their biases: one matrix product."""
    return constrain(dense(x_bsd, weight(self.wkv_dn2h)), FUSED_HEADS)

  def project_qkv(self, x_btd: jax.Array) -> jax.Array:
    """A self-attention layer's queries, keys and values [b, t, n, 3, h] before their biases: one matrix product."""
    return constrain(dense(x_btd, weight(self.wqkv_dn3h)), FUSED_HEADS)

  def query(self, x_btd: jax.Array, positions_bt: jax.Array | None = None) -> jax.Array:
    """Queries [b, t, n, h] of a cross-attention layer."""
    q_btnh = self.project_q(x_btd)
    if self.use_bias:
      q_btnh = q_btnh + self.bq_nh[...].astype(x_btd.dtype)
    return self._rope(q_btnh, positions_bt)

  def key_value(self, x_bsd: jax.Array, positions_bs: jax.Array | None = None) -> tuple[jax.Array, jax.Array]:
    """Keys and values [b, s, n, h] of a cross-attention layer, from one matrix product."""
    kv_bsn2h = self.project_kv(x_bsd)
    k_bsnh, v_bsnh = kv_bsn2h[..., 0, :], kv_bsn2h[..., 1, :]
    if self.use_bias:
      v_bsnh = v_bsnh + self.bv_nh[...].astype(x_bsd.dtype)
    return self._rope(k_bsnh, positions_bs), v_bsnh

  def query_key_value(self, x_btd: jax.Array, positions_bt: jax.Array | None = None):
    """Queries, keys and values [b, t, n, h] of a self-attention layer, from one matrix product."""
    qkv_btn3h = self.project_qkv(x_btd)
    q_btnh, k_btnh, v_btnh = (qkv_btn3h[..., i, :] for i in range(3))
    if self.use_bias:
      b_n2h = self.bqv_n2h[...].astype(x_btd.dtype)
      q_btnh, v_btnh = q_btnh + b_n2h[:, 0], v_btnh + b_n2h[:, 1]
    return self._rope(q_btnh, positions_bt), self._rope(k_btnh, positions_bt), v_btnh

  def attend(self, q_btnh, k_bsnh, v_bsnh, mask: SegmentMask | jax.Array, rng: jax.Array | None = None,
             bias_bnts: jax.Array | None = None, *, out_bias: bool = True) -> jax.Array:
    """Attention then the output projection: [b, t, d]. `mask` and `bias_bnts` (an additive
    bias [1 or b, n, t, s], or None) as `attention` takes them; without the output bias if not
    `out_bias`."""
    if self.record_weights:  # kept as an nnx.Intermediate; see Transformer.cross_attention_weights
      mask_b1ts = mask.dense_b1ts() if isinstance(mask, SegmentMask) else mask
      ctx_btnh, weights_bnts = explicit_attention(q_btnh, k_bsnh, v_bsnh, mask_b1ts, dropout_rate=self.dropout_rate,
                                                  rng=rng, return_weights=True, bias_bnts=bias_bnts)
      ctx_btnh = _zero_padding_queries(ctx_btnh, mask)
      self.weights_bnts = nnx.Intermediate(weights_bnts)
    else:
      ctx_btnh = attention(q_btnh, k_bsnh, v_bsnh, mask, impl=self.impl, dropout_rate=self.dropout_rate, rng=rng,
                           bias_bnts=bias_bnts)
    return self._out(ctx_btnh, out_bias)

  def output_bias(self) -> jax.Array | None:
    """The bias of the output projection (None without biases)."""
    return self.bo_d[...] if self.use_bias else None

  def _out(self, ctx_btnh: jax.Array, out_bias: bool = True) -> jax.Array:
    """The output projection of attention's [b, t, n, h] (or [b, n, h]): [b, t, d] (or [b, d]),
    its bias added if `out_bias`."""
    y_btd = dense(ctx_btnh, weight(self.wo_nhd), contract=2)
    return biased(y_btd, self.output_bias()) if out_bias else y_btd

  def _fused_flash(self, x_btd, context_bsd, mask, rng, bias_bnts) -> jax.Array | None:
    """Attention [b, t, n, h] by the flash kernel reading q, k and v in place from the fused
    projections, their biases added as it reads them (`flash.Layout`): no slice of the
    projections' output and no bias pass before the kernel, no concatenation of the gradient
    after it. None where the flash kernel does not run (`attention.implementation`), or rotary
    positions or recorded weights need q and k themselves."""
    if (not flash.IN_PLACE or self.use_rope or self.record_weights or bias_bnts is not None
        or not isinstance(mask, SegmentMask)):
      return None
    layout = flash.SELF if self.self_attention else flash.CROSS
    choice = implementation(self.impl, dtype=x_btd.dtype, head_dim=self.wo_nhd.shape[1], q_len=x_btd.shape[1],
                            kv_len=context_bsd.shape[1], mask=mask, dropout=rng is not None and self.dropout_rate > 0,
                            layout=layout)
    if choice != "flash":
      return None
    if self.self_attention:
      arrays = (self.project_qkv(x_btd),)
      biases = (self.bqv_n2h[...][:, 0], self.bqv_n2h[...][:, 1]) if self.use_bias else ()
    else:
      arrays = (self.project_q(x_btd)[:, :, :, None, :], self.project_kv(context_bsd))
      biases = (self.bq_nh[...], self.bv_nh[...]) if self.use_bias else ()
    q_bias, v_bias = (b.astype(x_btd.dtype) for b in biases) if biases else (None, None)
    return fused_flash_attention(arrays, layout, mask, q_bias_nh=q_bias, v_bias_nh=v_bias)

  def attend_cached(self, q_bnh, k_bnsh, v_bnsh, mask_bns, bias_ns: jax.Array | None = None, *,
                    out_bias: bool = True) -> jax.Array:
    """`attend` for one decoding position over a heads-first cache: [b, d]. `bias_ns`: the
    additive bias [n, s] of this position's query over the cached keys, or None."""
    return self._out(single_query_attention(q_bnh, k_bnsh, v_bnsh, mask_bns, bias_ns), out_bias)

  def __call__(self, x_btd: jax.Array, context_bsd: jax.Array, mask: SegmentMask | jax.Array, *,
               positions_bt: jax.Array | None = None, context_positions_bs: jax.Array | None = None,
               rng: jax.Array | None = None, bias_bnts: jax.Array | None = None, out_bias: bool = True) -> jax.Array:
    """Attention of `x` over `context`; a self-attention layer takes x itself as context.
    `bias_bnts`: an additive bias [1 or b, n, t, s] on the scores, or None; without the output
    projection's bias if not `out_bias` (the caller adds it: `output_bias`)."""
    if self.self_attention and context_bsd is not x_btd:
      raise ValueError("a self-attention layer attends over its own input: pass x as the context")
    ctx_btnh = self._fused_flash(x_btd, context_bsd, mask, rng, bias_bnts)
    if ctx_btnh is not None:
      return self._out(ctx_btnh, out_bias)
    if self.self_attention:
      q_btnh, k_bsnh, v_bsnh = self.query_key_value(x_btd, positions_bt)
    else:
      q_btnh = self.query(x_btd, positions_bt)
      k_bsnh, v_bsnh = self.key_value(context_bsd, context_positions_bs)
    return self.attend(q_btnh, k_bsnh, v_bsnh, mask, rng, bias_bnts, out_bias=out_bias)
