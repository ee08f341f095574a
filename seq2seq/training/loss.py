"""Label-smoothed cross entropy over non-pad target tokens, and the metrics derived from it."""

from __future__ import annotations

import contextlib
import contextvars
import functools

import jax
import jax.numpy as jnp

from seq2seq import sharding
from seq2seq.model.layers import dense
from seq2seq.training import loss_kernel

# The longest block of the vocabulary one reduction loop sums (a variadic reduction may add
# element by element, as XLA:CPU's does): short enough that rounding stays that of a tree sum.
MAX_BLOCK = 512


def vocab_blocks(vocab: int) -> tuple[int, int]:
  """(blocks, block length) that `_token_stats` splits `vocab` entries into: blocks of at most
  MAX_BLOCK, as few as possible (up to twice that) that divide it, else equal ones with the
  last padded."""
  fewest = -(-vocab // MAX_BLOCK)
  for g in range(fewest, 2 * fewest + 1):
    if vocab % g == 0:
      return g, vocab // g
  return fewest, -(-vocab // fewest)


def _vocab_shards(shape) -> int:
  """Devices the vocabulary axis of logits [b, t, v] is split over (sharding.ACTIVATION_RULES)."""
  mesh = sharding.current_mesh()
  if mesh is None or mesh.size == 1:
    return 1
  spec = sharding.activation_spec(("batch", "length", "vocab"), shape, mesh)
  return mesh.shape["tensor"] if spec[2] == "tensor" else 1


def _add_exp(x, y):
  """Combines (max, sum of exp(logit - max), label logit, sum) of two parts of a row, with one
  exp: the part with the smaller max has its exp-sum rescaled to the larger."""
  (max_x, sumexp_x, label_x, total_x), (max_y, sumexp_y, label_y, total_y) = x, y
  x_larger = max_x >= max_y
  high, low = jnp.where(x_larger, max_x, max_y), jnp.where(x_larger, max_y, max_x)
  sumexp = jnp.where(x_larger, sumexp_x, sumexp_y) + jnp.where(x_larger, sumexp_y, sumexp_x) * jnp.exp(low - high)
  return high, sumexp, label_x + label_y, total_x + total_y


def label_logits(logits_btv: jax.Array, labels_bt: jax.Array) -> jax.Array:
  """logits[b, t, labels[b, t]]: a gather batched over (b, t). With the vocabulary split over
  devices each gathers from its part and one [b, t] sum combines them (the `take_along_axis`
  gather's [b, t, 1] result is what crosses devices otherwise)."""
  dims = jax.lax.GatherDimensionNumbers(offset_dims=(), collapsed_slice_dims=(2,), start_index_map=(2,),
                                        operand_batching_dims=(0, 1), start_indices_batching_dims=(0, 1))
  return jax.lax.gather(logits_btv, labels_bt[..., None], dims, (1, 1, 1), mode=jax.lax.GatherScatterMode.CLIP)


def _stats_in_passes(logits_btv: jax.Array, labels_bt: jax.Array):
  """(max, log-sum-exp, label logit, sum) over the vocabulary in three reductions and a
  gather. XLA:CPU runs each of these reductions vectorized on all cores, but a variadic one
  element by element (on [2048, 8000] logits, 9 ms here and 200 ms in one pass), and fuses
  no select into them (a masked label sum writes [b, t, v] first)."""
  max_bt = jnp.max(logits_btv, axis=-1)
  lse_bt = max_bt + jnp.log(jnp.sum(jnp.exp(logits_btv - max_bt[..., None]), axis=-1))
  return max_bt, lse_bt, label_logits(logits_btv, labels_bt), jnp.sum(logits_btv, axis=-1)


def _stats_in_one_pass(logits_btv: jax.Array, labels_bt: jax.Array):
  """(max, log-sum-exp, label logit, sum) over the vocabulary, reading the logits once.

  One variadic reduction carries an online softmax (Milakov & Gimelshein 2018), the masked
  label sum and the sum. It runs within blocks of the vocabulary, then across them. With the
  vocabulary split over the tensor axis each device reduces its own blocks, and only
  per-token values cross devices (all-reduces of [b, t]).
  """
  b, t, v = logits_btv.shape
  u = _vocab_shards(logits_btv.shape)  # the vocabulary as [u devices, g blocks, e entries]
  per_device = v // u
  g, e = vocab_blocks(per_device)
  x_btuv = sharding.constrain(logits_btv.reshape(b, t, u, per_device), ("batch", "length", "vocab", None))
  vocab_uv = jnp.arange(v, dtype=labels_bt.dtype).reshape(u, per_device)
  label_btuv = jnp.where(labels_bt[..., None, None] == vocab_uv, x_btuv, 0.0)

  def blocks(x_btuv, fill: float):  # [b, t, u, v / u] -> [b, t, u, g, e], the last block padded with `fill`
    if g * e > per_device:
      x_btuv = jnp.pad(x_btuv, [(0, 0)] * 3 + [(0, g * e - per_device)], constant_values=fill)
    return x_btuv.reshape(b, t, u, g, e)

  lowest = float(jnp.finfo(x_btuv.dtype).min)  # padding: no weight in the max or the sums
  operands = (blocks(x_btuv, lowest), blocks(jnp.ones_like(x_btuv), 0.0), blocks(label_btuv, 0.0),
              blocks(x_btuv, 0.0))
  inits = tuple(jnp.array(i, x_btuv.dtype) for i in (lowest, 0.0, 0.0, 0.0))
  max_btug, sumexp_btug, label_btug, total_btug = jax.lax.reduce(operands, inits, _add_exp, (4,))
  max_bt = jnp.max(max_btug, axis=(2, 3))
  sumexp_bt = jnp.sum(sumexp_btug * jnp.exp(max_btug - max_bt[..., None, None]), axis=(2, 3))
  return max_bt, max_bt + jnp.log(sumexp_bt), jnp.sum(label_btug, axis=(2, 3)), jnp.sum(total_btug, axis=(2, 3))


STATS = {"passes": _stats_in_passes, "one_pass": _stats_in_one_pass}


def _token_stats(logits_btv: jax.Array, labels_bt: jax.Array, impl: str):
  """(max, log-sum-exp, label logit, sum) over the vocabulary. `impl` "auto": in passes where
  the program runs on a CPU, in one pass elsewhere (GPU, TPU: the logits are read once, not
  three times)."""
  if impl == "auto":
    return jax.lax.platform_dependent(logits_btv, labels_bt, cpu=_stats_in_passes, default=_stats_in_one_pass)
  if impl not in STATS:
    raise ValueError(f"loss impl {impl!r}: expected 'auto' or one of {sorted(STATS)}")
  return STATS[impl](logits_btv, labels_bt)


@functools.partial(jax.custom_vjp, nondiff_argnums=(2, 3))
def _xent(logits_btv: jax.Array, labels_bt: jax.Array, eps: float, impl: str):
  """Per-token (smoothed loss, NLL, correct) of logits; `impl` as `_token_stats`."""
  return _xent_fwd(logits_btv, labels_bt, eps, impl)[0]


def _f32(x):
  return x.astype(jnp.promote_types(x.dtype, jnp.float32))  # bf16 -> f32, inside the fusion that reads x


def _xent_fwd(logits_btv, labels_bt, eps, impl):
  max_bt, lse_bt, label_bt, total_bt = _token_stats(_f32(logits_btv), labels_bt, impl)
  nll_bt = lse_bt - label_bt
  loss_bt = (1.0 - eps) * nll_bt + eps * (lse_bt - total_bt / logits_btv.shape[-1])
  # Correct when the label's logit is the largest (a tie counts): both are exact, so the count
  # is that of an argmax (an index-carrying reduction, 3% of a CPU train step) without one.
  correct_bt = (label_bt >= max_bt).astype(jnp.float32)
  # The logits are kept in their own dtype (bf16 logits: half the bytes kept for the backward pass).
  return (loss_bt, nll_bt, correct_bt), (logits_btv, lse_bt, labels_bt)


def _xent_bwd(eps, impl, residuals, cotangents):
  logits_btv, lse_bt, labels_bt = residuals
  g_loss_bt, g_nll_bt, _ = cotangents  # the correct count is piecewise constant: no gradient
  vocab = logits_btv.shape[-1]
  p_btv = jnp.exp(_f32(logits_btv) - lse_bt[..., None])
  onehot_btv = labels_bt[..., None] == jnp.arange(vocab, dtype=labels_bt.dtype)
  # d loss / d logits = p - ((1 - eps) onehot + eps / V);  d nll / d logits = p - onehot.
  g_all_bt = (g_loss_bt + g_nll_bt)[..., None]
  g_onehot_bt = ((1.0 - eps) * g_loss_bt + g_nll_bt)[..., None]
  d_btv = g_all_bt * p_btv - jnp.where(onehot_btv, g_onehot_bt, 0.0) - (eps / vocab) * g_loss_bt[..., None]
  return d_btv.astype(logits_btv.dtype), None


_xent.defvjp(_xent_fwd, _xent_bwd)


def smoothed_xent(logits_btv: jax.Array, labels_bt: jax.Array, label_smoothing: float, impl: str = "auto"):
  """Per-token (smoothed loss, plain NLL) of f32 or bf16 logits, computed in f32.

  The smoothed target puts 1 - eps on the label and eps / V on every entry (optax's
  `smooth_labels`): loss = (1 - eps) * nll + eps * mean_v(-log p_v). The forward pass reads
  the logits once on a GPU or TPU (`_token_stats`); the gradient is written out, (p - target)
  per token, in one more pass over [b, t, v]: autodiff through log_softmax and a label gather
  costs several passes and a scatter, which dominated the backward pass on CPU.
  """
  return _xent(logits_btv, labels_bt, float(label_smoothing), impl)[:2]


def cross_entropy_sums(logits_btv: jax.Array, labels_bt: jax.Array, weights_bt: jax.Array,
                       label_smoothing: float = 0.0, impl: str = "auto") -> dict[str, jax.Array]:
  """Sums over weighted tokens: smoothed loss, plain NLL, token count, correct predictions.

  Sums (not means) let gradient accumulation and data-parallel reduction weigh every
  token equally; divide by `tokens` at the end. `impl`: see `_token_stats`.
  """
  loss_bt, nll_bt, correct_bt = _xent(logits_btv, labels_bt, float(label_smoothing), impl)
  w_bt = weights_bt.astype(jnp.float32)
  return {"loss_sum": jnp.sum(loss_bt * w_bt), "nll_sum": jnp.sum(nll_bt * w_bt), "tokens": jnp.sum(w_bt),
          "correct": jnp.sum(jax.lax.stop_gradient(correct_bt) * w_bt)}


def summarize(sums: dict) -> dict[str, float]:
  """Per-token loss, accuracy and perplexity from (possibly accumulated) sums."""
  tokens = max(float(sums["tokens"]), 1.0)
  nll = float(sums["nll_sum"]) / tokens
  return {"loss": float(sums["loss_sum"]) / tokens, "nll": nll, "accuracy": float(sums["correct"]) / tokens,
          "perplexity": float(jnp.exp(jnp.minimum(nll, 50.0))), "tokens": float(sums["tokens"])}


# -- the vocabulary projection and the loss in chunks of target positions ----------------------
_UNROLL_CHUNKS = contextvars.ContextVar("unroll_chunks", default=False)


@contextlib.contextmanager
def unrolled_chunks():
  """Within this block (when a step is traced) the chunk loop is unrolled. XLA's cost analysis
  counts a loop's body once; the unrolled program counts every chunk's FLOPs and bytes, which
  is what the dry run and benchmarks/loss_bytes.py report. Training keeps the loop."""
  token = _UNROLL_CHUNKS.set(True)
  try:
    yield
  finally:
    _UNROLL_CHUNKS.reset(token)


def _batch_groups(b: int) -> int:
  """Shards of the batch axis (data x fsdp): the weight gradient is summed per shard inside the
  chunk loop, so no chunk sums it across devices; the shards' sums are added once after it."""
  mesh = sharding.current_mesh()
  if mesh is None or mesh.size == 1:
    return 1
  n = sharding.data_parallel_size(mesh)
  return n if b % n == 0 else 1


def _chunk_loop(y_btd, w, labels_bt, weights_bt, eps, chunk, tied, logits_dtype, impl, with_grads, kernel=False):
  """Per-token (loss, NLL, correct) [b, t] and, `with_grads`, d loss_sum / d (y, w), from
  logits made and used one chunk of `chunk` target positions at a time; `kernel`: a chunk's
  statistics and gradient in seq2seq.training.loss_kernel, its logits read once."""
  b, t, d = y_btd.shape
  vocab = w.shape[0] if tied else w.shape[1]
  k = -(-t // chunk)
  if k * chunk > t:  # padded positions: label 0, weight 0
    pad = [(0, 0), (0, k * chunk - t)]
    y_btd, labels_bt, weights_bt = (jnp.pad(x, pad + [(0, 0)] * (x.ndim - 2)) for x in (y_btd, labels_bt, weights_bt))
  w_c = w.astype(y_btd.dtype)  # the compute dtype, as the unchunked projection
  n = _batch_groups(b)
  vocab_axes = ("batch", "length", "vocab")

  def project(y_bcd):
    out = jnp.dtype(logits_dtype)
    z = dense(y_bcd, w_c, w_transposed=True, out_dtype=out) if tied else dense(y_bcd, w_c, out_dtype=out)
    return sharding.constrain(z, vocab_axes)

  def body(i, carry):
    start = i * chunk
    y_bcd, labels_bc = (jax.lax.dynamic_slice_in_dim(x, start, chunk, 1) for x in (y_btd, labels_bt))
    z_bcv = project(y_bcd)
    # d loss_sum / d z: weight * (p - (1 - eps) onehot - eps / V), as `_xent_bwd` with g_loss = weight.
    g_bc = jax.lax.dynamic_slice_in_dim(weights_bt, start, chunk, 1)
    if with_grads and kernel:
      (max_bc, lse_bc, label_bc, total_bc), d_bcv = loss_kernel.stats_and_grad(z_bcv, labels_bc, g_bc, eps=eps,
                                                                               out_dtype=y_bcd.dtype)
    else:
      max_bc, lse_bc, label_bc, total_bc = _token_stats(_f32(z_bcv), labels_bc, impl)
    nll_bc = lse_bc - label_bc
    stats_bc = ((1.0 - eps) * nll_bc + eps * (lse_bc - total_bc / vocab), nll_bc,
                (label_bc >= max_bc).astype(max_bc.dtype))
    out = tuple(jax.lax.dynamic_update_slice_in_dim(acc, x, start, 1) for acc, x in zip(carry[:3], stats_bc))
    if not with_grads:
      return out
    if not kernel:
      g_bc = g_bc[..., None].astype(lse_bc.dtype)
      p_bcv = jnp.exp(_f32(z_bcv) - lse_bc[..., None])
      onehot_bcv = labels_bc[..., None] == jnp.arange(vocab, dtype=labels_bc.dtype)
      d_bcv = g_bc * p_bcv - jnp.where(onehot_bcv, (1.0 - eps) * g_bc, 0.0) - (eps / vocab) * g_bc
      d_bcv = d_bcv.astype(z_bcv.dtype).astype(y_bcd.dtype)
    d_bcv = sharding.constrain(d_bcv, vocab_axes)
    dy_bcd = dense(d_bcv, w_c) if tied else dense(d_bcv, w_c, w_transposed=True)
    # The weight gradient of each batch shard, [n, v, d] (tied) or [n, d, v], split over the
    # shards: a product of [n, m, v] and [n, m, d] over m, the shard's tokens of the chunk.
    d_nmv, y_nmd = d_bcv.reshape(n, -1, vocab), y_bcd.reshape(n, -1, d)
    lhs, rhs = (d_nmv, y_nmd) if tied else (y_nmd, d_nmv)
    if n == 1:  # a 2-D product: XLA:CPU runs it on its operands in place (see `dense`)
      dw_c = jax.lax.dot_general(lhs[0], rhs[0], (((0,), (0,)), ((), ())), preferred_element_type=carry[4].dtype)[None]
    else:
      dw_c = jax.lax.dot_general(lhs, rhs, (((1,), (1,)), ((0,), (0,))), preferred_element_type=carry[4].dtype)
    dw = carry[4] + dw_c
    dw = sharding.constrain(dw, ("batch", "vocab", "embed") if tied else ("batch", "embed", "vocab"))
    return out + (jax.lax.dynamic_update_slice_in_dim(carry[3], dy_bcd, start, 1), dw)

  zeros_bt = jnp.zeros(labels_bt.shape, jnp.promote_types(logits_dtype, jnp.float32))
  init = (zeros_bt,) * 3
  if with_grads:
    init += (jnp.zeros_like(y_btd), jnp.zeros((n, *w.shape), jnp.promote_types(w.dtype, jnp.float32)))
  out = jax.lax.fori_loop(0, k, body, init, unroll=True if _UNROLL_CHUNKS.get() else 1)
  stats = tuple(x[:, :t] for x in out[:3])
  if not with_grads:
    return stats, None
  return stats, (out[3][:, :t], jnp.sum(out[4], axis=0).astype(w.dtype))


def loss_plan(loss_chunk: int, loss_impl: str, labels_shape, w: jax.Array, tied: bool,
              logits_dtype) -> tuple[int, bool]:
  """(target positions the train step projects and scores at a time, 0: all, from the model's
  logits; whether seq2seq.training.loss_kernel computes the statistics and gradient) for
  `train.loss_chunk` and `train.loss_impl`. The kernel's caller owns the vocabulary projection
  (`chunked_cross_entropy_sums`): with the kernel, 0 becomes one chunk of all positions."""
  vocab = w.shape[0] if tied else w.shape[1]
  kernel = loss_kernel.chosen(loss_impl, _vocab_shards((*labels_shape, vocab)), logits_dtype)
  return loss_chunk or (labels_shape[1] if kernel else 0), kernel


def _chunked_sums(stats, weights_bt):
  loss_bt, nll_bt, correct_bt = stats
  w_bt = weights_bt.astype(jnp.float32)
  return jnp.sum(loss_bt * w_bt), jnp.sum(nll_bt * w_bt), jnp.sum(correct_bt * w_bt)


@functools.partial(jax.custom_vjp, nondiff_argnums=(4, 5, 6, 7, 8, 9))
def _chunked_xent(y_btd, w, labels_bt, weights_bt, eps, chunk, tied, logits_dtype, impl, kernel):
  """(loss_sum, nll_sum, correct); the gradient is that of loss_sum alone."""
  stats, _ = _chunk_loop(y_btd, w, labels_bt, weights_bt, eps, chunk, tied, logits_dtype, impl, False)
  return _chunked_sums(stats, weights_bt)


def _chunked_xent_fwd(y_btd, w, labels_bt, weights_bt, eps, chunk, tied, logits_dtype, impl, kernel):
  stats, grads = _chunk_loop(y_btd, w, labels_bt, weights_bt, eps, chunk, tied, logits_dtype, impl, True, kernel)
  return _chunked_sums(stats, weights_bt), grads


def _chunked_xent_bwd(eps, chunk, tied, logits_dtype, impl, kernel, grads, cotangents):
  g_loss = cotangents[0]  # nll_sum and correct leave through stop_gradient: no cotangent
  dy_btd, dw = grads
  return (g_loss * dy_btd).astype(dy_btd.dtype), (g_loss * dw).astype(dw.dtype), None, None


_chunked_xent.defvjp(_chunked_xent_fwd, _chunked_xent_bwd)


def chunked_cross_entropy_sums(y_btd: jax.Array, w: jax.Array, labels_bt: jax.Array, weights_bt: jax.Array, *,
                               tied: bool, chunk: int, label_smoothing: float = 0.0, logits_dtype: str = "float32",
                               impl: str = "auto", kernel: bool = False) -> dict[str, jax.Array]:
  """`cross_entropy_sums` of the logits y @ w (w: [d, v]; `tied`: [v, d], y @ w^T), without
  ever holding the [b, t, v] logits: they are made, reduced and differentiated `chunk` target
  positions at a time (`train.loss_chunk`).

  Under `jax.grad` the forward pass also computes each chunk's gradient with respect to y and
  w (loss_sum is a scalar: whatever follows it, its cotangent is one number that scales them),
  which takes the same three matmuls as the unchunked projection and its backward pass, not a
  fourth to recompute the logits. What stays in memory is [b, t, d] and [v, d], not [b, t, v] f32.
  `loss_sum` carries the gradient; `nll_sum` and `correct` are metrics and carry none.
  `kernel` (`loss_plan`): under `jax.grad`, each chunk's statistics and gradient come from
  seq2seq.training.loss_kernel, which reads its logits once (a chunk of all positions: the train
  step's loss on a GPU with `train.loss_chunk=0`).
  """
  if chunk < 1:
    raise ValueError(f"loss chunk {chunk}: expected at least 1 target position")
  loss_sum, nll_sum, correct = _chunked_xent(y_btd, w, labels_bt, weights_bt.astype(jnp.float32),
                                             float(label_smoothing), int(chunk), bool(tied), str(logits_dtype), impl,
                                             bool(kernel))
  return {"loss_sum": loss_sum, "nll_sum": jax.lax.stop_gradient(nll_sum),
          "tokens": jnp.sum(weights_bt.astype(jnp.float32)), "correct": jax.lax.stop_gradient(correct)}
