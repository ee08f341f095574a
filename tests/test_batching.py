"""Batching on the real Multi30k training corpus: determinism, exact resume, every
example once across processes, token budget, bounded shapes, padding, packing."""

import json

import numpy as np
import pytest

from seq2seq import data
from seq2seq.batching import BatchIterator, epoch_plan, make_batch, plan_stats
from seq2seq.tokenizer import EOS_ID

from conftest import make_config


@pytest.fixture(scope="module")
def setup(data_dir, session_cache):
  config = make_config("multi30k", data_dir, session_cache, packing=False)  # these tests are about length buckets
  tok = data.tokenizer(config)
  return config, data.corpus(config, config.data.train_split, tok)


def batching_with(config, **data_overrides):
  config = config.copy_and_resolve_references()
  config.data.update(data_overrides)
  return data.batching(config)


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
  cfg = data.batching(config)
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
    BatchIterator(corpus, data.batching(config), seed=0, state={"seed": 3, "epoch": 0, "position": 0})


def examples_in(batch):
  """(source ids, target ids) of every segment of every row, read back from a batch."""
  out = []
  for r in range(batch["src_bs"].shape[0]):
    for seg in range(1, int(batch["src_segments_bs"][r].max(initial=0)) + 1):
      src = batch["src_bs"][r][batch["src_segments_bs"][r] == seg]
      tgt_mask = batch["tgt_segments_bt"][r] == seg
      tgt, tgt_in = batch["tgt_out_bt"][r][tgt_mask], batch["tgt_in_bt"][r][tgt_mask]
      np.testing.assert_array_equal(tgt_in, np.concatenate([[EOS_ID], tgt[:-1]]))  # shifted per segment
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


def test_budget_bounded_shapes_and_padding_under_10_percent(setup):
  config, corpus = setup
  cfg = data.batching(config)
  plan = epoch_plan(corpus.src_lengths, corpus.tgt_lengths, cfg, config.seed, 0)
  stats = plan_stats(plan, corpus.src_lengths, corpus.tgt_lengths)
  bounds = set(cfg.boundaries().tolist())
  for rows, s, t in stats["shapes"]:
    assert rows % cfg.batch_multiple == 0 and rows * max(s, t) <= cfg.max_tokens
    assert s in bounds and t in bounds
  assert len(stats["shapes"]) <= 4 * len(bounds)
  assert stats["padding_fraction"] < 0.10
  # The planned fraction is what the batches really contain.
  batches = [make_batch(corpus, b) for b in plan]
  real = sum(int((b["src_segments_bs"] > 0).sum() + (b["tgt_segments_bt"] > 0).sum()) for b in batches)
  slots = sum(b["src_bs"].size + b["tgt_out_bt"].size for b in batches)
  assert 1 - real / slots == pytest.approx(stats["padding_fraction"], abs=1e-12)


def test_packing_uses_one_shape(setup):
  corpus, cfg = setup[1], batching_with(setup[0], packing=True, pack_length=64)
  stats = plan_stats(epoch_plan(corpus.src_lengths, corpus.tgt_lengths, cfg, 0, 0), corpus.src_lengths,
                     corpus.tgt_lengths)
  assert stats["shapes"] == [(cfg.max_tokens // 64 // 8 * 8, 64, 64)]


def test_rows_must_split_over_processes(setup):
  config, corpus = setup
  plan = epoch_plan(corpus.src_lengths, corpus.tgt_lengths, data.batching(config), 0, 0)
  planned = next(b for b in plan if b.shape[0] % 3)
  with pytest.raises(ValueError, match="do not split over 3 processes"):
    make_batch(corpus, planned, 0, 3)
