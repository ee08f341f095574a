"""Batching on a Multi30k-like training corpus (the synthetic one), and on real WMT lengths:
determinism, exact resume, every example once across processes, token budget, bounded shapes,
padding, packing."""

import json

import numpy as np
import pytest
from conftest import make_config

from seq2seq import data
from seq2seq.data import batching as batching_lib
from seq2seq.data.batching import BatchIterator, epoch_plan, make_batch, plan_stats
from seq2seq.special_tokens import SPECIAL


@pytest.fixture(scope="module")
def setup(data_dir, session_cache):
  # These tests are about length buckets; the synthetic corpus supports 1000 pieces, not 8000.
  config = make_config("multi30k", data_dir, session_cache, packing=False, vocab_size=1000)
  tok = data.load_tokenizer(config)
  return config, data.load_corpus(config, config.data.train_split, tok)


def batching_with(config, **data_overrides):
  config = config.copy_and_resolve_references()
  config.data.update(data_overrides)
  return data.batching_config(config)


def take(iterator, n):
  return [next(iterator) for _ in range(n)]


def assert_same(batches_a, batches_b):
  assert len(batches_a) == len(batches_b)
  for a, b in zip(batches_a, batches_b):
    assert a.keys() == b.keys()
    for k in a:
      np.testing.assert_array_equal(a[k], b[k], err_msg=k)


def test_same_seed_same_batches_other_seed_other_batches(setup):
  config, corpus = setup
  cfg = data.batching_config(config)
  first = take(BatchIterator(corpus, cfg, seed=0), 20)
  assert_same(first, take(BatchIterator(corpus, cfg, seed=0), 20))
  other = take(BatchIterator(corpus, cfg, seed=1), 20)
  assert any(a["src_bs"].shape != b["src_bs"].shape or not np.array_equal(a["src_bs"], b["src_bs"])
             for a, b in zip(first, other))


@pytest.mark.parametrize("packing", [False, True])
def test_restored_state_gives_exactly_the_next_50_batches(setup, packing):
  corpus, cfg = setup[1], batching_with(setup[0], packing=packing)
  run = BatchIterator(corpus, cfg, seed=0)
  n_epoch = len(run.plan(0))
  for skip in (37, n_epoch - 20):  # mid-epoch, and 50 batches that cross into epoch 1
    run = BatchIterator(corpus, cfg, seed=0)
    take(run, skip)
    state = json.loads(json.dumps(run.state))
    assert state == {"seed": 0, "epoch": 0, "position": skip}
    uninterrupted = take(run, 50)
    assert_same(uninterrupted, take(BatchIterator(corpus, cfg, seed=0, state=state), 50))
  assert run.epoch == 1


def test_state_from_another_seed_is_refused(setup):
  config, corpus = setup
  with pytest.raises(ValueError, match="seed 3 but config.seed is 0"):
    BatchIterator(corpus, data.batching_config(config), seed=0, state={"seed": 3, "epoch": 0, "position": 0})


def examples_in(batch):
  """(source ids, target ids) of every segment of every row, read back from a batch."""
  out = []
  for r in range(batch["src_bs"].shape[0]):
    for seg in range(1, int(batch["src_segments_bs"][r].max(initial=0)) + 1):
      src = batch["src_bs"][r][batch["src_segments_bs"][r] == seg]
      tgt_mask = batch["tgt_segments_bt"][r] == seg
      tgt, tgt_in = batch["tgt_out_bt"][r][tgt_mask], batch["tgt_in_bt"][r][tgt_mask]
      np.testing.assert_array_equal(tgt_in, np.concatenate([[SPECIAL.bos], tgt[:-1]]))  # shifted per segment
      np.testing.assert_array_equal(batch["src_positions_bs"][r][batch["src_segments_bs"][r] == seg],
                                    np.arange(len(src)))
      np.testing.assert_array_equal(batch["tgt_positions_bt"][r][tgt_mask], np.arange(len(tgt)))
      out.append((tuple(src), tuple(tgt)))
  return out


@pytest.mark.parametrize("packing", [False, True])
def test_processes_together_cover_every_example_exactly_once(setup, packing):
  corpus, cfg = setup[1], batching_with(setup[0], packing=packing)
  n_batches = len(BatchIterator(corpus, cfg, seed=0).plan(0))
  seen = []
  for p in range(4):
    it = BatchIterator(corpus, cfg, seed=0, process_index=p, process_count=4)
    for batch in take(it, n_batches):
      seen += examples_in(batch)
  expected = [tuple(map(tuple, corpus.example(i))) for i in range(len(corpus))]
  assert sorted(seen) == sorted(expected)


@pytest.fixture(scope="module")
def real_setup(real_data_dir, session_cache):
  """The multi30k config's length buckets over the real Multi30k training corpus."""
  config = make_config("multi30k", real_data_dir, session_cache, packing=False)
  return config, data.load_corpus(config, config.data.train_split, data.load_tokenizer(config))


@pytest.mark.data
def test_budget_bounded_shapes_and_padding(real_setup):
  config, corpus = real_setup
  cfg = data.batching_config(config)
  plan = epoch_plan(corpus.src_lengths, corpus.tgt_lengths, cfg, config.seed, 0)
  stats = plan_stats(plan, corpus.src_lengths, corpus.tgt_lengths)
  allowed = cfg.shapes(corpus.src_lengths, corpus.tgt_lengths)
  assert len(allowed) <= cfg.num_buckets and set(stats["shapes"]) <= set(allowed)
  for rows, s, t in stats["shapes"]:
    assert rows % cfg.batch_multiple == 0 and rows * max(s, t) <= cfg.max_tokens
    assert s % 8 == 0 and t % 8 == 0
  assert stats["padding_fraction"] < 0.03
  # The planned fraction is what the batches really contain.
  batches = [make_batch(corpus, b) for b in plan]
  real = sum(int((b["src_segments_bs"] > 0).sum() + (b["tgt_segments_bt"] > 0).sum()) for b in batches)
  slots = sum(b["src_bs"].size + b["tgt_out_bt"].size for b in batches)
  assert 1 - real / slots == pytest.approx(stats["padding_fraction"], abs=1e-12)


def test_one_pair_per_row_without_filling(setup):
  corpus, cfg = setup[1], batching_with(setup[0], fill_rows=False)
  plan = epoch_plan(corpus.src_lengths, corpus.tgt_lengths, cfg, 0, 0)
  assert all(len(np.unique(b.rows)) == len(b.rows) for b in plan)
  assert sum(len(b.ids) for b in plan) == len(corpus)
  # Each pair sits in the shortest row length it fits.
  shapes = cfg.shapes(corpus.src_lengths, corpus.tgt_lengths)
  for b in plan[:20]:
    fits = [k for k, (_, s, t) in enumerate(shapes) if (corpus.src_lengths[b.ids] <= s).all()
            and (corpus.tgt_lengths[b.ids] <= t).all()]
    assert shapes[fits[0]] == b.shape or b is plan[-1]


def test_packing_uses_one_shape_sized_by_the_token_ratio(setup):
  """The side with more tokens gets rows of pack_length, the other side rows shorter by the
  token ratio; neither shorter than its longest sentence. In both directions of the corpus."""
  corpus, cfg = setup[1], batching_with(setup[0], packing=True, pack_length=64)
  one_way = (corpus.src_lengths, corpus.tgt_lengths)
  ratios = []
  for src, tgt in (one_way, one_way[::-1]):
    ratio = tgt.sum() / src.sum()
    s = 64 if ratio <= 1 else -(-int(np.ceil(64 / ratio)) // 8) * 8
    t = 64 if ratio >= 1 else -(-int(np.ceil(64 * ratio)) // 8) * 8
    s, t = max(s, int(src.max())), max(t, int(tgt.max()))
    stats = plan_stats(epoch_plan(src, tgt, cfg, 0, 0), src, tgt)
    assert stats["shapes"] == [(cfg.max_tokens // max(s, t) // 8 * 8, s, t)]
    # Best-fit packing: within 2% of the fewest rows that could hold the longer side's tokens.
    planner = batching_lib.Planner(src, tgt, cfg)
    assert len(planner.row_bucket) <= 1.02 * max(src.sum() / s, tgt.sum() / t)
    ratios.append(ratio)
  assert min(ratios) < 1 < max(ratios)


@pytest.fixture(scope="module")
def wmt_lengths(real_data_dir):
  """Token lengths of the real newstest2013 + 2014 (WMT-length news sentences), 6003 pairs
  tiled 25x to 150k, under a sentencepiece model trained on them."""
  from seq2seq.data import tokenizer as tk
  from seq2seq.data.sources import Source

  pairs = [p for year in (2013, 2014) for p in Source(f"files:wmt14/newstest{year}.{{lang}}", "en", "de",
                                                      data_dir=str(real_data_dir))]
  tok = tk.Tokenizer(tk.train(tk.sample_sentences(pairs, 10**6, 0), vocab_size=8000))
  src, tgt = ([len(ids) for ids in tok.encode([p[side] for p in pairs])] for side in (0, 1))
  return np.tile(src, 25), np.tile(tgt, 25)


@pytest.mark.data
@pytest.mark.parametrize("packing, max_shapes, max_padding", [(False, 8, 0.05), (True, 1, 0.03)])
def test_wmt_length_epoch_has_few_shapes_and_little_padding(wmt_lengths, packing, max_shapes, max_padding):
  src, tgt = wmt_lengths
  cfg = batching_lib.Batching(max_tokens=25000, max_len=256, packing=packing)
  plan = epoch_plan(src, tgt, cfg, 0, 0)
  stats = plan_stats(plan, src, tgt)
  assert len(stats["shapes"]) <= max_shapes and stats["padding_fraction"] <= max_padding, stats
  assert sorted(np.concatenate([b.ids for b in plan]).tolist()) == list(range(len(src)))  # each pair once


@pytest.mark.data
def test_next_fit_in_order_pads_more_than_the_planner(wmt_lengths):
  """The old packing (next-fit in shuffled order) on the same data: the reference the
  planner must beat by a wide margin."""
  src, tgt = wmt_lengths
  order = np.random.default_rng(0).permutation(len(src))
  rows, used_s, used_t = 1, 0, 0
  for i in order:
    if used_s + src[i] > 256 or used_t + tgt[i] > 256:
      rows, used_s, used_t = rows + 1, 0, 0
    used_s, used_t = used_s + src[i], used_t + tgt[i]
  next_fit = 1 - (src.sum() + tgt.sum()) / (rows * 512)
  planned = plan_stats(epoch_plan(src, tgt, batching_lib.Batching(max_tokens=25000, max_len=256, packing=True), 0, 0),
                       src, tgt)["padding_fraction"]
  assert next_fit > 0.1 and planned < next_fit / 5


def test_rows_must_split_over_processes(setup):
  config, corpus = setup
  plan = epoch_plan(corpus.src_lengths, corpus.tgt_lengths, data.batching_config(config), 0, 0)
  planned = next(b for b in plan if b.shape[0] % 3)
  with pytest.raises(ValueError, match="do not split over 3 processes"):
    make_batch(corpus, planned, 0, 3)
