"""The figures docs/data.md and docs/training.md quote are those of the committed records they
cite (benchmarks/results/*.json, docs/history.md, the configs and constants), each computed
with the page's own rounding; the pages' tables are rebuilt row by row from their records."""

import re

from conftest import REPO
import report_tables
from report_tables import words


def page(name: str) -> str:
  return words(f"docs/{name}")


result = report_tables.record


def section(text: str, heading: str) -> str:
  """The text under a `## heading` (to the next heading of that level or above), whitespace normalised."""
  body = text.split(f"\n## {heading}\n", 1)[1]
  return " ".join(re.split(r"^#{1,2} ", body, maxsplit=1, flags=re.M)[0].split())


def test_data_pipeline_figures_are_the_wmt_benchmarks():
  """data.md's WMT-size timings, memory, corpus and host figures are data_pipeline_wmt_cpu2.json's."""
  r = result("data_pipeline_wmt_cpu2.json")
  doc = page("data.md")
  tokens = r["tokens"]["src"] + r["tokens"]["tgt"]
  median = r["length_percentiles"]
  tok, corpus, both = r["tokenizer"], r["corpus"], r["text_to_token_cache"]
  assert (f"on a {r['pairs_kept'] / 1e6:.1f}M-pair corpus made with newstest2013/2014's sentence lengths and vocabulary "
          f"(`benchmarks/wmt_like.py`; {tokens / 1e6:.0f}M tokens, median {median['src']['50']} pieces per English "
          f"sentence and {median['tgt']['50']} per German one)") in doc
  assert f"sentencepiece sample and training {tok['seconds']:.0f} s at {tok['peak_gib']:.1f} GiB peak" in doc
  assert f"tokenizing and caching {corpus['seconds']:.0f} s at {corpus['peak_gib']:.1f} GiB" in doc
  assert (f"**text to token cache in {both['seconds']:.0f} s ({round(both['pairs_per_s'], -3):,.0f} pairs/s) at "
          f"{both['peak_gib']:.1f} GiB**") in doc
  from seq2seq.configs import wmt14_base
  # host time per batch against the wmt14_base step (bucketed, as the run batches)
  host, step = r["bucketed"]["host_per_batch"], r["train_step"]
  from seq2seq.model.flops import PEAK_TFLOPS

  share = 400 / PEAK_TFLOPS["H100"][0]
  assert (f"A {wmt14_base.get_config().data.max_tokens // 1000}k-token batch takes {host['build_ms']:.1f} ms to build "
          f"and {host['put_ms']:.1f} ms to put on the (CPU) device here, against "
          f"{step['accelerator_seconds_at_400_tflops'] * 1e3:.0f} ms for the wmt14_base step at 400 TFLOP/s (about "
          f"{round(share, 1):.0%} of an H100's bf16 peak) and {step['cpu_seconds_8x_an_eighth']:.0f} s on this CPU.") in doc
  assert f"both together take less than the table's {r['bucketed']['seconds_from_cache']:.1f} s" in doc
  # subword regularization's memory check, by its own formula, on this corpus
  from seq2seq.data import subword

  class Side:
    def __init__(self, n: int):
      self.n, self.dtype = n, __import__("numpy").dtype("uint16")

    def __len__(self):
      return self.n

  class Corpus:
    src, tgt = Side(r["tokens"]["src"]), Side(r["tokens"]["tgt"])

    def __len__(self):
      return r["pairs_kept"]

  need = subword.memory_needed(Corpus(), 64)
  assert (f"(the 64 best of the {r['pairs_kept'] / 1e6:.1f}M-pair corpus above, {tokens / 1e6:.0f}M tokens, could take "
          f"about {need / 2**30:.0f} GiB)") in doc


def test_the_batching_table_is_the_wmt_benchmarks():
  """data.md's batching table: its measured rows are data_pipeline_wmt_cpu2.json's, row by row."""
  r = result("data_pipeline_wmt_cpu2.json")
  doc = (REPO / "docs" / "data.md").read_text(encoding="utf-8")
  from seq2seq.configs import wmt14_base

  config = wmt14_base.get_config()
  header = f"| {r['pairs_kept'] / 1e6:.1f}M WMT-length pairs, {config.data.max_tokens // 1000}k tokens |"
  rows = [line for line in doc.splitlines() if line.startswith("| ")]
  start = rows.index(next(line for line in rows if line.startswith(header)))
  measured = [f"| {label} | {m['batches']} | {len(m['batch_shapes'])} | {m['padding_fraction']:.1%} | "
              f"{m['seconds_from_cache']:.1f} s |"
              for label, m in (("bucketed (wmt14_base)", r["bucketed"]), (r["packed"]["batching"], r["packed"]))]
  assert rows[start + 1:start + 3] == measured
  assert r["bucketed"]["batching"] == f"{config.data.num_buckets} row lengths" and not config.data.packing
  assert r["packed"]["batching"] == f"packing into {config.data.max_len}"


def test_the_tokenizer_comparison_is_historys():
  """data.md's 0.2.3-against-0.2.2 figures are those of the history.md section it links to."""
  doc = page("data.md")
  anchor = "history.md#the-main-jobs-tokenizer-before-the-pin"
  history = section((REPO / "docs" / "history.md").read_text(encoding="utf-8"), "The main job's tokenizer before the pin")
  tokens = re.search(r"under sentencepiece 0\.2\.3 with 2 threads \(([\d,]+) validation tokens\)", history)[1]
  gap, p = re.search(r"they trail by ([\d.]+) BLEU \(\[[^]]*\], Welch p = ([\d.]+)\)", history).groups()
  assert "an exploratory comparison of 4 against 2 seeds" in history and "inconclusive" in history
  assert f"cuts the validation targets into {tokens} tokens against 16,345" in doc  # 16,345: tests/test_tokenizer.py
  assert (f"Two runs of the main job with 0.2.3's tokenizer trail four with 0.2.2's by {gap} validation BLEU "
          f"(Welch p = {p}, inconclusive; [history.md]({anchor}))") in doc


def test_data_figures_that_are_settings_are_the_configs_and_constants():
  """data.md's settings (thread count, chunk sizes, bucket count, output limit, sample sizes) are the code's."""
  doc = page("data.md")
  from seq2seq.configs import default, multi30k, wmt14_base
  from seq2seq.data import corpus, tokenizer

  assert f"the trainer always runs with {tokenizer.TRAIN_THREADS} threads" in doc
  assert f"encoded {corpus.CHUNK_PAIRS:,} pairs at a time" in doc
  assert f"once in {corpus.READ_BYTES >> 20} MiB chunks" in doc
  assert f"up to `data.num_buckets` ({default.get_config().data.num_buckets}) row lengths" in doc
  assert f"(for Multi30k with {multi30k.get_config().data.vocab_size} subwords, source + " \
         f"{multi30k.get_config().eval.max_len_b};" in doc
  sample = wmt14_base.get_config().data.spm_sample_size
  note = " ".join((REPO / "configs" / "wmt14_base.py").read_text().split())
  bigger = re.search(r"\((\d)M would take ([\d.]+ GB) to train; (\d)M takes", note).groups()
  assert int(bigger[2]) * 10**6 == sample
  assert f"Training sentencepiece on {bigger[0]}M sentences instead of {sample // 10**6}M takes {bigger[1]}." in doc


def test_training_speed_figures_are_the_benchmarks():
  """training.md's train-step MFU, validation BLEU time and stop times are those of their JSON records."""
  doc = page("training.md")
  t = result("train_throughput_cpu2.json")
  b, s, _ = t["shape"]
  assert t["dtype"] == "float32"
  assert (f"{b}×{s} tokens, f32, dropout 0.1) the train step runs at {t['mfu_best']:.0%} of a plain f32 matmul peak "
          f"measured in the same run on a 2-core CPU") in doc
  # validation BLEU's cost: the later validations' range, and the first one's (it compiles the search)
  seconds = result("eval_speed_cpu2.json")["validation_fills_cache"]["training"]["val_bleu_seconds_beam4"]
  first, *later = [seconds[step] for step in sorted(seconds, key=int)]
  assert (f"`benchmarks/results/eval_speed_cpu2.json`: {min(later):.1f}–{max(later):.1f} s on the 2-core CPU, "
          f"{first:.0f} s at the first validation, which compiles the search)") in doc
  # a stop: the steps in flight plus the one computing, then the save to exit
  from seq2seq.training.train import STEPS_IN_FLIGHT

  assert f"`STEPS_IN_FLIGHT` = {STEPS_IN_FLIGHT} steps queued" in doc
  assert f"the checkpoint is at most {STEPS_IN_FLIGHT + 1} steps past" in doc
  profile = result("profile_cpu2_multi30k.json")
  from seq2seq.configs import multi30k

  data = multi30k.get_config().data
  assert data.packing and profile["config"] == "configs/multi30k.py"
  step = next(row for row in profile["rows"].values()
              if row["shape"] == [data.max_tokens // data.pack_length, data.pack_length, data.pack_length])
  step_s = step["step_ms_untraced"] / 1e3
  saves = {row["config"]: row for row in result("save_time_cpu2.json")["rows"]}
  stop_s = (STEPS_IN_FLIGHT + 1) * step_s + saves["multi30k"]["stop_s"]
  big = saves["wmt14_big"]
  assert (f"So a stop of `multi30k` on the 2-core CPU (about {step_s:.1f} s a step, "
          f"`benchmarks/results/profile_cpu2_multi30k.json`) ends within about {stop_s:.0f} s of the signal; "
          f"`wmt14_big` saves its {big['state_bytes'] / 1e9:.1f} GB to a local disk and exits in about "
          f"{big['stop_s']:.0f} s.") in doc


def test_training_mds_resumed_run_is_the_one_history_describes():
  """training.md's example of a resumed run points at the history.md section that says it was resumed."""
  doc = page("training.md")
  assert ("(The `m30k_d02` run in [history.md](history.md#multi30k_6k) was stopped twice with SIGTERM and resumed "
          "with the same command.)") in doc
  history = section((REPO / "docs" / "history.md").read_text(encoding="utf-8"), "multi30k_6k")
  assert re.search(r"The sinusoidal run `m30k_d02` .* \(three legs, stopped twice with SIGTERM and resumed\)", history)
