"""Translating text with a trained model: tokenize, sort by length, decode batches of a few
fixed shapes on the device mesh, detokenize, and return the input order.

  translator = Translator(model_cfg, graphdef, tok, mesh, beam_size=4, alpha=0.6)
  hypotheses = translator(params, ["A man rides a bike.", ...])

An ensemble passes lists: Translator([cfg_a, cfg_b], [graphdef_a, graphdef_b], ...) and
translator([params_a, params_b], sentences) searches the mean of the models' probabilities.
"""

from __future__ import annotations

import math
import sys

import jax
import numpy as np
from flax import nnx
from jax.sharding import NamedSharding, PartitionSpec

from seq2seq import decode, sharding
from seq2seq.config import ModelConfig
from seq2seq.tokenizer import EOS_ID, Tokenizer

# Padded source lengths: each batch uses the smallest that fits, so a test set compiles
# at most a handful of programs however its lengths are spread.
SOURCE_BUCKETS = (16, 32, 48, 64, 96, 128, 192, 256, 384, 512)


def source_bucket(length: int) -> int:
  for b in SOURCE_BUCKETS:
    if length <= b:
      return b
  return 128 * math.ceil(length / 128)


class Translator:
  """Batched, jit-compiled translation of sentences; one compiled search per source bucket."""

  def __init__(self, model_cfg: ModelConfig | list[ModelConfig], graphdef, tok: Tokenizer, mesh, *,
               beam_size: int = 4, alpha: float = 0.6, max_len_a: float = 1.0, max_len_b: int = 50,
               batch_size: int = 64, min_len: int = 0, use_cache: bool = True):
    if beam_size < 1 or batch_size < 1:
      raise ValueError(f"beam_size and batch_size must be >= 1, got {beam_size} and {batch_size}")
    self.ensemble = isinstance(model_cfg, list)
    cfgs, graphdefs = (model_cfg, graphdef) if self.ensemble else ([model_cfg], [graphdef])
    if not cfgs or len(cfgs) != len(graphdefs) or len({c.vocab_size for c in cfgs}) != 1:
      raise ValueError(f"an ensemble needs one graphdef per model config and one vocabulary, got {len(cfgs)} "
                       f"configs (vocabularies {sorted({c.vocab_size for c in cfgs})}) and {len(graphdefs)} graphdefs")
    self.graphdefs, self.tok, self.mesh = graphdefs, tok, mesh
    # Sources and outputs must fit every learned position table (None: no limit).
    self.position_limit = min((c.max_len for c in cfgs if c.positions == "learned"), default=None)
    self.settings = dict(beam_size=beam_size, alpha=alpha, max_len_a=max_len_a, max_len_b=max_len_b, min_len=min_len)
    dp = sharding.data_parallel_size(mesh)
    self.batch_size = dp * math.ceil(batch_size / dp)  # rows are split over the data-parallel devices
    self.use_cache = use_cache
    self.truncated = 0  # sources of the last call cut to the model's position table (learned positions)
    self._batch_sharding = sharding.batch_sharding(mesh)
    self._search = jax.jit(self._search_fn, static_argnames=("max_len",),
                           out_shardings=NamedSharding(mesh, PartitionSpec()))

  def _search_fn(self, params, src_bs, limits_b, max_len: int):
    models = [nnx.merge(g, p) for g, p in zip(self.graphdefs, params if self.ensemble else [params])]
    s = self.settings
    return decode.search(models, src_bs, limits_b, beam_size=s["beam_size"], alpha=s["alpha"], max_len=max_len,
                         min_len=s["min_len"], use_cache=self.use_cache)

  def _max_output(self, src_len: int) -> int:
    out = int(self.settings["max_len_a"] * src_len) + self.settings["max_len_b"]
    return out if self.position_limit is None else min(out, self.position_limit)

  def _put(self, x: np.ndarray) -> jax.Array:
    """A global array from the full batch every process holds (each places its own shards)."""
    return jax.make_array_from_callback(x.shape, self._batch_sharding, lambda index: x[index])

  def translate_ids(self, params, sources: list[list[int]], *, progress: bool = False) -> list[list[int]]:
    """Output ids (without eos) of each source id sequence (with eos), in input order."""
    sources = list(sources)
    if self.position_limit is not None:
      limit = self.position_limit
      self.truncated = sum(len(s) > limit for s in sources)
      sources = [s if len(s) <= limit else s[:limit - 1] + [EOS_ID] for s in sources]
    order = sorted(range(len(sources)), key=lambda i: -len(sources[i]))  # longest first: memory errors show early
    outputs: list[list[int]] = [[] for _ in sources]
    from tqdm import tqdm

    bar = tqdm(total=len(sources), unit="sent", dynamic_ncols=True, leave=False,
               disable=not progress or not sys.stderr.isatty() or jax.process_index() != 0)
    for start in range(0, len(order), self.batch_size):
      rows = order[start:start + self.batch_size]
      width = source_bucket(max(len(sources[i]) for i in rows))
      src_bs = np.zeros((self.batch_size, width), np.int32)
      src_bs[:, 0] = EOS_ID  # filler rows: an empty sentence, finished after one step
      lengths = np.ones((self.batch_size,), np.int32)
      for r, i in enumerate(rows):
        src_bs[r, :len(sources[i])] = sources[i]
        lengths[r] = len(sources[i])
      max_len = self._max_output(width)
      limits = np.array(decode.output_limits(lengths, self.settings["max_len_a"], self.settings["max_len_b"],
                                               max_len))
      limits[len(rows):] = 1
      tokens_bl = np.asarray(jax.device_get(self._search(params, self._put(src_bs), self._put(limits),
                                                         max_len=max_len)))
      for r, i in enumerate(rows):
        row = tokens_bl[r].tolist()
        outputs[i] = row[:row.index(EOS_ID)] if EOS_ID in row else row
      bar.update(len(rows))
    bar.close()
    return outputs

  def __call__(self, params, sentences: list[str], *, progress: bool = False) -> list[str]:
    """Detokenized translations; blank sources give blank outputs without running the model."""
    nonblank = [i for i, s in enumerate(sentences) if s.strip()]
    ids = self.tok.encode([sentences[i] for i in nonblank]) if nonblank else []
    out = [""] * len(sentences)
    for i, hyp in zip(nonblank, self.translate_ids(params, ids, progress=progress)):
      out[i] = self.tok.decode(hyp)
    return out
