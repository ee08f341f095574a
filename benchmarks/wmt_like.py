"""A WMT-size parallel corpus made here, without a download: sentence lengths and
vocabulary follow WMT14's news test sets.

Pair i takes the word counts of a random newstest2013/2014 pair (English and German sides
each), and each side's words are drawn from that language's newstest unigram distribution
(about 25k word types per language, counted with their punctuation as whitespace splits
them). The text is gibberish with the right lengths, word frequencies and characters,
which is what sentencepiece training, tokenizing, cleaning and batching cost depends on.
Real WMT14 training text has more word types (so sentencepiece sees more distinct words).

  python benchmarks/wmt_like.py --pairs=4500000 --out=/tmp/wmt_like   # writes wmt_like.en/.de
"""

from __future__ import annotations

import argparse
import collections
import os
import pathlib
import sys

import numpy as np

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

from seq2seq.data.sources import Source  # noqa: E402

CHUNK = 100_000


def newstest(data_dir: str) -> list[tuple[str, str]]:
  return [p for year in (2013, 2014) for p in Source(f"files:wmt14/newstest{year}.{{lang}}", "en", "de",
                                                     data_dir=data_dir)]


def write(data_dir: str, pairs: int, out: pathlib.Path, seed: int = 0) -> dict:
  """Writes out/wmt_like.{en,de} with `pairs` lines each; returns what it was built from."""
  real = newstest(data_dir)
  words = [[s.split() for s in side] for side in zip(*real)]
  counts = np.array([[len(w) for w in side] for side in words]).T  # [pair, side]
  vocab, cdf = [], []
  for side in words:
    freq = collections.Counter(w for sentence in side for w in sentence)
    types = np.array(list(freq), dtype=object)
    vocab.append(types)
    cdf.append(np.cumsum(np.fromiter(freq.values(), np.float64)) / sum(freq.values()))
  rng = np.random.default_rng(seed)
  out.mkdir(parents=True, exist_ok=True)
  files = [open(out / f"wmt_like.{lang}", "w", encoding="utf-8") for lang in ("en", "de")]
  try:
    for start in range(0, pairs, CHUNK):
      lengths = np.maximum(counts[rng.integers(0, len(counts), min(CHUNK, pairs - start))], 1)
      for side, f in enumerate(files):
        n = lengths[:, side]
        drawn = vocab[side][np.minimum(np.searchsorted(cdf[side], rng.random(int(n.sum()))), len(cdf[side]) - 1)]
        sep = np.full(len(drawn), " ", dtype=object)
        sep[np.cumsum(n) - 1] = "\n"
        text = np.empty(2 * len(drawn), dtype=object)
        text[0::2], text[1::2] = drawn, sep
        f.write("".join(text))
  finally:
    for f in files:
      f.close()
  return {"pairs": pairs, "seed": seed, "length_source": "newstest2013+2014 word counts per pair",
          "word_types": {lang: len(v) for lang, v in zip(("en", "de"), vocab)},
          "bytes": {lang: os.path.getsize(out / f"wmt_like.{lang}") for lang in ("en", "de")}}


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--pairs", type=int, default=4_500_000)
  parser.add_argument("--out", required=True)
  parser.add_argument("--data_dir", default=os.environ.get("SEQ2SEQ_DATA_DIR", "../shared/data"))
  args = parser.parse_args()
  print(write(args.data_dir, args.pairs, pathlib.Path(args.out)))


if __name__ == "__main__":
  main()
