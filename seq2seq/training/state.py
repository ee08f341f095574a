"""What training updates and checkpoints save: `TrainState`, created on a device mesh.

A checkpoint holds it as a dict with the same four keys (`saved()` / `from_saved`), the
layout every version has written, so older runs resume.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import optax
from flax import nnx, struct

from seq2seq import sharding
from seq2seq.model import transformer
from seq2seq.model.config import ModelConfig


@struct.dataclass
class TrainState:
  params: nnx.State  # the model's parameters (float32), sharded by their logical axes
  opt_state: optax.OptState  # the optimizer's moments (the parameters' tree) and counts
  step: jax.Array  # int32 []: updates applied so far
  lr_scale: jax.Array  # float32 []: multiplies each update; lowered by every divergence rollback

  def saved(self) -> dict:
    """The tree a checkpoint stores."""
    return {"params": self.params, "opt_state": self.opt_state, "step": self.step, "lr_scale": self.lr_scale}

  @classmethod
  def from_saved(cls, tree: dict) -> TrainState:
    return cls(**tree)


def _initializer(model_cfg: ModelConfig, tx: optax.GradientTransformation, seed: int):
  def init() -> TrainState:
    params = nnx.state(transformer.Transformer(model_cfg, rngs=nnx.Rngs(seed)), nnx.Param)
    return TrainState(params=params, opt_state=tx.init(params), step=jnp.zeros((), jnp.int32),
                      lr_scale=jnp.ones((), jnp.float32))
  return init


def init_state(model_cfg: ModelConfig, tx: optax.GradientTransformation, mesh, seed: int):
  """(graphdef, state, shardings): parameters and optimizer state created directly in their
  shardings on `mesh`."""
  state, shardings = sharding.init_on_mesh(_initializer(model_cfg, tx, seed), mesh)
  return transformer.graphdef(model_cfg), state, shardings


def abstract_state(model_cfg: ModelConfig, tx: optax.GradientTransformation, mesh, seed: int):
  """`init_state`'s state as sharded shapes, and its shardings; nothing is allocated."""
  init = _initializer(model_cfg, tx, seed)
  shardings = sharding.state_shardings(jax.eval_shape(init), mesh)
  return jax.jit(init, out_shardings=shardings).eval_shape(), shardings
