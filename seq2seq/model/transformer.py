"""The encoder-decoder Transformer (Vaswani et al. 2017) and its variants, in Flax NNX.

API used by training and decoding:
  logits_btv = model(src_bs, tgt_in_bt, dropout_rng=key)        # teacher forcing
  enc_bsd = model.encode(src_bs)                                 # once per source
  cache = model.init_cache(enc_bsd, src_segments_bs, max_len)    # a DecoderState; cross K/V computed here
  logits_bv, cache = model.decode_step(tokens_b, cache)          # one target token

The decoder input starts with the bos id (`SPECIAL.bos`, seq2seq/special_tokens.py: the eos
id, as in fairseq). Segment ids (0 = padding) default to `tokens != SPECIAL.pad`; packed
batches pass their own segment ids and positions. `packed=False` promises every row is one
sentence then padding, which lets the GPU use cuDNN attention given sequence lengths
(seq2seq/model/attention.py); by default rows count as packed when segment ids are passed.
`dropout_rng=None` means evaluation (no dropout).

Positions (`config.model.positions`): sinusoidal or learned embeddings added to the inputs,
RoPE in every self-attention, or `relative`: T5's bucketed bias on the self-attention
scores (one `RelativePositionBias` per stack: bidirectional in the encoder, causal in the
decoder; cross-attention has none), from each token's position within its sentence. A
learned table does not extend: a call whose shapes allow a position at or past
config.model.max_len is refused while tracing (`LearnedPositions.check`).
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
from flax import nnx, struct

from seq2seq.model.attention import SegmentMask
from seq2seq.model.config import ModelConfig
from seq2seq.model.dropout import DropoutKeys, dropout, fold
from seq2seq.model.layers import (
  Embed,
  FeedForward,
  LearnedPositions,
  Norm,
  RelativePositionBias,
  dense,
  param,
  residual_sum,
  sinusoidal,
  weight,
)
from seq2seq.model.multihead import MultiHeadAttention
from seq2seq.sharding import constrain
from seq2seq.special_tokens import SPECIAL

# Module switch, read when a step is traced: False derives each dropout key by its own fold_in
# (a kernel each on a GPU), as before `DropoutKeys` (benchmarks/device_check.py's
# `dropout_keys_apart` variant times it).
DROPOUT_KEYS_AT_ONCE = True

RESIDUAL = ("batch", "length", "embed")  # logical axes of the residual stream [b, t, d]


@struct.dataclass
class DecoderState:
  """What a decoder keeps between steps, in two parts by what it belongs to: `rows` holds one
  entry per output row (beam search copies a sentence's to each of its k beams and reorders
  them with the beams), `sentences` one per sentence (what depends only on the source; the
  k beams of a sentence share it). The model's own (`init_cache`):
    rows: per decoder layer, {"k", "v"} self-attention keys/values [b*k, n, max_len, h]
    sentences: {"mask_bs": source positions that are not padding [b, s], "layers": per
      decoder layer, {"k", "v"} cross-attention keys/values [b, n, s, h]}
  A step may take g rows per sentence (g consecutive rows share a sentence's entries)."""

  index: jax.Array  # []: position of the token the next step takes
  rows: Any  # arrays [b*k, ...]: one per output row
  sentences: Any  # arrays [b, ...]: one per sentence


def _norm(cfg: ModelConfig, rngs: nnx.Rngs) -> Norm:
  return Norm(cfg.norm, cfg.d_model, eps=cfg.norm_eps, adanorm_k=cfg.adanorm_k, adanorm_c=cfg.adanorm_c,
              impl=cfg.norm_impl, rngs=rngs)


def _attention(cfg: ModelConfig, rngs: nnx.Rngs, *, self_attention: bool) -> MultiHeadAttention:
  return MultiHeadAttention(cfg.d_model, cfg.num_heads, cfg.head_size, use_bias=cfg.use_bias,
                            dropout_rate=cfg.attention_dropout_rate, self_attention=self_attention,
                            rope_base=cfg.rope_base, use_rope=self_attention and cfg.positions == "rope",
                            impl=cfg.attention_impl, rngs=rngs)


def _ffn(cfg: ModelConfig, rngs: nnx.Rngs) -> FeedForward:
  return FeedForward(cfg.d_model, cfg.d_ff, cfg.activation, use_bias=cfg.use_bias,
                     hidden_dropout=cfg.ffn_dropout_rate, rngs=rngs)


class Fork(NamedTuple):
  """A post-norm's output, the same array twice: one for the residual path, one for the next
  sublayer's input. Their gradients then reach the norm's backward apart, and on GPUs its kernel
  adds them as it reads them (seq2seq/model/norm_kernels.py); JAX would add them first, in an
  XLA pass of their own over [tokens, d] per norm (docs/scaling.md). `joined` ends a stack."""

  residual: jax.Array
  sublayer: jax.Array


class Pending(NamedTuple):
  """A pre-norm's residual add not made yet, residual + dropout(branch + bias, rate, rng): on GPUs
  the next norm's kernels make it (the next block's, which hands the sum on as the residual
  stream, or the stack's final norm), where XLA would write the sum in a kernel of its own for
  the norm to read, and take the branch's gradient through the dropout and sum its bias's in
  passes of their own (seq2seq/model/norm_kernels.py)."""

  residual: jax.Array
  branch: jax.Array  # the sublayer's output without its bias
  bias: jax.Array | None
  rate: float
  rng: Any

  def through(self, norm: Norm, **kwargs):
    """norm(the sum, **kwargs), the add made by its kernels where they run."""
    return norm.add(self.residual, self.branch, bias_d=self.bias, rate=self.rate, rng=self.rng, **kwargs)


def joined(x_btd) -> jax.Array:
  """The residual stream as one array (a `Fork`'s residual copy, a `Pending` add made in XLA)."""
  if isinstance(x_btd, Pending):
    return constrain(residual_sum(*x_btd), RESIDUAL)
  return x_btd.residual if isinstance(x_btd, Fork) else x_btd


def ended(x_btd, norm: Norm | None) -> jax.Array:
  """A stack's output: its residual stream, through its final norm (a pre-norm's) if it has one."""
  if norm is None:
    return joined(x_btd)
  return x_btd.through(norm) if isinstance(x_btd, Pending) else norm(joined(x_btd))


def residual(x_btd, sublayer, norm: Norm, *, pre: bool, rate: float, rng, bias=None):
  """Pre-norm: x + drop(f(norm(x))), as a `Pending` add where the next norm's kernels make it.
  Post-norm: norm(x + drop(f(x))), as a `Fork`. `sublayer(h, out_bias)` is f, or f less its
  output `bias` if not `out_bias`: where the kernels make the add (`Norm.adds`), they add the
  bias. The residual stream is split over the batch only (`sharding.ACTIVATION_RULES`)."""
  if pre:  # x handed on through the norm too: its two gradients meet in the norm's backward
    if isinstance(x_btd, Pending):  # the previous block's add, made here: its sum handed on
      h_btd, x_btd = x_btd.through(norm, with_input=True)
      x_btd = constrain(x_btd, RESIDUAL)
    else:
      h_btd, x_btd = norm(x_btd, with_input=True)
    if norm.adds(x_btd, rate=rate, rng=rng, pre=True):  # without `bias`, f adds its own (if it has one)
      return Pending(x_btd, sublayer(h_btd, bias is None), bias, rate, rng)
    return constrain(residual_sum(x_btd, sublayer(h_btd, True), None, rate, rng), RESIDUAL)
  x = x_btd if isinstance(x_btd, Fork) else Fork(x_btd, x_btd)
  in_kernels = bias is not None and norm.adds(x.residual, rate=rate, rng=rng)
  y_btd = norm.add(x.residual, sublayer(x.sublayer, not in_kernels), bias_d=bias if in_kernels else None, rate=rate,
                   rng=rng, copies=2)
  return Fork(*(constrain(y, RESIDUAL) for y in y_btd))


class EncoderLayer(nnx.Module):
  """Self-attention then feed-forward, each in a residual block."""

  def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
    self.self_attn = _attention(cfg, rngs, self_attention=True)
    self.ffn = _ffn(cfg, rngs)
    self.attn_norm, self.ffn_norm = _norm(cfg, rngs), _norm(cfg, rngs)
    self.pre, self.rate = cfg.norm_position == "pre", cfg.dropout_rate

  def __call__(self, x_bsd, mask: SegmentMask, positions_bs, rng, bias_bnss=None):
    def attn(h_bsd, out_bias):
      return self.self_attn(h_bsd, h_bsd, mask, positions_bt=positions_bs, context_positions_bs=positions_bs,
                            rng=fold(rng, 0), bias_bnts=bias_bnss, out_bias=out_bias)
    x_bsd = residual(x_bsd, attn, self.attn_norm, pre=self.pre, rate=self.rate, rng=fold(rng, 1),
                     bias=self.self_attn.output_bias())
    ffn = lambda h_bsd, out_bias: self.ffn(h_bsd, fold(rng, 2), out_bias=out_bias)
    return residual(x_bsd, ffn, self.ffn_norm, pre=self.pre, rate=self.rate, rng=fold(rng, 3),
                    bias=self.ffn.output_bias())


class DecoderLayer(nnx.Module):
  """Causal self-attention, cross-attention over the encoder output, feed-forward."""

  def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
    self.self_attn = _attention(cfg, rngs, self_attention=True)
    self.cross_attn = _attention(cfg, rngs, self_attention=False)
    self.ffn = _ffn(cfg, rngs)
    self.self_norm, self.cross_norm, self.ffn_norm = _norm(cfg, rngs), _norm(cfg, rngs), _norm(cfg, rngs)
    self.pre, self.rate = cfg.norm_position == "pre", cfg.dropout_rate

  def _cross_and_ffn(self, y_btd, cross, rng, cross_bias=None):
    y_btd = residual(y_btd, cross, self.cross_norm, pre=self.pre, rate=self.rate, rng=fold(rng, 3), bias=cross_bias)
    ffn = lambda h_btd, out_bias: self.ffn(h_btd, fold(rng, 4), out_bias=out_bias)
    return residual(y_btd, ffn, self.ffn_norm, pre=self.pre, rate=self.rate, rng=fold(rng, 5),
                    bias=self.ffn.output_bias())

  def __call__(self, y_btd, self_mask: SegmentMask, positions_bt, enc_bsd, cross_mask: SegmentMask, rng,
               self_bias_bntt=None):
    def self_attn(h_btd, out_bias):
      return self.self_attn(h_btd, h_btd, self_mask, positions_bt=positions_bt, context_positions_bs=positions_bt,
                            rng=fold(rng, 0), bias_bnts=self_bias_bntt, out_bias=out_bias)
    y_btd = residual(y_btd, self_attn, self.self_norm, pre=self.pre, rate=self.rate, rng=fold(rng, 1),
                     bias=self.self_attn.output_bias())
    cross = lambda h_btd, out_bias: self.cross_attn(h_btd, enc_bsd, cross_mask, rng=fold(rng, 2), out_bias=out_bias)
    return self._cross_and_ffn(y_btd, cross, rng, cross_bias=self.cross_attn.output_bias())

  def step(self, y_b1d, positions_b1, self_kv: dict, cross_kv: dict, index, cross_mask_bs, self_bias_nl=None):
    """One decoding position: writes this token's key/value into `self_kv` at `index`; returns
    the output and the new `self_kv`. Keys/values are heads-first, [b, n, length, h];
    `self_bias_nl` is the relative bias of position `index` over cache positions, or None."""
    new_kv = dict(self_kv)

    def self_attn(h_b1d, out_bias):
      q_b1nh, k_b1nh, v_b1nh = self.self_attn.query_key_value(h_b1d, positions_b1)
      q_bnh = q_b1nh[:, 0]
      for name, x_b1nh in (("k", k_b1nh), ("v", v_b1nh)):
        x_bn1h = jnp.swapaxes(x_b1nh, 1, 2).astype(self_kv[name].dtype)
        new_kv[name] = jax.lax.dynamic_update_slice(self_kv[name], x_bn1h, (0, 0, index, 0))
      mask_11l = (jnp.arange(self_kv["k"].shape[2]) <= index)[None, None, :]
      return self.self_attn.attend_cached(q_bnh, new_kv["k"], new_kv["v"], mask_11l, self_bias_nl, out_bias=out_bias)[:, None]

    y_b1d = residual(y_b1d, self_attn, self.self_norm, pre=self.pre, rate=self.rate, rng=None)

    def cross(h_b1d, out_bias):
      q_bnh = self.cross_attn.query(h_b1d)[:, 0]
      return self.cross_attn.attend_cached(q_bnh, cross_kv["k"], cross_kv["v"], cross_mask_bs[:, None, :],
                                           out_bias=out_bias)[:, None]

    return self._cross_and_ffn(y_b1d, cross, None), new_kv


class Transformer(nnx.Module):
  """Encoder-decoder Transformer with switchable norms, activations and positions."""

  def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
    self.cfg = cfg
    self.src_embed = Embed(cfg.vocab_size, cfg.d_model, rngs=rngs)
    self.tgt_embed = None if cfg.share_embeddings else Embed(cfg.vocab_size, cfg.d_model, rngs=rngs)
    learned = cfg.positions == "learned"
    self.src_positions = LearnedPositions(cfg.max_len, cfg.d_model, rngs=rngs) if learned else None
    self.tgt_positions = LearnedPositions(cfg.max_len, cfg.d_model, rngs=rngs) if learned else None
    # relative: one bias table per attention stack, shared by its layers (as T5; see RelativePositionBias)
    relative = lambda bidirectional: None if cfg.positions != "relative" else RelativePositionBias(
        cfg.num_heads, cfg.relative_buckets, cfg.relative_max_distance, bidirectional=bidirectional, rngs=rngs)
    self.encoder_bias, self.decoder_bias = relative(True), relative(False)
    self.encoder_layers = nnx.List([EncoderLayer(cfg, rngs=rngs) for _ in range(cfg.num_encoder_layers)])
    self.decoder_layers = nnx.List([DecoderLayer(cfg, rngs=rngs) for _ in range(cfg.num_decoder_layers)])
    pre = cfg.norm_position == "pre"
    self.encoder_norm = _norm(cfg, rngs) if pre else None
    self.decoder_norm = _norm(cfg, rngs) if pre else None
    init = nnx.initializers.normal(stddev=cfg.d_model**-0.5)
    self.output_dv = None if cfg.tie_output else param(rngs, init, (cfg.d_model, cfg.vocab_size), ("embed", "vocab"))

  # -- pieces ---------------------------------------------------------------------------
  def _embed(self, tokens_bt, positions_bt, embed: Embed, table: LearnedPositions | None, rng, what: str = "a row"):
    x_btd = embed(tokens_bt, self.cfg.compute_dtype)
    if self.cfg.positions == "sinusoidal":
      x_btd = x_btd + sinusoidal(positions_bt, self.cfg.d_model).astype(x_btd.dtype)
    elif self.cfg.positions == "learned":
      x_btd = x_btd + table(positions_bt, what).astype(x_btd.dtype)
    return constrain(dropout(x_btd, self.cfg.dropout_rate, rng), RESIDUAL)

  @staticmethod
  def _self_bias(table: RelativePositionBias | None, positions_bt, given: bool):
    """A self-attention stack's relative bias [b, n, t, t] (or [1, ...] when the positions
    are the default ones, the same in every row), or None without relative positions."""
    if table is None:
      return None
    positions_bt = positions_bt if given else positions_bt[:1]
    return table(positions_bt, positions_bt)

  def _defaults(self, tokens_bt, segments_bt, positions_bt):
    if segments_bt is None:
      segments_bt = (tokens_bt != SPECIAL.pad).astype(jnp.int32)
    if positions_bt is None:
      positions_bt = jnp.broadcast_to(jnp.arange(tokens_bt.shape[1], dtype=jnp.int32), tokens_bt.shape)
    return segments_bt, positions_bt

  @property
  def _tgt_embed(self) -> Embed:
    return self.src_embed if self.tgt_embed is None else self.tgt_embed

  def _features(self, y_btd):
    return ended(y_btd, self.decoder_norm)

  def output_projection(self) -> tuple[jax.Array, bool]:
    """(the vocabulary projection's weight, tied): [v, d], the target embedding, when tied;
    else [d, v]. What `seq2seq.training.loss.chunked_cross_entropy_sums` multiplies by."""
    if self.output_dv is None:
      return weight(self._tgt_embed.embedding_vd), True
    return weight(self.output_dv), False

  def _logits(self, y_btd, dtype: str = "float32"):
    y_btd = self._features(y_btd)
    if self.output_dv is None:
      logits_btv = self._tgt_embed.attend(y_btd, dtype)
    else:
      logits_btv = dense(y_btd, weight(self.output_dv), out_dtype=jnp.dtype(dtype))
    return constrain(logits_btv, ("batch", "length", "vocab"))

  # -- public API -----------------------------------------------------------------------
  def encode(self, src_bs, *, src_segments_bs=None, src_positions_bs=None, dropout_rng=None, packed=None):
    """Encoder output [b, s, d] in the compute dtype."""
    packed = src_segments_bs is not None if packed is None else packed
    given = src_positions_bs is not None
    src_segments_bs, src_positions_bs = self._defaults(src_bs, src_segments_bs, src_positions_bs)
    x_bsd = self._embed(src_bs, src_positions_bs, self.src_embed, self.src_positions, fold(dropout_rng, 0),
                        "a source row")
    mask = SegmentMask(src_segments_bs, src_segments_bs, packed=packed)
    bias_bnss = self._self_bias(self.encoder_bias, src_positions_bs, given)
    for i, layer in enumerate(self.encoder_layers):
      x_bsd = layer(x_bsd, mask, src_positions_bs, fold(dropout_rng, i + 1), bias_bnss)
    x_bsd = ended(x_bsd, self.encoder_norm)
    return x_bsd if self.encoder_norm is None else constrain(x_bsd, RESIDUAL)

  def decode(self, tgt_in_bt, enc_bsd, src_segments_bs, *, tgt_segments_bt=None, tgt_positions_bt=None,
             dropout_rng=None, packed=None, logits_dtype=None, project=True):
    """Teacher-forced decoder: logits [b, t, v] for every target position, in `logits_dtype`
    (default config.model.logits_dtype). `project=False`: the states [b, t, d] the vocabulary
    projection reads (after the final norm), for a loss that projects them in chunks."""
    packed = tgt_segments_bt is not None if packed is None else packed
    given = tgt_positions_bt is not None
    tgt_segments_bt, tgt_positions_bt = self._defaults(tgt_in_bt, tgt_segments_bt, tgt_positions_bt)
    y_btd = self._embed(tgt_in_bt, tgt_positions_bt, self._tgt_embed, self.tgt_positions, fold(dropout_rng, 0),
                        "a target row")
    self_mask = SegmentMask(tgt_segments_bt, tgt_segments_bt, causal=True, packed=packed)
    cross_mask = SegmentMask(tgt_segments_bt, src_segments_bs, packed=packed)
    bias_bntt = self._self_bias(self.decoder_bias, tgt_positions_bt, given)
    for i, layer in enumerate(self.decoder_layers):
      y_btd = layer(y_btd, self_mask, tgt_positions_bt, enc_bsd, cross_mask, fold(dropout_rng, i + 1), bias_bntt)
    if not project:
      return constrain(self._features(y_btd), RESIDUAL)
    return self._logits(y_btd, logits_dtype or self.cfg.logits_dtype)

  def __call__(self, src_bs, tgt_in_bt, *, src_segments_bs=None, tgt_segments_bt=None, src_positions_bs=None,
               tgt_positions_bt=None, dropout_rng=None, packed=None, project=True):
    """Logits [b, t, v] (f32) of the next target token at every position (`project=False`:
    the decoder's states [b, t, d] before the vocabulary projection; see `decode`)."""
    if packed is None:
      packed = src_segments_bs is not None or tgt_segments_bt is not None
    if src_segments_bs is None:
      src_segments_bs = (src_bs != SPECIAL.pad).astype(jnp.int32)
    dropout_rng = self._dropout_keys(dropout_rng)
    enc_bsd = self.encode(src_bs, src_segments_bs=src_segments_bs, src_positions_bs=src_positions_bs,
                          dropout_rng=fold(dropout_rng, 0), packed=packed)
    return self.decode(tgt_in_bt, enc_bsd, src_segments_bs, tgt_segments_bt=tgt_segments_bt,
                       tgt_positions_bt=tgt_positions_bt, dropout_rng=fold(dropout_rng, 1), packed=packed,
                       project=project)

  def _dropout_keys(self, key):
    """`key`'s dropout keys for every site, derived at once (`DropoutKeys`; a typed key, as
    the train step's): the stack (encoder 0, decoder 1), then the embedding (0) or a layer
    (1 + its index), then the layer's site (up to 6, a decoder layer's)."""
    if key is None or not DROPOUT_KEYS_AT_ONCE or not jax.dtypes.issubdtype(key.dtype, jax.dtypes.prng_key):
      return key
    layers = max(self.cfg.num_encoder_layers, self.cfg.num_decoder_layers)
    return DropoutKeys.derive(key, (2, layers + 1, 6))

  def cross_attention_weights(self, src_bs, tgt_in_bt) -> jax.Array:
    """Cross-attention weights [layers, b, n, t, s] of a teacher-forced pass (for plots)."""
    layers = [layer.cross_attn for layer in self.decoder_layers]
    for attn in layers:
      attn.record_weights = True
    try:
      self(src_bs, tgt_in_bt)
      weights = [attn.weights_bnts[...] for attn in layers]
    finally:
      for attn in layers:
        attn.record_weights = False
        if hasattr(attn, "weights_bnts"):
          del attn.weights_bnts
    return jnp.stack(weights)

  def init_cache(self, enc_bsd, src_segments_bs, max_decode_len: int) -> DecoderState:
    """Decoding state: empty self-attention K/V of `max_decode_len` per row, the cross K/V and
    the source mask per sentence. Keys/values are stored heads-first, [b, n, length, h], so
    each step reads them without a transpose. A learned position table must hold the
    `max_decode_len` positions (ConfigError otherwise)."""
    b, cfg = enc_bsd.shape[0], self.cfg
    if self.tgt_positions is not None:
      self.tgt_positions.check(max_decode_len, f"a decoding cache of {max_decode_len} positions")
    zeros = jnp.zeros((b, cfg.num_heads, max_decode_len, cfg.head_size), cfg.compute_dtype)
    cross = []
    for layer in self.decoder_layers:
      cross_k, cross_v = (jnp.swapaxes(x_bsnh, 1, 2) for x_bsnh in layer.cross_attn.key_value(enc_bsd))
      cross.append({"k": cross_k, "v": cross_v})
    return DecoderState(index=jnp.zeros((), jnp.int32), rows=[{"k": zeros, "v": zeros} for _ in cross],
                        sentences={"mask_bs": src_segments_bs != 0, "layers": cross})

  def decode_step(self, tokens_b, cache: DecoderState) -> tuple[jax.Array, DecoderState]:
    """Logits [b, v] (f32) for the token after `tokens_b`, which sits at `cache.index`.
    `cache.sentences` may hold one entry per group of g consecutive rows of `tokens_b`
    (beam search keeps one per sentence for its beams)."""
    index = cache.index
    tokens_b1 = tokens_b[:, None]
    positions_b1 = jnp.full(tokens_b1.shape, index, jnp.int32)
    y_b1d = self._embed(tokens_b1, positions_b1, self._tgt_embed, self.tgt_positions, None)
    length = cache.rows[0]["k"].shape[2] if cache.rows else 0  # index < length: the longest position
    if self.tgt_positions is not None:
      self.tgt_positions.check(length, f"a decoding cache of {length} positions")
    bias_nl = None  # relative positions: query `index` over keys 0 .. length - 1 (the mask hides later ones)
    if self.decoder_bias is not None:
      bias_nl = self.decoder_bias(index[None, None], jnp.arange(length, dtype=jnp.int32)[None])[0, :, 0]
    rows = []
    for layer, self_kv, cross_kv in zip(self.decoder_layers, cache.rows, cache.sentences["layers"]):
      y_b1d, self_kv = layer.step(y_b1d, positions_b1, self_kv, cross_kv, index, cache.sentences["mask_bs"],
                                  bias_nl)
      rows.append(self_kv)
    return self._logits(y_b1d)[:, 0], cache.replace(index=index + 1, rows=rows)


def abstract(cfg: ModelConfig) -> Transformer:
  """The model with shape-only parameters (nothing is allocated)."""
  return nnx.eval_shape(lambda: Transformer(cfg, rngs=nnx.Rngs(0)))


def graphdef(cfg: ModelConfig):
  """The model's static structure, which `nnx.merge` joins with parameters."""
  return nnx.graphdef(abstract(cfg))


def count_params(cfg: ModelConfig) -> int:
  """Number of parameters, from abstract shapes (nothing is allocated)."""
  return sum(int(v.size) for v in jax.tree.leaves(nnx.state(abstract(cfg), nnx.Param)))
