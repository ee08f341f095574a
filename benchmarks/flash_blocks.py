"""How much of the flash kernels' work packed rows of translation pairs leave, now that each
program loops over only the other side's blocks that share one of its segments
(seq2seq/model/flash_kernels.py, `_segment_span`), against looping over the whole row (causal
attention: up to the diagonal) as before.

Batches are planned by the data pipeline's own planner (seq2seq.data.batching.Planner), at the
batch shapes it gave that corpus (wmt14_base's 25000 tokens a side, rows of up to 256: packed
into 256, and bucketed into 7 row lengths, filled best-fit, the config's default), from pair
lengths drawn to match a recorded corpus's token lengths (a log-normal per side through
the median and 90th percentile of benchmarks/results/data_pipeline_wmt_cpu2.json: WMT14-sized
text under its 37000-piece model; the target's length correlated with the source's). For each
batch shape and each attention of the model (encoder self, decoder causal self, cross), the
block iterations of the three kernels at their default tiles are counted as the kernels bound
their loops, with and without the segment spans, weighted by the matmuls an iteration does
(forward 2, dK/dV 4, dQ 3: the attention kernels' FLOPs). The fraction left is the model's
prediction of the kernels' time on such batches (their time taken as proportional to their
FLOPs); the GPU device check's step (one random sentence filling each row) has one segment a
row and leaves all of it.

  python benchmarks/flash_blocks.py --out=benchmarks/results/flash_blocks_wmt.json
"""

from __future__ import annotations

import argparse
import json
import pathlib
import sys

import numpy as np

REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from seq2seq.data.batching import Batching, Planner  # noqa: E402

MATMULS = {"forward": 2, "dkdv": 4, "dq": 3}  # per block iteration: QK^T, PV; +dV, dP, dK; QK^T, dP, dQ


def lengths(record: dict, pairs: int, rng) -> tuple[np.ndarray, np.ndarray]:
  """Source and target token lengths of `pairs` pairs, log-normal through each side's recorded
  median and 90th percentile (1.2816 standard deviations), the target following the source."""
  z90 = 1.2816
  src_q, tgt_q = record["length_percentiles"]["src"], record["length_percentiles"]["tgt"]
  sigma = lambda q: np.log(q["90"] / q["50"]) / z90
  z = rng.standard_normal(pairs)
  noise = rng.standard_normal(pairs)
  rho = 0.9  # source and target lengths of a translation pair move together
  src = np.exp(np.log(src_q["50"]) + sigma(src_q) * z)
  tgt = np.exp(np.log(tgt_q["50"]) + sigma(tgt_q) * (rho * z + np.sqrt(1 - rho**2) * noise))
  cap = record.get("max_len", 256)
  return (np.clip(np.rint(x), 1, cap).astype(np.int64) for x in (src, tgt))


def segments(planned, src_len, tgt_len) -> tuple[np.ndarray, np.ndarray]:
  """[B, S] and [B, T] segment ids of a planned batch (as seq2seq.data.batching.make_batch lays
  rows out: pairs in order, numbered from 1, then padding 0)."""
  rows, s, t = planned.shape
  out = []
  for side, length in ((src_len, s), (tgt_len, t)):
    grid = np.zeros((rows, length), np.int32)
    fill = np.zeros(rows, np.int64)
    count = np.zeros(rows, np.int32)
    for i, r in zip(planned.ids, planned.rows):
      count[r] += 1
      grid[r, fill[r]:fill[r] + side[i]] = count[r]
      fill[r] += side[i]
    out.append(grid)
  return out[0], out[1]


def spans(own: np.ndarray, other: np.ndarray, own_block: int, other_block: int) -> tuple[np.ndarray, np.ndarray]:
  """[rows, own blocks] start and stop of the other side's blocks holding a segment in each own
  block's range of segments (padding left out), as the kernels' `_segment_span` finds them."""
  rows = own.shape[0]
  blocks = own.reshape(rows, -1, own_block)
  live = blocks != 0
  low = np.where(live, blocks, 2**30).min(-1)
  high = np.where(live, blocks, 0).max(-1)
  other_blocks = other.reshape(rows, -1, other_block)
  hit = ((other_blocks[:, None, :, :] >= low[:, :, None, None]) &
         (other_blocks[:, None, :, :] <= high[:, :, None, None])).any(-1)  # [rows, own, other]
  count = other_blocks.shape[1]
  index = np.arange(count)
  start = np.where(hit, index, count).min(-1)
  stop = np.maximum(np.where(hit, index + 1, 0).max(-1), start)
  return start, stop


def iterations(q_seg, k_seg, causal: bool, skip: bool, tiles: dict) -> dict:
  """Block iterations of each kernel over a batch, as it bounds its loops."""
  t, s = q_seg.shape[1], k_seg.shape[1]
  out = {}
  for kernel, (outer, inner) in tiles.items():
    if kernel == "dkdv":  # a program per key block, a loop over query blocks
      n_outer, n_inner = s // outer, t // inner
      start, stop = spans(k_seg, q_seg, outer, inner) if skip else (
          np.zeros((len(k_seg), n_outer), int), np.full((len(k_seg), n_outer), n_inner))
      if causal:
        start = np.maximum(start, (np.arange(n_outer) * outer) // inner)
    else:  # forward, dq: a program per query block, a loop over key blocks
      n_outer, n_inner = t // outer, s // inner
      start, stop = spans(q_seg, k_seg, outer, inner) if skip else (
          np.zeros((len(q_seg), n_outer), int), np.full((len(q_seg), n_outer), n_inner))
      if causal:
        upper = np.minimum((outer * (np.arange(n_outer) + 1) + inner - 1) // inner, n_inner)
        stop = np.minimum(stop, upper)
    out[kernel] = int(np.maximum(stop - start, 0).sum()) * outer * inner  # positions^2, per head
  return out


def measure(record: dict, pairs: int, seed: int, packing: bool) -> dict:
  from seq2seq.model.flash import BLOCK, Blocks

  rng = np.random.default_rng(seed)
  src_len, tgt_len = lengths(record, pairs, rng)
  cfg = Batching(max_tokens=25000, max_len=256, packing=packing)
  shapes = sorted((tuple(x) for x in record["packed" if packing else "bucketed"]["batch_shapes"]), key=lambda x: x[1])
  plan = Planner(src_len, tgt_len, cfg, shapes=shapes).epoch(seed, 0)
  blocks = Blocks()  # the default tiles
  work = {"before": 0.0, "after": 0.0}
  by_shape = {}
  for planned in plan:
    src, tgt = segments(planned, src_len, tgt_len)
    row = by_shape.setdefault(str(list(planned.shape)), {"batches": 0, "before": 0.0, "after": 0.0})
    row["batches"] += 1
    if planned.shape[1] % BLOCK or planned.shape[2] % BLOCK:  # the model takes XLA attention there
      continue
    for q, k, causal in ((src, src, False), (tgt, tgt, True), (tgt, src, False)):
      fitted = blocks.fitted(q.shape[1], k.shape[1])  # the tiles the kernels run at these lengths
      tiles = {name: getattr(fitted, name) for name in MATMULS}
      for when, skip in (("before", False), ("after", True)):
        done = iterations(q, k, causal, skip, tiles)
        flops = sum(MATMULS[name] * n for name, n in done.items())
        row[when] += flops
        work[when] += flops
  for row in by_shape.values():
    after, before = row.pop("after"), row.pop("before")
    row["left"] = round(after / before, 4) if before else "no flash: lengths not multiples of 16"
  return {"batches": len(plan), "left": round(work["after"] / work["before"], 4), "by_shape": by_shape}


def main(argv=None) -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--lengths", default=str(REPO / "benchmarks/results/data_pipeline_wmt_cpu2.json"))
  parser.add_argument("--pairs", type=int, default=200_000)
  parser.add_argument("--seed", type=int, default=0)
  parser.add_argument("--out", default="")
  args = parser.parse_args(argv)
  record = json.loads(pathlib.Path(args.lengths).read_text())
  result = {"check": "benchmarks/flash_blocks.py", "lengths_from": str(pathlib.Path(args.lengths).relative_to(REPO))
            if pathlib.Path(args.lengths).resolve().is_relative_to(REPO) else args.lengths,
            "length_percentiles": record["length_percentiles"], "pairs": args.pairs, "seed": args.seed,
            "max_tokens": 25000, "max_len": 256, "matmuls_per_iteration": MATMULS,
            "packed": measure(record, args.pairs, args.seed, packing=True),
            "bucketed": measure(record, args.pairs, args.seed, packing=False)}
  text = json.dumps(result, indent=1)
  print(text)
  if args.out:
    pathlib.Path(args.out).write_text(text + "\n")


if __name__ == "__main__":
  main()
