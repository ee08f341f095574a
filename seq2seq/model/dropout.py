"""Dropout: inverted dropout whose keep mask is a hash of each element's index under a key
(`keep_mask`), and the keys of the model's dropout sites (`fold`, `DropoutKeys`)."""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np


def dropout(x: jax.Array, rate: float, rng: jax.Array | None) -> jax.Array:
  """Inverted dropout; identity when `rng` is None (evaluation) or rate is 0.

  The keep mask is a counter-based hash of each element's index under the key
  (`keep_mask`), computed inside the fusion that applies it: no separate pass
  drawing random bits, which took 10-15% of a CPU train step with threefry.
  """
  if rng is None or rate == 0.0:
    return x
  return jnp.where(keep_mask(rng, x.shape, rate), x / (1.0 - rate), jnp.zeros_like(x))


_MIX1, _MIX2, _GOLDEN = 0x85EBCA6B, 0xC2B2AE35, 0x9E3779B9


def _fmix32(h: jax.Array) -> jax.Array:
  """MurmurHash3's 32-bit finaliser: a bijection with full avalanche."""
  h = (h ^ (h >> 16)) * jnp.uint32(_MIX1)
  h = (h ^ (h >> 13)) * jnp.uint32(_MIX2)
  return h ^ (h >> 16)


def keep_mask(rng: jax.Array, shape: Sequence[int], rate: float) -> jax.Array:
  """Bernoulli(1 - rate) booleans of `shape`, a pure function of (key, shape).

  Element i (row-major index over the whole, global shape) keeps iff
  fmix32(fmix32(i * golden ^ k0) ^ k1) >= rate * 2^32, with (k0, k1) the key's words.
  The index is global, so the mask does not depend on how the array is sharded.
  Arrays of 2^32 elements or more take `jax.random.bits` instead.
  """
  rng = rng.key() if isinstance(rng, DropoutKeys) else rng
  if math.prod(shape) >= 2**32:
    return jax.random.bits(rng, tuple(shape), jnp.uint32) >= _threshold(rate)
  words, first, last = key_table(rng)
  index = jnp.zeros(shape, jnp.uint32)
  stride = 1
  for axis in reversed(range(len(shape))):
    index = index + jax.lax.broadcasted_iota(jnp.uint32, tuple(shape), axis) * jnp.uint32(stride)
    stride *= shape[axis]
  return hash_keep(index, words[first], words[last], rate)


def _threshold(rate: float) -> jax.Array:
  return jnp.uint32(min(int(rate * 2**32), 2**32 - 1))


def key_table(rng) -> tuple[jax.Array, int, int]:
  """A uint32 vector that holds a dropout key's words, and where its k0 and k1 are: the whole
  table of a `DropoutKeys` that holds the key (so that a kernel reads the key from it, where
  slicing it out would be a kernel of its own), else the key's own words."""
  if isinstance(rng, DropoutKeys):
    depth = rng.depth()
    if depth == len(rng.path):
      table = jax.random.key_data(rng.tables[depth])
      width = table.shape[-1]
      first = (int(np.ravel_multi_index(rng.path, table.shape[:-1])) if rng.path else 0) * width
      return table.reshape(-1), first, first + width - 1
    rng = rng.key()
  words = jax.random.key_data(rng).reshape(-1)
  return words, 0, words.shape[0] - 1


def hash_keep(index: jax.Array, word0: jax.Array, word1: jax.Array, rate: float) -> jax.Array:
  """`keep_mask`'s rule for elements of global row-major `index` (uint32): also what the norm
  kernels compute inside a Pallas kernel (seq2seq.model.norm_kernels), so both keep the same."""
  h = _fmix32(index * jnp.uint32(_GOLDEN) ^ word0)
  return _fmix32(h ^ word1) >= _threshold(rate)


def fold(rng, i: int):
  """Derives an independent key for dropout site `i`: `jax.random.fold_in(rng, i)`, or, given
  `DropoutKeys`, the same key from its table (None stays None)."""
  if rng is None:
    return None
  return rng.fold(i) if isinstance(rng, DropoutKeys) else jax.random.fold_in(rng, i)


@functools.partial(jax.tree_util.register_dataclass, data_fields=["tables"], meta_fields=["path"])
@dataclasses.dataclass(frozen=True)
class DropoutKeys:
  """Every dropout key a model derives from one key, computed at once.

  A site's key is derived by `fold`s from the step's key, fold_in(...fold_in(key, i1)..., ik):
  on a GPU each fold is a small threefry kernel launched alone (64 a wmt14_base step).
  `derive` computes the key of every path of a grid, each depth's in one batched threefry
  (`tables[k]`: the keys of the paths of length k, [grid[0], ..., grid[k - 1]]; `tables[0]`
  the key itself); `fold` extends the path, and `key` reads the path's key from its table, or
  folds on from the longest prefix inside the grid. The keys are fold_in's, bit for bit: only
  the number of kernels changes."""
  tables: tuple
  path: tuple[int, ...] = ()

  @classmethod
  def derive(cls, key: jax.Array, grid: Sequence[int]) -> DropoutKeys:
    fold_each = jax.vmap(jax.random.fold_in, in_axes=(None, 0))  # one key, a vector of indices
    tables = [key]
    for depth, n in enumerate(grid, 1):
      children = jax.vmap(lambda k, n=n: fold_each(k, jnp.arange(n)))(tables[-1].reshape(-1))
      tables.append(children.reshape(tuple(grid[:depth])))
    return cls(tuple(tables))

  def fold(self, i: int) -> DropoutKeys:
    return DropoutKeys(self.tables, (*self.path, i))

  def depth(self) -> int:
    """The longest prefix of the path whose key a table holds."""
    depth = min(len(self.path), len(self.tables) - 1)
    while any(i >= n for i, n in zip(self.path[:depth], self.tables[depth].shape)):
      depth -= 1
    return depth

  def key(self) -> jax.Array:
    depth = self.depth()
    key = self.tables[depth][self.path[:depth]]
    for i in self.path[depth:]:
      key = jax.random.fold_in(key, i)
    return key
