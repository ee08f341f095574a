"""The settings, defaults and counts the README and docs/ quote are the code's and the records':
each figure is read from its source (a config, a constant, a flag's default, a function's
signature, a committed record) and found in the page's sentence, so changing one without the
other fails here."""

import ast
import inspect

from conftest import REPO
from report_tables import words

from seq2seq.configs import get as config


def source(name: str) -> str:
  return (REPO / name).read_text(encoding="utf-8")


def test_the_readmes_decoding_and_seed_counts_are_the_config_and_records():
  """The results table's decoding is configs/multi30k.py's; the recipe claims' seed counts and
  steps are the search's records'."""
  from seq2seq.research import recipe_search

  readme, c = words("README.md"), config("multi30k")
  assert f"sacreBLEU (cased, 13a, detokenized), beam {c.eval.beam_size}, alpha {c.eval.alpha:g}" in readme
  records = recipe_search.load(REPO / "docs" / "runs" / "main_job_search.jsonl")
  seeds = lambda prefix: [r for r in records if r.run.startswith(prefix)]
  chosen, former, shipped = (seeds(p) for p in (recipe_search.CHOSEN, recipe_search.BASELINE, recipe_search.ROWS64))
  assert len(chosen) == len(former) == len(shipped) == 3 and {r.steps for r in chosen} == {7000}
  assert "only, at 7000 steps: over 3 seeds each it gains" in readme
  assert "Over 3 seeds against those 3 it gains" in readme


def test_data_mds_settings_are_the_codes():
  """data.md: the Hub split's size (configs/wmt14_base.py's note), the prefetch depth, the row
  lengths' multiple, the fingerprint's length, subword regularization's default, the tokenizer
  test's words, and 0.2.2's seeding time against 0.2.3's (docs/history.md)."""
  import re

  from seq2seq.data import batching

  page, history = words("docs/data.md"), words("docs/history.md")
  pairs = int(re.search(r"split `train`: ([\d,]+) pairs", source("configs/wmt14_base.py"))[1].replace(",", ""))
  assert f"`hf:wmt/wmt14:de-en:train`, {pairs / 1e6:.1f}M pairs from Europarl v7" in page
  assert "with Prefetch(_feed(train_iter, mesh, model_cfg), depth=2) as feed:" in source("seq2seq/training/train.py")
  assert page.count("two steps ahead") == 2
  assert batching.LENGTH_MULTIPLE == 8 and "geometric from `data.bucket_min` to `data.max_len`, multiples of 8" in page
  assert "hexdigest()[:16]" in source("seq2seq/data/corpus.py") and "`Corpus.fingerprint` is 16 hex digits" in page
  assert f"best ones (default {config('default').data.subword_nbest})" in page
  test = ast.parse(source("tests/test_tokenizer.py"))
  (fn,) = [n for n in test.body if isinstance(n, ast.FunctionDef) and n.name == "test_a_frequent_word_becomes_one_piece"]
  listed = next(n.value for n in ast.walk(fn) if isinstance(n, ast.Assign) and n.targets[0].id == "words")
  n_words, n_sentences = len(listed.elts), 10_000
  assert f"for i in range({n_sentences:_}):" in source("tests/test_tokenizer.py")
  assert f"({n_words} words that occur {n_sentences // n_words} times each:" in page
  slow, fast = (int(s) for s in re.search(r"0\.2\.2's seeding took (\d+) s .* against (\d+) s under 0\.2\.3", history)
                .groups())
  assert round(slow / fast) == 2
  assert "the pinned 0.2.2 trains about twice as slowly" in page and "about twice 0.2.3's time" in page


def test_training_mds_settings_are_the_codes():
  """training.md: the benchmark's reference model, the optimizer's defaults, the save benchmark's
  repeats, the dry run's assumed MFU, and the steps a stop can be behind."""
  import re

  from seq2seq.training.train import STEPS_IN_FLIGHT

  page = words("docs/training.md")
  bench = source("benchmarks/train_throughput.py")
  assert ("config.model.update(d_model=256, num_heads=4, num_encoder_layers=3, num_decoder_layers=3, d_ff=1024,"
          in bench and 'parser.add_argument("--vocab_size", type=int, default=8000)' in bench)
  assert "Speed: on the reference shape (d_model 256, 4 heads, 3+3 layers, ffn 1024, vocab 8000," in page
  t = config("default").train
  assert f"AdamW (beta2 {t.adam_b2:g}, eps {t.adam_eps:.0e})".replace("e-0", "e-") in page
  assert 'parser.add_argument("--repeats", type=int, default=3)' in source("benchmarks/save_time.py")
  assert "median of 3;" in page
  # The flag's default from its definition (importing the command would define its absl flags twice in one
  # process, beside the sweep's).
  mfu = float(re.search(r'DEFINE_float\("mfu", ([\d.]+),', source("seq2seq/commands/train.py"))[1])
  assert f"at `--mfu` (default {mfu:g})" in page
  assert f"the time to save is about {STEPS_IN_FLIGHT + 1} steps plus" in page
  assert f"(at most {STEPS_IN_FLIGHT} behind the one computing" in page


def test_evaluation_mds_settings_are_the_codes():
  """evaluation.md: the progress line's interval, sacreBLEU's paired tests' defaults, the source
  limit and full-row width, the settings' bounds (RULES), compaction's threshold and the default
  batch, and the CTranslate2 benchmark's batches."""
  from sacrebleu import significance

  from seq2seq.inference import progress, settings, translate

  page = words("docs/evaluation.md")
  every = inspect.signature(progress.Progress.__init__).parameters["every"].default
  assert f"at most every {every:g} s" in page
  bs = inspect.signature(significance._paired_bs_test).parameters["n_samples"].default
  ar = inspect.signature(significance._paired_ar_test).parameters["n_samples"].default
  assert "os.environ.get('SACREBLEU_SEED', '12345')" in inspect.getsource(significance)
  assert (f"the default, {bs} resamples: mean and 95% interval per system and the p-value) or approximate "
          f"randomization (`ar`, {ar} trials: the p-value)") in page
  assert "(`SACREBLEU_SEED`, 12345 unless set)" in page and f"(`bs:{bs}|seed:12345|...`)" in page
  e = config("default").eval
  assert f"`eval.max_source_len` tokens ({e.max_source_len};" in page
  assert f"(as many tokens as a batch of {translate.FULL_ROWS_WIDTH}-token ones)" in page
  rules = settings.RULES
  assert (f"`--alpha` at most {rules['alpha'].high:g}, `--max_len_a` at most {rules['max_len_a'].high:g} and "
          f"`--max_len_b` at most {rules['max_len_b'].high:,}") in page
  assert rules["seed"].high == 2**31 - 1 and "`--seed` a 32-bit integer" in page
  # Compaction: a quarter of the batch, for batches whose quarter is at least 8 sentences.
  code = inspect.getsource(translate.Translator.__init__)
  assert "tuple(n for n in (self.batch_size // 4,) if n >= max(dp, 8))" in code
  assert e.batch_size == 64
  assert ("Once a quarter of a batch's sentences are unfinished, they move into a batch of that size and go on there "
          "(batches of 32 sentences or more;") in page and "keep 64 sentences' rows busy" in page
  assert "Translator.from_workdir(args.workdir, batch_size=64" in source("benchmarks/ctranslate2_speed.py")
  assert "with beam 4 in batches of 64 on a 2-core Intel Xeon" in page
  assert e.max_programs == 3 and "need three source widths, so three search programs" in page


def test_scaling_mds_settings_are_the_codes():
  """scaling.md: the device check's training run and profile steps, the vocabulary and angle
  range of the bf16 table, and accumulation's tokens."""
  page = words("docs/scaling.md")
  check = source("benchmarks/device_check.py")
  assert "train_steps=100, train_pairs=150_000," in check
  assert "100 steps on newstest2013+2014 tiled to 150k pairs" in page
  assert 'parser.add_argument("--profile_steps", type=int, default=5,' in check
  assert "traces five train steps of each row layout" in page
  base = config("wmt14_base")
  assert base.data.vocab_size // 1000 == 37 and "logsumexp over 37k entries" in page
  assert base.model.max_len == 256 and "position × frequency up to 256" in page
  assert 4 * base.data.max_tokens == 100_000 and "(4 gives 100k tokens)" in page


def test_model_mds_defaults_are_the_model_configs():
  """model.md: the learned table's and the relative bias's defaults."""
  import dataclasses

  from seq2seq.model.config import ModelConfig

  defaults = {f.name: f.default for f in dataclasses.fields(ModelConfig)}
  page = words("docs/model.md")
  assert f"a trained table of `max_len` (default {defaults['max_len']}) embeddings" in page
  assert (f"(`relative_buckets`, default {defaults['relative_buckets']}, `relative_max_distance`, default "
          f"{defaults['relative_max_distance']})") in page


def test_results_mds_settings_are_the_configs_records_and_notebook():
  """results.md: the retired configs (CHANGELOG.md) against the former default's record, the main job's
  validation steps, the family's size, the search's FLOPs budget (multi30k_d128 at 0.98x the
  former default), its stages' seeds, the tokenizer's threads, the notebook's steps and sentences."""
  import re

  from seq2seq.data import tokenizer
  from seq2seq.model import flops
  from seq2seq.model.config import ModelConfig
  from seq2seq.research import family, recipe_search

  page = words("docs/results.md")
  records = {r.run: r for r in recipe_search.load(REPO / "docs" / "runs" / "main_job_search.jsonl")}
  former = records["default_s1"]
  m = former.settings["model"]
  assert (f"the former hour run: d_model {m['d_model']}, {m['num_encoder_layers']}+{m['num_decoder_layers']} layers, "
          f"{'RoPE' if m['positions'] == 'rope' else m['positions']}, {former.steps} steps |") in page
  # The retired configs, as CHANGELOG.md keeps them: overrides of the former recipe, or of today's multi30k.
  changelog = " ".join(source("CHANGELOG.md").split())
  retired = lambda name: re.search(rf"`{name}` is (?:it|the former recipe above) with `--config.model.dropout_rate=([\d.]+) "
                                   r"--config.train.steps=(\d+)", changelog).groups()
  for name, said in (("multi30k_long", "2x the steps and dropout 0.3"), ("multi30k_6k", "2.5x the steps and dropout 0.2")):
    dropout, steps = retired(name)
    assert f"{int(steps) / former.steps:g}x the steps and dropout {float(dropout):g}" == said, name
    assert f"that run with {said}" in page
  assert "`multi30k_d128` is `--config=multi30k --config.model.dropout_rate=0.3`;" in changelog
  main = config("multi30k")
  assert "today's `multi30k` with dropout 0.3 |" in page
  assert (f"at every validation step, {main.train.eval_every} to {main.train.steps}") in page
  assert f"in the README's family of {len(family.claims(REPO))} NLL tests" in page
  # The budget: training FLOPs (steps x FLOPs a step, in rows of 128 as both trained) against the former default's.
  def spent(r):
    s = r.settings
    cfg = ModelConfig.from_config(s["model"], vocab_size=s["data"]["vocab_size"])
    length = s["data"]["pack_length"]
    return r.steps * flops.train_step_flops(cfg, s["data"]["max_tokens"] // length, length, length)

  assert former.settings["data"]["pack_length"] == records["d128_s0"].settings["data"]["pack_length"] == 128
  assert f"they start from `multi30k_d128` ({spent(records['d128_s0']) / spent(former):.2f}x)" in page
  seeds = lambda prefix: sorted(r.seed for r in records.values() if r.run.startswith(prefix))
  assert seeds("m30k_3600_s") + [records["m30k_3600_readme"].seed] == [1, 2, 3, 0]
  retuned = [r for r in records.values() if r.run.startswith("m30k_3600_") and r.seed == 0
             and r.run not in ("m30k_3600_readme",)]
  assert len(retuned) == 3 and seeds("m30k_3600_lr007_s") == [1, 2, 3]
  assert seeds("m30k_p64_s") + [records["m30k_p64_readme"].seed] == [1, 2, 0]
  assert ("the chosen recipe cut to the main job's time (3600 steps, seeds 0 to 3), three re-tunings at 3600 steps "
          "with seed 0 and the rate 0.007's seeds 1 to 3, then rows of 64 in 4200 steps (seeds 0 to 2)") in page
  assert f"sentencepiece 0.2.2 with {tokenizer.TRAIN_THREADS} threads reproduces here" in page
  notebook = source("notebooks/quickstart.ipynb")
  assert "config.train.update(steps=400," in notebook
  sources = ast.literal_eval(notebook.split('"sources = ', 1)[1].split('\\n",', 1)[0].replace('\\"', '"'))
  assert len(sources) == 3
  assert "trains `multi30k` for 400 steps on all of Multi30k" in page and "three sentences correctly" in page


def test_sweeps_mds_variants_are_variants_py():
  """sweeps.md: what `deep` and `wide` do, as variants.py describes and builds them, and the
  config's calibration as docs/history.md tells it."""
  from seq2seq.research import variants

  page, history = words("docs/sweeps.md"), words("docs/history.md")
  code = source("seq2seq/research/variants.py")
  assert '"deep": ("2x the layers, d_model x3/4, d_ff for equal layer parameters", _depth(2.0)),' in code
  assert '"wide": ("1/2 the layers, d_ff for equal layer parameters", _depth(0.5)),' in code
  assert {"deep", "wide"} <= set(variants.VARIANTS)
  assert "| `deep`, `wide` | 2x the layers (and d_model x3/4) or 1/2 the layers, at equal layer parameters |" in page
  assert "calibrated for vanilla to pass 25 BLEU in the least time" in history
  assert "was calibrated for vanilla to pass 25 test BLEU in the least time" in page
