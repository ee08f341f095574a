"""Plots and the results table (docs/results.md) are generated from a run's files."""

import json
import subprocess
import sys

import pytest
from conftest import REPO
import report_tables
from report_tables import signed

from seq2seq.inference.settings import SearchSettings
from seq2seq.research import plot, recipe_search, results

OLD_SIG = "nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp|version:2.5.0"
NEW_SIG = "nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp|version:2.6.0"  # the one fake_run's result has


def fake_run(root, with_bleu=True):
  run = root / "m30k"
  (run / "eval").mkdir(parents=True)
  records = [{"step": s, "loss": 5.0 - s / 100, "nll": 4.5 - s / 100, "learning_rate": 1e-3 * s / 100, "target_tokens_per_s": 1000.0 + s,
              "wall_time_s": 6.0 * s} for s in (50, 100, 150, 200)]
  records += [{"step": s, "val_loss": 4.0 - s / 200, "val_nll": 4.0 - s / 200} | ({"val_bleu": s / 10, "val_chrf": s / 5} if with_bleu else {})
              for s in (100, 200)]
  (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
  (run / "commands.txt").write_text("python train.py --config=configs/multi30k.py --workdir=/tmp/m30k\n")
  result = {"name": "test_2016_flickr", "bleu": 36.123, "chrf": 61.5, "checkpoint": "average5-200",
            "bleu_signature": NEW_SIG,
            "decode": {"beam_size": 4, "alpha": 0.6}, "hardware": "2-core CPU",
            "command": "python eval.py --workdir=/tmp/m30k --average_last=5"}
  (run / "eval" / "test_2016_flickr.average5-200.json").write_text(json.dumps(result))
  return run


def test_results_table_comes_from_the_run_files(tmp_path):
  run = fake_run(tmp_path)
  text = results.table([str(run)])
  row = text.splitlines()[2]
  for cell in ("**36.12**", "61.50", "average5-200", "beam 4, alpha 0.6", "| 200 |", "| 20 min |", "| 1125 |",
               "python train.py --config=configs/multi30k.py", "python eval.py --workdir=/tmp/m30k --average_last=5"):
    assert cell in row, cell
  assert row.endswith("| `nrefs:1\\|case:mixed\\|eff:no\\|tok:13a\\|smooth:exp\\|version:2.6.0` |")  # one cell
  doc = tmp_path / "results.md"
  doc.write_text(f"# Title\n\n{results.START}\nold table\n{results.END}\n\nafter\n")
  results.update_file(doc, text)
  assert doc.read_text() == f"# Title\n\n{results.START}\n{text}{results.END}\n\nafter\n"
  (tmp_path / "plain.md").write_text("no markers\n")
  with pytest.raises(ValueError, match="markers"):
    results.update_file(tmp_path / "plain.md", text)
  with pytest.raises(ValueError, match="no eval results"):
    results.rows(tmp_path)


def test_the_command_updates_the_table_of_the_file_it_is_given(tmp_path):
  run = fake_run(tmp_path)
  doc = tmp_path / "results.md"
  doc.write_text(f"# Results\n\n{results.START}\nold table\n{results.END}\n\nnotes\n")
  out = subprocess.run([sys.executable, "-m", "seq2seq.research.results", str(run), f"--update={doc}"], cwd=REPO,
                       capture_output=True, text=True, timeout=300)
  assert out.returncode == 0, out.stderr
  assert out.stdout == results.table([str(run)])
  assert doc.read_text() == f"# Results\n\n{results.START}\n{out.stdout}{results.END}\n\nnotes\n"


def old_layout(rows: list[str], signatures: list[str]) -> str:
  """A table as the generator wrote it before rows carried their signature: listed below it."""
  header = results.HEADER.replace(" BLEU signature |", "").replace("|---|\n", "\n").rstrip("|-") + "|"
  header = "\n".join(line.removesuffix("---|") if i else line for i, line in enumerate(header.splitlines()))
  return "\n".join([header, *rows]) + "\n" + "  \n".join(f"BLEU signature: `{s}`" for s in signatures) + "\n"


def test_updating_the_table_replaces_the_given_runs_rows_and_keeps_the_others(tmp_path):
  run = fake_run(tmp_path)
  new_row = results.rows(run)[0]
  assert new_row.endswith(f"| {results.signature_cell(NEW_SIG)} |")
  before = ["| `first` | test_2016_flickr | **30.00** |", "| `first` | test_2017_flickr | **20.00** |",
            "| `m30k` | test_2016_flickr | **1.00** |", "| `last` | test_2016_flickr | **35.00** |"]
  kept = [f"{row} {results.signature_cell(OLD_SIG)} |" for row in before]  # an old row gets the one signature listed
  doc = tmp_path / "results.md"
  doc.write_text(f"# T\n{results.START}\n{old_layout(before, [OLD_SIG])}{results.END}\ntail\n")
  merged = results.update_file(doc, results.table([str(run)]))
  assert merged == results._format(kept[:2] + [new_row] + kept[3:])
  assert doc.read_text() == f"# T\n{results.START}\n{merged}{results.END}\ntail\n"
  # A run the table does not have yet is appended; running the update again changes nothing.
  other = fake_run(tmp_path / "b").rename(tmp_path / "b" / "newrun")
  merged = results.update_file(doc, results.table([str(other)]))
  assert merged.splitlines()[2:7] == kept[:2] + [new_row] + kept[3:] + [new_row.replace("`m30k`", "`newrun`")]
  assert results.update_file(doc, results.table([str(other)])) == merged


def test_an_old_table_that_listed_two_signatures_is_not_guessed(tmp_path):
  """Rows without a signature under two listed ones: which row had which is unknown."""
  run = fake_run(tmp_path)
  with pytest.raises(ValueError, match="a results row without its BLEU signature, under a table listing 2"):
    results.merge(old_layout(["| `first` | test_2016_flickr | **30.00** |"], [OLD_SIG, NEW_SIG]),
                  results.table([str(run)]))


class StubTranslator:
  """What `evaluate.evaluate` reads of a Translator, translating every line alike."""

  settings = SearchSettings(beam_size=4, alpha=0.6)
  workers, compiled_programs, compile_seconds, truncated = 1, 1, 0.0, 0

  def __call__(self, params, sources, progress=True):
    return ["ein Hund läuft am Strand entlang." for _ in sources]


def test_scoring_options_name_their_own_result_files_and_rows_show_each_signature(tmp_path):
  """Issue 60: --lowercase --tokenize=intl wrote the file a default-scored evaluation writes
  (and replaced it), and the table showed cased/13a and lc/intl scores in one column with
  nothing saying which was which."""
  from seq2seq.inference import evaluate

  run = fake_run(tmp_path)
  for path in (run / "eval").iterdir():
    path.unlink()
  found = []
  for tokenize, lowercase in (("13a", False), ("intl", True), ("13a", True)):
    r = evaluate.evaluate(StubTranslator(), None, ["A dog runs along the beach."],
                          ["Ein Hund läuft am Strand entlang."],
                          name="in.en", label="step200", outdir=run / "eval", tokenize=tokenize, lowercase=lowercase,
                          progress=False)
    found.append(r)
    assert evaluate.scoring_of(r) == (tokenize, lowercase)
  assert sorted(p.name for p in (run / "eval").glob("*.json")) == [
      "in.en.step200.beam4-alpha0.6-lc-tok_intl.json", "in.en.step200.beam4-alpha0.6-lc.json",
      "in.en.step200.beam4-alpha0.6.json"]
  assert [r["bleu"] for r in evaluate.saved_results(run / "eval", "in.en", "step200")] == [found[0]["bleu"]]
  assert found[0]["bleu"] < found[2]["bleu"] == pytest.approx(100)  # "Ein" / "ein": the casing counts
  rows = results.rows(run)
  assert len(rows) == 3
  for r in found:
    assert sum(row.endswith(f"| {results.signature_cell(r['bleu_signature'])} |") for row in rows) == 1
  assert {"case:lc", "tok:intl", "case:mixed"} <= {part for r in found for part in r["bleu_signature"].split("|")}


def test_plots_have_one_png_per_panel_with_data(tmp_path):
  import matplotlib.image

  written = plot.plot(fake_run(tmp_path))
  assert sorted(p.name for p in written) == ["bleu.png", "learning_rate.png", "loss.png", "throughput.png"]
  assert all(matplotlib.image.imread(p).shape[:2] == (350, 600) for p in written)
  assert sorted(p.name for p in plot.plot(fake_run(tmp_path / "b", with_bleu=False))) == [
      "learning_rate.png", "loss.png", "throughput.png"]
  with pytest.raises(ValueError, match="metrics.jsonl"):
    plot.plot(tmp_path / "empty")


# --- the main-job recipe search (docs/results.md#choosing-the-main-job-recipe) -----------------


def test_the_recipe_search_tables_are_generated_from_the_committed_run_records():
  """docs/results.md's search tables are what seq2seq.research.recipe_search makes of
  docs/runs/main_job_search.jsonl: regenerating them changes nothing."""
  from seq2seq.research import recipe_search

  text = (REPO / "docs" / "results.md").read_text()
  committed = text.split(recipe_search.START, 1)[1].split(recipe_search.END, 1)[0]
  assert committed == "\n" + recipe_search.report(recipe_search.load(REPO / "docs" / "runs" / "main_job_search.jsonl"))


def test_the_recipe_search_states_its_question_protocol_limits_and_what_survives_from_its_records():
  """The report's head is made from the records (how many runs, how many outside every
  comparison, the machines, the tokenizations, the seeds a side), and its last part lists
  each comparison's readings as its table gives them."""
  import dataclasses

  from seq2seq.research import recipe_search

  records = recipe_search.load(REPO / "docs" / "runs" / "main_job_search.jsonl")
  head = "\n".join(recipe_search.scope(records))
  prefixes = {p for pair in recipe_search.COMPARISONS for p in pair}
  alone = [r for r in records if not any(r.run.startswith(p) for p in prefixes)]
  assert f"**Protocol.** {len(records)} runs" in head and f"{len(alone)} of the {len(records)} runs are in no comparison" in head
  assert "(2-core AMD EPYC, 2-core Xeon, H100, H200)" in head and "2 tokenizations (16,345, 16,842 validation" in head
  assert "not the page's 21" in head and "3 seeds a side: Welch's degrees of freedom are 2 to 4" in head
  one = [dataclasses.replace(r, val_tokens=16345) for r in records]
  assert "one tokenization (16,345 validation target tokens)" in "\n".join(recipe_search.scope(one))
  lines = [line for line in recipe_search.survives(records) if line.startswith("- ")]
  assert len(lines) == len(recipe_search.COMPARISONS)
  for line, (runs, against) in zip(lines, recipe_search.COMPARISONS):
    found = recipe_search.readings(*recipe_search.comparison(records, runs, against))
    assert line.startswith(f"- {recipe_search.LABELS[runs]} against {recipe_search.LABELS[against]}: ")
    assert [part.split(" ", 2)[2] for part in line.split(": ", 1)[1].rstrip(".").split(", ")] == found
  assert recipe_search.survives([r for r in records if not r.run.startswith(recipe_search.BASELINE)])[2].startswith(
      "- peak rate 0.007")  # a comparison without its runs is left out


def test_the_recipe_search_read_validation_only_and_its_welch_tests_are_scipys():
  """No record holds a test-set figure (every evaluation is of val), and the comparison's
  p-values are scipy's Welch t-test (ttest_ind, equal_var=False) on the records' values."""
  from scipy import stats

  from seq2seq.research import recipe_search

  records = recipe_search.load(REPO / "docs" / "runs" / "main_job_search.jsonl")
  results = [json.dumps({k: v for k, v in vars(r).items() if k != "settings"}) for r in records]
  assert not [r for r in results if "test_201" in r]  # the settings name the test sets; nothing else does
  assert all(e["sentences"] == 1014 for r in records for e in r.val_eval.values())
  assert all("--split=val" not in r.command for r in records)  # the records' commands are the trainings
  rows, adjusted = recipe_search.comparison(records)
  assert [len(a) for _, a, _, _ in rows] == [3, 3, 3] and [len(b) for _, _, b, _ in rows] == [3, 3, 3]
  for _, chosen, base, welch in rows:
    assert welch.p == pytest.approx(stats.ttest_ind(chosen, base, equal_var=False).pvalue, rel=1e-9)
  order = sorted(range(3), key=lambda i: rows[i][3].p)  # Holm by hand: 3 p(1), 2 p(2), p(3), kept monotone
  expected, running = {}, 0.0
  for rank, i in enumerate(order):
    running = max(running, min(1.0, (3 - rank) * rows[i][3].p))
    expected[i] = running
  assert adjusted == pytest.approx([expected[i] for i in range(3)], rel=1e-12)


def test_the_recipe_search_compares_nlls_of_one_tokenization_only():
  """An NLL is a mean over the validation set's tokens: runs whose tokenizers cut it into
  other counts (another vocabulary, another sentencepiece version) are starred, and a Welch
  test between them is refused."""
  import dataclasses

  from seq2seq.research import recipe_search

  records = recipe_search.load(REPO / "docs" / "runs" / "main_job_search.jsonl")
  starred = {line.split("`")[1] for line in recipe_search.runs_table(records).splitlines() if "* |" in line}
  assert starred == {r.run for r in records if r.val_tokens != 16345} == {"d128_v6k", "d128_drop02_v6k"}
  other = [dataclasses.replace(r, val_tokens=17177) if r.run == "default_s2" else r for r in records]
  with pytest.raises(ValueError, match=r"other validation token counts, so their NLLs do not compare: 16345 in "
                                       r"d128_drop02_s1, d128_drop02_s2, d128_drop02_s3, \.\.\.; 17177 in default_s2$"):
    recipe_search.comparison(other)


def test_the_recipe_search_refuses_a_file_without_its_markers_in_one_line(tmp_path):
  target = tmp_path / "notes.md"
  target.write_text("# notes\n")
  out = subprocess.run([sys.executable, "-m", "seq2seq.research.recipe_search",
                        str(REPO / "docs" / "runs" / "main_job_search.jsonl"), f"--update={target}"],
                       capture_output=True, text=True, cwd=tmp_path)
  assert out.returncode == 2 and out.stderr.strip().splitlines() == [
      f"error: {target} has no <!-- search:start --> ... <!-- search:end --> markers"]
  assert target.read_text() == "# notes\n"  # nothing written


def test_the_family_refuses_a_missing_file_in_one_line_and_writes_nothing(tmp_path):
  target = tmp_path / "missing.md"
  out = subprocess.run([sys.executable, "-m", "seq2seq.research.family", f"--update={target}"],
                       capture_output=True, text=True, cwd=REPO)
  assert out.returncode == 2 and out.stderr.strip().splitlines() == [
      f"error: {target} does not exist: the file whose <!-- family:start --> ... <!-- family:end --> section to write"]
  assert list(tmp_path.iterdir()) == []


def test_a_runs_search_record_is_made_from_its_workdir_and_holds_no_test_set_figure(tmp_path):
  """`recipe_search --add=WORKDIR` makes a record from the run's files: its command with the
  workdir's parent as WORK, the overrides but the seed, the validation curve, the full-val
  result of the run's own search (not another alpha's), no test-set result; adding it again
  replaces it."""
  from seq2seq.research import recipe_search

  run = tmp_path / "runs" / "trial_drop01"
  (run / "eval").mkdir(parents=True)
  settings = {"seed": 0, "data": {"dir": "/data", "cache_dir": "/cache", "vocab_size": 8000},
              "eval": {"beam_size": 4, "alpha": 1.5}, "train": {"steps": 200}, "model": {"dropout_rate": 0.1}}
  (run / "config.json").write_text(json.dumps(settings))
  command = (f"python train.py --config=configs/multi30k.py --workdir={run} --config.seed=0 "
             "--config.model.dropout_rate=0.1")
  (run / "provenance.jsonl").write_text(json.dumps({"command": command, "commit": "abcdef0123"}) + "\n")
  (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in [
      {"step": 50, "loss": 3.0}, {"step": 100, "val_nll": 2.1234567, "val_tokens": 300.0, "val_bleu": 20.123456},
      {"step": 200, "val_nll": 1.9, "val_tokens": 300.0, "val_bleu": 25.0}]))
  for alpha, bleu in ((1.0, 30.0), (1.5, 31.234567)):
    (run / "eval" / f"val.step200.beam4-alpha{alpha}.json").write_text(json.dumps(
        {"bleu": bleu, "chrf": 55.0, "checkpoint": "step200", "sentences": 1014, "hardware": "cpu",
         "decode": {"beam_size": 4, "alpha": alpha}}))
  (run / "eval" / "test_2016_flickr.step200.beam4-alpha1.5.json").write_text(json.dumps(
      {"bleu": 99.0, "checkpoint": "step200", "decode": {"beam_size": 4, "alpha": 1.5}}))
  path = tmp_path / "records.jsonl"
  path.write_text("")
  recipe_search.add(path, run, "2026-11-29 CPU")
  (record,) = recipe_search.load(path)
  assert (record.run, record.call, record.commit, record.config, record.seed) == (
      "trial_drop01", "2026-11-29 CPU", "abcdef0", "multi30k", 0)
  assert record.command == ("python train.py --config=configs/multi30k.py --workdir=WORK/trial_drop01 --config.seed=0 "
                            "--config.model.dropout_rate=0.1")
  assert record.overrides == ["--config.model.dropout_rate=0.1"]
  assert (record.steps, record.reached, record.status, record.val_tokens) == (200, 200, "exit 0", 300)
  assert record.val_curve == [{"bleu500": 20.1235, "nll": 2.123457, "step": 100}, {"bleu500": 25.0, "nll": 1.9, "step": 200}]
  assert record.val_eval == {"latest": {"bleu": 31.2346, "chrf": 55.0, "checkpoint": "step200", "sentences": 1014,
                                        "hardware": "cpu"}}
  assert "dir" not in record.settings["data"] and "cache_dir" not in record.settings["data"]
  assert "99.0" not in path.read_text()
  recipe_search.add(path, run, "again")
  assert [r.call for r in recipe_search.load(path)] == ["again"]


def test_a_resumed_runs_search_record_names_each_commit_and_each_validated_step_once(tmp_path):
  """A run restarted from other (or uncommitted) code records every commit it ran from, as
  provenance.commit_of writes them, and a step validated again after a resume counts once,
  with its last figures."""
  from seq2seq.research import recipe_search

  run = tmp_path / "runs" / "resumed"
  run.mkdir(parents=True)
  (run / "config.json").write_text(json.dumps({"seed": 1, "data": {"dir": "/data"}, "eval": {"beam_size": 4, "alpha": 1.5}, "train": {"steps": 200}}))
  command = f"python train.py --config=configs/multi30k.py --workdir={run} --config.seed=1"
  (run / "provenance.jsonl").write_text("".join(json.dumps(e) + "\n" for e in [
      {"command": command, "commit": "abcdef0123"}, {"command": command, "commit": "1234567890", "changes": True}]))
  (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in [
      {"step": 100, "val_nll": 2.5, "val_tokens": 300.0}, {"step": 100, "val_nll": 2.4, "val_tokens": 300.0},
      {"step": 200, "val_nll": 1.9, "val_tokens": 301.0}]))
  record = recipe_search.record_of(run, "CPU")
  assert record.commit == "abcdef0,1234567+changes"
  assert [(p["step"], p["nll"]) for p in record.val_curve] == [(100, 2.4), (200, 1.9)]
  assert (record.reached, record.status, record.val_tokens, record.val_eval) == (200, "exit 0", 301, {})


def test_a_recipe_comparison_reads_level_only_from_an_equivalence_test():
  """A comparison's reading is "differs" after Holm, "equivalent" only from TOST within the
  stated margin (0.02 NLL, 0.5 BLEU; chrF has none, so it can only differ or stay
  inconclusive), else "inconclusive": copies of the shipped seeds are equivalent to them."""
  import dataclasses

  from seq2seq.research import recipe_search

  records = [r for r in recipe_search.load(REPO / "docs" / "runs" / "main_job_search.jsonl")
             if not r.run.startswith(recipe_search.RETUNED)]
  shipped = [r for r in records if r.run.startswith(recipe_search.SHIPPED)]
  copies = [dataclasses.replace(r, run=r.run.replace(recipe_search.SHIPPED, recipe_search.RETUNED),
                                val_curve=r.val_curve[:-1] + [{**r.val_curve[-1], "nll": r.nll + 0.001}])
            for r in shipped]
  readings = recipe_search.readings(*recipe_search.comparison(records + copies, recipe_search.RETUNED, recipe_search.SHIPPED))
  assert readings == ["equivalent (±0.02)", "equivalent (±0.5)", "inconclusive"]
  assert recipe_search.readings(*recipe_search.comparison(records, recipe_search.SHIPPED, recipe_search.BASELINE)) == ["differs"] * 3
  table = recipe_search.comparison_table(records + copies, recipe_search.RETUNED, recipe_search.SHIPPED)
  assert [line.rsplit("|", 2)[1].strip() for line in table.splitlines() if line.startswith("| validation")] == readings


def generated_rows(page: str) -> list[list[str]]:
  """The cells of each run's row in a page's generated results table."""
  return [[c.strip() for c in line.split("|")[1:-1]] for line in
          page.split(results.START, 1)[1].split(results.END, 1)[0].splitlines()[2:] if line.startswith("| `")]


def pages_prose() -> list[str]:
  """The words of docs/results.md and docs/history.md (the main job's account until 2026-12-01)."""
  return [w for page in ("results.md", "history.md") for w in (REPO / "docs" / page).read_text(encoding="utf-8").split()]


def side(values, digits: int) -> str:
  """How docs/results.md quotes runs: mean ± sd."""
  from seq2seq.research import significance

  return "{0:.{2}f} ± {1:.{2}f}".format(*significance.summary(values)[:2], digits)


def test_the_re_tuned_rates_figures_in_results_md_are_its_records():
  """docs/results.md's sentence on the confirmatory seeds of the rate 0.007 quotes the means,
  the difference, its interval and the Holm p's that recipe_search computes from the records."""
  from seq2seq.research import recipe_search

  records = recipe_search.load(REPO / "docs" / "runs" / "main_job_search.jsonl")
  rows, adjusted = recipe_search.comparison(records, recipe_search.RETUNED, recipe_search.SHIPPED)
  (_, a, b, nll), (_, c, d, bleu) = rows[:2]
  claim = (f"validation NLL {side(a, 3)} against {side(b, 3)} ({signed(nll.difference, 3)}, 95% interval "
           f"[{signed(nll.low, 3)}, {signed(nll.high, 3)}], Holm p = {adjusted[0]:.2g}) and BLEU on all 1014 "
           f"sentences {side(c, 2)} against {side(d, 2)} ({signed(bleu.difference, 2)}, Holm p = {adjusted[1]:.2g})")
  prose = " ".join(pages_prose())
  assert claim in prose
  readings = recipe_search.readings(rows, adjusted)
  assert readings == ["inconclusive"] * 3 and "Inconclusive on all three metrics" in prose


def test_the_main_jobs_prose_in_results_md_is_its_records_and_its_table():
  """Every figure docs/results.md's prose quotes for the main job and its search is what the
  search's records (docs/runs/main_job_search.jsonl) or the page's generated results table
  (the runs' own eval files) make: validation figures, the confirmatory seeds' tests, the test
  sets read once, decoding and averaging checks, and the reading of the search."""
  import statistics

  from seq2seq.research import recipe_search

  records = {r.run: r for r in recipe_search.load(REPO / "docs" / "runs" / "main_job_search.jsonl")}
  page = (REPO / "docs" / "results.md").read_text(encoding="utf-8")
  rows = generated_rows(page)
  table = {(r[0].strip("`"), r[1], r[5].split("<br>")[1]): (float(r[2].strip("*")), float(r[3]), r[4]) for r in rows}
  test = lambda run, split: next(v for (n, s, _), v in table.items() if n == run and s == split)
  val = lambda run, flags="": table[(run, "val", f"`python eval.py --workdir=/work/runs/{run} --split=val{flags}`")][0]
  prose = " ".join(pages_prose())  # the 3600-step main job's account is history now
  quoted = []

  # The README's run, seed 0: its validation figures (records) and its decoding checks (table).
  readme = records["m30k_3600_readme"]
  quoted.append(f"On validation: NLL {readme.nll:.3f} at the end ({readme.val_tokens:,} tokens), BLEU "
                f"{readme.full('bleu'):.2f} on all 1014 sentences ({readme.val_curve[-1]['bleu500']:.2f} on the first 500")
  alphas = ("1.0", "1.2", "", "2.0")
  seeds = ("m30k_3600_readme", "m30k_3600_s3")
  by_alpha = [" / ".join(f"{val(run, f' --alpha={a}' if a else ''):.2f}" for a in alphas) for run in seeds]
  averaged = [" / ".join(f"{val(run, f' --average_last={k}'):.2f}" for k in (2, 4)) for run in seeds]
  quoted.append(f"alpha 1.0 / 1.2 / 1.5 / 2.0 give {by_alpha[0]} and {by_alpha[1]} BLEU; averaging the last 2 or 4 "
                f"checkpoints (450 steps apart, `--average_last`) gives {averaged[0]} and {averaged[1]}, against "
                f"{val(seeds[0]):.2f} and {val(seeds[1]):.2f} for the last alone")

  # Seeds 1-3 of the main job against the former default's: the second comparison table's tests.
  (_, a, b, nll), (_, c, d, bleu), _ = (found := recipe_search.comparison(records.values(), recipe_search.SHIPPED))[0]
  holm = found[1]
  assert f"{holm[0]:.3f}" == f"{holm[1]:.3f}"  # "0.010 for both"
  quoted.append(f"validation NLL {side(a, 3)} against {side(b, 3)} ({signed(nll.difference, 3)}, Welch p = {nll.p:.3f}) "
                f"and BLEU on all 1014 sentences {side(c, 2)} against {side(d, 2)} ({signed(bleu.difference, 2)}, p = "
                f"{bleu.p:.3f}; Holm over the table's three metrics {holm[0]:.3f} for both)")

  # The test sets, read once: each seed, their mean, and the mean with seed 0.
  shipped = ("m30k_3600_s1", "m30k_3600_s2", "m30k_3600_s3")
  sets = ("test_2016_flickr", "test_2017_flickr")
  quoted.append("The test sets, read once afterwards: " + ", ".join(
      " / ".join(f"{test(run, s)[0]:.2f}" for s in sets) for run in shipped[:2]) + " and "
      + " / ".join(f"{test(shipped[2], s)[0]:.2f}" for s in sets) + " BLEU (chrF " + ", ".join(
      " / ".join(f"{test(run, s)[1]:.2f}" for s in sets) for run in shipped[:2]) + " and "
      + " / ".join(f"{test(shipped[2], s)[1]:.2f}" for s in sets) + ")")
  mean = lambda runs: " / ".join(side([test(run, s)[0] for run in runs], 2) for s in sets)
  quoted.append(f"a mean of **{mean(shipped)}**; with seed 0 above, the README's command averages "
                f"**{mean(('m30k_3600_readme',) + shipped)}** over 4 seeds")

  # Re-tuning at 3600 steps, one seed each, against seed 0 and the shipped seeds' spread.
  drop, warm, rate = (records[f"m30k_3600_{name}"] for name in ("drop01", "warm400", "lr007"))
  quoted.append(f"(`m30k_3600_drop01`: NLL {drop.nll:.3f}, BLEU {drop.full('bleu'):.2f},")
  quoted.append(f"(`m30k_3600_warm400`: NLL {warm.nll:.3f}, BLEU {warm.full('bleu'):.2f})")
  quoted.append(f"(`m30k_3600_lr007`: NLL {rate.nll:.3f}, BLEU {rate.full('bleu'):.2f},")
  quoted.append(f"raises it by {warm.nll - readme.nll:.3f}")
  quoted.append(f"lowers it by {readme.nll - rate.nll:.3f}")
  spread = sorted(records[run].nll for run in shipped)
  four = sorted(records[run].full("bleu") for run in ("m30k_3600_readme",) + shipped)
  quoted.append(f"seeds spread ({spread[0]:.3f} to {spread[-1]:.3f} over seeds 1-3)")
  quoted.append(f"gains of {drop.full('bleu') - readme.full('bleu'):.1f} and {warm.full('bleu') - readme.full('bleu'):.1f} "
                f"over seed 0, lies within the shipped recipe's own four seeds ({four[0]:.2f} to {four[-1]:.2f})")

  # The search's reading: the chosen recipe against the former default, its neighbours, averaging.
  (_, a, b, nll), (_, c, d, bleu), (_, e, f, chrf) = (found := recipe_search.comparison(records.values()))[0]
  quoted.append(f"{-nll.difference:.3f} lower NLL (Holm p = {found[1][0]:.1g}), {bleu.difference:.1f} higher BLEU "
                f"(p = {found[1][1]:.1g}) and {chrf.difference:.1f} higher chrF on all 1014 sentences")
  quoted.append(f"(BLEU sd {statistics.stdev(c):.2f} against {statistics.stdev(d):.2f})")
  chosen = sorted(records[f"d128_drop02_s{s}"].nll for s in (1, 2, 3))
  quoted.append(f"a peak rate of 0.007 ({records['d128_drop02_lr007'].nll:.3f}) and 5+5 layers in 6000 steps "
                f"({records['d128_drop02_l5'].nll:.3f}) end within the chosen recipe's seed spread ({chosen[0]:.3f} to "
                f"{chosen[-1]:.3f}); dropout 0.1 ({records['d128_drop01'].nll:.3f}) and no label smoothing "
                f"({records['d128_drop02_ls0'].nll:.3f}) overfit")
  lowest = lambda r: min(r.val_curve, key=lambda c: c["nll"])["step"]
  quoted.append(f"their NLL rising after steps {lowest(records['d128_drop01'])} and "
                f"{lowest(records['d128_drop02_ls0'])}")
  quoted.append(f"(seed 1: {records['d128_s1'].nll:.3f}, {records['d128_s1'].full('bleu'):.2f} BLEU on all of val)")
  confirm = [records[f"d128_drop02_s{s}"] for s in (1, 2, 3)]
  (every,) = {r.settings["train"]["checkpoint_every"] for r in confirm}
  quoted.append(f"(the last 5, {every} steps apart)")
  rows, adjusted = recipe_search.comparison(list(records.values()), recipe_search.CHOSEN, recipe_search.SHIPPED)
  quoted.append(f"NLL {signed(rows[0][3].difference, 3)} (Holm p = {adjusted[0]:.1g}) and chrF "
                f"{signed(rows[2][3].difference, 2)} (Holm p = {adjusted[2]:.2g}), BLEU level (equivalent within ±0.5")
  quoted.append("where 0.2.3 (what the CPU runs before the pin took) gives 17,177")
  assert "with the same tokenizer (17,177 target tokens)" in " ".join(pages_prose())
  quoted.append(f"does not help: {statistics.mean(r.full('bleu', 'average5') for r in confirm):.2f} against "
                f"{statistics.mean(r.full('bleu') for r in confirm):.2f} for the latest")
  vocab = records["d128_drop02_v6k"]
  at_500 = sorted(r.val_curve[-1]["bleu500"] for r in confirm)
  quoted.append(f"({vocab.nll:.3f} NLL, of another vocabulary) reached step {vocab.reached} of {vocab.steps} at "
                f"{vocab.val_curve[-1]['bleu500']:.2f} BLEU on 500 sentences, within the chosen recipe's "
                f"{at_500[0]:.2f} to {at_500[-1]:.2f}")
  for sentence in quoted:
    assert sentence in prose, sentence


def test_the_main_jobs_rows_of_64_prose_is_its_records_and_its_table():
  """docs/results.md's figures for the main job as shipped since 2026-12-01 (rows of 64, 4200
  steps; seeds 0, 1, 2) are what its records and the generated results table make: each seed's
  validation figures, the tests against the main job as it was and the former default, the
  family's Holm p, and the test sets read once."""
  import statistics

  from seq2seq.research import family, recipe_search, significance

  records = {r.run: r for r in recipe_search.load(REPO / "docs" / "runs" / "main_job_search.jsonl")}
  page = (REPO / "docs" / "results.md").read_text(encoding="utf-8")
  rows = generated_rows(page)
  test = lambda run, split: next(float(r[2].strip("*")) for r in rows if r[0] == f"`{run}`" and r[1] == split)
  prose = " ".join(page.split())
  runs = ("m30k_p64_readme", "m30k_p64_s1", "m30k_p64_s2")
  seeds = [records[run] for run in runs]
  assert [r.seed for r in seeds] == [0, 1, 2] and all(r.run.startswith(recipe_search.ROWS64) for r in seeds)
  readme = seeds[0]
  quoted = [f"On validation: NLL {readme.nll:.3f} at the end ({readme.val_tokens:,} tokens), BLEU "
            f"{readme.full('bleu'):.2f} on all 1014 sentences ({readme.val_curve[-1]['bleu500']:.2f} on the first 500",
            "Validation NLL " + ", ".join(f"{r.nll:.3f}" for r in seeds[:2]) + f" and {seeds[2].nll:.3f}, BLEU on all "
            "1014 sentences " + ", ".join(f"{r.full('bleu'):.2f}" for r in seeds[:2]) + f" and {seeds[2].full('bleu'):.2f}"]
  (_, a, b, nll), (_, c, d, bleu), (_, e, f, _) = (found := recipe_search.comparison(records.values(), recipe_search.ROWS64,
                                                                                        recipe_search.SHIPPED))[0]
  assert recipe_search.readings(*found) == ["inconclusive"] * 3
  quoted.append(f"NLL {side(a, 3)} against {side(b, 3)} ({signed(nll.difference, 3)}, 95% interval "
                f"[{signed(nll.low, 3)}, {signed(nll.high, 3)}], Holm p = {found[1][0]:.2f}), BLEU {side(c, 2)} against "
                f"{side(d, 2)} ({signed(bleu.difference, 2)}, Holm p = {found[1][1]:.1f}), chrF "
                f"{statistics.mean(e):.2f} against {statistics.mean(f):.2f}: inconclusive on all three metrics")
  (_, _, _, nll), (_, _, _, bleu), (_, _, _, chrf) = (found := recipe_search.comparison(
      records.values(), recipe_search.ROWS64, recipe_search.BASELINE))[0]
  assert recipe_search.readings(*found) == ["differs"] * 3 and f"{found[1][0]:.3f}" == f"{found[1][1]:.3f}"
  quoted.append(f"NLL {signed(nll.difference, 3)} (Welch p = {nll.p:.3f}), BLEU {signed(bleu.difference, 2)} (p = "
                f"{bleu.p:.3f}; Holm over the table's three metrics {found[1][0]:.3f} for both) and chrF "
                f"{signed(chrf.difference, 2)}")
  claims = family.claims(REPO)
  shipped = dict(zip((c.comparison for c in claims), significance.holm([c.p for c in claims])))
  quoted.append("the NLL gain is inconclusive (Holm p = " + next(f"{p:.3f}" for name, p in shipped.items()
                                                                 if name.startswith("main job as shipped")))
  sets = ("test_2016_flickr", "test_2017_flickr")
  quoted.append("The test sets, read once afterwards: " + ", ".join(" / ".join(f"{test(run, s):.2f}" for s in sets)
                                                                   for run in runs[:2])
                + " and " + " / ".join(f"{test(runs[2], s):.2f}" for s in sets) + " BLEU")
  mean = lambda names: " / ".join(side([test(run, s) for run in names], 2) for s in sets)
  quoted.append(f"a mean of **{mean(runs)}**, where the main job as it was averaged "
                f"{mean(('m30k_3600_s1', 'm30k_3600_s2', 'm30k_3600_s3'))} over its seeds 1-3")
  (_, _, _, nll), (_, _, _, bleu), _ = (found := recipe_search.comparison(records.values(), recipe_search.CHOSEN,
                                                                          recipe_search.SHIPPED))[0]
  assert recipe_search.readings(*found)[1] == "equivalent (±0.5)"
  quoted.append(f"(7000 against 3600 steps: {signed(nll.difference, 3)}, Holm p = {found[1][0]:.3f}")
  for sentence in quoted:
    assert sentence in prose, sentence


def test_the_fresh_clone_rerun_is_the_readme_runs_figures():
  """docs/results.md's rerun of the main job from a fresh clone (`m30k_fresh`) quotes its
  generated rows, and they equal the README run's on every set, BLEU and chrF."""
  page = (REPO / "docs" / "results.md").read_text(encoding="utf-8")
  rows = {(r[0].strip("`"), r[1]): (r[2].strip("*"), r[3], r[8].removesuffix(" min")) for r in generated_rows(page)}
  sets = ("test_2016_flickr", "test_2017_flickr", "val")
  fresh, readme = ([rows[(run, s)] for s in sets] for run in ("m30k_fresh", "m30k_p64_readme"))
  assert [f[:2] for f in fresh] == [r[:2] for r in readme]
  prose = " ".join(page.split())
  assert (f"**{fresh[0][0]} / {fresh[1][0]}**, chrF {fresh[0][1]} / {fresh[1][1]}, and {fresh[2][0]} BLEU on all of "
          f"val, in {fresh[0][2]} minutes") in prose


def test_the_half_length_runs_figures_in_results_md_are_its_records():
  """The bullet on halving the main job's steps (for an ensemble of two in the budget) quotes
  the records of that run and of the README's run of the same seed."""
  from seq2seq.research import recipe_search

  records = {r.run: r for r in recipe_search.load(REPO / "docs" / "runs" / "main_job_search.jsonl")}
  half, full = records["m30k_half_s0"], records["m30k_p64_readme"]
  assert (half.seed, half.steps, half.reached, full.seed, full.steps) == (0, 2100, 2100, 0, 4200)
  assert half.overrides[0] == "--config.train.steps=2100" and half.val_tokens == full.val_tokens
  prose = " ".join(pages_prose())
  assert (f"validation NLL {half.nll:.3f} and {half.full('bleu'):.2f} BLEU on all 1014 sentences, against "
          f"{full.nll:.3f} and {full.full('bleu'):.2f} for the same seed in 4200 steps. Halving the steps costs "
          f"{full.full('bleu') - half.full('bleu'):.2f} BLEU") in prose
  assert f"(+{41.23 - 40.41:.2f} and +{41.24 - 40.41:.2f})" in prose  # the bullet above's ensembles and seed


@pytest.mark.parametrize("run, section, key, what", [("m30k_mu_bf16", "train", "adam_mu_dtype", "moments"),
                                                     ("m30k_logits_bf16", "model", "logits_dtype", "logits")])
def test_the_bf16_options_figures_in_scaling_md_are_their_records(run, section, key, what):
  """docs/scaling.md's main-job checks of bf16 first moments and bf16 logits quote their records
  and that of the README's run of the same seed (float32), and the rows-of-64 seeds' spread."""
  import statistics

  from seq2seq.research import recipe_search

  records = {r.run: r for r in recipe_search.load(REPO / "docs" / "runs" / "main_job_search.jsonl")}
  bf16, f32 = records[run], records["m30k_p64_readme"]
  assert bf16.overrides == [f"--config.{section}.{key}=bfloat16"] and bf16.settings[section][key] == "bfloat16"
  assert (bf16.seed, bf16.steps, bf16.reached) == (f32.seed, f32.steps, f32.steps) and bf16.val_tokens == f32.val_tokens
  spread = statistics.stdev(r.nll for name, r in records.items() if name.startswith(recipe_search.ROWS64))
  page = " ".join((REPO / "docs" / "scaling.md").read_text(encoding="utf-8").split())
  assert (f"validation NLL is {bf16.nll:.3f} and BLEU on all 1014 sentences {bf16.full('bleu'):.2f}, against "
          f"{f32.nll:.3f} and {f32.full('bleu'):.2f} for the same seed with f32 {what}: a difference of "
          f"{signed(bf16.nll - f32.nll, 3)} NLL against a seed spread of ±{spread:.3f}") in page


def test_the_earlier_d128_runs_bullet_is_historys_table():
  """docs/results.md's bullet on the earlier CPU runs of the d_model 128 recipe quotes their
  validation rows in docs/history.md's table (beam 4), and their compute against the plain
  recipe's 7000 steps: the steps of each checkpoint an ensemble joins."""
  import re

  rows = [r for runs in report_tables.results_table("docs/history.md").values() for r in runs
          if r[1] == "val" and "beam 4" in r[5]]
  val = lambda run, ensemble=False: next(r for r in rows if r[0] == f"`{run}`" and ("ensemble" in r[4]) == ensemble)
  bleu = lambda row: row[2].strip("*")
  steps = lambda row: sum(int(s) for s in re.findall(r"step(\d+)", row[4]))
  plain = val("m30k_d128_s1")
  assert steps(plain) == 7000
  ahead = [val("m30k_d128_11k"), val("m30k_d128_s1", True), val("m30k_d128_11k", True)]
  ratios = sorted(steps(r) / steps(plain) for r in ahead)
  assert steps(ahead[0]) == 11000
  below = [val("m30k_d128_sr"), val("m30k_d128_v4k")]
  assert all(float(bleu(r)) < float(bleu(plain)) for r in below) and all(float(bleu(r)) > float(bleu(plain)) for r in ahead)
  text = " ".join(pages_prose())
  assert (f"subword regularization 0.1 ({bleu(below[0])}) and a 4000-piece vocabulary ({bleu(below[1])}) ended below "
          f"the plain recipe's second seed ({bleu(plain)}), label smoothing 0.2 ({bleu(val('m30k_d128_ls02'))}) within "
          f"seed noise; 11,000 steps ({bleu(ahead[0])}) and two-run ensembles ({bleu(ahead[1])}, {bleu(ahead[2])}) ended "
          f"above it at {ratios[0]:.1f} to {ratios[-1]:.1f} times the compute, outside the budget") in text


def test_the_main_jobs_paragraphs_quote_its_table_rows_and_records():
  """docs/results.md's account of the main job: the README run's test rows, steps, time and speed
  (the results table), its validation NLL, tokens and BLEU (its record), the seeds' times, and
  the search's stages as the records' calls, steps and curves hold them."""
  table = report_tables.results_table()
  records = {r.run: r for r in recipe_search.load(REPO / "docs" / "runs" / "main_job_search.jsonl")}
  text = " ".join(pages_prose())
  row = lambda run, split: next(r for r in table[run] if r[1] == split)
  t16, t17, val = (row("m30k_p64_readme", s) for s in ("test_2016_flickr", "test_2017_flickr", "val"))
  readme = records["m30k_p64_readme"]
  assert (f"**{t16[2].strip('*')} on test_2016_flickr and {t17[2].strip('*')} on test_2017_flickr**, chrF {t16[3]} / "
          f"{t17[3]}, after {t16[7]} steps in {t16[8].replace(' min', ' minutes')} ({t16[9]} target tokens/s). On "
          f"validation: NLL {readme.nll:.3f} at the end ({readme.val_tokens:,} tokens), BLEU {readme.full('bleu'):.2f} "
          f"on all {readme.val_eval['latest']['sentences']} sentences ({readme.val_curve[-1]['bleu500']:.2f} on the "
          "first 500 during training)") in text
  assert val[2].strip("*") == f"{readme.full('bleu'):.2f}" and readme.reached == int(t16[7])
  fresh = row("m30k_fresh", "test_2016_flickr")
  assert f"and 41.38 BLEU on all of val, in {fresh[8].replace(' min', ' minutes')}: the figures" in text
  seeds = {table[f"m30k_p64_s{s}"][0][8] for s in (1, 2)}
  assert len(seeds) == 1 and f"alone but for a few minutes of tests beside seed 1; {seeds.pop().replace(' min', ' minutes')} each)" in text
  assert max(int(table[run][0][8].split()[0]) for run in ("m30k_p64_readme", "m30k_fresh", "m30k_3600_readme")) < 40
  assert "Both are within the 40 minutes" in text
  # The search: the former default and the chosen recipe, as their records' settings hold them.
  former, chosen = records["default_s1"], records["d128_drop02_s1"]
  shape = lambda r: (f"d_model {r.settings['model']['d_model']}, {r.settings['model']['num_encoder_layers']}+"
                     f"{r.settings['model']['num_decoder_layers']} layers, dropout {r.settings['model']['dropout_rate']:g}")
  assert (f"from {shape(former)}, {former.steps} steps (run `m30k_rope`, [docs/history.md](history.md)) to "
          f"{shape(chosen)}, {chosen.steps} steps") in text
  # Its stages: six runs a call on the GPUs, where stage 1 stopped, and its leader at step 4000.
  calls = {}
  for r in records.values():
    calls.setdefault(r.call, []).append(r)
  gpu = {call: runs for call, runs in calls.items() if "H100" in call or "H200" in call}
  assert {len(runs) for runs in gpu.values()} == {6}
  assert "On lent GPUs, six runs at a time on one device" in text
  (first,) = [runs for call, runs in gpu.items() if call.startswith("2026-11-27")]
  at = lambda r, step: next(c["nll"] for c in r.val_curve if c["step"] == step)
  lead = min((r for r in first if r.reached == 4000), key=lambda r: at(r, 4000))
  assert lead.run == "d128_drop02" and "--config.model.dropout_rate=0.2" in lead.overrides
  assert (f"six variations with seed 0, stopped by the call's time at steps {min(r.reached for r in first)} to "
          f"{max(r.reached for r in first)}; dropout 0.2 led ({at(lead, 4000):.3f} NLL against `multi30k_d128`'s "
          f"{at(records['d128_s0'], 4000):.3f} at step 4000)") in text
  (third,) = [runs for call, runs in gpu.items() if call.startswith("2026-11-28 H100 call 2")]
  assert sum(r.reached < r.steps for r in third) == 1
  assert "but all but one reached their last validation step" in text


@pytest.mark.data
def test_the_rows_of_64_figures_are_the_data_commands(real_data_dir, session_cache):
  """The longest target, the padding in rows of 128 and of 64, and the target tokens a batch, as
  `python -m seq2seq.data --config=multi30k` prints them on the real corpus (and the training
  pairs findings.md counts)."""
  import os
  import re

  def described(*overrides):
    out = subprocess.run([sys.executable, "-m", "seq2seq.data", "--config=multi30k", f"--config.data.dir={real_data_dir}",
                          f"--config.data.cache_dir={session_cache}", *overrides], capture_output=True, text=True,
                         cwd=REPO, env={k: v for k, v in os.environ.items() if k != "SEQ2SEQ_DATA_DIR"})
    assert out.returncode == 0, out.stderr[-2000:]
    return out.stdout

  rows64, rows128 = described(), described("--config.data.pack_length=128")
  longest = int(re.search(r"target length p50/p90/p95/p99/max: [\d/]+/(\d+)", rows64)[1])
  padding = [float(re.search(r"padding fraction: ([\d.]+)%", out)[1]) for out in (rows128, rows64)]
  tokens = int(re.search(r"tokens: source=\d+ target=(\d+)", rows64)[1])
  batches = int(re.search(r"batches per epoch: (\d+)", rows64)[1])
  assert longest <= 64 and round(tokens / batches, -2) == 2000
  read = int(re.search(r"pairs: read=(\d+)", rows64)[1])
  findings = report_tables.words("docs/findings.md")
  assert f"Translation on {read // 1000}k Multi30k pairs" in findings
  text = " ".join(pages_prose())
  assert (f"(the longest target has {longest} tokens: `python -m seq2seq.data --config=multi30k`), and padding rises "
          f"from {padding[0]:.1f}% to {padding[1]:.1f}%, so a batch still holds about 2000 target tokens") in text


def test_the_bf16_logits_seeds_paragraph_is_their_comparison():
  """docs/scaling.md's three seeds of bf16 logits against the main job's three (rows of 64): each
  metric's difference, interval and reading as recipe_search's comparison (docs/results.md's
  table) has them; seed 0 trained on the Xeon with the f32 seeds, seeds 1 and 2 on the EPYC."""
  from seq2seq.research import recipe_search

  records = recipe_search.load(REPO / "docs" / "runs" / "main_job_search.jsonl")
  bf16 = sorted((r for r in records if r.run.startswith(recipe_search.LOGITS_BF16)), key=lambda r: r.seed)
  assert [r.seed for r in bf16] == [0, 1, 2]
  assert all(r.overrides == ["--config.model.logits_dtype=bfloat16"] and r.reached == r.steps == 4200 for r in bf16)
  assert [r.call.split(", ", 1)[1] for r in bf16] == ["2-core Xeon", "2-core AMD EPYC", "2-core AMD EPYC"]
  rows, adjusted = recipe_search.comparison(records, recipe_search.LOGITS_BF16, recipe_search.ROWS64)
  readings = recipe_search.readings(rows, adjusted)
  page = " ".join((REPO / "docs" / "scaling.md").read_text(encoding="utf-8").split())
  for (_, _, _, w), metric, reading in zip(rows, recipe_search.METRICS, readings):
    d = metric.digits
    assert (f"{metric.name} {signed(w.difference, d)} [{signed(w.low, d)}, {signed(w.high, d)}], "
            f"{reading.split(' (')[0]}") in page, metric.name
  f32 = {r.seed: r for r in records if r.run.startswith(recipe_search.ROWS64)}
  by_seed = [f32[r.seed].nll - r.nll for r in bf16]
  assert all(x > 0 for x in by_seed)
  assert (f"bf16 logits ended lower in NLL all three times (by {by_seed[0]:.3f}, {by_seed[1]:.3f} and "
          f"{by_seed[2]:.3f})") in page
