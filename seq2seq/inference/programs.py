"""Which compiled searches a translation needs, and compiling them ahead of time.

A compiled search serves one batch shape: sentences x padded source width (and the output
limit that follows from the width). Compiling a 12-layer beam search takes tens of seconds
(on a GPU as on a CPU), so a test set should need few of them:

- `plan_widths` picks at most `max_programs` source widths for a call, from the fixed
  `SOURCE_BUCKETS` (so that later calls reuse them), fitted to the call's own lengths: the
  widths that pad the sentences least (a dynamic program over the buckets they fall in).
- `Programs` compiles the shapes a call will use before decoding starts, several at once in
  threads (XLA compiles outside Python's lock), keeps them for later calls, and counts the
  programs and the seconds spent compiling (or loading them from the persistent cache).
"""

from __future__ import annotations

import concurrent.futures
import math
import os
import threading
import time
from typing import Callable, Hashable

import jax

# Padded source lengths. A call uses at most `max_programs` of them (plan_widths); each batch
# the smallest chosen one that fits its longest sentence.
SOURCE_BUCKETS = (16, 32, 48, 64, 96, 128, 192, 256, 384, 512)


def source_bucket(length: int) -> int:
  """The smallest bucket that holds `length` tokens (past the last: a multiple of 128)."""
  for b in SOURCE_BUCKETS:
    if length <= b:
      return b
  return 128 * math.ceil(length / 128)


def plan_widths(lengths: list[int], max_programs: int, cost: Callable[[int], float],
                weight: Callable[[int], float] = lambda n: 1.0) -> tuple[int, ...]:
  """At most `max_programs` source widths (0: one per bucket) that hold every length, the
  largest always among them, chosen to minimise the sum over sentences of
  `weight(length) * cost(width)` (a sentence is padded to the smallest chosen width that
  holds it). Translator weighs a sentence by its output limit (the steps it may take) and
  a width by what a step costs there (`step_cost`)."""
  counts: dict[int, float] = {}
  for n in lengths:
    counts[source_bucket(n)] = counts.get(source_bucket(n), 0.0) + weight(n)
  buckets = sorted(counts)
  if max_programs < 0:
    raise ValueError(f"max_programs must be >= 0, got {max_programs}")
  if max_programs == 0 or len(buckets) <= max_programs:
    return tuple(buckets)
  below = [0]  # below[j]: sentences in buckets[:j]
  for b in buckets:
    below.append(below[-1] + counts[b])
  # best[m][j]: (cost, widths) of buckets[:j + 1] in m + 1 widths, the largest being buckets[j]
  best = [[(cost(w) * below[j + 1], (w,)) for j, w in enumerate(buckets)]]
  for m in range(1, max_programs):
    row = []
    for j, w in enumerate(buckets):
      options = [(best[m - 1][i][0] + cost(w) * (below[j + 1] - below[i + 1]), best[m - 1][i][1] + (w,))
                 for i in range(j)]
      row.append(min(options, default=best[m - 1][j]))
    best.append(row)
  return best[-1][-1][1]


# What a decode step costs per sentence, in units of one source or output position it
# attends to, besides those positions: fitted to newstest2014's translation by a random
# wmt14_base model with 6 and with 3 programs on the 2-core CPU (benchmarks/decode_programs.py),
# where the step's cost is mostly reading and reordering the key/value cache.
STEP_COST = 40.0


def step_cost(width: int, max_output: int) -> float:
  """A decode step's cost per sentence in a batch of sources `width` wide, with a
  `max_output`-long key/value cache: STEP_COST + both lengths."""
  return STEP_COST + width + max_output


def width_for(length: int, widths: tuple[int, ...]) -> int:
  """The smallest of `widths` that holds `length` tokens, else its bucket (a width not planned)."""
  return next((w for w in widths if w >= length), source_bucket(length))


def signature(tree) -> Hashable:
  """What a compiled program's inputs must match: structure, shapes, dtypes and placements."""
  leaves, treedef = jax.tree.flatten(tree)
  return treedef, tuple((x.shape, x.dtype, getattr(x, "sharding", None)) for x in leaves)


class Programs:
  """Compiled programs of one jitted function, one per key, compiled in threads and kept.

    programs = Programs(jax.jit(search, static_argnames=("max_len",)))
    programs.prepare(key, args, max_len=96)   # starts compiling (args: arrays or ShapeDtypeStruct)
    out = programs.get(key)(*arrays)          # waits until it is compiled
  """

  def __init__(self, fn, threads: int | None = None):
    self.fn = fn
    self.threads = threads or max(1, min(8, (os.cpu_count() or 1) // 2))
    self._futures: dict[Hashable, concurrent.futures.Future] = {}
    self._lock = threading.Lock()
    self._pool: concurrent.futures.ThreadPoolExecutor | None = None
    self.seconds: dict[Hashable, float] = {}  # per key: the time its compilation (or cache load) took

  def prepare(self, key: Hashable, args: tuple, **static) -> concurrent.futures.Future:
    """Starts compiling `fn(*args, **static)` under `key` unless it is compiled or compiling."""
    with self._lock:
      if key not in self._futures:
        if self._pool is None:
          self._pool = concurrent.futures.ThreadPoolExecutor(self.threads, thread_name_prefix="compile")
        self._futures[key] = self._pool.submit(self._compile, key, args, static)
      return self._futures[key]

  def _compile(self, key, args, static):
    start = time.perf_counter()
    compiled = self.fn.lower(*args, **static).compile()
    self.seconds[key] = time.perf_counter() - start
    return compiled

  def ready(self, key: Hashable) -> bool:
    return key in self._futures and self._futures[key].done()

  def get(self, key: Hashable):
    """The compiled program of `key` (prepared before), once compiled; its error if it failed
    (and it is forgotten, so that a later call compiles it again)."""
    future = self._futures[key]
    try:
      return future.result()
    except BaseException:
      with self._lock:
        self._futures.pop(key, None)
      raise
