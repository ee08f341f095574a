"""Translation quality by source length, for the length-extrapolation study
(seq2seq/research/positions.py): every evaluated pair's source and target length in the
run's own subword tokens, its translation and its teacher-forced log-probability, then BLEU
and NLL per source-length bucket.

- **Lengths** count subword tokens with eos, as config.data.max_len counts them when it drops
  the training pairs longer than it (on either side): a run trained with max_len L has seen
  sources of 1 to L tokens, and the first bucket is exactly that range.
- **Buckets** are upper edges, multiples of L: (16, 32, 48, 64) makes 1–16, 17–32, 33–48,
  49–64 and >64.
- **Joined pairs**: k consecutive pairs of a split joined into one (sources with a space,
  references too), for k in `joins`, so that the long buckets hold sentences where a
  sentence-level corpus has few (Multi30k's longest sources are about 3.5 x 16 tokens).
- **BLEU** of a bucket is corpus BLEU over its sentences (seq2seq/inference/score.py,
  sacreBLEU 13a); **NLL** is the bucket's summed negative log-probability of the references
  (teacher-forced, `Translator.score`, eos included, no length penalty) over its target
  tokens: training's validation loss, per bucket.
- **Nothing is cut.** The translator cuts sources past eval.max_source_len, and a learned
  position table holds config.model.max_len positions: `evaluate` refuses a set whose longest
  source, target or output limit does not fit (`check_fits`), and records the table's size.
"""

from __future__ import annotations

import bisect
import dataclasses
import json
import math
import pathlib
import time

from seq2seq.errors import ConfigError
from seq2seq.files import write_atomic
from seq2seq.inference.score import score

PREFIX = "lengths"  # DIR/eval/lengths.CHECKPOINT.SEARCH.json
COLUMNS = ("split", "join", "source", "reference", "hypothesis", "src_len", "tgt_len", "logprob")


def edges(limit: int, multiples=(1, 2, 3, 4)) -> tuple[int, ...]:
  """Upper bucket edges: the training length times each multiple, ascending."""
  if limit < 1 or not multiples or any(m <= 0 for m in multiples):
    raise ConfigError(f"buckets need a positive training length and positive multiples, got {limit} and {multiples}")
  return tuple(sorted({round(limit * m) for m in multiples}))


def labels(upper: tuple[int, ...]) -> list[str]:
  """Each bucket's range: ["1–16", "17–32", ..., ">64"]."""
  lows = (1, *(e + 1 for e in upper))
  return [f"{low}–{high}" for low, high in zip(lows, upper)] + [f">{upper[-1]}"]


def bucket(length: int, upper: tuple[int, ...]) -> int:
  """The bucket of a length: 0 for 1..upper[0], ..., len(upper) past the last edge."""
  return bisect.bisect_left(upper, length)


def joined(pairs: list[tuple[str, str]], k: int) -> list[tuple[str, str]]:
  """Consecutive groups of k pairs, each joined into one pair (a space between sentences);
  a last group of fewer than k is left out. k = 1: the pairs themselves."""
  if k < 1:
    raise ConfigError(f"joins must be >= 1, got {k}")
  groups = [pairs[i:i + k] for i in range(0, len(pairs) - k + 1, k)]
  return [(" ".join(s for s, _ in g), " ".join(t for _, t in g)) for g in groups]


def measure(tok, splits: dict[str, list[tuple[str, str]]], joins=(1,)) -> dict[str, list]:
  """Columns split, join, source, reference, src_len and tgt_len (tokens of `tok`, eos
  included) of every pair of every split, then of its joined pairs for each k in `joins`."""
  out = {key: [] for key in COLUMNS[:4]}
  for name, pairs in splits.items():
    for k in joins:
      for source, reference in joined(pairs, k):
        for key, value in zip(COLUMNS[:4], (name, k, source, reference)):
          out[key].append(value)
  encode = lambda texts: [len(ids) for ids in tok.encode(texts)] if texts else []
  return out | {"src_len": encode(out["source"]), "tgt_len": encode(out["reference"])}


def check_fits(translator, src_len: list[int], tgt_len: list[int]) -> None:
  """A ConfigError unless every source fits the translator uncut, and every reference and
  every output limit (max_len_a x source + max_len_b) fits a learned position table."""
  settings, table = translator.settings, translator.position_limit
  longest = max(src_len, default=0)
  if longest > translator.source_limit:
    raise ConfigError(
        f"the longest evaluated source has {longest} tokens, but this model takes {translator.source_limit} "
        + ("(config.model.max_len, its learned position table): train the study with --config.model.max_len="
           f"{longest} or more" if table == translator.source_limit else "(eval.max_source_len): raise it")
        + "; the study cuts no source")
  if table is None:
    return
  output = max((int(settings.max_len_a * n) + settings.max_len_b for n in src_len), default=0)
  if max(max(tgt_len, default=0), output) > table:
    raise ConfigError(f"references of up to {max(tgt_len, default=0)} tokens and outputs of up to {output} do not "
                      f"fit the learned position table of {table} rows: train with a larger config.model.max_len")


def evaluate(translator, splits: dict[str, list[tuple[str, str]]], joins=(1,)) -> dict:
  """The study's record of one model: every pair's columns (`measure`), its translation and
  its teacher-forced log-probability, with the decoding settings, the position table and the
  time taken. Refuses (`check_fits`) where a source would be cut."""
  columns = measure(translator.tok, splits, joins)
  check_fits(translator, columns["src_len"], columns["tgt_len"])
  start = time.perf_counter()
  columns["hypothesis"] = translator.translate(columns["source"]) if columns["source"] else []
  translated = time.perf_counter()
  cut = translator.truncated
  columns["logprob"] = translator.score(columns["source"], columns["reference"], normalize=False)
  if cut or translator.truncated:
    raise ConfigError(f"{max(cut, translator.truncated)} sources were cut although they fit: a bug")
  return {"checkpoint": translator.checkpoint, "decode": dataclasses.asdict(translator.settings),
          "position_table": translator.position_limit, "source_limit": translator.source_limit,
          "splits": list(splits), "joins": list(joins), "translate_seconds": translated - start,
          "score_seconds": time.perf_counter() - translated, "sentences": {k: columns[k] for k in COLUMNS}}


def result_path(outdir: pathlib.Path, checkpoint: str, search: str) -> pathlib.Path:
  return outdir / f"{PREFIX}.{checkpoint}.{search}.json"


def write(outdir: pathlib.Path, record: dict, search: str) -> pathlib.Path:
  path = result_path(outdir, record["checkpoint"], search)
  outdir.mkdir(parents=True, exist_ok=True)
  write_atomic(path, (json.dumps(record) + "\n").encode("utf-8"))
  return path


def saved(outdir: pathlib.Path, step: int) -> list[pathlib.Path]:
  """The study's records of checkpoint `step` in a run's eval folder, one per search."""
  return sorted(outdir.glob(f"{PREFIX}.step{step}.*.json"))


def scores(sentences: dict[str, list], upper: tuple[int, ...]) -> list[dict]:
  """Per bucket (all of them, in order): label, sentences, joined (of them, how many are
  joined pairs), BLEU (nan if empty), target tokens and NLL per target token."""
  members = [[] for _ in range(len(upper) + 1)]
  for i, n in enumerate(sentences["src_len"]):
    members[bucket(n, upper)].append(i)
  out = []
  for label, rows in zip(labels(upper), members):
    tokens = sum(sentences["tgt_len"][i] for i in rows)
    bleu = score([sentences["hypothesis"][i] for i in rows], [sentences["reference"][i] for i in rows])["bleu"] \
        if rows else math.nan
    nll = -sum(sentences["logprob"][i] for i in rows) / tokens if tokens else math.nan
    out.append({"label": label, "sentences": len(rows), "joined": sum(sentences["join"][i] > 1 for i in rows),
                "bleu": bleu, "target_tokens": tokens, "nll": nll})
  return out
