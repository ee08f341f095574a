"""Label-smoothed cross entropy over non-pad target tokens, and the metrics derived from it."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from seq2seq import sharding

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
