"""Token-budget batches with few shapes and little padding: rows of a few lengths, each
filled best-fit with one or more sentence pairs (segment ids and positions tell them apart).

Both modes cut every batch from rows of a fixed length, so each batch has one of a few
shapes (B, S, T) and training compiles once per shape:
- bucketed (`packing=False`): up to `num_buckets` row lengths, geometric from `bucket_min`
  to `max_len`. A pair opens a row of the shortest length it fits (or up to REACH longer,
  when that fills better); the rest of the row is filled best-fit with shorter pairs
  (`fill_rows`; off: one pair per row). Short pairs sit in short rows, so attention spans
  little padding.
- packing (`packing=True`): one row length, `pack_length`; one shape for the whole run.
A row's source and target lengths follow the corpus's token ratio: the side with more
tokens gets the row length, the other side that length divided by the ratio (never less
than its longest pair), so neither side is padded by the other's surplus.
Rows per batch B = max_tokens // max(S, T), a multiple of `batch_multiple`.

Which lengths share a row is decided once per corpus (`Planner`, `_layout`: greedy,
longest pair first); which pairs of those lengths, the order of rows and of batches are
drawn per epoch. An epoch's plan is a pure function of
(lengths, settings, seed, epoch), so the iterator state is three integers and restoring it
replays exactly the batches that would have come next. Process p of P takes rows
[p*B/P, (p+1)*B/P) of every global batch.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator

import numpy as np

from seq2seq.errors import ConfigError
from seq2seq.data.corpus import Corpus
from seq2seq.special_tokens import SPECIAL

Batch = dict[str, np.ndarray]
LENGTH_MULTIPLE = 8  # row lengths are multiples of this (TPU/GPU tiles)
# A row opens at the shortest length its longest pair fits, or up to REACH lengths longer when
# that one would stay over SLACK empty: better filled, at the cost of longer attention spans
# (newstest lengths at 25k tokens: REACH 0 / 1 / 2 / all pad 9.7 / 4.2 / 3.3 / 2.7%).
REACH = 2
SLACK = 0.02


def _round_up(n, multiple: int = LENGTH_MULTIPLE) -> int:
  return int(-(-int(n) // multiple) * multiple)


@dataclasses.dataclass(frozen=True)
class Batching:
  max_tokens: int = 4096  # per batch, per side: B * max(S, T) <= max_tokens
  max_len: int = 128
  batch_multiple: int = 8  # B is a multiple of this (data-parallel devices x processes)
  num_buckets: int = 8  # bucketed: at most this many row lengths (distinct batch shapes)
  bucket_min: int = 8
  fill_rows: bool = True  # bucketed: top rows up with shorter pairs; False: one pair per row
  packing: bool = False
  pack_length: int = 0  # 0: max_len

  def lengths(self) -> list[int]:
    """Row lengths of the side with more tokens, ascending; the last covers max_len."""
    if self.packing:
      return [self.pack_length or self.max_len]
    if self.num_buckets < 1:
      raise ConfigError(f"config.data.num_buckets must be >= 1, got {self.num_buckets}")
    low, high = min(self.bucket_min, self.max_len), self.max_len
    raw = low * (high / low) ** (np.arange(self.num_buckets) / max(self.num_buckets - 1, 1))
    out = sorted({_round_up(x) for x in raw[:-1]} | {high})
    return [n for n in out if n <= high]

  def shapes(self, src_len: np.ndarray, tgt_len: np.ndarray, longest: tuple[int, int] | None = None) -> list[tuple]:
    """(B, S, T) of each row length. `longest`: the longest (source, target) pair lengths that
    can occur (default: the corpus's own), which the last row length must hold."""
    src_tokens, tgt_tokens = float(np.sum(src_len)) or 1.0, float(np.sum(tgt_len)) or 1.0
    longest = longest or (int(np.max(src_len, initial=0)), int(np.max(tgt_len, initial=0)))
    lengths = self.lengths()
    out = []
    for i, length in enumerate(lengths):
      s = length if src_tokens >= tgt_tokens else _round_up(length * src_tokens / tgt_tokens)
      t = length if tgt_tokens >= src_tokens else _round_up(length * tgt_tokens / src_tokens)
      if i == len(lengths) - 1:
        s, t = max(s, longest[0]), max(t, longest[1])
      out.append((self.rows(max(s, t)), s, t))
    return out

  def rows(self, length: int) -> int:
    rows = self.max_tokens // length // self.batch_multiple * self.batch_multiple
    if rows == 0:
      raise ConfigError(f"config.data.max_tokens={self.max_tokens} cannot hold {self.batch_multiple} rows of "
                       f"{length} tokens (batch_multiple); raise max_tokens or lower max_len")
    return rows


@dataclasses.dataclass
class PlannedBatch:
  ids: np.ndarray  # example ids in this batch, ordered by row, then position in the row
  rows: np.ndarray  # the row each example goes to
  shape: tuple[int, int, int]  # (B, S, T)


class Planner:
  """Epoch plans over one corpus's lengths: rows laid out once, drawn per epoch (`epoch`)."""

  def __init__(self, src_len: np.ndarray, tgt_len: np.ndarray, cfg: Batching, shapes: list[tuple] | None = None):
    self.cfg, self.n = cfg, len(src_len)
    self.shapes = shapes or cfg.shapes(src_len, tgt_len)
    caps = np.array([(s, t) for _, s, t in self.shapes], np.int64).reshape(-1, 2)
    src_len, tgt_len = np.asarray(src_len, np.int64), np.asarray(tgt_len, np.int64)
    too_long = np.flatnonzero((src_len > caps[-1, 0]) | (tgt_len > caps[-1, 1]))
    if len(too_long):
      i = int(too_long[0])
      raise ValueError(f"example {i} has {src_len[i]} source and {tgt_len[i]} target tokens but rows hold at most "
                       f"{caps[-1, 0]} and {caps[-1, 1]}: config.data.max_len (or pack_length) must cover the "
                       "corpus's cleaning max_len")
    # Pairs of equal (source, target) length are interchangeable: lay out rows by length class.
    base = int(tgt_len.max(initial=0)) + 1
    classes, self.class_of, counts = np.unique(src_len * base + tgt_len, return_inverse=True, return_counts=True)
    self.row_of_slot, self.seg_of_slot, self.row_bucket = _layout(classes // base, classes % base, counts, caps,
                                                                  fill=cfg.packing or cfg.fill_rows)

  def epoch(self, seed: int, epoch: int) -> list[PlannedBatch]:
    """The batches of one epoch, in their (shuffled) order."""
    rng = np.random.default_rng([seed, epoch])
    # Slot p (in class order) gets example ids[p]: each class's examples in a random order.
    perm = rng.permutation(self.n)
    ids = perm[np.argsort(self.class_of[perm], kind="stable")]
    # Rows into batches, bucket by bucket; a bucket's leftover rows join the next (longer) bucket.
    n_rows = len(self.row_bucket)
    batch_of_row, pos_of_row = np.zeros(n_rows, np.int64), np.zeros(n_rows, np.int64)
    shapes, carry = [], np.zeros(0, np.int64)
    used = np.unique(self.row_bucket)
    for j, b in enumerate(used):
      members = rng.permutation(np.concatenate([carry, np.flatnonzero(self.row_bucket == b)]))
      rows = self.shapes[b][0]
      full = len(members) if j == len(used) - 1 else len(members) // rows * rows
      batch_of_row[members[:full]] = len(shapes) + np.arange(full) // rows
      pos_of_row[members[:full]] = np.arange(full) % rows
      shapes += [self.shapes[b]] * -(-full // rows)
      carry = members[full:]
    rank = rng.permutation(len(shapes))  # batch i is served rank[i]-th
    served_shapes = [shapes[i] for i in np.argsort(rank)]
    batch = rank[batch_of_row[self.row_of_slot]]
    row = pos_of_row[self.row_of_slot]
    key = (batch * max(s[0] for s in self.shapes) + row) * (int(self.seg_of_slot.max(initial=0)) + 1) + \
        self.seg_of_slot
    order = np.argsort(key, kind="stable")
    bounds = np.searchsorted(batch[order], np.arange(len(shapes) + 1))
    return [PlannedBatch(ids[order[bounds[k]:bounds[k + 1]]], row[order[bounds[k]:bounds[k + 1]]], served_shapes[k])
            for k in range(len(shapes))]


def _layout(cls_s, cls_t, counts, caps, fill: bool, slack: float = SLACK):
  """Greedy row layout over length classes (examples of equal source and target length).

  The longest remaining pair opens a row: of the shortest length it fits if the row can be
  filled to within `slack` of full, else of the length (up to REACH longer) that fills best.
  The row is topped up with the pairs that fit whose lengths best match the room left on
  each side (the largest dot product of the pair's and the room's (source, target) lengths:
  Panigrahy et al. 2011, "Heuristics for vector bin packing"). A layout is repeated while every class it uses has
  pairs enough left, so this loops over distinct layouts (about as many as classes), not rows.

  Returns, per slot (examples in class order), its row and its place in the row, and each
  row's bucket (index into `caps`)."""
  n_cls = len(counts)
  smallest = np.argmax((cls_s[:, None] <= caps[None, :, 0]) & (cls_t[:, None] <= caps[None, :, 1]), axis=1)
  opening = np.lexsort((-(cls_s + cls_t), -smallest))  # longest bucket first, then longest pair
  left = counts.astype(np.int64)
  next_slot = np.concatenate([[0], np.cumsum(counts)[:-1]])  # the next unused slot of each class
  total = int(counts.sum())
  row_of_slot, seg_of_slot = np.zeros(total, np.int64), np.zeros(total, np.int64)
  row_bucket, n_rows = [], 0

  def fill_row(first, b):
    layout, avail = {first: 1}, left.copy()  # class -> pairs of it in the row
    avail[first] -= 1
    room_s, room_t = caps[b, 0] - cls_s[first], caps[b, 1] - cls_t[first]
    while fill:
      fits = (cls_s <= room_s) & (cls_t <= room_t) & (avail > 0)
      score = np.where(fits, cls_s * room_s + cls_t * room_t, -1)
      c = int(np.argmax(score))
      if not fits[c]:
        break
      layout[c] = layout.get(c, 0) + 1
      avail[c] -= 1
      room_s, room_t = room_s - cls_s[c], room_t - cls_t[c]
    return layout, (room_s + room_t) / (caps[b, 0] + caps[b, 1])

  i = 0
  while True:
    while i < n_cls and left[opening[i]] == 0:
      i += 1
    if i == n_cls:
      break
    first = int(opening[i])
    best = None
    lowest = int(smallest[first])
    for b in range(lowest, min(len(caps), lowest + 1 + REACH) if fill else lowest + 1):
      layout, empty = fill_row(first, b)
      if best is None or empty < best[2]:
        best = (b, layout, empty)
      if empty <= slack:
        break
    b, layout, _ = best
    repeats = min(int(left[c]) // m for c, m in layout.items())
    seg = 0
    for c, m in layout.items():
      slots = next_slot[c] + np.arange(repeats * m)
      row_of_slot[slots] = n_rows + np.arange(repeats * m) // m
      seg_of_slot[slots] = seg + np.arange(repeats * m) % m
      next_slot[c] += repeats * m
      left[c] -= repeats * m
      seg += m
    row_bucket.append(np.full(repeats, b))
    n_rows += repeats
  return row_of_slot, seg_of_slot, np.concatenate(row_bucket or [np.zeros(0, np.int64)])


def epoch_plan(src_len: np.ndarray, tgt_len: np.ndarray, cfg: Batching, seed: int, epoch: int) -> list[PlannedBatch]:
  """The batches of one epoch, in their (shuffled) order."""
  return Planner(src_len, tgt_len, cfg).epoch(seed, epoch)


def make_batch(corpus: Corpus, planned: PlannedBatch, process_index: int = 0, process_count: int = 1) -> Batch:
  """This process's rows of a planned batch as int32 arrays.

  Keys: src_bs, src_segments_bs, src_positions_bs, tgt_in_bt (decoder input: bos, then the target shifted),
  tgt_out_bt (labels), tgt_segments_bt, tgt_positions_bt. Segment 0 marks padding.
  """
  rows, s_len, t_len = planned.shape
  if rows % process_count:
    raise ConfigError(f"{rows} rows per batch do not split over {process_count} processes; "
                     "make config.data.batch_multiple a multiple of the process count")
  local = rows // process_count
  first = process_index * local
  mine = (planned.rows >= first) & (planned.rows < first + local)
  ids, row = planned.ids[mine], planned.rows[mine] - first  # ordered by row, then place in the row
  n = len(ids)
  new_row = np.ones(n, bool)
  new_row[1:] = row[1:] != row[:-1]
  index = np.arange(n)
  segment = index - np.maximum.accumulate(np.where(new_row, index, 0)) + 1
  out = {}
  for side, flat, offsets, length in (("s", corpus.src, corpus.src_offsets, s_len),
                                      ("t", corpus.tgt, corpus.tgt_offsets, t_len)):
    lengths = offsets[ids + 1] - offsets[ids]
    starts = np.cumsum(lengths) - lengths  # of each example among this process's tokens
    column = starts - np.maximum.accumulate(np.where(new_row, starts, 0))  # where it starts in its row
    example = np.repeat(index, lengths)
    within = np.arange(int(lengths.sum())) - starts[example]
    r, c = row[example], column[example] + within
    tokens = np.asarray(flat[offsets[ids][example] + within], np.int32)
    grid = {k: np.zeros((local, length), np.int32) for k in ("tokens", "segments", "positions")}
    grid["tokens"][r, c] = tokens
    grid["segments"][r, c] = segment[example]
    grid["positions"][r, c] = within
    if side == "s":
      out |= {"src_bs": grid["tokens"], "src_segments_bs": grid["segments"], "src_positions_bs": grid["positions"]}
    else:
      tgt_in = np.zeros((local, length), np.int32)
      tgt_in[r, c] = np.where(within == 0, SPECIAL.bos, np.roll(tokens, 1))  # shifted right within each example
      out |= {"tgt_in_bt": tgt_in, "tgt_out_bt": grid["tokens"], "tgt_segments_bt": grid["segments"],
              "tgt_positions_bt": grid["positions"]}
  assert SPECIAL.pad == 0  # the zeros above are padding
  return out


def plan_stats(plan: list[PlannedBatch], src_len: np.ndarray, tgt_len: np.ndarray) -> dict:
  """Padding fraction (both sides), batch count and distinct shapes of a plan."""
  slots = sum(b.shape[0] * (b.shape[1] + b.shape[2]) for b in plan)
  real = int(np.sum(src_len) + np.sum(tgt_len))
  return {"batches": len(plan), "padding_fraction": 1 - real / slots if slots else 0.0,
          "shapes": sorted({b.shape for b in plan})}


class BatchIterator:
  """Endless batches over epochs; `state` (seed, epoch, position) is JSON-serializable.

  `resample(epoch)`, when given, is the corpus to batch in that epoch (the same pairs in
  other segmentations: seq2seq.data.subword); it must be a pure function of the epoch. Batch
  shapes are fixed from the first corpus, with room for any pair up to `max_len`.
  """

  def __init__(self, corpus: Corpus, cfg: Batching, seed: int, *, process_index: int = 0, process_count: int = 1,
               state: dict | None = None, resample: Callable[[int], Corpus] | None = None):
    self.cfg, self.seed, self.resample = cfg, seed, resample
    self.process_index, self.process_count = process_index, process_count
    longest = (cfg.max_len, cfg.max_len) if resample is not None else None
    self.shapes = cfg.shapes(corpus.src_lengths, corpus.tgt_lengths, longest)
    self._use(corpus)
    self.epoch, self.position = 0, 0
    self._plan, self._plan_epoch = None, None
    if state is not None:
      self.restore(state)

  def _use(self, corpus: Corpus) -> None:
    self.corpus = corpus
    self.planner = Planner(corpus.src_lengths, corpus.tgt_lengths, self.cfg, self.shapes)

  @property
  def state(self) -> dict:
    return {"seed": self.seed, "epoch": self.epoch, "position": self.position}

  def restore(self, state: dict) -> None:
    if int(state["seed"]) != self.seed:
      raise ConfigError(f"data iterator state has seed {state['seed']} but config.seed is {self.seed}")
    self.epoch, self.position = int(state["epoch"]), int(state["position"])

  def plan(self, epoch: int) -> list[PlannedBatch]:
    if self._plan_epoch != epoch:
      if self.resample is not None:  # this epoch's segmentations (subword regularization)
        self._use(self.resample(epoch))
      self._plan, self._plan_epoch = self.planner.epoch(self.seed, epoch), epoch
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
