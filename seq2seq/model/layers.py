"""Building blocks of the Transformer: parameters with logical axes, dropout,
embeddings, positions (sinusoidal / learned / RoPE / T5's relative bias), norms and
feed-forward.

Shapes are in the names: b=batch, t=target length, s=source length, d=d_model,
n=heads, h=head dim, f=feed-forward width, v=vocabulary.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence

import jax
import jax.numpy as jnp
from flax import nnx

from seq2seq.errors import ConfigError
from seq2seq.model import norm_kernels
from seq2seq.model.dropout import dropout
from seq2seq.sharding import constrain

# Logical axis names a parameter may carry; `seq2seq.sharding` maps them onto a mesh.
LOGICAL_AXES = ("vocab", "embed", "heads", "kv", "mlp", None)


def param(rngs: nnx.Rngs, init, shape: Sequence[int], axes: Sequence[str | None]) -> nnx.Param:
  """An f32 parameter annotated with one logical axis name per dimension."""
  if len(axes) != len(shape):
    raise ValueError(f"axes {axes} do not match shape {shape}")
  return nnx.Param(init(rngs.params(), tuple(shape), jnp.float32), axes=tuple(axes))


def weight(p: nnx.Param) -> jax.Array:
  """A parameter's value laid out for use: whole along `embed` (FSDP shards it at rest and
  gathers it here, once per use) and split along heads / mlp / vocab on the tensor axis."""
  return constrain(p[...], p.get_metadata()["axes"])


def xavier(in_axis, out_axis, batch_axis=()):
  """Glorot-uniform over the given fan-in / fan-out axes (Vaswani et al., fairseq); each
  index of `batch_axis` is a matrix of its own (the q, k, v of a fused projection)."""
  return nnx.initializers.variance_scaling(1.0, "fan_avg", "uniform", in_axis=in_axis, out_axis=out_axis,
                                           batch_axis=batch_axis)


class Embed(nnx.Module):
  """Token embedding scaled by sqrt(d_model); `attend` is the tied output projection."""

  def __init__(self, vocab_size: int, d_model: int, *, rngs: nnx.Rngs):
    init = nnx.initializers.normal(stddev=d_model**-0.5)
    self.embedding_vd = param(rngs, init, (vocab_size, d_model), ("vocab", "embed"))
    self.scale = math.sqrt(d_model)

  def __call__(self, tokens_bt: jax.Array, dtype) -> jax.Array:
    x_btd = jnp.take(weight(self.embedding_vd), tokens_bt, axis=0)
    return (x_btd * self.scale).astype(dtype)

  def attend(self, x_btd: jax.Array, out_dtype: str | None = None) -> jax.Array:
    """Logits against the embedding matrix, in f32 (or `out_dtype`, a dtype name)."""
    return tied_logits(x_btd, weight(self.embedding_vd).astype(x_btd.dtype), out_dtype)


def biased(y: jax.Array, bias: jax.Array | None) -> jax.Array:
  """y plus an output bias (None: y) in y's dtype."""
  return y if bias is None else y + bias.astype(y.dtype)


def residual_sum(residual: jax.Array, branch: jax.Array, bias: jax.Array | None, rate: float, rng) -> jax.Array:
  """residual + dropout(branch + bias, rate, rng): a residual block's add as XLA makes it (the norm
  kernels make the same, `Norm.add`)."""
  return residual + dropout(biased(branch, bias), rate, rng)


def dense(x: jax.Array, w: jax.Array, *, contract: int = 1, w_transposed: bool = False, out_dtype=None) -> jax.Array:
  """Contracts the last `contract` axes of x with w's leading ones (trailing ones when
  `w_transposed`), as one 2-D matrix product over x's flattened leading axes.

  Flat on purpose: the weight gradient is then x_mk^T g_mn, a 2-D product XLA:CPU runs
  on its operands in place. The same einsum over [b, t, ...] contracts two axes in the
  backward pass, and XLA first copies (transposes) the activations: single-threaded
  passes that took about 10% of a CPU train step.
  """
  lead, k = x.shape[:x.ndim - contract], math.prod(x.shape[x.ndim - contract:])
  w = w.astype(x.dtype)
  if w_transposed:  # w is [out..., in...]: [n, k]
    out, w_2d, w_axis = w.shape[:w.ndim - contract], w.reshape(-1, k), 1
  else:  # w is [in..., out...]: [k, n]
    out, w_2d, w_axis = w.shape[contract:], w.reshape(k, -1), 0
  y = jax.lax.dot_general(x.reshape(-1, k), w_2d, (((1,), (w_axis,)), ((), ())), preferred_element_type=out_dtype)
  return y.reshape(*lead, *out)


# Whether `dense_bias` adds a narrow product's bias to its f32 accumulator (in the matmul's
# epilogue on GPUs) or, off, to the rounded product in a pass of its own, as the layers did
# before (benchmarks/device_check.py's `ffn_bias_apart` variant times the two).
BIAS_IN_MATMUL = True


def dense_bias(x: jax.Array, w: jax.Array, b: jax.Array) -> jax.Array:
  """x @ w + b in x's dtype (w [k, n], b [n]). In a dtype narrower than f32 (bf16), the bias
  is added to the matmul's f32 accumulator and the sum rounded once (`_dense_bias_narrow`),
  which XLA's GPU compiler does in the matmul's epilogue: no pass of its own over the
  [tokens, n] product. In f32 it is `dense(x, w) + b`, as it was."""
  if jnp.promote_types(x.dtype, jnp.float32) == x.dtype or not BIAS_IN_MATMUL:
    return dense(x, w) + b.astype(x.dtype)
  return _dense_bias_narrow(x, w, b)


@jax.custom_vjp
def _dense_bias_narrow(x: jax.Array, w: jax.Array, b: jax.Array) -> jax.Array:
  """`dense_bias` for narrow x. JAX's own backward of the f32 sum would give the products'
  transposes an f32 cotangent and run them in f32; this one takes the gradient in x's dtype,
  as the unbiased product's backward does: dx = g w^T in x's dtype, dw = x^T g and db the sum
  of g over tokens, both accumulated in f32."""
  y = dense(x, w, out_dtype=jnp.float32) + b.astype(jnp.float32)
  return y.astype(x.dtype)


def _dense_bias_fwd(x, w, b):
  return _dense_bias_narrow(x, w, b), (x, w, b)


def _dense_bias_bwd(residuals, g):
  x, w, b = residuals
  g = g.astype(x.dtype)
  dx = dense(g, w, w_transposed=True)
  g_mn, x_mk = g.reshape(-1, g.shape[-1]), x.reshape(-1, x.shape[-1])
  wide = jnp.promote_types(w.dtype, jnp.float32)
  dw = jax.lax.dot_general(x_mk, g_mn, (((0,), (0,)), ((), ())), preferred_element_type=wide)
  db = jnp.sum(g_mn, axis=0, dtype=jnp.promote_types(b.dtype, jnp.float32))
  return dx, dw.astype(w.dtype), db.astype(b.dtype)


_dense_bias_narrow.defvjp(_dense_bias_fwd, _dense_bias_bwd)


@functools.partial(jax.custom_vjp, nondiff_argnums=(2,))
def tied_logits(x_btd: jax.Array, w_vd: jax.Array, out_dtype: str | None = None) -> jax.Array:
  """x @ w^T, accumulated in f32 and written in `out_dtype` (a dtype name; None: f32, or the
  activations' dtype if wider; "bfloat16": half the bytes of [tokens, vocab]). The backward
  pass casts the logit gradient to the activations' dtype once and takes the weight gradient
  as g^T x, which lands in w's [v, d] layout without a transpose."""
  dtype = jnp.promote_types(x_btd.dtype, jnp.float32) if out_dtype is None else jnp.dtype(out_dtype)
  return dense(x_btd, w_vd, w_transposed=True, out_dtype=dtype)


def _tied_logits_fwd(x_btd, w_vd, out_dtype):
  return tied_logits(x_btd, w_vd, out_dtype), (x_btd, w_vd)


def _tied_logits_bwd(out_dtype, residuals, g_btv):
  x_btd, w_vd = residuals
  g_btv = g_btv.astype(x_btd.dtype)
  dx_btd = dense(g_btv, w_vd)
  g_mv, x_md = g_btv.reshape(-1, g_btv.shape[-1]), x_btd.reshape(-1, x_btd.shape[-1])
  dw_vd = jax.lax.dot_general(g_mv, x_md, (((0,), (0,)), ((), ())),
                              preferred_element_type=jnp.promote_types(w_vd.dtype, jnp.float32))
  return dx_btd, dw_vd.astype(w_vd.dtype)


tied_logits.defvjp(_tied_logits_fwd, _tied_logits_bwd)


def sinusoidal(positions_bt: jax.Array, d_model: int) -> jax.Array:
  """Vaswani et al. position encodings, computed for any position: [b, t, d]."""
  half = d_model // 2
  inv_freq = jnp.exp(-math.log(10000.0) * jnp.arange(half, dtype=jnp.float32) / half)
  angles_btk = positions_bt[..., None].astype(jnp.float32) * inv_freq
  out = jnp.concatenate([jnp.sin(angles_btk), jnp.cos(angles_btk)], axis=-1)
  return jnp.pad(out, [(0, 0), (0, 0), (0, d_model - 2 * half)])


class LearnedPositions(nnx.Module):
  """A trained table of `max_len` position embeddings. It does not extend: a call whose
  positions may reach `max_len` is refused while tracing (`check`, from the longest
  position the call's shapes allow), and a position past the table that reached it
  anyway would give NaN (jnp.take's "fill"), never the last row again."""

  def __init__(self, max_len: int, d_model: int, *, rngs: nnx.Rngs):
    init = nnx.initializers.normal(stddev=d_model**-0.5)
    self.table_ld = param(rngs, init, (max_len, d_model), (None, "embed"))
    self.max_len = max_len

  def check(self, length: int, what: str) -> None:
    """Raises ConfigError unless positions 0 .. length - 1 (of `what`) are in the table."""
    if length > self.max_len:
      raise ConfigError(f"{what} reaches position {length - 1}, past the learned position table "
                        f"(config.model.max_len={self.max_len}): learned positions do not extend. Cut the "
                        f"input to {self.max_len} tokens, or train with config.model.max_len of at least {length}")

  def __call__(self, positions_bt: jax.Array, what: str = "a row") -> jax.Array:
    # Positions count tokens within a row's sentence (they restart per packed segment): each
    # is less than the row's width, the longest position a call can reach.
    self.check(positions_bt.shape[-1], f"{what} of {positions_bt.shape[-1]} tokens")
    return jnp.take(weight(self.table_ld), positions_bt, axis=0, mode="fill")


def relative_bucket(relative_ts: jax.Array, *, bidirectional: bool, num_buckets: int, max_distance: int) -> jax.Array:
  """T5's bucket (Raffel et al. 2020) of each relative position, key minus query: int32 in
  [0, num_buckets).

  Bidirectional: half the buckets for keys at or before the query, half for keys after
  it. Unidirectional (causal): all for keys at or before it; later keys share bucket 0
  with distance 0 (the mask hides them). Within a half of m buckets, distance d (>= 0)
  has its own bucket below m/2, then the log-spaced m/2 + floor(log(d / (m/2)) /
  log(max_distance / (m/2)) * m/2), at most m - 1: every distance from `max_distance`
  on shares the last bucket.
  """
  distance = -relative_ts  # how far the key lies before the query
  bucket = jnp.zeros_like(distance)
  if bidirectional:
    num_buckets //= 2
    bucket = jnp.where(distance < 0, num_buckets, 0)
    distance = jnp.abs(distance)
  else:
    distance = jnp.maximum(distance, 0)
  exact = num_buckets // 2
  # float32 and its epsilon as T5 computes it, so that d = m/2 * r^k lands on bucket m/2 + k
  ratio = jnp.maximum(distance, exact).astype(jnp.float32) / exact + jnp.finfo(jnp.float32).eps
  far = exact + (jnp.log(ratio) / math.log(max_distance / exact) * (num_buckets - exact)).astype(jnp.int32)
  return (bucket + jnp.where(distance < exact, distance, jnp.minimum(far, num_buckets - 1))).astype(jnp.int32)


class RelativePositionBias(nnx.Module):
  """A learned scalar per head and relative-position bucket (`relative_bucket`), added to
  the attention logits: T5's relative position bias. One serves a whole attention stack
  (the encoder's self-attention, or the decoder's), shared by its layers, as in T5 and
  T5X (T5 computes it in the first layer and passes it on), rather than one per layer:
  that is the published model (the same parameters: buckets x heads per stack), its bias
  [1 or b, n, t, s] is computed once per stack and pass instead of once per layer, and
  each layer's gradient trains the one table. Initialised as T5X does: N(0, 1 / heads)."""

  def __init__(self, num_heads: int, num_buckets: int, max_distance: int, *, bidirectional: bool,
               rngs: nnx.Rngs):
    init = nnx.initializers.normal(stddev=num_heads**-0.5)
    self.bias_rn = param(rngs, init, (num_buckets, num_heads), (None, "heads"))  # r = bucket
    self.num_buckets, self.max_distance, self.bidirectional = num_buckets, max_distance, bidirectional

  def __call__(self, q_positions_bt: jax.Array, k_positions_bs: jax.Array) -> jax.Array:
    """The f32 bias [b, n, t, s] of queries at `q_positions_bt` over keys at `k_positions_bs`
    (each [b or 1, ...]): a function of each pair's key - query position only. Packed rows
    pass each token's position within its sentence (pairs across sentences are masked)."""
    buckets_bts = relative_bucket(k_positions_bs[:, None, :] - q_positions_bt[:, :, None],
                                  bidirectional=self.bidirectional, num_buckets=self.num_buckets,
                                  max_distance=self.max_distance)
    bias_btsn = jnp.take(weight(self.bias_rn), buckets_bts, axis=0)
    return constrain(jnp.moveaxis(bias_btsn, -1, 1), ("batch", "heads", "length", None))


def rope(x_btnh: jax.Array, positions_bt: jax.Array, base: float = 10000.0) -> jax.Array:
  """Rotary position embedding (Su et al. 2021) on the last (head) dimension."""
  head_dim = x_btnh.shape[-1]
  half = head_dim // 2
  inv_freq = base ** (-jnp.arange(half, dtype=jnp.float32) / half)
  angles_bt1k = (positions_bt[..., None].astype(jnp.float32) * inv_freq)[:, :, None, :]
  sin, cos = jnp.sin(angles_bt1k), jnp.cos(angles_bt1k)
  x1, x2 = jnp.split(x_btnh.astype(jnp.float32), 2, axis=-1)
  out = jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)
  return out.astype(x_btnh.dtype)


class Norm(nnx.Module):
  """LayerNorm, RMSNorm or AdaNorm over the last axis, computed in f32.

  AdaNorm (Xu et al. 2019) has no gain or bias: z = C * (1 - k*y) * y with
  y the standardised input and the factor C(1 - k*y) detached from the gradient.
  `impl` (`config.model.norm_impl`): "auto" runs LayerNorm and RMSNorm in the Pallas kernels of
  seq2seq.model.norm_kernels where they apply (GPUs), "xla" always as written below.
  """

  KINDS = ("layernorm", "rmsnorm", "adanorm")

  def __init__(self, kind: str, d_model: int, *, eps: float = 1e-6, adanorm_k: float = 0.1,
               adanorm_c: float = 1.0, impl: str = "auto", rngs: nnx.Rngs):
    if kind not in self.KINDS:
      raise ConfigError(f"norm must be one of {self.KINDS}, got {kind!r}")
    self.kind, self.eps, self.k, self.c, self.impl = kind, eps, adanorm_k, adanorm_c, impl
    if kind in ("layernorm", "rmsnorm"):
      self.scale_d = param(rngs, nnx.initializers.ones, (d_model,), ("embed",))
    if kind == "layernorm":
      self.bias_d = param(rngs, nnx.initializers.zeros, (d_model,), ("embed",))

  def __call__(self, x_btd: jax.Array, copies: int = 1, with_input: bool = False):
    """The normalised x; `copies` > 1: that many references to it (a tuple), whose gradients the
    kernels add in their backward pass (`transformer.Fork`); `with_input`: x itself after them,
    whose gradient the backward kernel adds to its own (a pre-norm's residual path)."""
    if norm_kernels.chosen(self.impl, self.kind, x_btd.shape[-1], x_btd.dtype):  # GPUs: one pass each way
      bias_d = self.bias_d[...] if self.kind == "layernorm" else None
      return norm_kernels.fused_norm(x_btd, self.scale_d[...], bias_d, eps=self.eps, copies=copies,
                                     with_input=with_input)
    out = (self._xla(x_btd),) * copies + ((x_btd,) if with_input else ())
    return out if len(out) > 1 else out[0]

  def adds(self, residual_btd: jax.Array, *, rate: float, rng, pre: bool = False) -> bool:
    """Whether `add` makes the residual add inside the norm kernels (GPUs; `pre`: a pre-norm's)."""
    return (norm_kernels.chosen(self.impl, self.kind, residual_btd.shape[-1], residual_btd.dtype)
            and norm_kernels.adds(residual_btd.shape, rate, rng, pre=pre))

  def add(self, residual_btd: jax.Array, branch_btd: jax.Array, *, bias_d: jax.Array | None = None, rate: float,
          rng, copies: int = 1, with_input: bool = False):
    """self(x, copies, with_input) of x = residual + dropout(branch + bias, rate, rng) (`biased`):
    a residual add, made inside the norm kernels where they run (`norm_kernels.adds`): the sum is
    not read again (a post-norm's is not written either; `with_input`, a pre-norm's, hands it on),
    nor the branch's gradient taken through the dropout in a pass of its own, nor its bias added
    and its gradient summed in passes of their own."""
    if self.adds(residual_btd, rate=rate, rng=rng, pre=with_input):
      norm_bias_d = self.bias_d[...] if self.kind == "layernorm" else None
      return norm_kernels.fused_norm(residual_btd, self.scale_d[...], norm_bias_d, eps=self.eps, copies=copies,
                                     with_input=with_input, branch_btd=branch_btd, branch_bias_d=bias_d, rate=rate,
                                     rng=rng)
    return self(residual_sum(residual_btd, branch_btd, bias_d, rate, rng), copies=copies, with_input=with_input)

  def _xla(self, x_btd: jax.Array) -> jax.Array:
    x = x_btd.astype(jnp.float32)
    if self.kind == "rmsnorm":
      y = x * jax.lax.rsqrt(jnp.mean(x * x, axis=-1, keepdims=True) + self.eps)
      return (y * self.scale_d[...]).astype(x_btd.dtype)
    centred = x - jnp.mean(x, axis=-1, keepdims=True)
    y = centred * jax.lax.rsqrt(jnp.mean(centred * centred, axis=-1, keepdims=True) + self.eps)
    if self.kind == "layernorm":
      y = y * self.scale_d[...] + self.bias_d[...]
    else:
      y = jax.lax.stop_gradient(self.c * (1.0 - self.k * y)) * y
    return y.astype(x_btd.dtype)


# Feed-forward activations. Plain: act(x W_i) W_o. Gated (Shazeer 2020, "GLU Variants
# Improve Transformer"): (gate(x W_g) * x W_i) W_o, a third matrix; variants that compare
# them at equal parameters give gated ones 2/3 of the width
# (seq2seq.research.variants.glu_width).
PLAIN = {"relu": jax.nn.relu, "gelu": jax.nn.gelu, "swish": jax.nn.silu}  # swish = SiLU, x * sigmoid(x)
GATES = {"glu": jax.nn.sigmoid, "reglu": jax.nn.relu, "geglu": jax.nn.gelu, "swiglu": jax.nn.silu}


class FeedForward(nnx.Module):
  """Position-wise feed-forward: plain (relu, gelu, swish: two matrices) or gated (glu,
  reglu, geglu, swiglu: three)."""

  ACTIVATIONS = tuple(PLAIN) + tuple(GATES)

  def __init__(self, d_model: int, d_ff: int, activation: str, *, use_bias: bool,
               hidden_dropout: float, rngs: nnx.Rngs):
    if activation not in self.ACTIVATIONS:
      raise ConfigError(f"activation must be one of {self.ACTIVATIONS}, got {activation!r}")
    self.activation, self.hidden_dropout = activation, hidden_dropout
    self.gated = activation in GATES
    init = xavier(0, 1)
    self.wi_df = param(rngs, init, (d_model, d_ff), ("embed", "mlp"))
    if self.gated:
      self.wg_df = param(rngs, init, (d_model, d_ff), ("embed", "mlp"))
    self.wo_fd = param(rngs, init, (d_ff, d_model), ("mlp", "embed"))
    self.bi_f = param(rngs, nnx.initializers.zeros, (d_ff,), ("mlp",)) if use_bias else None
    self.bo_d = param(rngs, nnx.initializers.zeros, (d_model,), ("embed",)) if use_bias else None

  def output_bias(self) -> jax.Array | None:
    """The bias added to the output (None without biases)."""
    return None if self.bo_d is None else self.bo_d[...]

  def __call__(self, x_btd: jax.Array, rng: jax.Array | None, *, out_bias: bool = True) -> jax.Array:
    """The layer's output; without its output bias if not `out_bias` (the caller adds it)."""
    if self.bi_f is not None:
      h_btf = dense_bias(x_btd, weight(self.wi_df), self.bi_f[...])
    else:
      h_btf = dense(x_btd, weight(self.wi_df))
    if self.gated:
      h_btf = GATES[self.activation](dense(x_btd, weight(self.wg_df))) * h_btf
    else:
      h_btf = PLAIN[self.activation](h_btf)
    h_btf = dropout(constrain(h_btf, ("batch", "length", "mlp")), self.hidden_dropout, rng)
    y_btd = dense(h_btf, weight(self.wo_fd))
    return biased(y_btd, self.output_bias()) if out_bias else y_btd
