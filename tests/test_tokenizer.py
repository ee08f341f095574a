"""Sentencepiece: reserved ids, seeded sampling, identical models for identical inputs,
reuse from the workdir, an existing model path."""

import json
import os

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
