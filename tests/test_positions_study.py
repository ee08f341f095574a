"""The length-extrapolation study (seq2seq/research/positions.py, lengths.py and
positions_report.py): sources bucketed by their tokens, BLEU per bucket as sacreBLEU gives it
on the bucket's sentences, NLL per bucket from the forced score, the runs' commands, and the
report (tables, tests, plot) from run files. positions.py defines absl flags, so it runs as a
subprocess here, never imported."""

import json
import math
import os
import statistics
import subprocess
import sys
import types

import pytest
from sacrebleu.metrics import BLEU

from conftest import REPO
import report_tables
from seq2seq.errors import ConfigError, DataError
from seq2seq.inference.settings import SearchSettings
from seq2seq.research import lengths, positions_report, significance, variants


class Words:
  """A tokenizer of whitespace-separated words, eos appended (as Tokenizer.encode does)."""

  def encode(self, texts):
    return [[5] * len(t.split()) + [1] for t in texts]


def words(n: int, word: str = "w") -> str:
  return " ".join([word] * n)


def test_sources_are_bucketed_by_their_tokens_with_eos_at_multiples_of_the_training_length():
  pairs = [(words(n), words(n + 1, "v")) for n in range(1, 71)]  # sources of 2 to 71 tokens with eos
  columns = lengths.measure(Words(), {"val": pairs})
  assert columns["src_len"] == list(range(2, 72)) and columns["tgt_len"] == list(range(3, 73))
  upper = lengths.edges(16)
  assert upper == (16, 32, 48, 64) and lengths.edges(16, (1, 1.5, 2)) == (16, 24, 32)
  assert lengths.labels(upper) == ["1–16", "17–32", "33–48", "49–64", ">64"]
  assert [lengths.bucket(n, upper) for n in (1, 16, 17, 32, 33, 64, 65)] == [0, 0, 1, 1, 2, 3, 4]
  scored = columns | {"hypothesis": columns["reference"], "logprob": [-1.0] * 70}
  assert [row["sentences"] for row in lengths.scores(scored, upper)] == [15, 16, 16, 16, 7]
  assert [row["target_tokens"] for row in lengths.scores(scored, upper)] == [
      sum(range(3, 18)), sum(range(18, 34)), sum(range(34, 50)), sum(range(50, 66)), sum(range(66, 73))]
  with pytest.raises(ConfigError, match="positive"):
    lengths.edges(0)


def test_joined_pairs_fill_the_long_buckets():
  pairs = [(words(n), words(n, "v")) for n in (3, 4, 5, 6, 7)]
  assert lengths.joined(pairs, 2) == [(words(7), words(7, "v")), (words(11), words(11, "v"))]  # the 5th left out
  columns = lengths.measure(Words(), {"val": pairs, "test": pairs[:4]}, joins=(1, 2, 4))
  assert columns["split"] == ["val"] * 8 + ["test"] * 7
  assert columns["join"] == [1] * 5 + [2, 2, 4] + [1] * 4 + [2, 2, 4]
  assert columns["src_len"][5:8] == [8, 12, 19] and columns["source"][7] == words(18)  # 3+4+5+6 words and eos
  scored = columns | {"hypothesis": columns["reference"], "logprob": [-1.0] * 15}
  # Up to 8 tokens: 9 single sentences and the two joined pairs of 3+4 words; then 12 and 19 tokens, joined.
  assert [(r["sentences"], r["joined"]) for r in lengths.scores(scored, lengths.edges(8))] == [
      (11, 2), (2, 2), (2, 2), (0, 0), (0, 0)]
  with pytest.raises(ConfigError, match=">= 1"):
    lengths.joined(pairs, 0)


def test_bucket_bleu_is_sacrebleu_on_the_buckets_sentences_and_nll_the_summed_forced_score_per_token():
  references = ["a man rides a red bike", "two dogs run on the beach", "a woman sings on a stage",
                "children play football in a park near the river", "an old man reads a newspaper on a bench"]
  hypotheses = ["a man rides a bike", "two dogs run on a beach", "a woman is singing", "children play in a park",
                "an old man reads a book on a bench"]
  columns = {"split": ["val"] * 5, "join": [1, 1, 2, 1, 2], "src_len": [3, 4, 9, 12, 30], "tgt_len": [7, 7, 7, 10, 10],
             "logprob": [-3.5, -2.0, -7.0, -12.5, -20.0], "hypothesis": hypotheses, "reference": references}
  rows = lengths.scores(columns, (4, 8, 12, 16))
  sacre = lambda idx: BLEU().corpus_score([hypotheses[i] for i in idx], [[references[i] for i in idx]]).score
  assert rows[0]["bleu"] == pytest.approx(sacre([0, 1]), abs=1e-9) and rows[0]["nll"] == pytest.approx(5.5 / 14)
  assert rows[2]["bleu"] == pytest.approx(sacre([2, 3]), abs=1e-9) and rows[2]["nll"] == pytest.approx(19.5 / 17)
  assert rows[2]["joined"] == 1 and rows[4]["bleu"] == pytest.approx(sacre([4]), abs=1e-9)
  assert rows[1]["sentences"] == 0 and math.isnan(rows[1]["bleu"]) and math.isnan(rows[1]["nll"])


def test_the_study_refuses_a_source_the_model_would_cut():
  translator = types.SimpleNamespace(settings=SearchSettings(max_len_a=1.0, max_len_b=10), position_limit=64,
                                     source_limit=64)
  lengths.check_fits(translator, [50, 54], [60, 64])
  with pytest.raises(ConfigError, match="the longest evaluated source has 65 tokens.*--config.model.max_len=65"):
    lengths.check_fits(translator, [65], [10])
  with pytest.raises(ConfigError, match="outputs of up to 65 do not fit the learned position table of 64 rows"):
    lengths.check_fits(translator, [55], [10])
  with pytest.raises(ConfigError, match="references of up to 65"):
    lengths.check_fits(translator, [10], [65])
  sinusoidal = types.SimpleNamespace(settings=SearchSettings(), position_limit=None, source_limit=1024)
  lengths.check_fits(sinusoidal, [1000], [2000])
  with pytest.raises(ConfigError, match=r"\(eval.max_source_len\)"):
    lengths.check_fits(sinusoidal, [1025], [10])


@pytest.mark.long  # translates and scores with the tiny run (5 s)
def test_the_evaluation_records_the_translation_and_the_forced_score(tiny_run):
  """On a trained tiny model: the hypotheses are Translator.translate's, the log-probabilities
  Translator.score's (teacher-forced, unnormalized), so a bucket's NLL is the forced score."""
  from seq2seq import data
  from seq2seq.inference.translate import Translator

  translator = Translator.from_workdir(tiny_run)
  pairs = data.eval_pairs(translator.config, "val")[:24]
  record = lengths.evaluate(translator, {"val": pairs}, joins=(1, 2))
  columns = record["sentences"]
  assert len(columns["source"]) == 36 and columns["src_len"] == [len(s) for s in translator.tok.encode(columns["source"])]
  assert columns["hypothesis"] == translator.translate(columns["source"])
  forced = translator.score(columns["source"], columns["reference"], normalize=False)
  assert columns["logprob"] == pytest.approx(forced, rel=1e-6)
  upper = lengths.edges(int(translator.config.data.max_len) // 4)
  for b, row in enumerate(lengths.scores(columns, upper)):
    rows = [i for i, n in enumerate(columns["src_len"]) if lengths.bucket(n, upper) == b]
    assert row["sentences"] == len(rows)
    if rows:
      tokens = sum(columns["tgt_len"][i] for i in rows)
      assert row["nll"] == pytest.approx(-sum(forced[i] for i in rows) / tokens, rel=1e-6)
  assert record["position_table"] is None and record["checkpoint"] == translator.checkpoint
  assert record["decode"]["beam_size"] == translator.settings.beam_size
  with pytest.raises(ConfigError, match="eval.max_source_len"):
    lengths.evaluate(Translator.from_workdir(tiny_run, max_source_len=8), {"val": pairs})


def study(workdir, *extra, env=None, timeout=300):
  return subprocess.run([sys.executable, "-m", "seq2seq.research.positions", f"--workdir={workdir}", *extra,
                         "--compilation_cache="], capture_output=True, text=True, cwd=REPO, env=env, timeout=timeout)


def kinds():
  return ["sinusoidal", "learned", "rope"] + (["relative"] if variants.available("relative") else [])


@pytest.mark.long  # a subprocess (5 s)
def test_list_prints_each_runs_training_and_evaluation(tmp_path):
  listed = study(tmp_path, "--config=tiny", "--list", "--seeds=2", "--joins=1,3", "--config.train.steps=30")
  assert listed.returncode == 0, listed.stderr[-2000:]
  lines = listed.stdout.splitlines()
  assert len(lines) == 2 * len(kinds())
  for i, line in enumerate(lines):
    seed, kind = divmod(i, len(kinds()))
    kind = kinds()[kind]
    name = ("prenorm" if kind == "sinusoidal" else f"prenorm+{kind}") + f"-s{seed}"
    train, evaluation = line.split(" && ")
    flags = train.split()
    assert flags[:3] == ["seq2seq-train", "--config=tiny", "--config.train.steps=30"]
    assert {f"--config.model.positions={kind}", "--config.model.norm_position=pre", f"--config.seed={seed}",
            f"--workdir={tmp_path / name}"} <= set(flags)
    assert evaluation == f"python -m seq2seq.research.positions --evaluate --workdir={tmp_path / name} --joins=1,3"
  assert ("positions=relative is not in this version's model" in listed.stderr) != variants.available("relative")
  assert not (tmp_path / "sweep.json").exists()  # --list runs nothing
  bad = study(tmp_path, "--config=tiny", "--list", "--positions=sinusoidal,sinusoidal")
  assert bad.returncode == 2 and "each position type once" in bad.stderr


def write_run(root, name, kind, seed, bleu_noise, nll, steps=20):
  """A finished run's files as the study leaves them: config.json, metrics.jsonl and its record."""
  run = root / name
  (run / "eval").mkdir(parents=True)
  (run / "config.json").write_text(json.dumps({"train": {"steps": steps, "learning_rate": 0.002}, "data": {"max_len": 4},
                                               "model": {"positions": kind, "max_len": 64},
                                               "eval": {"beam_size": 2, "alpha": 0.6}}))
  (run / "metrics.jsonl").write_text(json.dumps({"step": steps, "loss": 2.0, "wall_time_s": 60.0}) + "\n"
                                     + json.dumps({"step": steps, "val_nll": nll}) + "\n")
  references = ["a man rides a red bike", "two dogs run on the beach", "a woman sings on a stage",
                "children play football in a park", "an old man reads a newspaper"]
  hypotheses = [r if i >= bleu_noise else " ".join(r.split()[:-1]) for i, r in enumerate(references)]
  sentences = {"split": ["val"] * 5, "join": [1, 1, 1, 2, 2], "source": ["x"] * 5, "reference": references,
               "hypothesis": hypotheses, "src_len": [2, 4, 6, 7, 20], "tgt_len": [7, 7, 7, 7, 6],
               "logprob": [-nll * 7, -nll * 7, -2 * nll * 7, -2 * nll * 7, -3 * nll * 6]}
  record = {"checkpoint": f"step{steps}", "decode": {"beam_size": 2, "alpha": 0.6}, "position_table": 64,
            "splits": ["val"], "joins": [1, 2], "translate_seconds": 20.0, "score_seconds": 10.0,
            "hardware": "2-core test CPU", "sentences": sentences}
  (run / "eval" / f"lengths.step{steps}.beam2-alpha0.6.json").write_text(json.dumps(record))
  return {"name": name, "variant": name.rsplit("-s", 1)[0], "size": "base", "seed": seed,
          "command": f"seq2seq-train ... --workdir={run}"}


def test_the_report_tables_tests_and_plot_from_run_files(tmp_path):
  entries = [write_run(tmp_path, "prenorm-s0", "sinusoidal", 0, 1, 1.00),
             write_run(tmp_path, "prenorm-s1", "sinusoidal", 1, 2, 1.02),
             write_run(tmp_path, "prenorm+learned-s0", "learned", 0, 3, 1.50),
             write_run(tmp_path, "prenorm+learned-s1", "learned", 1, 4, 1.56),
             write_run(tmp_path, "prenorm+rope-s0", "rope", 0, 0, 0.90),
             {"name": "prenorm+rope-s1", "variant": "prenorm+rope", "size": "base", "seed": 1, "command": ""}]
  command = "python -m seq2seq.research.positions --config=configs/multi30k_positions.py --workdir=DIR"
  (tmp_path / "sweep.json").write_text(json.dumps({"runs": entries, "sweeps": [command]}))
  out = tmp_path / "docs" / "positions.md"
  records = tmp_path / "docs" / "runs" / "positions.jsonl"
  assert positions_report.write(tmp_path, out) == f"{out}: 5 finished runs, 1 unfinished (records: {records})"
  report = out.read_text()
  assert report.startswith("# Length extrapolation") and positions_report.START in report
  assert f"```bash\n{command}\n```" in report and "`prenorm+rope-s1`" in report.split("### Not finished yet")[1]
  assert "Time: 5.0 min of training and 2.5 min of the study's translation and scoring for 5 runs" in report
  assert "Training pairs of at most 4 subword tokens" in report and "a table of 64 rows" in report
  # Question, protocol and limits come from the runs: their seeds, steps, rate, training length, the
  # joined share past it, the untrained rows (no relative run here, so no relative buckets).
  assert "**Question.** Do `learned` and `rope` positions translate sources" in report
  assert ("**Protocol.** 3 position types x 1–2 seeds (5 runs), each trained 20 steps at a peak rate of 0.002 on "
          "pairs of at most 4 tokens a side, then evaluated by source length in 5 buckets; Welch's t-test of each "
          "type against `sinusoidal` per bucket and metric, Holm's correction over the ") in report
  limits = report.split("**Limits.** ")[1].split("\n")[0]
  assert limits.startswith("One peak learning rate for every type (0.002) and one training length (20 steps)")
  assert "67% of the sources past 4 tokens are consecutive pairs joined" in limits  # 2 of 6, 7 and 20 tokens
  assert "learned positions' rows 4 to 63 were never trained" in limits and "relative" not in limits
  assert "1–2 seeds a side: Welch's degrees of freedom are 1 to 2" in limits
  bleu_table = report.split("### BLEU by source length")[1].split("###")[0]
  head = "| Source tokens | Sentences | Joined | `sinusoidal` (n = 2) | `learned` (n = 2) | `rope` (n = 1) |"
  assert head in bleu_table
  body = [line for line in bleu_table.splitlines() if line.startswith("| ") and not line.startswith("| Source")]
  rows = {cells[0]: cells[1:] for cells in ([c.strip() for c in line.split("|")[1:-1]] for line in body)}
  assert list(rows) == ["1–4", "5–8", "9–12", "13–16", ">16"] and rows["5–8"][:2] == ["2", "1"]
  assert rows["9–12"][2:] == ["–", "–", "–"]  # an empty bucket
  # learned in 1-4: the BLEU of each seed's two sentences, as sacreBLEU gives it; mean ± std, the difference.
  refs = ["a man rides a red bike", "two dogs run on the beach"]
  cut = lambda r: " ".join(r.split()[:-1])
  learned = [BLEU().corpus_score([cut(r) for r in refs], [refs]).score] * 2
  sinusoidal = [BLEU().corpus_score([cut(refs[0]), refs[1]], [refs]).score,
                BLEU().corpus_score([cut(r) for r in refs], [refs]).score]
  diff = statistics.fmean(learned) - statistics.fmean(sinusoidal)
  assert rows["1–4"][3] == f"{learned[0]:.2f} (−{abs(diff):.2f})"  # no spread between its seeds
  assert rows["1–4"][2] == f"{statistics.fmean(sinusoidal):.2f} ± {statistics.stdev(sinusoidal):.2f}"
  # The tests: Welch against sinusoidal per bucket and metric, Holm over all that have a p.
  found = positions_report.comparisons(positions_report.per_run(positions_report.collect(tmp_path)[0], lengths.edges(4)))
  nll = next(c for c in found if c.variant == "learned" and c.column == "1–4 NLL")
  assert nll.welch.p == pytest.approx(significance.welch([1.50, 1.56], [1.00, 1.02]).p)
  tested = [c.welch.p for c in found if c.welch.tested]
  assert nll.adjusted == pytest.approx(significance.holm(tested)[tested.index(nll.welch.p)])
  assert all(not c.welch.tested for c in found if c.variant == "rope")  # one seed: no test
  assert f"Holm-corrected over the {len(tested)} tests" in report
  assert "| `learned` | 1–4 | NLL | 2 / 2 |" in report
  # "No difference" only from an equivalence test: TOST against the sweep's margins, and the readings it supports.
  assert nll.tost.p == significance.tost([1.50, 1.56], [1.00, 1.02], 0.02).p and nll.tost.margin == 0.02
  assert next(c for c in found if c.variant == "learned" and c.column.endswith(" BLEU")).tost.margin == 0.5
  row = next(line for line in report.splitlines() if line.startswith("| `learned` | 1–4 | NLL |"))
  assert row.endswith(f"| {nll.tost.p:.3f} (±0.02) | {significance.reading(nll.adjusted, nll.tost)} |")
  survives = report.split("What survives:")[1].split("\n\n")[1]
  assert all(line.startswith("- **") for line in survives.splitlines())
  assert f"`learned` 1–4 NLL {nll.welch.difference:+.3f}" in survives
  png = out.with_name("positions_lengths.png")
  assert png.read_bytes()[:4] == b"\x89PNG" and "![BLEU and NLL against source length" in report


def test_the_records_remake_the_results_without_the_runs_and_keep_no_sentences(tmp_path):
  entries = [write_run(tmp_path, f"{v}-s{seed}", kind, seed, noise, nll)
             for v, kind, seed, noise, nll in (("prenorm", "sinusoidal", 0, 1, 1.00), ("prenorm", "sinusoidal", 1, 2, 1.02),
                                               ("prenorm+rope", "rope", 0, 3, 0.90), ("prenorm+rope", "rope", 1, 0, 0.95))]
  (tmp_path / "sweep.json").write_text(json.dumps({"runs": entries, "sweeps": ["study"]}))
  out = tmp_path / "docs" / "positions.md"
  positions_report.write(tmp_path, out)
  kept = tmp_path / "docs" / "runs" / "positions.jsonl"
  text = kept.read_text()
  assert "a man rides" not in text and json.loads(text.splitlines()[0])["upper"] == [4, 8, 12, 16]
  # Each run's record says what trained it: steps, peak rate, final validation NLL (the code's commit
  # where the run recorded one: none here).
  first = json.loads(text.splitlines()[1])
  assert (first["name"], first["steps"], first["learning_rate"], first["final_nll"], first["commit"]) == (
      "prenorm-s0", 20, 0.002, 1.00, "")
  report = out.read_text()
  assert "Every run's figures per bucket are kept in [runs/positions.jsonl](runs/positions.jsonl)" in report
  for name in ("prenorm-s0", "prenorm+rope-s1"):  # no run left: the records alone
    (tmp_path / name / "eval" / "lengths.step20.beam2-alpha0.6.json").unlink()
  again = tmp_path / "again" / "positions.md"
  assert positions_report.write(None, again, records_path=kept) == f"{again}: 4 finished runs, 0 unfinished"
  assert again.read_text() == report
  cli = subprocess.run([sys.executable, "-m", "seq2seq.research.positions", f"--records={kept}", "--table",
                        f"--output={tmp_path / 'cli' / 'positions.md'}"], cwd=REPO, capture_output=True, text=True)
  assert cli.returncode == 0 and (tmp_path / "cli" / "positions.md").read_text() == report, cli.stderr[-2000:]
  with pytest.raises(ConfigError, match=r"keeps buckets up to \(4, 8, 12, 16\): other --multiples need the runs"):
    positions_report.write(None, again, multiples=(1, 2), records_path=kept)
  (tmp_path / "bad.jsonl").write_text('{"sweeps": []}\n')
  for path, message in ((tmp_path / "bad.jsonl", "not a length study's records file"),
                        (tmp_path / "none.jsonl", "does not exist")):
    with pytest.raises(DataError, match=message):
      positions_report.write(None, again, records_path=path)


def test_the_report_goes_between_the_markers_of_a_written_page(tmp_path):
  write_run(tmp_path, "prenorm-s0", "sinusoidal", 0, 1, 1.0)
  (tmp_path / "sweep.json").write_text(json.dumps({"runs": [{"name": "prenorm-s0", "variant": "prenorm",
                                                               "size": "base", "seed": 0}], "sweeps": []}))
  page = tmp_path / "positions.md"
  page.write_text(f"# Prose\n\nBefore.\n\n{positions_report.START}\n**Not run yet.**\n{positions_report.END}\n\nAfter.\n")
  positions_report.write(tmp_path, page)
  text = page.read_text()
  assert text.startswith("# Prose\n\nBefore.\n\n") and text.endswith(f"{positions_report.END}\n\nAfter.\n")
  assert "Not run yet" not in text and "from 1 finished runs" in text
  positions_report.write(tmp_path, page)
  assert page.read_text() == text  # rerunning replaces, never repeats
  page.write_text("# Prose without markers\n")
  with pytest.raises(ConfigError, match="markers"):
    positions_report.write(tmp_path, page)


@pytest.mark.long  # four trainings and evaluations (and its parts: `pytest -m long`)
def test_the_study_trains_evaluates_and_reports_two_position_types(tmp_path, data_dir, session_cache):
  """Two position types x 1 seed of a few steps of the tiny config, on pairs of at most 16
  tokens: each run trained and evaluated, the report written; a rerun only reports."""
  env = os.environ | {"SEQ2SEQ_DATA_DIR": str(data_dir), "SEQ2SEQ_CACHE": str(session_cache)}
  args = ["--config=tiny", "--positions=sinusoidal,learned", "--seeds=1", "--joins=1,2", "--splits=val",
          "--config.train.steps=20", "--config.train.checkpoint_every=10", "--config.train.eval_every=10",
          "--config.train.log_every=5", "--config.data.max_len=16", "--config.model.max_len=128",
          "--config.eval.batch_size=64"]
  first = study(tmp_path, *args, env=env, timeout=1200)
  assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
  for name in ("prenorm-s0", "prenorm+learned-s0"):
    (record,) = lengths.saved(tmp_path / name / "eval", 20)
    sentences = json.loads(record.read_text())["sentences"]
    assert len(sentences["source"]) == 450 and max(sentences["src_len"]) > 32  # val's 300 and 150 joined pairs
  assert json.loads((tmp_path / "prenorm+learned-s0" / "config.json").read_text())["data"]["max_len"] == 16
  report = (tmp_path / "positions.md").read_text()
  assert "from 2 finished runs" in report and "| `sinusoidal` (n = 1) | `learned` (n = 1) |" in report
  assert "a table of 128 rows (config.model.max_len), of which only the first 16 were trained" in report
  rerun = study(tmp_path, *args, env=env, timeout=600)
  assert rerun.returncode == 0 and "[2/2] prenorm+learned-s0: finished already" in rerun.stdout


def test_the_pages_conclusion_is_what_the_committed_records_make():
  """docs/positions.md's Conclusion, and the one-line summaries in docs/sweeps.md and the
  README, quote figures recomputed here from docs/runs/positions.jsonl (means, differences,
  raw and corrected p, TOST p, readings): a rerun that moves one fails until the prose follows."""
  runs, head = positions_report.read_records(REPO / "docs" / "runs" / "positions.jsonl")
  by_kind = positions_report.per_run(runs, tuple(head["upper"]))
  found = positions_report.comparisons(by_kind)
  labels = [s["label"] for s in by_kind["sinusoidal"][0]]
  past = range(1, len(labels))  # the buckets past the training length
  mean = lambda kind, b, key="bleu": statistics.fmean(s[b][key] for s in by_kind[kind])
  spread = lambda kind, b, key="bleu": statistics.stdev(s[b][key] for s in by_kind[kind])
  test = {(c.variant, *c.cells[1:]): c for c in found}  # (kind, bucket, metric)
  diff = lambda kind, b, metric="BLEU": test[(kind, labels[b], metric)].welch.difference
  raw = lambda kind, b, metric="BLEU": test[(kind, labels[b], metric)].welch.p
  held = lambda kind, b, metric="BLEU": test[(kind, labels[b], metric)].adjusted
  reading = {key: significance.reading(c.adjusted, c.tost) for key, c in test.items()}
  signed = lambda x, d=2: f"{x:+.{d}f}".replace("-", "−")
  span = lambda values, d=2, sep=" to ": f"{min(values):.{d}f}{sep}{max(values):.{d}f}"
  kinds, others = list(by_kind), [k for k in by_kind if k != "sinusoidal"]
  drops = {k: mean(k, 0) - mean(k, 1) for k in kinds}

  # The shapes the prose asserts in words.
  assert len(found) == 30
  assert {k for k, r in reading.items() if r == "differs"} == {("learned", labels[0], "BLEU"), ("learned", labels[1], "BLEU")}
  assert {k for k, r in reading.items() if r == "equivalent"} == {(k, labels[b], "BLEU") for k in ("learned", "rope")
                                                                 for b in (3, 4)}
  assert all(r == "inconclusive" for (_, _, metric), r in reading.items() if metric == "NLL")
  for b in past:
    assert max(kinds, key=lambda k: mean(k, b, "nll")) == "sinusoidal"
    assert min(kinds, key=lambda k: mean(k, b, "nll")) == "learned"
  assert min(drops, key=drops.get) == "learned"
  assert [max(kinds, key=lambda k: mean(k, b)) for b in (0, 1)] == ["rope", "rope"]
  assert min(kinds, key=lambda k: mean(k, 0, "nll")) == "rope"
  assert [max(kinds, key=lambda k: mean(k, b)) for b in (2, 3, 4)] == ["relative"] * 3
  assert max(kinds, key=lambda k: spread(k, 0)) == "relative"

  nll_past = [(k, b) for k in others for b in past]
  expected = [
      f"Every type keeps {span([mean(k, 0) for k in kinds])} BLEU on sources as long as its training pairs",
      f"{span([mean(k, 1) for k in kinds])} on sources up to twice as long, {span([mean(k, 2) for k in kinds])} up "
      f"to three times, {span([mean(k, 3) for k in kinds])} up to four times and {span([mean(k, 4) for k in kinds])} "
      "past that",
      f"rises from {span([mean(k, 0, 'nll') for k in kinds], 3, '–')} to {span([mean(k, 4, 'nll') for k in kinds], 3, '–')}",
      f"is {span(drops.values())} BLEU for each type",
      f"more than {max(abs(c.welch.difference) for c in found if c.column.endswith(' BLEU')):.2f} BLEU or "
      f"{max(abs(c.welch.difference) for c in found if c.column.endswith(' NLL')):.3f} NLL from sinusoidal",
      f"Of the {len(found)} differences to sinusoidal positions, "
      f"{sum(r == 'differs' for r in reading.values())} are significant",
      f"{sum(r == 'equivalent' for r in reading.values())} are equivalent",
      f"scores {span([mean(k, b) for k in kinds for b in (3, 4)])} BLEU",
      f"The other {sum(r == 'inconclusive' for r in reading.values())}, every NLL difference",
      # sinusoidal
      f"{span([-diff(k, b, 'NLL') for k, b in nll_past], 3)} above the others, and none of those {len(nll_past)} "
      f"differences is significant (raw p {span([raw(k, b, 'NLL') for k, b in nll_past], 3)})",
      # learned
      f"{span([-diff('learned', b, 'NLL') for b in past], 3)} below sinusoidal's (raw p "
      f"{span([raw('learned', b, 'NLL') for b in past], 3)}, inconclusive)",
      f"{signed(diff('learned', 0))} BLEU (p = {held('learned', 0):.3f}) on 1–16 tokens",
      f"({signed(diff('learned', 1))}, p = {held('learned', 1):.3f})",
      f"({signed(diff('learned', 2))}, {reading[('learned', labels[2], 'BLEU')]})",
      f"(TOST p {test[('learned', labels[3], 'BLEU')].tost.p:.3f} and {test[('learned', labels[4], 'BLEU')].tost.p:.3f})",
      f"Their drop from 1–16 to 17–32 tokens, {drops['learned']:.2f} BLEU, is the smallest of the four",
      # rope
      f"{signed(diff('rope', 0))} on 1–16 tokens (raw p {raw('rope', 0):.3f}, corrected {held('rope', 0):.3f}) and "
      f"{signed(diff('rope', 1))} on 17–32 (raw p {raw('rope', 1):.3f})",
      f"({signed(diff('rope', 0, 'NLL'), 3)}, raw p {raw('rope', 0, 'NLL'):.3f}, corrected {held('rope', 0, 'NLL'):.3f})",
      f"BLEU difference is {signed(diff('rope', 2))}, {signed(diff('rope', 3))} and {signed(diff('rope', 4))}",
      # relative
      f"({signed(diff('relative', 2))}, {signed(diff('relative', 3))}, {signed(diff('relative', 4))}), none significant "
      f"(raw p {span([raw('relative', b) for b in (2, 3, 4)], 3)})",
      f"Its NLL past L is {span([-diff('relative', b, 'NLL') for b in past], 3)} below sinusoidal's (raw p "
      f"{span([raw('relative', b, 'NLL') for b in past], 3)})",
      f"(±{spread('relative', 0):.2f} BLEU on 1–16 tokens)",
      f"Past 48 tokens all four are at {span([mean(k, b) for k in kinds for b in (3, 4)])} BLEU",
      f"spreads {span([spread('sinusoidal', b, 'nll') for b in past], 3, ' to ±').replace('', '±', 1)} over its seeds",
  ]
  page = report_tables.words("docs/positions.md")
  assert [s for s in expected if s not in page] == []
  sweeps = " ".join((REPO / "docs" / "sweeps.md").read_text(encoding="utf-8").split())
  assert f"losing {span(drops.values(), 1)} BLEU in the first bucket past it" in sweeps
  # "learned positions lose only the gap they carry from the training range": their only significant
  # differences are in the training range and the bucket after it, and both are losses.
  assert all(diff("learned", b) < 0 for b in (0, 1))
  readme = " ".join((REPO / "README.md").read_text(encoding="utf-8").split())
  assert "learned positions lose only the gap they carry from the training range" in readme
  # "(N seeds each): all four collapse alike": the seeds of each type, and every type's drop into the
  # first bucket past L within the span the page quotes (above).
  runs, _ = positions_report.read_records(REPO / "docs" / "runs" / "positions.jsonl")
  (seeds,) = {sum(r.positions == k for r in runs) for k in kinds}
  assert len(kinds) == 4 and f"positions ({seeds} seeds each): all four collapse alike past the training length" in readme


def test_the_pages_counts_of_sources_are_the_records_buckets():
  """docs/positions.md's description of the evaluation quotes its sources per bucket, the joined
  pairs among them, the single sentences past 32 tokens and the totals, as every run's records
  count them."""
  runs, head = positions_report.read_records(REPO / "docs" / "runs" / "positions.jsonl")
  counts = {tuple((b["sentences"], b["joined"]) for b in r.scores) for r in runs}
  assert len(counts) == 1  # one tokenizer: every run counts the same
  (buckets,) = counts
  sentences, joined = [s for s, _ in buckets], [j for _, j in buckets]
  single = [s - j for s, j in buckets]
  page = report_tables.words("docs/positions.md")
  assert head["upper"] == [16, 32, 48, 64] and single[-1] == 0
  assert (f"only {sum(single[2:])} of the {sum(single)} sources exceed 32 tokens and none exceeds 64") in page
  assert f"That gives {sum(sentences)} sources in all." in page
  assert (f"They hold {', '.join(map(str, sentences[:-1]))} and {sentences[-1]} sources; joined pairs make up "
          f"{joined[0]} of the first, {joined[1]} of the second") in page


def test_the_pages_budget_is_the_records_time():
  """docs/positions.md's intro and Budget quote the records' time (the report's Time: line, per
  run, in all), the first report's training time as docs/history.md keeps it, the runs' steps
  and rows, and the sources each evaluation translates."""
  from seq2seq import configs

  runs, _ = positions_report.read_records(REPO / "docs" / "runs" / "positions.jsonl")
  page = report_tables.words("docs/positions.md")
  history = report_tables.words("docs/history.md")
  train, evaluate = (sum(getattr(r, key) for r in runs) / 60 for key in ("train_seconds", "eval_seconds"))
  (hardware,) = {r.hardware for r in runs}
  assert f"Time: {train:.1f} min of training and {evaluate:.1f} min of the study's translation" in page
  assert (f"Measured ({hardware}): the report's `Time:` line sums {train:.1f} minutes of training and {evaluate:.1f} "
          f"minutes of translation and scoring for the {len(runs)} runs, {train / len(runs):.1f} and "
          f"{evaluate / len(runs):.1f} minutes a run") in page
  assert f"({len(runs)} runs, {train + evaluate:.0f} minutes of training and evaluation on 2 cores)" in page
  first = 50.6  # the first report's training, in minutes, as docs/history.md says it
  assert f"{len(runs)} runs on a {hardware}, {first} minutes of training" in history
  assert f"the same {len(runs)} runs on the same kind of machine in {first} minutes, {first / len(runs):.1f} a run" in page
  sweep, study = configs.get("multi30k_sweep"), configs.get("multi30k_positions")
  assert {r.steps for r in runs} == {sweep.train.steps} == {study.train.steps}
  assert study.data.pack_length == sweep.data.pack_length
  assert (f"(the same model, {sweep.train.steps} steps, rows of the same {sweep.data.pack_length} packed tokens)"
          in page)
  (sources,) = {sum(b["sentences"] for b in r.scores) for r in runs}
  assert f"the evaluation translates {sources} sources and scores them by teacher forcing" in page


def test_the_pages_description_of_the_study_is_its_configs_model_and_records():
  """docs/positions.md's description: the sweep's config as it states it, the learned table's
  rows and the relative buckets (seq2seq.model.layers.relative_bucket) that training on L tokens
  reaches, the test count, the seeds' degrees of freedom, the records' size, the model's size,
  and the repeats of the Conclusion's and the pre-norm study's figures."""
  import dataclasses

  import jax.numpy as jnp
  import numpy as np

  from seq2seq import configs
  from seq2seq.model import transformer
  from seq2seq.model.config import ModelConfig
  from seq2seq.model.layers import relative_bucket
  from seq2seq.research import ablations, records

  page = report_tables.words("docs/positions.md")
  sweep, study = configs.get("multi30k_sweep"), configs.get("multi30k_positions")
  m = sweep.model
  expected = [f"(`multi30k_sweep.py`: {sweep.train.steps} steps, d_model {m.d_model}, {m.num_encoder_layers}+"
              f"{m.num_decoder_layers} layers, {sweep.data.vocab_size} pieces) with `data.max_len = {study.data.max_len}`",
              f"decoding (beam {sweep.eval.beam_size}, alpha {sweep.eval.alpha:g}, outputs up to source + "
              f"{sweep.eval.max_len_b} tokens)"]
  assert (study.train.steps, study.eval.beam_size, study.eval.alpha, study.eval.max_len_b) == (
      sweep.train.steps, sweep.eval.beam_size, sweep.eval.alpha, sweep.eval.max_len_b)
  L, rows = study.data.max_len, study.model.max_len
  expected += [f"The learned table has {rows} rows (`model.max_len`)",
               f"Only rows 0 to {L - 1} are trained; rows {L} to {rows - 1} keep their initial values"]
  # T5's buckets with the model's defaults, and those that offsets below L reach.
  cfg = ModelConfig.from_config(study.model, vocab_size=study.data.vocab_size)
  defaults = {f.name: f.default for f in dataclasses.fields(ModelConfig)}
  n, far = cfg.relative_buckets, cfg.relative_max_distance
  assert (n, far) == (defaults["relative_buckets"], defaults["relative_max_distance"])
  offsets = np.arange(far)
  enc = np.asarray(relative_bucket(-jnp.asarray(offsets), bidirectional=True, num_buckets=n, max_distance=far))
  dec = np.asarray(relative_bucket(-jnp.asarray(offsets), bidirectional=False, num_buckets=n, max_distance=far))
  half, exact = n // 2, n // 4
  assert sorted(set(enc)) == list(range(half))  # keys before the query: one direction's half
  assert all(len(set(enc[offsets == d])) == 1 for d in range(exact)) and len(set(enc[:exact])) == exact
  assert len(set(dec[:half])) == half and len(set(dec)) == n
  unreached = half - len(set(enc[:L]))
  expected += [f"With the model's defaults ({n} buckets, maximum distance {far})",
               f"The encoder gives each direction {half} buckets: offsets 0 to {exact - 1} have one each, and offsets "
               f"{exact} to {far - 1} share {half - exact} log-spaced ones",
               f"its {n} buckets all count backwards: offsets 0 to {half - 1} have one each, and offsets {half} to "
               f"{far - 1} share the other {n - half}",
               f"never reaches an offset past {L - 1}",
               f"the encoder's buckets for offsets of {L} and more ({unreached} of each direction's {half})",
               f"T5's bias has {n} buckets up to a distance of {far}"]
  # The tests, the seeds, the records.
  runs, head = positions_report.read_records(REPO / "docs" / "runs" / "positions.jsonl")
  by_kind = positions_report.per_run(runs, tuple(head["upper"]))
  found = positions_report.comparisons(by_kind)
  buckets, kinds = len(by_kind["sinusoidal"][0]), len(by_kind)
  assert len(found) == (kinds - 1) * buckets * 2
  (seeds,) = {sum(r.positions == k for r in runs) for k in by_kind}
  expected += [f"({kinds - 1} types x {buckets} buckets x 2 metrics = {len(found)} with the four types)",
               f"With {seeds} seeds a side, Welch's degrees of freedom are {seeds - 1} to {2 * seeds - 2}",
               f"after Holm's correction over the report's {len(found)} tests",
               f"None is significant over {len(found)} tests with {seeds} seeds"]
  lines = (REPO / "docs" / "runs" / "positions.jsonl").read_text().splitlines()[1:]
  assert {round(len(line) / 1000) for line in lines} == {2}
  expected.append("not its sentences: about 2 kB a run")
  assert {tuple(r.record["splits"]) for r in runs} == {("val", "test_2016_flickr", "test_2017_flickr")}
  single = sum(b["sentences"] - b["joined"] for b in runs[0].scores)
  expected.append(f"Each run is evaluated on the validation set and both test sets ({single} sentences)")
  # The model's size and schedule.
  base = next(r for r in runs if r.positions == "sinusoidal")
  params = transformer.count_params(dataclasses.replace(cfg, norm_position="pre"))
  expected.append(f"The model is small ({params / 1e6:.1f}M parameters) and trained for {base.steps} steps")
  # The pre-norm study's RoPE, repeated.
  pre = records.read(REPO / "docs" / "runs" / "ablations_prenorm.jsonl")
  (sin,) = [c for c in ablations.comparisons(pre.results, baseline=pre.baseline)
            if (c.variant, c.column) == ("prenorm", "Final loss")]
  assert sin.adjusted < 0.001
  expected.append(f"(+{sin.welch.difference:.3f} final NLL, corrected p < 0.001")
  # Relative positions' NLL past L, as the Conclusion quotes it, repeated for Press et al.
  nll = [c.welch.difference for c in found if c.variant == "relative" and c.cells[2] == "NLL"][1:]
  expected.append(f"Our relative bias's lower NLL past L ({-max(nll):.3f} to {-min(nll):.3f} below sinusoidal's, "
                  "inconclusive)")
  assert [s for s in expected if s not in page] == []
