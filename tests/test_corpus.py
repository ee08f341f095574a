"""Tokenized corpus: cleaning keeps pairs aligned and counts drops; the cache is reused
and keyed by data, tokenizer and cleaning; errors leave no partial cache."""

import numpy as np
import pytest
import synthetic

from seq2seq.data import corpus as corpus_lib
from seq2seq.data import tokenizer as tk
from seq2seq.data.sources import DataError, Source


@pytest.fixture(scope="module")
def tok(data_dir):
  pairs = list(Source("multi30k:val", "en", "de", data_dir=str(data_dir)))
  return tk.Tokenizer(tk.train(tk.sample_sentences(pairs, 10**6, 0), vocab_size=400))


def test_cleaning_drops_whole_pairs_and_reports_reasons(tok, tmp_path):
  long = " ".join(["word"] * 60)
  pairs = [("A dog runs.", "Ein Hund rennt."), ("", "leer"), ("nur Quelle", "   "), (long, "kurz"),
           ("Two cats sleep on a red sofa today.", "Zwei Katzen schlafen heute auf einem roten Sofa."),
           ("Yes", "Ja ja ja ja ja ja ja ja"), ("A man.", "Ein Mann.")]
  cleaning = corpus_lib.Cleaning(max_len=40, max_length_ratio=3.0)
  c = corpus_lib.build(pairs, "fp-clean", tok, cleaning, tmp_path, "test pairs")
  assert c.stats["pairs"] == {"read": 7, "kept": 3, "empty": 2, "too_long": 1, "length_ratio": 1}
  kept = [pairs[i] for i in (0, 4, 6)]
  for i, (src, tgt) in enumerate(kept):
    s_ids, t_ids = c.example(i)
    assert tok.decode(s_ids) == src and tok.decode(t_ids) == tgt
    assert s_ids[-1] == tk.EOS_ID and t_ids[-1] == tk.EOS_ID


def test_cache_is_reused_and_keyed_by_settings(tok, data_dir, tmp_path, monkeypatch):
  src = Source("multi30k:val", "en", "de", data_dir=str(data_dir))
  cleaning = corpus_lib.Cleaning(max_len=64)
  first = corpus_lib.build(src, src.fingerprint(), tok, cleaning, tmp_path, src.spec)
  assert first.stats["pairs"]["read"] == synthetic.MULTI30K["val"] and len(first) == first.stats["pairs"]["kept"]
  monkeypatch.setattr(tk.Tokenizer, "encode", lambda *a: pytest.fail("re-tokenized a cached corpus"))
  again = corpus_lib.build(src, src.fingerprint(), tok, cleaning, tmp_path, src.spec)
  np.testing.assert_array_equal(again.src, first.src)
  np.testing.assert_array_equal(again.tgt_offsets, first.tgt_offsets)
  for other in (corpus_lib.Cleaning(max_len=32), corpus_lib.Cleaning(max_len=64, max_length_ratio=2.0)):
    with pytest.raises(pytest.fail.Exception):
      corpus_lib.build(src, src.fingerprint(), tok, other, tmp_path, src.spec)
  other_data = Source("multi30k:test_2016_flickr", "en", "de", data_dir=str(data_dir))
  assert corpus_lib.cache_key(other_data.fingerprint(), tok, cleaning) != corpus_lib.cache_key(
      src.fingerprint(), tok, cleaning)


def test_empty_corpus_after_cleaning_is_an_error_and_caches_nothing(tok, tmp_path):
  with pytest.raises(DataError, match=r"my-split: no pairs left after cleaning \(read 2, dropped empty=2"):
    corpus_lib.build([("", "x"), ("y", "")], "fp-empty", tok, corpus_lib.Cleaning(), tmp_path, "my-split")
  assert list((tmp_path / "corpus").iterdir()) == []


def test_bad_line_midway_leaves_no_partial_cache(tok, tmp_path):
  (tmp_path / "c.en").write_text("a\nb\nc\n")
  (tmp_path / "c.de").write_bytes(b"x\ny\n\xff\n")
  src = Source(f"files:{tmp_path}/c.{{lang}}", "en", "de")
  with pytest.raises(DataError, match=r"c\.de:3: invalid UTF-8"):
    corpus_lib.build(src, src.fingerprint(), tok, corpus_lib.Cleaning(), tmp_path / "cache", src.spec)
  assert list((tmp_path / "cache" / "corpus").iterdir()) == []
