"""Sentencepiece: reserved ids, seeded sampling, identical models for identical inputs,
reuse from the workdir, an existing model path, and the pinned version's whole words."""

import hashlib
import json
import os

import numpy as np
import pytest
import sentencepiece
from conftest import make_config

from seq2seq import data
from seq2seq.data import tokenizer as tk
from seq2seq.data.sources import Source


@pytest.fixture(scope="module")
def val_pairs(data_dir):
  return list(Source("multi30k:val", "en", "de", data_dir=str(data_dir)))


def test_sampling_is_seeded_uniform_and_bounded(val_pairs):
  a = tk.sample_sentences(val_pairs, 500, seed=1)
  assert len(a) == 500 and a == tk.sample_sentences(val_pairs, 500, seed=1)
  assert a != tk.sample_sentences(val_pairs, 500, seed=2)
  everything = {s for p in val_pairs for s in p}
  assert set(a) <= everything
  assert sorted(tk.sample_sentences(val_pairs, 10**6, seed=1)) == sorted(s for p in val_pairs for s in p)


def test_same_data_and_seed_give_the_same_model_with_reserved_ids(val_pairs):
  sample = tk.sample_sentences(val_pairs, 10**6, seed=0)
  model = tk.train(sample, vocab_size=500, model_type="bpe", seed=0)
  assert model == tk.train(sample, vocab_size=500, model_type="bpe", seed=0)
  tok = tk.Tokenizer(model)
  assert (tok.sp.pad_id(), tok.sp.eos_id(), tok.sp.unk_id(), tok.sp.bos_id()) == (0, 1, 2, -1)
  assert tok.vocab_size == 500
  ids = tok.encode([val_pairs[0][0]])[0]
  assert ids[-1] == tk.EOS_ID and tk.PAD_ID not in ids
  assert tok.decode(ids + [0, 0]) == val_pairs[0][0]


def test_a_frequent_word_becomes_one_piece():
  """Each of 20 words occurs 500 times among 10,000 sentences of rarer filler words; a
  2000-piece unigram model keeps all of them whole under sentencepiece 0.2.2, and none under
  0.2.1 or 0.2.3, whose seed pieces miss whole words (on Multi30k they split "▁Thre e",
  "▁look ing", "▁in to", docs/data.md#tokenizing). Guards the pin."""
  rng = np.random.default_rng(0)
  words = ["Three", "looking", "into", "their", "several", "carrying", "elderly", "against", "during", "people",
           "walking", "standing", "woman", "street", "wearing", "Zwei", "einem", "Männer", "spielen", "Straße"]
  filler = ["".join(rng.choice(list("abcdefghijklmnoprstu"), size=rng.integers(3, 9))) for _ in range(3000)]
  zipf = 1 / np.arange(1, len(filler) + 1)
  sentences = []
  for i in range(10_000):
    line = list(rng.choice(filler, size=rng.integers(5, 12), p=zipf / zipf.sum()))
    line.insert(rng.integers(0, len(line)), words[i % len(words)])
    sentences.append(" ".join(line))
  tok = tk.Tokenizer(tk.train(sentences, vocab_size=2000, seed=0))
  assert [w for w in words if len(tok.sp.encode(w)) != 1] == []


def test_the_model_does_not_depend_on_the_machines_core_count(val_pairs, monkeypatch):
  """sentencepiece sums its trainer's work in `num_threads` parts: with the machine's core
  count as that number, 16 cores gave other piece ids than 2 (and other NLLs per token)."""
  sample = tk.sample_sentences(val_pairs, 10**6, seed=0)
  models = []
  for cores in (1, 2, 16):
    monkeypatch.setattr(os, "cpu_count", lambda: cores)
    models.append(tk.train(sample, vocab_size=500, seed=0))
  assert models[0] == models[1] == models[2]


def test_unigram_model_is_trained_once_and_reused_from_the_workdir(data_dir, tmp_path, monkeypatch):
  config = make_config("tiny", data_dir, tmp_path / "cache", train_split="val", vocab_size=300)
  first = data.load_tokenizer(config, workdir=str(tmp_path / "run"))
  assert (tmp_path / "run" / data.SPM_FILE).read_bytes() == first.model_bytes
  recorded = json.loads((tmp_path / "run" / data.SPM_SETTINGS_FILE).read_text())
  assert recorded == {"train_split": "val", "vocab_size": 300, "spm_model_type": "unigram",
                      "spm_character_coverage": 1.0, "spm_sample_size": recorded["spm_sample_size"],
                      "sentencepiece": sentencepiece.__version__, "threads": tk.TRAIN_THREADS}
  monkeypatch.setattr(tk, "train", lambda *a, **k: pytest.fail("retrained although a model exists"))
  assert data.load_tokenizer(config, workdir=str(tmp_path / "run")).model_bytes == first.model_bytes
  # A restart reuses the workdir's model even when the cache is gone...
  config.data.cache_dir = str(tmp_path / "other-cache")
  assert data.load_tokenizer(config, workdir=str(tmp_path / "run")).model_bytes == first.model_bytes
  # ...but not with other tokenizer settings: that run would silently keep the old vocabulary.
  config.data.vocab_size = 400
  with pytest.raises(ValueError, match=r"spm.model was made with other tokenizer settings(.|\n)*"
                                       r"config.data.vocab_size: 300 there, 400 now"):
    data.load_tokenizer(config, workdir=str(tmp_path / "run"))
  config.data.vocab_size = 300
  # An existing model can be named instead of trained.
  config.data.spm_model = str(tmp_path / "run" / data.SPM_FILE)
  assert data.load_tokenizer(config, workdir=str(tmp_path / "run2")).model_bytes == first.model_bytes


def test_a_bad_model_file_is_a_clear_error(tmp_path):
  (tmp_path / "broken.model").write_bytes(b"not a model")
  with pytest.raises(ValueError, match=r"broken\.model: cannot load"):
    tk.Tokenizer.load(tmp_path / "broken.model")


def test_more_pieces_than_the_sample_supports_is_an_error(data_dir, tmp_path):
  config = make_config("tiny", data_dir, tmp_path / "cache", train_split="val", vocab_size=200_000)
  with pytest.raises(ValueError, match=r"config.data.vocab_size=200000, but the sample of val supports only \d+ pieces"):
    data.load_tokenizer(config, workdir=str(tmp_path / "run"))
  assert not (tmp_path / "run" / data.SPM_FILE).exists()


@pytest.mark.data
def test_the_main_jobs_tokenizer_is_the_one_its_reported_runs_trained_with(real_data_dir, tmp_path):
  """The README's command trains, on any machine, the tokenizer of the 8000-piece runs in
  docs/runs/main_job_search.jsonl (the GPU runs' and the CPU seeds'; two runs there have 6000
  pieces): the same bytes, so its 16,345 validation target tokens and its NLLs per token
  compare with theirs."""
  config = make_config("multi30k", real_data_dir, tmp_path / "cache")
  tok = data.load_tokenizer(config, write=False)
  assert hashlib.sha256(tok.model_bytes).hexdigest()[:16] == "3cc38697c9698507"
  targets = [t for _, t in Source("multi30k:val", "en", "de", data_dir=str(real_data_dir))]
  assert sum(map(len, tok.encode(targets))) == 16345
