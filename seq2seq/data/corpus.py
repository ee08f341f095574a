"""A tokenized, cleaned parallel corpus stored on disk as flat token arrays plus offsets.

Cleaning drops whole pairs, so source and target stay aligned: empty pairs, pairs with a
side longer than `max_len` tokens (eos included) and pairs whose length ratio exceeds
`max_length_ratio`. The arrays are cached under a key of (data, tokenizer, cleaning
settings), written to a staging folder and renamed into place: all or nothing. stats.json
records each file's size and crc32, and its own sha256 (`checksum`, of the rest of the
record): a cache is checked against them once per process and rebuilt when damaged or
edited (it is derived data).
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import itertools
import json
import os
import pathlib
import sys
import zlib
from collections.abc import Iterable

import numpy as np

from seq2seq import errors, files
from seq2seq.data.prefetch import Prefetch
from seq2seq.data.sources import Pair
from seq2seq.data.tokenizer import Tokenizer
from seq2seq.errors import DataError

# 2: offsets stored raw (int64), written chunk by chunk; 3: file sizes and checksums in stats.json; 4: stats.json's
# own checksum
FORMAT_VERSION = 4
CHUNK_PAIRS = 50_000
DROP_REASONS = ("empty", "too_long", "length_ratio")
FILES = ("src.bin", "src_offsets.bin", "tgt.bin", "tgt_offsets.bin")
HASH = "crc32"  # zlib's: 6.0 GB/s here, against sha256 2.0, blake2b 1.4 (docs/data.md)
READ_BYTES = 8 << 20
_verified: set[pathlib.Path] = set()  # cache folders checked by this process


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

  @property
  def fingerprint(self) -> str:
    """The tokenized content's identity (16 hex digits): the sizes and checksums of the four
    files, independent of paths and file times."""
    return hashlib.sha256(json.dumps(self.stats["files"], sort_keys=True).encode()).hexdigest()[:16]

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


def scan(path: pathlib.Path, dtype: np.dtype) -> tuple[int, str, int]:
  """Size, crc32 (8 hex digits) and largest value (-1 if none) of a file of `dtype` values, in
  one pass of READ_BYTES reads."""
  size, crc, top = 0, 0, -1
  buf = bytearray(READ_BYTES)
  view = memoryview(buf)
  with open(path, "rb", buffering=0) as f:
    while n := f.readinto(buf):
      size, crc = size + n, zlib.crc32(view[:n], crc)
      values = np.frombuffer(view[:n - n % dtype.itemsize], dtype)
      top = max(top, int(values.max())) if values.size else top
  return size, f"{crc:08x}", top


def _dtype(name: str, dtype: np.dtype) -> np.dtype:
  return np.dtype(np.int64) if name.endswith("_offsets.bin") else dtype


def file_records(folder: pathlib.Path, dtype: np.dtype) -> dict:
  """stats.json's record of the files in `folder`: each one's size and checksum, and the
  largest token id of each side."""
  scans = {name: scan(folder / name, _dtype(name, dtype)) for name in FILES}
  return {"files": {name: {"bytes": size, HASH: crc} for name, (size, crc, _) in scans.items()},
          "max_id": {side: scans[f"{side}.bin"][2] for side in ("src", "tgt")}}


def stats_checksum(stats: dict) -> str:
  """sha256 of a stats.json record without its `checksum`, as canonical JSON (sorted keys)."""
  rest = {k: v for k, v in stats.items() if k != "checksum"}
  return hashlib.sha256(json.dumps(rest, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def write_stats(folder: pathlib.Path, stats: dict) -> None:
  """Writes a cache folder's stats.json with its checksum."""
  stats = {k: v for k, v in stats.items() if k != "checksum"}
  (folder / "stats.json").write_text(json.dumps(stats | {"checksum": stats_checksum(stats)}, indent=1))


def verify(folder: pathlib.Path, vocab_size: int) -> tuple[pathlib.Path, str] | None:
  """The first damaged file of a cache folder and what is wrong with it, or None when
  stats.json matches its checksum and every file its recorded size and checksum. Token ids
  outside the vocabulary in intact files (a cache made by hand, or with another tokenizer)
  raise a DataError."""
  try:
    stats = json.loads((folder / "stats.json").read_text())
    if stats.get("checksum") != stats_checksum(stats):  # an edited record: its figures cannot be trusted
      return folder / "stats.json", ("no checksum" if "checksum" not in stats else
                                     "its content does not match its checksum (edited?)")
    dtype = np.dtype(stats["dtype"])
    expected = {name: (int(stats["files"][name]["bytes"]), stats["files"][name][HASH]) for name in FILES}
  except (OSError, ValueError, KeyError, TypeError, AttributeError) as err:
    return folder / "stats.json", "missing" if isinstance(err, FileNotFoundError) else f"unreadable: {err!r}"
  for name, (size, _) in expected.items():  # sizes first: a missing or truncated file is found without reading
    if not (folder / name).is_file():
      return folder / name, "missing"
    if (found := (folder / name).stat().st_size) != size:
      return folder / name, f"{found} bytes, {size} recorded"
  tops = {}
  for name, (_, crc) in expected.items():
    _, found, tops[name] = scan(folder / name, _dtype(name, dtype))
    if found != crc:
      return folder / name, f"{HASH} {found}, {crc} recorded"
  for name in ("src.bin", "tgt.bin"):
    if tops[name] >= vocab_size:
      raise DataError(f"{folder / name}: token id {tops[name]} is outside the tokenizer's vocabulary of {vocab_size}; "
                      f"the cache was made by hand or with another tokenizer: remove {folder} to rebuild it")
  return None


def _intact(folder: pathlib.Path, vocab_size: int) -> bool:
  """Whether a cache folder is intact, checked once per process; warns when it is damaged."""
  if folder.absolute() not in _verified:
    if damage := verify(folder, vocab_size):
      print(f"warning: token cache {damage[0]} is damaged ({damage[1]}); rebuilding it", file=sys.stderr)
      return False
    _verified.add(folder.absolute())
  return True


def _discard(root: pathlib.Path, folder: pathlib.Path) -> None:
  """Moves a damaged cache folder aside, into a staging folder removed with it."""
  with files.staging_dir(root, folder.name) as aside:
    with contextlib.suppress(FileNotFoundError):  # another process moved it first
      os.rename(folder, aside)  # onto the empty staging folder


def _write(pairs: Iterable[Pair], tokenizer: Tokenizer, cleaning: Cleaning, root: pathlib.Path,
           final: pathlib.Path, where: str) -> None:
  """Tokenizes `pairs` into a staging folder and renames it to `final`: all or nothing."""
  files.remove_stale(root)  # half-built folders of killed processes
  with files.staging_dir(root, final.name) as tmp:
    stats = tokenize(pairs, tokenizer, cleaning, tmp, where)
    stats |= file_records(tmp, np.dtype(stats["dtype"]))
    write_stats(tmp, stats)
    try:
      os.rename(tmp, final)
    except OSError:  # another process finished the same corpus first
      if not (final / "stats.json").is_file():
        raise


def build(pairs: Iterable[Pair], fingerprint: str, tokenizer: Tokenizer, cleaning: Cleaning,
          cache_dir: str | os.PathLike, where: str) -> Corpus:
  """The tokenized corpus, from the cache when this data was tokenized this way before (its
  files checked once per process; a damaged cache is rebuilt with a warning)."""
  root = pathlib.Path(cache_dir) / "corpus"
  final = root / cache_key(fingerprint, tokenizer, cleaning)
  cached = final.exists()
  if cached and _intact(final, tokenizer.vocab_size):
    return load(final)
  try:
    if cached:
      _discard(root, final)
    _write(pairs, tokenizer, cleaning, root, final, where)
  except OSError as err:
    outside = err.filename is not None and not str(err.filename).startswith(str(cache_dir))  # e.g. reading the data
    resource = None if outside else errors.from_os_error(err, f"writing the token cache in {root}")
    if resource is None:
      raise
    raise resource from err
  _verified.add(final.absolute())  # freshly built (or by another process just now): not checked again
  return load(final)
