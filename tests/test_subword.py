"""Subword regularization: sampled segmentations spell the same text, follow P^alpha, are a
pure function of (seed, epoch), and keep the batch iterator's exact resume."""

import json

import numpy as np
import pytest
from conftest import make_config

from seq2seq import data
from seq2seq.data import subword
from seq2seq.data.batching import BatchIterator
from seq2seq.data.corpus import Corpus
from seq2seq.data.tokenizer import EOS_ID

N_PAIRS = 400


@pytest.fixture(scope="module")
def setup(data_dir, session_cache):
  """The tiny config's tokenizer and the first N_PAIRS pairs of its training corpus."""
  config = make_config("tiny", data_dir, session_cache)
  tok = data.load_tokenizer(config)
  full = data.load_corpus(config, config.data.train_split, tok)
  ends = full.src_offsets[N_PAIRS], full.tgt_offsets[N_PAIRS]
  corpus = Corpus(np.asarray(full.src[:ends[0]]), full.src_offsets[:N_PAIRS + 1], np.asarray(full.tgt[:ends[1]]),
                  full.tgt_offsets[:N_PAIRS + 1], full.stats)
  sampler = subword.Sampler(corpus, tok, alpha=0.1, nbest=16, max_len=config.data.max_len, seed=0)
  return config, tok, corpus, sampler


def same_corpus(a: Corpus, b: Corpus) -> bool:
  return all(np.array_equal(x, y) for x, y in ((a.src, b.src), (a.src_offsets, b.src_offsets), (a.tgt, b.tgt),
                                              (a.tgt_offsets, b.tgt_offsets)))


def test_samples_spell_the_corpus_text_within_max_len(setup):
  config, tok, corpus, sampler = setup
  changed = 0
  for epoch in (0, 1):
    sampled = sampler(epoch)
    assert len(sampled) == len(corpus)
    for i in range(len(corpus)):
      for base, new in zip(corpus.example(i), sampled.example(i)):
        assert tok.decode(new) == tok.decode(base)
        assert new[-1] == EOS_ID and len(new) <= config.data.max_len
        changed += not np.array_equal(new, base)
  assert changed > len(corpus)  # most segmentations are not the one best at alpha 0.1


def test_each_example_first_candidate_is_its_corpus_segmentation(setup):
  _, _, corpus, sampler = setup
  for cands, ids, offsets in ((sampler.src, corpus.src, corpus.src_offsets),
                              (sampler.tgt, corpus.tgt, corpus.tgt_offsets)):
    first = cands.first[:-1]
    assert (np.diff(cands.first) >= 1).all()
    for i in range(len(corpus)):
      c = first[i]
      np.testing.assert_array_equal(cands.ids[cands.offsets[c]:cands.offsets[c + 1]], ids[offsets[i]:offsets[i + 1]])
    best_in_example = np.maximum.reduceat(cands.log_p, cands.first[:-1])
    np.testing.assert_array_equal(cands.log_p[first], best_in_example)  # the corpus's is the Viterbi one


def test_draws_are_a_pure_function_of_seed_and_epoch(setup):
  config, tok, corpus, sampler = setup
  rebuilt = subword.Sampler(corpus, tok, alpha=0.1, nbest=16, max_len=config.data.max_len, seed=0)
  assert same_corpus(sampler(3), rebuilt(3))
  assert not same_corpus(sampler(3), sampler(4))
  other_seed = subword.Sampler(corpus, tok, alpha=0.1, nbest=16, max_len=config.data.max_len, seed=1)
  assert not same_corpus(sampler(3), other_seed(3))


def test_a_sharp_alpha_gives_the_one_best_corpus(setup):
  config, tok, corpus, _ = setup
  sharp = subword.Sampler(corpus, tok, alpha=1e4, nbest=16, max_len=config.data.max_len, seed=0)
  assert same_corpus(sharp(0), corpus) and same_corpus(sharp(1), corpus)


def test_draw_frequencies_follow_p_to_the_alpha():
  # Example 0 has three candidates, example 1 only one.
  cands = subword.Candidates(ids=np.zeros(0, np.int32), offsets=np.zeros(5, np.int64),
                             log_p=np.array([-1.0, -2.0, -4.0, -3.0]), first=np.array([0, 3, 4]))
  alpha, n = 0.5, 20_000
  rng = np.random.default_rng(0)
  chosen = np.stack([subword.draw(cands, alpha, rng) for _ in range(n)])
  assert (chosen[:, 1] == 3).all()
  p = np.exp(alpha * cands.log_p[:3])
  p /= p.sum()
  freq = np.bincount(chosen[:, 0], minlength=3)[:3] / n
  assert (np.abs(freq - p) < 5 * np.sqrt(p * (1 - p) / n)).all(), (freq, p)  # 5 binomial standard deviations


def test_iterator_with_resampling_resumes_exactly_across_epochs(setup):
  config, _, corpus, sampler = setup
  cfg = data.batching_config(config)
  run = BatchIterator(corpus, cfg, seed=0, resample=sampler)
  n_epoch = len(run.plan(0))
  for _ in range(n_epoch - 2):
    next(run)
  state = json.loads(json.dumps(run.state))
  uninterrupted = [next(run) for _ in range(n_epoch + 4)]  # into epoch 2
  resumed = BatchIterator(corpus, cfg, seed=0, state=state, resample=sampler)
  for a, b in zip(uninterrupted, [next(resumed) for _ in range(len(uninterrupted))]):
    for k in a:
      np.testing.assert_array_equal(a[k], b[k], err_msg=k)
  plain = BatchIterator(corpus, cfg, seed=0)
  assert not all(np.array_equal(a["tgt_out_bt"], next(plain)["tgt_out_bt"]) for a in
                 [BatchIterator(corpus, cfg, seed=0, resample=sampler).__next__() for _ in range(3)])


def test_train_iterator_uses_the_config_and_refuses_bpe(data_dir, session_cache, tmp_path):
  pairs = [(en, de) for en, de in data.eval_pairs(make_config("tiny", data_dir, session_cache), "val")][:300]
  (tmp_path / "small.tsv").write_text("".join(f"{en}\t{de}\n" for en, de in pairs))
  settings = dict(train_split=f"tsv:{tmp_path / 'small.tsv'}", vocab_size=300, subword_alpha=0.1, subword_nbest=8)
  config = make_config("tiny", data_dir, session_cache, **settings)
  tok = data.load_tokenizer(config)
  iterator = data.train_iterator(config, tok)
  assert iterator.resample is not None and iterator.resample.alpha == 0.1
  next(iterator)
  assert same_corpus(iterator.corpus, iterator.resample(0))  # epoch 0 batches its sampled corpus
  assert data.train_iterator(make_config("tiny", data_dir, session_cache, **(settings | {"subword_alpha": 0.0})),
                             tok).resample is None
  bpe = make_config("tiny", data_dir, session_cache, **(settings | {"spm_model_type": "bpe"}))
  with pytest.raises(ValueError, match="subword_alpha needs a unigram sentencepiece model; this one is bpe"):
    data.train_iterator(bpe, data.load_tokenizer(bpe))


def test_memory_estimate_bounds_the_candidates_and_a_corpus_too_large_is_refused(setup, monkeypatch):
  config, tok, corpus, sampler = setup
  built = sum(a.nbytes for c in (sampler.src, sampler.tgt) for a in (c.ids, c.offsets, c.log_p, c.first))
  needed = subword.memory_needed(corpus, 16)
  assert built <= needed < 4 * built  # an upper bound, not a wild one
  monkeypatch.setattr(subword, "physical_memory", lambda: 2 * needed)
  subword.Sampler(corpus, tok, alpha=0.1, nbest=16, max_len=config.data.max_len, seed=0)  # exactly half: accepted
  monkeypatch.setattr(subword, "physical_memory", lambda: 2 * needed - 2)
  with pytest.raises(ValueError, match=r"config.data.subword_nbest=16 x 400 training pairs.*subword_alpha=0"):
    subword.Sampler(corpus, tok, alpha=0.1, nbest=16, max_len=config.data.max_len, seed=0)
