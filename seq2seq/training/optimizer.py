"""Learning-rate schedules and the optax optimizer: Adam/AdamW (beta2 0.98, eps 1e-9 as
Vaswani et al.), global-norm clipping, weight decay masked off norms and biases; the
gradient's global norm (`global_norm`)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import optax
from flax import nnx

from seq2seq.errors import ConfigError
from seq2seq.training.config import TrainConfig

SCHEDULES = ("rsqrt", "warmup_cosine", "warmup_linear", "warmup_rsqrt", "constant")


def schedule(name: str, *, learning_rate: float, warmup_steps: int, total_steps: int, d_model: int,
             end_fraction: float = 0.0) -> optax.Schedule:
  """Learning rate as a function of the (0-based) update count.

  rsqrt: Vaswani et al.: learning_rate * d_model^-0.5 * min(n^-0.5, n * warmup^-1.5), n = count + 1.
  warmup_*: linear warmup to `learning_rate`, then cosine / linear decay to
  `end_fraction * learning_rate` at `total_steps`, or inverse square root decay.
  """
  warmup = max(warmup_steps, 1)
  if name == "rsqrt":
    def rsqrt(count):
      n = jnp.asarray(count, jnp.float32) + 1.0
      return learning_rate * d_model**-0.5 * jnp.minimum(n**-0.5, n * warmup**-1.5)
    return rsqrt
  if name == "constant":
    return optax.constant_schedule(learning_rate)
  ramp = optax.linear_schedule(0.0, learning_rate, warmup)
  end = end_fraction * learning_rate
  decay_steps = max(total_steps - warmup, 1)
  if name == "warmup_cosine":
    decay = optax.cosine_decay_schedule(learning_rate, decay_steps, alpha=end_fraction)
  elif name == "warmup_linear":
    decay = optax.linear_schedule(learning_rate, end, decay_steps)
  elif name == "warmup_rsqrt":
    decay = lambda count: learning_rate * jnp.sqrt(warmup / (jnp.asarray(count, jnp.float32) + warmup))
  else:
    raise ConfigError(f"config.train.schedule must be one of {SCHEDULES}, got {name!r}")
  return optax.join_schedules([ramp, decay], [warmup])


def decay_mask(params):
  """True for matrices and embeddings; False for norm scales and biases (named b*, scale*, bias*)."""
  def decays(path, _):
    names = [str(k.key) for k in path if isinstance(k, jax.tree_util.DictKey)]  # skips Variable's `.value`
    return not (names[-1].startswith("b") or names[-1].startswith("scale"))
  return jax.tree_util.tree_map_with_path(decays, params)


# Module switch, read when a step is traced: False sums each leaf's squares alone, as
# optax.tree.norm does (benchmarks/device_check.py's `norm_per_leaf` variant times it).
GROUPED_NORM = True


def global_norm(tree) -> jax.Array:
  """The L2 norm of all the arrays of `tree` (an nnx.State or any pytree).

  The squares are summed a group at a time: the leaves of one shape, dtype and logical axes,
  stacked. `optax.tree.norm` sums each leaf alone, and XLA's GPU compiler fuses each of those
  reductions into that leaf's Adam update: the 193 updates of wmt14_base become reductions, and
  each large one needs a second kernel to finish its sum (330 optimizer kernels). Stacked, the
  norm is 11 reductions and the updates stay plain elementwise kernels (220 kernels, 0.29 ms
  less predicted on an H200: docs/scaling.md). Leaves of one group have one sharding (the
  logical axes decide it), so stacking them moves nothing between devices."""
  groups: dict[tuple, list] = {}
  for leaf in jax.tree.leaves(tree, is_leaf=lambda x: isinstance(x, nnx.Variable)):
    axes = leaf.get_metadata().get("axes") if isinstance(leaf, nnx.Variable) else None
    value = jnp.asarray(leaf[...] if isinstance(leaf, nnx.Variable) else leaf)
    key = (value.shape, value.dtype, axes) if GROUPED_NORM else len(groups)
    groups.setdefault(key, []).append(value)
  squares = [jnp.sum(jnp.square(jnp.stack(values))) for values in groups.values()]
  return jnp.sqrt(sum(squares, jnp.zeros((), jnp.float32)))


def clip_by_global_norm(max_norm: float) -> optax.GradientTransformation:
  """`optax.clip_by_global_norm` with `global_norm`: the same rule (updates above `max_norm`
  scaled to it) and the same (empty) state, so checkpoints of either restore; the train step's
  grad_norm metric and the clip are then one computation (XLA merges the two)."""
  def update(updates, state, params=None):
    del params
    norm = global_norm(updates)
    keep = norm < max_norm
    return jax.tree.map(lambda t: jnp.where(keep, t, t / norm.astype(t.dtype) * max_norm), updates), state

  return optax.GradientTransformation(optax.clip_by_global_norm(max_norm).init, update)


def make(train_cfg: TrainConfig, *, d_model: int) -> tuple[optax.GradientTransformation, optax.Schedule]:
  """The optimizer described by `config.train`, and its schedule (for logging)."""
  lr = schedule(train_cfg.schedule, learning_rate=train_cfg.learning_rate, warmup_steps=train_cfg.warmup_steps,
                total_steps=train_cfg.steps, d_model=d_model, end_fraction=train_cfg.end_lr_fraction)
  parts = []
  if train_cfg.grad_clip_norm:
    parts.append(clip_by_global_norm(train_cfg.grad_clip_norm))
  mu_dtype = train_cfg.adam_mu_dtype or None  # bfloat16: half the first moment's memory
  parts.append(optax.adamw(lr, b1=train_cfg.adam_b1, b2=train_cfg.adam_b2, eps=train_cfg.adam_eps,
                           weight_decay=train_cfg.weight_decay, mask=decay_mask, mu_dtype=mu_dtype))
  return optax.chain(*parts), lr
