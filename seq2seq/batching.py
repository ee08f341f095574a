"""Token-budget batches: length buckets with shapes from a small fixed set, or packing.

Each epoch's plan is a pure function of (lengths, settings, seed, epoch), so the iterator
state is three integers and restoring it replays exactly the batches that would have come
next. Process p of P takes rows [p*B/P, (p+1)*B/P) of every global batch.

Bucketing: examples are grouped by max(source, target) length rounded up to a boundary
(geometric, ratio `bucket_ratio`); within a bucket they are shuffled then sorted by
length; leftovers of a bucket join the next one; each batch's source and target are
padded to the bucket's boundary or the one below it (at most 4 shapes a bucket). Rows per batch B =
max_tokens // bucket length, a multiple of `batch_multiple`.
Packing: shuffled examples fill rows of `pack_length` tokens per side (segment ids and
positions tell them apart), B = max_tokens // pack_length; one shape for the whole run.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Iterator

import numpy as np

from seq2seq.corpus import Corpus
from seq2seq.tokenizer import EOS_ID, PAD_ID

Batch = dict[str, np.ndarray]


@dataclasses.dataclass(frozen=True)
class Batching:
  max_tokens: int = 4096  # per batch, per side: B * max(S, T) <= max_tokens
  max_len: int = 128
  batch_multiple: int = 8  # B is a multiple of this (data-parallel devices x processes)
  bucket_min: int = 8
  bucket_ratio: float = 1.1
  packing: bool = False
  pack_length: int = 0  # 0: max_len

  def boundaries(self) -> np.ndarray:
    """Allowed padded lengths: even numbers growing by `bucket_ratio`, up to >= max_len."""
    out = [self.bucket_min]
    while out[-1] < self.max_len:
      out.append(max(out[-1] + 2, 2 * math.ceil(out[-1] * self.bucket_ratio / 2)))
    return np.asarray(out)

  def rows(self, length: int) -> int:
    rows = self.max_tokens // length // self.batch_multiple * self.batch_multiple
    if rows == 0:
      raise ValueError(f"config.data.max_tokens={self.max_tokens} cannot hold {self.batch_multiple} rows of "
                       f"{length} tokens (batch_multiple); raise max_tokens or lower max_len")
    return rows


@dataclasses.dataclass
class PlannedBatch:
  ids: np.ndarray  # example ids in this batch
  rows: np.ndarray  # the row each example goes to
  shape: tuple[int, int, int]  # (B, S, T)


def _bucket_plan(src_len, tgt_len, cfg: Batching, rng) -> list[PlannedBatch]:
  bounds = cfg.boundaries()
  up = lambda n: int(bounds[np.searchsorted(bounds, n)])
  bucket = np.searchsorted(bounds, np.maximum(src_len, tgt_len))
  order_key = src_len.astype(np.int64) * (int(tgt_len.max(initial=0)) + 1) + tgt_len
  batches, carry = [], np.zeros(0, np.int64)
  used = np.unique(bucket)
  for j, b in enumerate(used):
    members = np.concatenate([carry, rng.permutation(np.flatnonzero(bucket == b))])
    members = members[np.argsort(order_key[members], kind="stable")]
    rows = cfg.rows(int(bounds[b]))
    floor = int(bounds[max(b - 1, 0)])  # pad to at least one boundary below: <= 4 shapes per bucket
    full = len(members) if j == len(used) - 1 else len(members) // rows * rows
    for start in range(0, full, rows):
      ids = members[start:start + rows]
      shape = (rows, max(floor, up(src_len[ids].max())), max(floor, up(tgt_len[ids].max())))
      batches.append(PlannedBatch(ids, np.arange(len(ids)), shape))
    carry = members[full:]
  return batches


def _pack_plan(src_len, tgt_len, cfg: Batching, rng) -> list[PlannedBatch]:
  length = cfg.pack_length or cfg.max_len
  rows = cfg.rows(length)
  batches, ids, row_of = [], [], []
  row, s_used, t_used = 0, 0, 0
  for i in rng.permutation(len(src_len)):
    s, t = int(src_len[i]), int(tgt_len[i])
    if s_used + s > length or t_used + t > length:  # next-fit: open a new row
      row, s_used, t_used = row + 1, 0, 0
      if row == rows:
        batches.append(PlannedBatch(np.asarray(ids), np.asarray(row_of), (rows, length, length)))
        ids, row_of, row = [], [], 0
    ids.append(i)
    row_of.append(row)
    s_used, t_used = s_used + s, t_used + t
  if ids:
    batches.append(PlannedBatch(np.asarray(ids), np.asarray(row_of), (rows, length, length)))
  return batches


def epoch_plan(src_len: np.ndarray, tgt_len: np.ndarray, cfg: Batching, seed: int, epoch: int) -> list[PlannedBatch]:
  """The batches of one epoch, in their (shuffled) order."""
  rng = np.random.default_rng([seed, epoch])
  plan = (_pack_plan if cfg.packing else _bucket_plan)(src_len, tgt_len, cfg, rng)
  return [plan[i] for i in rng.permutation(len(plan))]


def make_batch(corpus: Corpus, planned: PlannedBatch, process_index: int = 0, process_count: int = 1) -> Batch:
  """This process's rows of a planned batch as int32 arrays.

  Keys: src_bs, src_segments_bs, src_positions_bs, tgt_in_bt (eos-started decoder input),
  tgt_out_bt (labels), tgt_segments_bt, tgt_positions_bt. Segment 0 marks padding.
  """
  rows, s_len, t_len = planned.shape
  if rows % process_count:
    raise ValueError(f"{rows} rows per batch do not split over {process_count} processes; "
                     "make config.data.batch_multiple a multiple of the process count")
  local = rows // process_count
  first = process_index * local
  out = {k: np.zeros((local, s_len), np.int32) for k in ("src_bs", "src_segments_bs", "src_positions_bs")}
  out |= {k: np.zeros((local, t_len), np.int32) for k in ("tgt_in_bt", "tgt_out_bt", "tgt_segments_bt",
                                                          "tgt_positions_bt")}
  fill = np.zeros((local, 3), np.int64)  # per row: source used, target used, segments
  for i, row in zip(planned.ids, planned.rows):
    if not first <= row < first + local:
      continue
    r = row - first
    src, tgt = corpus.example(int(i))
    s0, t0, seg = fill[r]
    seg += 1
    out["src_bs"][r, s0:s0 + len(src)] = src
    out["src_segments_bs"][r, s0:s0 + len(src)] = seg
    out["src_positions_bs"][r, s0:s0 + len(src)] = np.arange(len(src))
    out["tgt_out_bt"][r, t0:t0 + len(tgt)] = tgt
    out["tgt_in_bt"][r, t0] = EOS_ID
    out["tgt_in_bt"][r, t0 + 1:t0 + len(tgt)] = tgt[:-1]
    out["tgt_segments_bt"][r, t0:t0 + len(tgt)] = seg
    out["tgt_positions_bt"][r, t0:t0 + len(tgt)] = np.arange(len(tgt))
    fill[r] = (s0 + len(src), t0 + len(tgt), seg)
  assert PAD_ID == 0  # the zeros above are padding
  return out


def plan_stats(plan: list[PlannedBatch], src_len: np.ndarray, tgt_len: np.ndarray) -> dict:
  """Padding fraction (both sides), batch count and distinct shapes of a plan."""
  slots = sum(b.shape[0] * (b.shape[1] + b.shape[2]) for b in plan)
  real = int(src_len.sum() + tgt_len.sum())
  return {"batches": len(plan), "padding_fraction": 1 - real / slots if slots else 0.0,
          "shapes": sorted({b.shape for b in plan})}


class BatchIterator:
  """Endless batches over epochs; `state` (seed, epoch, position) is JSON-serializable.

  `resample(epoch)`, when given, is the corpus to batch in that epoch (the same pairs in
  other segmentations: seq2seq.subword); it must be a pure function of the epoch.
  """

  def __init__(self, corpus: Corpus, cfg: Batching, seed: int, *, process_index: int = 0, process_count: int = 1,
               state: dict | None = None, resample: Callable[[int], Corpus] | None = None):
    self.cfg, self.seed, self.resample = cfg, seed, resample
    self.process_index, self.process_count = process_index, process_count
    self._use(corpus)
    self.epoch, self.position = 0, 0
    self._plan, self._plan_epoch = None, None
    if state is not None:
      self.restore(state)

  def _use(self, corpus: Corpus) -> None:
    self.corpus, self.src_len, self.tgt_len = corpus, corpus.src_lengths, corpus.tgt_lengths
    longest = int(max(self.src_len.max(initial=0), self.tgt_len.max(initial=0)))
    limit = (self.cfg.pack_length or self.cfg.max_len) if self.cfg.packing else int(self.cfg.boundaries()[-1])
    if longest > limit:
      raise ValueError(f"corpus has a {longest}-token example but batches hold at most {limit}: "
                       "config.data.max_len (or pack_length) must cover the corpus's cleaning max_len")

  @property
  def state(self) -> dict:
    return {"seed": self.seed, "epoch": self.epoch, "position": self.position}

  def restore(self, state: dict) -> None:
    if int(state["seed"]) != self.seed:
      raise ValueError(f"data iterator state has seed {state['seed']} but config.seed is {self.seed}")
    self.epoch, self.position = int(state["epoch"]), int(state["position"])

  def plan(self, epoch: int) -> list[PlannedBatch]:
    if self._plan_epoch != epoch:
      if self.resample is not None:  # this epoch's segmentations (subword regularization)
        self._use(self.resample(epoch))
      self._plan, self._plan_epoch = epoch_plan(self.src_len, self.tgt_len, self.cfg, self.seed, epoch), epoch
    return self._plan

  def __iter__(self) -> Iterator[Batch]:
    return self

  def __next__(self) -> Batch:
    plan = self.plan(self.epoch)
    if self.position >= len(plan):
      self.epoch, self.position = self.epoch + 1, 0
      plan = self.plan(self.epoch)
    batch = make_batch(self.corpus, plan[self.position], self.process_index, self.process_count)
    self.position += 1
    return batch
