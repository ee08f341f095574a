"""A tokenized, cleaned parallel corpus stored on disk as flat token arrays plus offsets.

Cleaning drops whole pairs, so source and target stay aligned: empty pairs, pairs with a
side longer than `max_len` tokens (eos included) and pairs whose length ratio exceeds
`max_length_ratio`. The arrays are cached under a key of (data, tokenizer, cleaning
settings), written to a temporary folder and renamed into place: all or nothing.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import itertools
import json
import os
import pathlib
import shutil
import tempfile
from collections.abc import Iterable

import numpy as np

from seq2seq.data.prefetch import Prefetch
from seq2seq.data.sources import DataError, Pair
from seq2seq.data.tokenizer import Tokenizer

FORMAT_VERSION = 2  # 2: offsets stored raw (int64), written chunk by chunk
CHUNK_PAIRS = 50_000
DROP_REASONS = ("empty", "too_long", "length_ratio")


@dataclasses.dataclass(frozen=True)
class Cleaning:
  max_len: int = 128  # tokens per side, eos included
  max_length_ratio: float = 3.0  # 0 = no limit


@dataclasses.dataclass
class Corpus:
  """Token ids of kept pairs: example i's source is src[src_offsets[i]:src_offsets[i+1]]."""

  src: np.ndarray
  src_offsets: np.ndarray
  tgt: np.ndarray
  tgt_offsets: np.ndarray
  stats: dict

  def __len__(self) -> int:
    return len(self.src_offsets) - 1

  @property
  def src_lengths(self) -> np.ndarray:
    return np.diff(self.src_offsets)

  @property
  def tgt_lengths(self) -> np.ndarray:
    return np.diff(self.tgt_offsets)

  def example(self, i: int) -> tuple[np.ndarray, np.ndarray]:
    return (self.src[self.src_offsets[i]:self.src_offsets[i + 1]],
            self.tgt[self.tgt_offsets[i]:self.tgt_offsets[i + 1]])


def _keep(src_ids: list[int], tgt_ids: list[int], src: str, tgt: str, cleaning: Cleaning) -> str | None:
  """The reason to drop a pair, or None to keep it."""
  if not src.strip() or not tgt.strip():
    return "empty"
  if len(src_ids) > cleaning.max_len or len(tgt_ids) > cleaning.max_len:
    return "too_long"
  if cleaning.max_length_ratio and max(len(src_ids), len(tgt_ids)) > cleaning.max_length_ratio * min(
      len(src_ids), len(tgt_ids)):
    return "length_ratio"
  return None


def tokenize(pairs: Iterable[Pair], tokenizer: Tokenizer, cleaning: Cleaning, out_dir: pathlib.Path,
             where: str) -> dict:
  """Encodes and cleans `pairs` CHUNK_PAIRS at a time (sentencepiece on every core, the next
  chunk read meanwhile), appending tokens and offsets to flat files in `out_dir`: memory
  does not grow with the corpus."""
  dtype = np.uint16 if tokenizer.vocab_size <= np.iinfo(np.uint16).max else np.int32
  counts = {"read": 0, "kept": 0} | {reason: 0 for reason in DROP_REASONS}
  tokens = {"src": 0, "tgt": 0}
  with contextlib.ExitStack() as stack:
    files = {f"{side}{kind}": stack.enter_context(open(out_dir / f"{side}{kind}.bin", "wb"))
             for side in ("src", "tgt") for kind in ("", "_offsets")}
    for side in ("src", "tgt"):
      files[f"{side}_offsets"].write(np.zeros(1, np.int64).tobytes())
    iterator = iter(pairs)
    chunks = stack.enter_context(Prefetch(iter(lambda: list(itertools.islice(iterator, CHUNK_PAIRS)), []), depth=2))
    for chunk in chunks:  # the next chunk is read while this one is encoded
      srcs, tgts = [p[0] for p in chunk], [p[1] for p in chunk]
      src_ids, tgt_ids = tokenizer.encode(srcs), tokenizer.encode(tgts)
      kept = {"src": [], "tgt": []}
      for s_ids, t_ids, s, t in zip(src_ids, tgt_ids, srcs, tgts):
        reason = _keep(s_ids, t_ids, s, t, cleaning)
        if reason:
          counts[reason] += 1
        else:
          kept["src"].append(s_ids)
          kept["tgt"].append(t_ids)
      counts["read"] += len(chunk)
      counts["kept"] += len(kept["src"])
      for side, seqs in kept.items():
        lens = np.fromiter(map(len, seqs), np.int64, count=len(seqs))
        flat = np.fromiter(itertools.chain.from_iterable(seqs), dtype, count=int(lens.sum()))
        files[side].write(flat.tobytes())
        files[f"{side}_offsets"].write((tokens[side] + np.cumsum(lens)).tobytes())
        tokens[side] += int(lens.sum())
  if counts["kept"] == 0:
    raise DataError(f"{where}: no pairs left after cleaning (read {counts['read']}, dropped "
                    + ", ".join(f"{r}={counts[r]}" for r in DROP_REASONS) + ")")
  return {"pairs": counts, "tokens": tokens, "dtype": np.dtype(dtype).name, "source": where}


def cache_key(fingerprint: str, tokenizer: Tokenizer, cleaning: Cleaning) -> str:
  parts = [str(FORMAT_VERSION), fingerprint, hashlib.sha256(tokenizer.model_bytes).hexdigest(),
           json.dumps(dataclasses.asdict(cleaning), sort_keys=True)]
  return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:20]


def load(directory: pathlib.Path) -> Corpus:
  stats = json.loads((directory / "stats.json").read_text())
  dtype = np.dtype(stats["dtype"])
  arrays = {}
  for side in ("src", "tgt"):
    arrays[side] = np.memmap(directory / f"{side}.bin", dtype=dtype, mode="r") if stats["tokens"][side] else \
        np.zeros(0, dtype)
    arrays[f"{side}_offsets"] = np.memmap(directory / f"{side}_offsets.bin", dtype=np.int64, mode="r")
  return Corpus(stats=stats, **arrays)


def build(pairs: Iterable[Pair], fingerprint: str, tokenizer: Tokenizer, cleaning: Cleaning,
          cache_dir: str | os.PathLike, where: str) -> Corpus:
  """The tokenized corpus, from the cache when this data was tokenized this way before."""
  root = pathlib.Path(cache_dir) / "corpus"
  final = root / cache_key(fingerprint, tokenizer, cleaning)
  if (final / "stats.json").is_file():
    return load(final)
  root.mkdir(parents=True, exist_ok=True)
  tmp = pathlib.Path(tempfile.mkdtemp(dir=root, prefix=f".{final.name}."))
  try:
    stats = tokenize(pairs, tokenizer, cleaning, tmp, where)
    (tmp / "stats.json").write_text(json.dumps(stats, indent=1))
    try:
      os.rename(tmp, final)
    except OSError:  # another process finished the same corpus first
      if not (final / "stats.json").is_file():
        raise
  finally:
    if tmp.exists():
      shutil.rmtree(tmp)
  return load(final)
