"""Parameters saved before the attention projections were fused (separate `wq_dnh`,
`wk_dnh`, `wv_dnh` in every attention layer), read into today's layout
(seq2seq.model.multihead): checkpoint trees as they are restored, export tensors by name.

A fused parameter is its parts stacked on one axis; the others keep their names:
  self-attention   wqkv_dn3h = wq_dnh, wk_dnh, wv_dnh on axis 2;  bqv_n2h = bq_nh, bv_nh on axis 1
  cross-attention  wkv_dn2h = wk_dnh, wv_dnh on axis 2 (wq_dnh, bq_nh, bv_nh stay)
The Adam moments of a train state have the parameters' tree, so they convert alike.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.sharding import NamedSharding, PartitionSpec

FUSED = {"wqkv_dn3h": (("wq_dnh", "wk_dnh", "wv_dnh"), 2), "wkv_dn2h": (("wk_dnh", "wv_dnh"), 2),
         "bqv_n2h": (("bq_nh", "bv_nh"), 1)}  # fused name -> (its parts, the axis they are stacked on)
_OLD_ONLY = "wk_dnh"  # a name that only the old layout has


def is_old(tree) -> bool:
  """Whether a saved tree (restored, or orbax's metadata of it) has the separate layout."""
  paths = jax.tree_util.tree_flatten_with_path(tree)[0]
  return any(getattr(key, "key", None) == _OLD_ONLY for path, _ in paths for key in path)


def _holds_fused(x) -> bool:
  return isinstance(x, Mapping) and any(name in x for name in FUSED)


def _with_value(leaf, value):
  return leaf.replace(value=value) if isinstance(leaf, nnx.Variable) else value


def _value(leaf):
  return leaf.get_value() if isinstance(leaf, nnx.Variable) else leaf


def _part(x, axis: int) -> jax.ShapeDtypeStruct:
  """The shape and layout of one part of fused array `x`: `axis` dropped."""
  sharding = getattr(x, "sharding", None)
  if isinstance(sharding, NamedSharding):
    spec = (*sharding.spec, *(None,) * (len(x.shape) - len(sharding.spec)))
    sharding = NamedSharding(sharding.mesh, PartitionSpec(*spec[:axis], *spec[axis + 1:]))
  return jax.ShapeDtypeStruct(x.shape[:axis] + x.shape[axis + 1:], x.dtype, sharding=sharding)


@functools.cache
def _stack(axis: int, sharding):
  return jax.jit(lambda xs: jnp.stack(xs, axis), out_shardings=sharding)


def split(target):
  """`target` (any tree holding today's parameters in dicts or nnx.States: parameters, a
  train state) in the old layout, as shapes laid out like it: what to restore an old
  checkpoint into."""
  def layer(m):
    if not _holds_fused(m):
      return m
    out = {}
    for name, leaf in m.items():
      parts, axis = FUSED.get(name, ((name,), None))
      out |= {p: leaf if axis is None else _with_value(leaf, _part(_value(leaf), axis)) for p in parts}
    return type(m)(out)
  return jax.tree.map(layer, target, is_leaf=_holds_fused)


def fuse(target, old):
  """`old` (restored into `split(target)`) in today's layout, laid out like `target`."""
  def layer(want, got):
    if not _holds_fused(want):
      return got
    out = {}
    for name, like in want.items():
      if name in FUSED:
        parts, axis = FUSED[name]
        stacked = _stack(axis, getattr(_value(like), "sharding", None))([_value(got[p]) for p in parts])
        out[name] = _with_value(like, stacked)
      else:
        out[name] = got[name]
    return type(want)(out)
  return jax.tree.map(layer, target, old, is_leaf=_holds_fused)


def fuse_named(tensors: dict[str, np.ndarray], names) -> dict[str, np.ndarray]:
  """Export tensors {dotted name: array} with the parts of each fused name in `names`
  (today's) stacked under it; everything else as it was."""
  out = dict(tensors)
  for name in names:
    layer, _, leaf = name.rpartition(".")
    if name in out or leaf not in FUSED:
      continue
    parts, axis = FUSED[leaf]
    keys = [f"{layer}.{p}" for p in parts]
    if all(k in out for k in keys):
      out[name] = np.stack([out.pop(k) for k in keys], axis)
  return out
