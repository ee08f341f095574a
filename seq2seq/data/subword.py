"""Subword regularization (Kudo, 2018): each training epoch sees every pair in a segmentation
sampled from the sentencepiece unigram model's l best ones, P(x) ~ P_unigram(x)^alpha.

sentencepiece can sample by itself (`enable_sampling`), but its draws are not reproducible
across processes even with `set_random_generator_seed`, which would break exact resume and
multi-host agreement. Its n-best search is deterministic, so the candidates come from
sentencepiece once per run, and the draw is a seeded numpy function of (seed, epoch): the
iterator state (seed, epoch, position) still replays exactly.

Memory: about nbest x the corpus's tokens (uint16/int32), so this is for small corpora
(Multi30k: 64-best of 29k pairs, ~130 MB, ~30 s to build). A corpus whose candidates could
not fit in half the machine's memory is refused before any is built (`check_memory`).
"""

from __future__ import annotations

import dataclasses
import itertools
import os

import numpy as np

from seq2seq.errors import ConfigError
from seq2seq.data.corpus import Corpus
from seq2seq.data.tokenizer import EOS_ID, Tokenizer

CHUNK_SENTENCES = 4096


@dataclasses.dataclass
class Candidates:
  """Segmentations of one side: example i's candidates are c in [first[i], first[i+1]),
  candidate c's ids are ids[offsets[c]:offsets[c+1]] (eos included), log P(c) is log_p[c].
  Candidate first[i] is always the corpus's own (Viterbi) segmentation."""

  ids: np.ndarray
  offsets: np.ndarray
  log_p: np.ndarray
  first: np.ndarray


def candidates(ids: np.ndarray, offsets: np.ndarray, tok: Tokenizer, nbest: int, max_len: int) -> Candidates:
  """The `nbest` best segmentations of each example of one corpus side, at most `max_len` long.

  The text is decoded from the corpus's ids; an example whose text does not encode back to
  the same ids (unknown pieces) keeps its one segmentation.
  """
  piece_log_p = tok.piece_log_probs
  chunk_lengths, chunk_ids, counts = [], [], np.zeros(len(offsets) - 1, np.int64)
  for start in range(0, len(counts), CHUNK_SENTENCES):  # numpy per chunk: Python lists hold one chunk at most
    own = [ids[offsets[i]:offsets[i + 1]].tolist() for i in range(start, min(start + CHUNK_SENTENCES, len(counts)))]
    seqs = []
    for k, (o, nb) in enumerate(zip(own, tok.nbest_encode([tok.decode(o) for o in own], nbest))):
      keep = [o] + [c for c in nb if c != o and len(c) <= max_len] if nb and nb[0] == o else [o]
      seqs += keep
      counts[start + k] = len(keep)
    chunk_lengths.append(np.fromiter(map(len, seqs), np.int64, count=len(seqs)))
    chunk_ids.append(np.fromiter(itertools.chain.from_iterable(seqs), ids.dtype, count=int(chunk_lengths[-1].sum())))
  lengths = np.concatenate(chunk_lengths or [np.zeros(0, np.int64)])
  flat = np.concatenate(chunk_ids or [np.zeros(0, ids.dtype)])
  cand_offsets = np.concatenate([[0], np.cumsum(lengths)])
  log_p = np.add.reduceat(piece_log_p[flat], cand_offsets[:-1])  # the eos piece scores 0
  return Candidates(flat, cand_offsets, log_p, np.concatenate([[0], np.cumsum(counts)]))


def memory_needed(corpus: Corpus, nbest: int) -> int:
  """Bytes that `nbest` candidates per example can take at most, both sides: their ids, and
  per candidate its offset and log P plus `draw`'s temporaries (key, example index, order)."""
  tokens = len(corpus.src) + len(corpus.tgt)
  return nbest * (tokens * corpus.src.dtype.itemsize + 2 * len(corpus) * 40)


def physical_memory() -> int:
  return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def check_memory(corpus: Corpus, nbest: int) -> None:
  """Refuses, before building anything, candidates that could take over half the machine's memory."""
  need, have = memory_needed(corpus, nbest), physical_memory()
  if need > have // 2:
    raise ConfigError(
        f"subword regularization would hold up to {need / 2**30:.1f} GiB of candidate segmentations "
        f"(config.data.subword_nbest={nbest} x {len(corpus)} training pairs, "
        f"{len(corpus.src) + len(corpus.tgt)} tokens), over half of this machine's {have / 2**30:.1f} GiB: "
        "it is meant for small corpora; lower config.data.subword_nbest or set config.data.subword_alpha=0")


def draw(cands: Candidates, alpha: float, rng: np.random.Generator) -> np.ndarray:
  """One candidate per example, P(c) = exp(alpha log P(c)) / sum over the example's candidates.

  Gumbel-max: argmax of alpha log P(c) + Gumbel noise within each example's candidates.
  """
  key = alpha * cands.log_p + rng.gumbel(size=len(cands.log_p))
  example = np.repeat(np.arange(len(cands.first) - 1), np.diff(cands.first))
  order = np.lexsort((-key, example))  # by example, best key first
  return order[cands.first[:-1]]


def gather(cands: Candidates, chosen: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
  """Flat ids and offsets of the chosen candidates, in example order."""
  starts, lengths = cands.offsets[chosen], np.diff(cands.offsets)[chosen]
  offsets = np.concatenate([[0], np.cumsum(lengths)])
  index = np.repeat(starts - offsets[:-1], lengths) + np.arange(offsets[-1])
  return cands.ids[index], offsets


class Sampler:
  """`sampler(epoch)` is the corpus with the segmentations of that epoch, a pure function of
  (corpus, tokenizer, alpha, nbest, seed, epoch)."""

  def __init__(self, corpus: Corpus, tok: Tokenizer, *, alpha: float, nbest: int, max_len: int, seed: int):
    if alpha <= 0 or nbest < 2:
      raise ConfigError(f"subword sampling needs alpha > 0 and nbest >= 2, got alpha={alpha}, nbest={nbest}")
    check_memory(corpus, nbest)
    self.corpus, self.alpha, self.seed = corpus, alpha, seed
    self.src = candidates(corpus.src, corpus.src_offsets, tok, nbest, max_len)
    self.tgt = candidates(corpus.tgt, corpus.tgt_offsets, tok, nbest, max_len)

  def __call__(self, epoch: int) -> Corpus:
    rng = np.random.default_rng([self.seed, epoch, 0x5B])
    src, src_offsets = gather(self.src, draw(self.src, self.alpha, rng))
    tgt, tgt_offsets = gather(self.tgt, draw(self.tgt, self.alpha, rng))
    assert (src[src_offsets[1:] - 1] == EOS_ID).all() and (tgt[tgt_offsets[1:] - 1] == EOS_ID).all()
    return Corpus(src, src_offsets, tgt, tgt_offsets, self.corpus.stats)
