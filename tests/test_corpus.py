"""Tokenized corpus: cleaning keeps pairs aligned and counts drops; the cache is reused
and keyed by data, tokenizer and cleaning; errors leave no partial cache; a damaged cache is
found (once per process) and rebuilt; the fingerprint is the token content."""

import json
import re
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import synthetic
from conftest import REPO

from seq2seq.data import corpus as corpus_lib
from seq2seq.data import tokenizer as tk
from seq2seq.data.sources import Source
from seq2seq.errors import DataError

ARRAYS = ("src", "src_offsets", "tgt", "tgt_offsets")


@pytest.fixture(scope="module")
def tok(data_dir):
  pairs = list(Source("multi30k:val", "en", "de", data_dir=str(data_dir)))
  return tk.Tokenizer(tk.train(tk.sample_sentences(pairs, 10**6, 0), vocab_size=400))


@pytest.fixture(scope="module")
def val_pairs(data_dir):
  return list(Source("multi30k:val", "en", "de", data_dir=str(data_dir)))


def build(pairs, tok, cache, fingerprint="fp-val"):
  return corpus_lib.build(pairs, fingerprint, tok, corpus_lib.Cleaning(), cache, "val pairs")


def folder(tok, cache, fingerprint="fp-val"):
  return cache / "corpus" / corpus_lib.cache_key(fingerprint, tok, corpus_lib.Cleaning())


def arrays(corpus):
  return {name: np.array(getattr(corpus, name)) for name in ARRAYS}


def new_process(monkeypatch):
  """As in a process that has checked no cache folder yet."""
  monkeypatch.setattr(corpus_lib, "_verified", set(), raising=False)


def restamp(cache_folder):
  """Records the files' current sizes and checksums in stats.json (and its own checksum), as a
  cache made by hand would."""
  stats = json.loads((cache_folder / "stats.json").read_text())
  stats |= corpus_lib.file_records(cache_folder, np.dtype(stats["dtype"]))
  corpus_lib.write_stats(cache_folder, stats)


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


def test_changed_tokens_in_a_cache_are_found_and_rebuilt_with_a_warning(tok, val_pairs, tmp_path, monkeypatch,
                                                                         capsys):
  fresh = arrays(build(val_pairs, tok, tmp_path))
  path = folder(tok, tmp_path) / "tgt.bin"
  ids = np.fromfile(path, np.uint16)
  ids[::7] = np.where(ids[::7] == 5, 6, 5)  # other ids of the vocabulary
  ids.tofile(path)
  new_process(monkeypatch)
  capsys.readouterr()
  again = build(val_pairs, tok, tmp_path)
  assert re.fullmatch(rf"warning: token cache {re.escape(str(path))} is damaged \(crc32 \w+, \w+ recorded\); "
                      r"rebuilding it\n", capsys.readouterr().err)
  for name, values in arrays(again).items():
    np.testing.assert_array_equal(values, fresh[name])
  assert list((tmp_path / "corpus").iterdir()) == [folder(tok, tmp_path)]  # the damaged one is gone


@pytest.mark.parametrize("damage", ["missing", "truncated"])
def test_a_missing_or_truncated_offsets_file_is_rebuilt_with_a_warning(tok, val_pairs, tmp_path, monkeypatch, capsys,
                                                                       damage):
  fresh = arrays(build(val_pairs, tok, tmp_path))
  path = folder(tok, tmp_path) / "src_offsets.bin"
  if damage == "missing":
    path.unlink()
  else:
    path.write_bytes(path.read_bytes()[:-8])
  new_process(monkeypatch)
  capsys.readouterr()
  again = build(val_pairs, tok, tmp_path)
  reason = "missing" if damage == "missing" else rf"{8 * len(fresh['src_offsets']) - 8} bytes, \d+ recorded"
  assert re.fullmatch(rf"warning: token cache {re.escape(str(path))} is damaged \({reason}\); rebuilding it\n",
                      capsys.readouterr().err)
  for name, values in arrays(again).items():
    np.testing.assert_array_equal(values, fresh[name])


def test_token_ids_outside_the_vocabulary_are_a_data_error(tok, val_pairs, tmp_path, monkeypatch):
  build(val_pairs, tok, tmp_path)
  path = folder(tok, tmp_path) / "tgt.bin"
  ids = np.fromfile(path, np.uint16)
  ids[3] = tok.vocab_size + 17
  ids.tofile(path)
  restamp(path.parent)  # checksums that match: made by hand, or with another tokenizer
  new_process(monkeypatch)
  with pytest.raises(DataError, match=rf"{re.escape(str(path))}: token id {tok.vocab_size + 17} is outside the "
                                      rf"tokenizer's vocabulary of {tok.vocab_size}"):
    build(val_pairs, tok, tmp_path)


def test_a_cache_is_checked_once_per_process(tok, val_pairs, tmp_path, monkeypatch):
  build(val_pairs, tok, tmp_path)
  new_process(monkeypatch)
  scanned, scan = [], corpus_lib.scan
  monkeypatch.setattr(corpus_lib, "scan", lambda path, dtype: scanned.append(path.name) or scan(path, dtype))
  build(val_pairs, tok, tmp_path)
  assert sorted(scanned) == sorted(corpus_lib.FILES)
  build(val_pairs, tok, tmp_path)
  assert len(scanned) == len(corpus_lib.FILES)


def test_the_next_build_removes_what_a_killed_build_left(tok, val_pairs, tmp_path):
  root, key = tmp_path / "corpus", folder(tok, tmp_path).name
  killed = textwrap.dedent(f"""
      import os
      from seq2seq import files
      with files.staging_dir({str(root)!r}, {key!r}) as staging:
        (staging / "src.bin").write_bytes(b"half")
        os._exit(9)
      """)
  assert subprocess.run([sys.executable, "-c", killed], cwd=REPO, timeout=60).returncode == 9
  left = sorted(p.name for p in root.iterdir())
  assert len(left) == 2 and re.fullmatch(rf"\.{key}\.\w+", left[0]) and left[1] == left[0] + ".owner"
  build(val_pairs, tok, tmp_path)
  assert [p.name for p in root.iterdir()] == [key]


def test_fingerprint_is_the_token_content(tok, val_pairs, tmp_path, monkeypatch):
  fresh = build(val_pairs, tok, tmp_path / "a")
  new_process(monkeypatch)
  cached, elsewhere = build(val_pairs, tok, tmp_path / "a"), build(val_pairs, tok, tmp_path / "b")
  assert re.fullmatch(r"[0-9a-f]{16}", fresh.fingerprint)
  assert fresh.fingerprint == cached.fingerprint == elsewhere.fingerprint
  path = folder(tok, tmp_path / "b") / "tgt.bin"
  ids = np.fromfile(path, np.uint16)
  ids[0] = 5 if ids[0] != 5 else 6
  ids.tofile(path)
  restamp(path.parent)
  new_process(monkeypatch)
  assert build(val_pairs, tok, tmp_path / "b").fingerprint != fresh.fingerprint


def test_a_file_size_limit_while_writing_is_a_resource_error_and_leaves_nothing(tok, tmp_path):
  (tmp_path / "spm.model").write_bytes(tok.model_bytes)
  limited = textwrap.dedent(f"""
      import resource
      from seq2seq import errors
      from seq2seq.data import corpus, tokenizer
      tok = tokenizer.Tokenizer.load({str(tmp_path / "spm.model")!r})
      resource.setrlimit(resource.RLIMIT_FSIZE, (4096, resource.getrlimit(resource.RLIMIT_FSIZE)[1]))
      try:
        corpus.build([("A dog runs on the green grass.", "Ein Hund rennt auf dem grünen Gras.")] * 2000, "fp", tok,
                     corpus.Cleaning(), {str(tmp_path / "cache")!r}, "pairs")
      except errors.ResourceError as err:
        print(err)
      """)
  out = subprocess.run([sys.executable, "-c", limited], cwd=REPO, capture_output=True, text=True, timeout=60)
  assert out.stdout == f"File too large (writing the token cache in {tmp_path / 'cache' / 'corpus'})\n", out.stderr
  assert list((tmp_path / "cache" / "corpus").iterdir()) == []
