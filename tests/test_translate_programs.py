"""Issue 46, parts 1 and 2: a translation compiles at most `max_programs` searches, fitted to
its lengths, with the hypotheses of one search per bucket; and what it shows while it runs."""

import io
import itertools
import json

import numpy as np
import pytest

from seq2seq.inference import evaluate
from seq2seq.inference.programs import SOURCE_BUCKETS, plan_widths, source_bucket
from seq2seq.inference.progress import Progress
from seq2seq.inference.translate import Translator


def padded_cost(lengths, widths, cost):
  return sum(n * cost(next(w for w in widths if w >= source_bucket(n))) for n in lengths)


@pytest.mark.parametrize("seed", range(6))
def test_planned_widths_are_the_cheapest_choice_of_buckets_that_holds_every_length(seed):
  rng = np.random.default_rng(seed)
  lengths = list(rng.integers(1, 600, size=int(rng.integers(1, 80))))
  cost = lambda w: w + 2 * w + 10  # a source of w tokens, outputs of up to 2w + 10
  buckets = sorted({source_bucket(n) for n in lengths})
  for k in (1, 2, 3):
    widths = plan_widths(lengths, k, cost, weight=lambda n: n)
    assert len(widths) <= k and widths[-1] == buckets[-1] and set(widths) <= set(buckets)
    best = min(padded_cost(lengths, combo + (buckets[-1],), cost)
               for r in range(min(k, len(buckets)))
               for combo in itertools.combinations(buckets[:-1], r))  # every choice, by brute force
    assert padded_cost(lengths, widths, cost) == pytest.approx(best, rel=1e-12)
  assert plan_widths(lengths, 0, cost) == tuple(buckets)  # 0: one per bucket


def test_a_set_over_six_buckets_compiles_three_searches_with_the_hypotheses_of_six(tiny_run):
  rng = np.random.default_rng(0)
  sources = [list(rng.integers(3, 900, size=n - 1)) + [1] for n in (5, 12, 20, 40, 60, 90, 130, 44, 9)]
  assert len({source_bucket(len(s)) for s in sources}) == 6
  settings = dict(beam_size=2, batch_size=1, max_len_b=4, workers=1)  # a batch per sentence: one per bucket
  per_bucket = Translator.from_workdir(tiny_run, max_programs=0, **settings)
  planned = Translator.from_workdir(tiny_run, **settings)  # max_programs=3, the config's default
  assert planned.max_programs == 3
  want = per_bucket.translate_ids(per_bucket.params, sources)
  assert per_bucket.compiled_programs == 6 and per_bucket.compile_seconds > 0
  assert planned.translate_ids(planned.params, sources) == want
  assert planned.compiled_programs == 3 and len(planned.programs.seconds) == 3
  first = planned.compile_seconds
  assert first > 0
  planned.translate_ids(planned.params, sources[::-1])  # compiled already: nothing new
  assert planned.compiled_programs == 3 and planned.compile_seconds == 0 and len(planned.programs.seconds) == 3
  one = Translator.from_workdir(tiny_run, max_programs=1, **settings)
  assert one.translate_ids(one.params, sources) == want and one.compiled_programs == 1
  assert SOURCE_BUCKETS[:3] == (16, 32, 48)


def test_eval_records_the_programs_and_compile_seconds_of_each_test_set(tiny_run, tmp_path):
  translator = Translator.from_workdir(tiny_run, beam_size=1, batch_size=4)
  sources = ["A man rides a bike.", "Two dogs play in the snow near a red house and a tree.", "Hi."]
  result = evaluate.evaluate(translator, translator.params, sources, sources, name="set", label="step60",
                             outdir=tmp_path)
  saved = json.loads(next(tmp_path.glob("set.step60.greedy*.json")).read_text())
  assert saved["compiled_programs"] == result["compiled_programs"] == translator.compiled_programs >= 1
  assert saved["compile_seconds"] == translator.compile_seconds


class Clock:
  def __init__(self):
    self.now = 100.0

  def __call__(self):
    return self.now


class Stream(io.StringIO):
  def __init__(self, tty: bool):
    super().__init__()
    self.tty = tty

  def isatty(self):
    return self.tty


def test_progress_off_a_terminal_is_a_line_per_batch_group_at_most_every_10_s():
  clock, stream = Clock(), Stream(tty=False)
  bar = Progress(300, enabled=True, stream=stream, clock=clock)
  bar.compiling(2)
  bar.compiling(1)  # one compiling line, when it starts
  for step in range(10):  # a batch of 30 sentences every 4 s
    clock.now += 4
    bar.update(30)
  bar.close()
  lines = stream.getvalue().splitlines()
  assert lines[0] == "compiling 2 search programs"
  assert lines[1:] == ["translated 90/300 sentences in 12.0 s (7.5 sentences/s)",
                       "translated 180/300 sentences in 24.0 s (7.5 sentences/s)",
                       "translated 270/300 sentences in 36.0 s (7.5 sentences/s)"]


def test_progress_at_a_terminal_is_a_bar_reading_compiling_and_quiet_is_silent():
  stream = Stream(tty=True)
  bar = Progress(64, enabled=True, stream=stream, clock=Clock())
  bar.compiling(3)
  assert "compiling 3 search programs" in stream.getvalue()
  bar.compiling(0)
  bar.update(64)
  assert bar.bar.n == 64 and bar.bar.desc == ""  # tqdm redraws at most every 0.1 s
  bar.close()
  assert "sent/s" in stream.getvalue()
  quiet = Stream(tty=True)
  bar = Progress(64, enabled=False, stream=quiet, clock=Clock())
  bar.compiling(3)
  bar.update(64)
  bar.close()
  assert quiet.getvalue() == ""
