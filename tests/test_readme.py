"""The README and docs/ as written: their Python blocks run (the README's against a trained
tiny model), the quick-start commands run (slow suite), the README's results table agrees
with docs/results.md and with the configs' "Expected:" lines, and relative links resolve."""

import ast
import os
import pathlib
import re
import shlex
import subprocess

import pytest
from conftest import REPO
from report_tables import printed_tests, table_rows

README = REPO / "README.md"
DOCS = REPO / "docs"
SOURCE = "A man is riding a bike."


def code_blocks(path: pathlib.Path, language: str) -> list[str]:
  return re.findall(rf"^```{language}\n(.*?)^```", path.read_text(encoding="utf-8"), flags=re.S | re.M)


def replace_paths(text: str, paths: dict[str, pathlib.Path]) -> str:
  """`text` with each example path (longest first, so /tmp/tiny-model before /tmp/tiny) replaced."""
  for example in sorted(paths, key=len, reverse=True):
    text = text.replace(example, str(paths[example]))
  return text


def run_block(block: str, where: pathlib.Path) -> dict:
  namespace = {"__name__": "__readme__"}
  exec(compile(block, str(where), "exec"), namespace)
  return namespace


@pytest.fixture(scope="module")
def tiny_model(tiny_run, tmp_path_factory) -> pathlib.Path:
  """The tiny run exported as `python -m seq2seq.export` does."""
  from seq2seq import export

  return export.export(tiny_run, tmp_path_factory.mktemp("tiny_model") / "model")


def test_readme_python_block_translates_with_a_trained_model(tiny_run, tiny_model, capsys):
  (block,) = code_blocks(README, "python")
  loaded = 'Translator.from_workdir("/tmp/tiny")'
  assert loaded in block and 'Translator.from_pretrained("/tmp/tiny-model")' in block
  # As written (a training run), and with the alternative its comment gives (an exported model).
  for variant in (block, block.replace(loaded, 'Translator.from_pretrained("/tmp/tiny-model")', 1)):
    run_block(replace_paths(variant, {"/tmp/tiny": tiny_run, "/tmp/tiny-model": tiny_model}), README)
    printed = capsys.readouterr().out.strip().splitlines()
    translations = ast.literal_eval(printed[-1])
    assert isinstance(translations, list) and len(translations) == 1
    assert isinstance(translations[0], str) and translations[0].strip() and translations[0] != SOURCE


def test_evaluation_doc_python_block_runs(tiny_run, tiny_model):
  block, _ = code_blocks(DOCS / "evaluation.md", "python")
  names = run_block(replace_paths(block, {"/tmp/m30k": tiny_run, "/tmp/m30k-model": tiny_model}),
                    DOCS / "evaluation.md")
  assert len(names["hypotheses"]) == len(names["sentences"]) == len(names["scores"]) == 2
  assert all(isinstance(h, str) and h.strip() for h in names["hypotheses"])
  assert all(isinstance(s, float) for s in names["scores"])
  assert isinstance(names["one"], str) and names["one"].strip()
  assert names["greedy"].settings.beam_size == 1 and names["greedy"].checkpoint.startswith("best")
  assert names["exported"].translate(names["sentences"]) == names["hypotheses"]


def test_evaluation_doc_ctranslate2_block_runs(tiny_run, tmp_path):
  """The Deploy section's five lines, on the tiny run exported with --format=ctranslate2."""
  pytest.importorskip("ctranslate2")
  from seq2seq import export

  folder = export.export(tiny_run, tmp_path / "ct2", format="ctranslate2")
  _, block = code_blocks(DOCS / "evaluation.md", "python")
  names = run_block(replace_paths(block, {"/tmp/m30k-ct2": folder}), DOCS / "evaluation.md")
  pieces = names["result"][0].hypotheses[0]
  assert pieces and all(names["sp"].piece_to_id(p) != names["sp"].unk_id() for p in pieces)


@pytest.mark.long
def test_model_doc_python_block_runs():
  (block,) = code_blocks(DOCS / "model.md", "python")
  names = run_block(block, DOCS / "model.md")
  assert names["logits_btv"].shape == (1, 3, 8000)
  assert names["logits_bv"].shape == (1, 8000)


def test_only_tested_docs_have_python_blocks():
  """A ```python block in docs/ must be run by a test above (else write it as ```text)."""
  tested = {"evaluation.md", "model.md"}
  assert {p.name for p in DOCS.glob("*.md") if code_blocks(p, "python")} == tested


# --- the results table ----------------------------------------------------------------


def section(text: str, heading: str) -> str:
  return text.split(heading + "\n", 1)[1]


def recipe_claim(comparison_rows) -> str:
  """How the README words a recipe comparison: BLEU and NLL gains with their Welch p-values."""
  nll, bleu = comparison_rows[0][3], comparison_rows[1][3]
  return (f"it gains {bleu.difference:.1f} validation BLEU (Welch p = {bleu.p:.1g}) and {-nll.difference:.2f} "
          f"NLL (p = {nll.p:.1g}")


def test_the_readmes_recipe_gains_are_the_run_records():
  """The README's figures for the main job's recipe against the former default are what
  seq2seq.research.recipe_search computes from docs/runs/main_job_search.jsonl."""
  from seq2seq.research import recipe_search

  records = recipe_search.load(DOCS / "runs" / "main_job_search.jsonl")
  prose = " ".join(README.read_text(encoding="utf-8").split())
  for against in (recipe_search.CHOSEN, recipe_search.ROWS64):
    rows, _ = recipe_search.comparison(records, against)
    assert recipe_claim(rows) in prose, against
  # "is inconclusive against 3600 steps": on every metric of that comparison.
  found = recipe_search.readings(*recipe_search.comparison(records, recipe_search.ROWS64, recipe_search.SHIPPED))
  assert found == ["inconclusive"] * 3 and "correction over the claims below), is inconclusive against 3600 steps," in prose


def test_the_readmes_norms_figure_is_the_norms_studys_records():
  """The README's AdaNorm figure is the final-NLL difference seq2seq.research.ablations
  computes from docs/runs/ablations_prenorm_norms.jsonl, and that report's only survivor."""
  from seq2seq.research import ablations, records

  kept = records.read(DOCS / "runs" / "ablations_prenorm_norms.jsonl")
  found = {(c.variant, c.column): c for c in ablations.comparisons(kept.results, baseline=kept.baseline)}
  adanorm = found[("adanorm-xu", "Final loss")]
  prose = " ".join(README.read_text(encoding="utf-8").split())
  assert f"AdaNorm (Xu et al.'s norm settings) ends {adanorm.welch.difference:+.3f} NLL above LayerNorm" in prose
  assert [key for key, c in found.items() if c.adjusted < 0.05 and key[1] == "Final loss"] == [("adanorm-xu",
                                                                                                   "Final loss")]


def test_the_readmes_prenorm_figures_are_the_prenorm_studys_records():
  """The README's RoPE, GELU and SwiGLU figures on the pre-norm base are what
  seq2seq.research.ablations computes from docs/runs/ablations_prenorm.jsonl: RoPE's the only
  final-NLL difference that survives, the activations' inconclusive (neither different nor level)."""
  from seq2seq.research import ablations, records, significance

  kept = records.read(DOCS / "runs" / "ablations_prenorm.jsonl")
  found = {(c.variant, c.column): c for c in ablations.comparisons(kept.results, baseline=kept.baseline)}
  sinusoidal, gelu, swiglu = (found[(v, "Final loss")] for v in ("prenorm", "prenorm+rope+gelu", "prenorm+rope+swiglu"))
  prose = " ".join(README.read_text(encoding="utf-8").split())
  assert (f"RoPE still beats sinusoidal positions ({-sinusoidal.welch.difference:+.3f} NLL, corrected p < 0.001), "
          f"GELU and SwiGLU are inconclusive against ReLU ({gelu.welch.difference:+.3f} / "
          f"{swiglu.welch.difference:+.3f} NLL)").replace("-", "−") in prose
  assert sinusoidal.adjusted < 0.001
  assert [key for key, c in found.items() if c.adjusted < 0.05 and key[1] == "Final loss"] == [("prenorm", "Final loss")]
  for activation in (gelu, swiglu):
    assert significance.reading(activation.adjusted, activation.tost) == "inconclusive"


def test_the_readmes_grid_claims_are_what_the_family_and_the_report_make():
  """The README's reading of the grid (docs/ablations.md): the variants whose final NLL survives
  Holm's correction over the README's declared family (seq2seq.research.family: every report's
  final-NLL tests), named as the README names them, and, BLEU being secondary and tested in the
  report's own table, those whose BLEU survives there on both test sets, at the printed
  differences."""
  from seq2seq.research import family, significance

  found = family.claims(REPO)
  adjusted = dict(zip((c.comparison for c in found), significance.holm([c.p for c in found])))
  printed = {key: (row[4], row[8].endswith("*")) for key, row in printed_tests(DOCS / "ablations.md").items()}
  order = list(dict.fromkeys(v for v, _ in printed))  # the report's table order
  named = {"transformer++": "Transformer++", "rope": "RoPE", "prenorm": "pre-norm", "gelu": "GELU",
           "swish": "Swish", "reglu": "ReGLU", "geglu": "GeGLU", "swiglu": "SwiGLU", "rmsnorm": "RMSNorm",
           "learned": "learned positions", "relative": "relative positions", "nobias": "no biases"}
  prose = " ".join(README.read_text(encoding="utf-8").split())
  listed = prose.split(" seeds of a 3.9M-parameter model, ", 1)[1].split(") puts ", 1)[1]
  listed = listed.split(" below post-norm vanilla's final NLL after Holm's correction", 1)[0]
  words = [w.strip() for part in listed.split(", ") for w in part.split(" and ")]
  survive = [v for v in order if significance.significant(adjusted[f"`{v}` − `vanilla`"])]
  glus = {"reglu", "geglu", "swiglu"}
  expected = {named[v] for v in survive}
  if glus <= set(survive):
    expected = expected - {named[v] for v in glus} | {"the GLUs"}
  assert sorted(words) == sorted(expected)
  bleu_survives = lambda column: [v for v in order if printed[(v, column)][1]]
  both = [v for v in bleu_survives("BLEU test_2016_flickr") if v in bleu_survives("BLEU test_2017_flickr")]
  bleu = lambda v: " / ".join(f"{float(printed[(v, c)][0]):+.1f}" for c in ("BLEU test_2016_flickr", "BLEU test_2017_flickr"))
  if len(both) == 1:
    said = f"in BLEU only {named[both[0]]}'s {bleu(both[0])} survives on both test sets"
  else:
    said = f"in BLEU {', '.join(f'{named[v]} {bleu(v)}' for v in both) or 'no variant'} survive on both test sets"
  assert said in prose


def test_the_readmes_scaling_claim_is_what_the_scaling_records_make():
  """"Transformer++ at d_model 96 ends below every vanilla run of 720 steps up to ...M parameters": every
  vanilla run of docs/runs/ablations_scaling.jsonl (every rate, every seed) ends above every
  confirmatory run of Transformer++ small, and the difference and p are the family's test of
  Transformer++ small against vanilla's best size (seq2seq/research/family.py); "both at
  d_model 192" quotes the family's test of the two at the base size, each at its best rate."""
  from seq2seq.research import family, multiplier, records

  results = records.read(DOCS / "runs" / "ablations_scaling.jsonl").results
  small, strong, size, weak = multiplier.smallest_against_best(results)
  vanilla = [r for r in results if multiplier.architecture_of(r.variant) == "vanilla"]
  assert small == "small" and min(r.final_nll for r in vanilla) > max(r.final_nll for r in strong)
  assert sorted({r.seed for r in strong}) == sorted({r.seed for r in weak}) == [1, 2, 3]
  claims = family.claims(REPO)
  scaling = next(c for c in claims if c.source == family.SCALING and "best size" in c.comparison)
  assert scaling == family.scaling_claim(results)
  widest = max(r.params for r in vanilla)
  prose = " ".join(README.read_text(encoding="utf-8").split())
  difference = f"{scaling.difference:+.3f}".replace("-", "−")
  # At the base size (d_model 192), each at its best rate: the family's test from the report's modifications table.
  pp, _ = multiplier.best_by_size(results, "transformer++")["base"]
  at_base = next(c for c in claims if c.source == family.SCALING and c.comparison.startswith(f"`{pp}`"))
  assert at_base.comparison == f"`{pp}` − `vanilla`" and multiplier.best_by_size(results, "vanilla")["base"][0] == "vanilla"
  at_base_difference = f"{at_base.difference:+.3f}".replace("-", "−")
  assert (f"Transformer++ at d_model 96 ends below every vanilla run of 720 steps up to {widest / 1e6:.1f}M "
          "parameters in NLL "
          f"({difference} against vanilla's best size, {size}; p = {scaling.p:.2g}); both at d_model 192, "
          f"{at_base_difference} (p = {at_base.p:.2g}).") in prose


def test_readme_results_table_matches_docs_results_and_configs():
  results_md = (DOCS / "results.md").read_text(encoding="utf-8")
  compact = table_rows(section(README.read_text(encoding="utf-8"), "## Results"))
  run_of = {config.strip("`"): run.strip("`")
            for config, run, _ in table_rows(section(results_md, "## Which run is which config"))}
  full = table_rows(results_md.split("<!-- results:start -->", 1)[1].split("<!-- results:end -->", 1)[0])
  assert compact and run_of and full
  seen = set()
  for link, test_set, bleu, chrf, steps, minutes, hardware in compact:
    config, target = re.fullmatch(r"\[(\w+)\]\(docs/results\.md#(\w+)\)", link).groups()
    assert target == config and f"\n## {config}\n" in results_md, link
    assert (config, test_set) not in seen, f"two rows for {config} on {test_set}"
    seen.add((config, test_set))
    # The run's single-model row (not an ensemble) on that test set in the generated table.
    matches = [r for r in full if r[0] == f"`{run_of[config]}`" and r[1] == test_set and not r[4].startswith("ensemble")]
    assert len(matches) == 1, (config, test_set, matches)
    row = matches[0]
    assert (bleu, chrf) == (row[2].strip("*"), row[3]), (config, test_set)
    assert (steps, minutes) == (row[7], row[8]), (config, test_set)
    assert all(word in row[10] for word in hardware.split()), (hardware, row[10])
    # The config's header states the same score, to one decimal.
    header = " ".join(line.lstrip("# ") for line in (REPO / "configs" / f"{config}.py").read_text().splitlines()
                      if line.startswith("#"))
    expected = re.search(r"Expected: ([\d.]+) sacreBLEU.*? on test_2016_flickr and ([\d.]+) on test_2017_flickr",
                         header).groups()
    stated = float(expected[0 if test_set == "test_2016_flickr" else 1])
    assert abs(stated - float(bleu)) <= 0.05 + 1e-9, (config, test_set, stated, bleu)
  assert {config for config, _ in seen} == set(run_of)


def readme_figures() -> dict[str, dict[str, tuple[str, str]]]:
  """{config: {test set: (BLEU, minutes)}} of the README's results table (checked against
  docs/results.md's generated table above)."""
  figures: dict[str, dict[str, tuple[str, str]]] = {}
  for link, test_set, bleu, _, _, minutes, _ in table_rows(section(README.read_text(encoding="utf-8"), "## Results")):
    config = re.fullmatch(r"\[(\w+)\]\(.*\)", link).group(1)
    figures.setdefault(config, {})[test_set] = (bleu, minutes.removesuffix(" min"))
  return figures


def test_figures_quoted_in_prose_agree_with_the_results_table():
  """The BLEU and minutes the README's prose, the notebook and docs/results.md's Reproduce
  commands quote for a shipped config are those of the results table."""
  import json

  figures = readme_figures()
  readme = README.read_text(encoding="utf-8")
  about = re.search(r"`--config=multi30k` trains a real model, about (\d+) BLEU on\s+test_2016_flickr after about "
                    r"(\d+) minutes", readme).groups()
  bleu, minutes = figures["multi30k"]["test_2016_flickr"]
  assert about == (str(round(float(bleu))), minutes)
  notebook = json.loads((REPO / "notebooks" / "quickstart.ipynb").read_text(encoding="utf-8"))
  prose = " ".join("".join(c["source"]) for c in notebook["cells"] if c["cell_type"] == "markdown")
  quoted = re.findall(r"reaches ([\d.]+) BLEU on test_2016_flickr after \d+ steps \((\d+) minutes\)", prose) + [
      (b, m) for m, b in re.findall(r"full (\d+)-minute run scores ([\d.]+) BLEU on test_2016_flickr", prose)]
  assert quoted and set(quoted) == {(bleu, minutes)}, quoted
  reproduce = section((DOCS / "results.md").read_text(encoding="utf-8"), "## Reproduce")
  stated = re.findall(r"--config=(\w+) --workdir=\S+\s+#[^\n]*?~(\d+) min\)\n", reproduce)
  assert stated and all(figures[config]["test_2016_flickr"][1] == minutes for config, minutes in stated), stated


def test_the_tiny_models_size_and_steps_are_its_configs():
  """The Quick start's figures of the tiny model come from configs/tiny.py; its BLEU bound
  (`mostly wrong (under N BLEU)`) is checked against a run of the Quick start, on the jax
  version CI installs, by .ci/user_path."""
  from seq2seq import configs
  from seq2seq.model import transformer
  from seq2seq.model.config import ModelConfig

  config = configs.get("tiny")
  millions, steps = re.search(r"The tiny model \(([\d.]+)M parameters, (\d+) steps\)", README.read_text()).groups()
  model_cfg = ModelConfig.from_config(config.model, vocab_size=config.data.vocab_size)
  assert (millions, int(steps)) == (f"{transformer.count_params(model_cfg) / 1e6:.1f}", config.train.steps)
  assert re.search(r"mostly wrong \(under (\d+) BLEU\)", README.read_text())  # what .ci/user_path reads


def test_the_readmes_notebook_time_is_the_notebooks_and_the_soak_kills_ten_times():
  """The layout's line on quickstart.ipynb quotes the training time the notebook states (the
  notebook's run, tests/test_notebook.py, is a long test); `pytest -m long`'s soak is the one that
  kills a run ten times (tests/test_faults.py)."""
  notebook = (REPO / "notebooks" / "quickstart.ipynb").read_text(encoding="utf-8")
  (span,) = set(re.findall(r"(\d+ to \d+) minutes on a 2-core CPU", notebook))
  assert f"quickstart.ipynb (trains a translator in {span} minutes)" in README.read_text()
  faults = (REPO / "tests" / "test_faults.py").read_text(encoding="utf-8")
  assert "def test_soak_ten_sigkills_at_seeded_moments" in faults and "size=10, replace=False" in faults
  assert "a 10-kill soak" in README.read_text()


# --- links ------------------------------------------------------------------------------


def slug(heading: str) -> str:
  """GitHub's anchor for a heading."""
  return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def test_relative_links_resolve():
  for page in [README, *sorted(DOCS.glob("*.md"))]:
    text = re.sub(r"^```.*?^```", "", page.read_text(encoding="utf-8"), flags=re.S | re.M)  # not in code
    for target in re.findall(r"\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)", text):
      if re.match(r"[a-z]+://", target):
        continue
      path, _, anchor = target.partition("#")
      file = (page.parent / path).resolve() if path else page
      assert file.exists(), f"{page.name}: {target}"
      if anchor:
        body = re.sub(r"^```.*?^```", "", file.read_text(encoding="utf-8"), flags=re.S | re.M)
        anchors = {slug(h) for h in re.findall(r"^#+ (.*)$", body, flags=re.M)}
        assert anchor in anchors, f"{page.name}: {target}"


# --- the quick start, as commands -------------------------------------------------------


@pytest.mark.long  # CI runs the Quick start after a plain `pip install .` instead (.ci/user_path)
def test_readme_quick_start_commands_run(data_dir, session_cache, tmp_path):
  (block,) = [b for b in code_blocks(README, "bash") if "seq2seq-train" in b]
  workdir, model_dir, cwd = tmp_path / "tiny", tmp_path / "tiny-model", tmp_path / "elsewhere"
  cwd.mkdir()  # not the repository: the commands and --config=NAME work from anywhere
  env = os.environ | {"SEQ2SEQ_DATA_DIR": str(data_dir), "SEQ2SEQ_CACHE": str(session_cache)}
  paths = {"/tmp/tiny": workdir, "/tmp/tiny-model": model_dir, "/tmp/tiny-ct2": tmp_path / "tiny-ct2"}
  lines = [line for line in replace_paths(block, paths).splitlines() if line.strip()]
  assert len(lines) == 7
  for line in lines:
    out = subprocess.run(["bash", "-c", line], cwd=cwd, env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, f"{line}\n{out.stderr[-3000:]}"
    command = shlex.split(line.split("|")[-1].split("#")[0])[0]
    if command == "seq2seq-translate":  # what the library translates (a 200-step model may say nothing)
      from seq2seq import Translator

      assert out.stdout.splitlines() == [Translator.from_workdir(workdir).translate(SOURCE)], out.stdout
    elif command == "seq2seq-eval":
      assert "BLEU = " in out.stdout and "chrF2 = " in out.stdout, out.stdout
  assert (workdir / "checkpoints").is_dir() and (model_dir / "model.safetensors").is_file()
  assert (tmp_path / "tiny-ct2" / "model.bin").is_file()


def test_the_main_jobs_seed_mean_is_the_results_tables():
  """The README's 3-seed test BLEU of the main job, and its 7000-step figure, are computed
  from docs/results.md's generated table (the runs' own eval files)."""
  import statistics

  results_md = (DOCS / "results.md").read_text(encoding="utf-8")
  full = table_rows(results_md.split("<!-- results:start -->", 1)[1].split("<!-- results:end -->", 1)[0])
  bleu = {(r[0].strip("`"), r[1]): float(r[2].strip("*")) for r in full if not r[4].startswith("ensemble")}
  seeds = ("m30k_p64_readme", "m30k_p64_s1", "m30k_p64_s2")
  means = [statistics.mean(bleu[(run, s)] for run in seeds) for s in ("test_2016_flickr", "test_2017_flickr")]
  prose = " ".join(README.read_text(encoding="utf-8").split())
  assert f"averages {means[0]:.2f} / {means[1]:.2f} on the test sets over these 3 seeds" in prose
  longer = [bleu[("m30k_new", s)] for s in ("test_2016_flickr", "test_2017_flickr")]
  (minutes,) = {r[8] for r in full if r[0] == "`m30k_new`"}
  assert (f"`--config.data.pack_length=128 --config.train.steps=7000`) gave {longer[0]:.2f} / {longer[1]:.2f} in "
          f"{minutes}") in prose


def test_the_readmes_former_default_figures_are_its_runs_rows():
  """"on the former default (X / Y)": the test-set BLEU of the former default's run, as
  docs/results.md names it (the retired configs' table) and docs/history.md's generated table
  holds its rows."""
  retired = {row[0]: row[1].strip("`") for row in table_rows(
      section((DOCS / "results.md").read_text(encoding="utf-8"), "Retired configs, each now a set of overrides of today's "
              "`multi30k` (CHANGELOG.md lists"))}
  run = retired["`multi30k` until 2026-11-28"]
  history = (DOCS / "history.md").read_text(encoding="utf-8")
  rows = table_rows(history.split("<!-- results:start -->", 1)[1].split("<!-- results:end -->", 1)[0])
  bleu = {row[1]: row[2].strip("*") for row in rows if row[0] == f"`{run}`"}
  prose = " ".join(README.read_text(encoding="utf-8").split())
  assert f"on the former default ({bleu['test_2016_flickr']} / {bleu['test_2017_flickr']})" in prose


def test_the_readmes_description_of_the_grid_is_its_records():
  """"13 variants x 3 seeds of a 3.9M-parameter model, 720 steps, 4.7 hours on 2 cores" (the grid's
  records and config: training and test-set translation, summed) and "(primary, 22 tests" with
  Swish inconclusive (the family)."""
  import importlib

  from seq2seq.research import family, records, significance

  kept = records.read(DOCS / "runs" / "ablations.jsonl").results
  seeds = {sum(r.variant == v for r in kept) for v in {r.variant for r in kept}}
  (params,) = {r.params for r in kept if r.variant == "vanilla"}
  hours = sum(r.train_seconds + r.eval_seconds for r in kept) / 3600
  assert len(seeds) == 1 and all(r.hardware.startswith("2-core") for r in kept)
  steps = importlib.import_module("configs.multi30k_sweep").get_config().train.steps
  prose = " ".join(README.read_text(encoding="utf-8").split())
  assert (f"{len({r.variant for r in kept})} variants x {seeds.pop()} seeds of a {params / 1e6:.1f}M-parameter model, "
          f"{steps} steps, {hours:.1f} hours on 2 cores") in prose
  found = family.claims(REPO)
  holm = dict(zip((c.comparison for c in found), significance.holm([c.p for c in found])))
  assert f"(primary, {len(found)} tests:" in prose and ", Swish inconclusive;" in prose
  assert not significance.significant(holm["`swish` − `vanilla`"])


def test_the_readmes_description_of_the_main_job_is_its_config():
  """The recipe and its row length as the README describes them are configs/multi30k.py's, and
  the decoder's compiled searches are at most eval.max_programs (the layout's line on programs.py)."""
  from seq2seq import configs

  config = configs.get("multi30k")
  text = " ".join(README.read_text(encoding="utf-8").split())
  m, data = config.model, config.data
  assert (f"The recipe (d_model {m.d_model}, {m.num_encoder_layers}+{m.num_decoder_layers} layers, dropout "
          f"{m.dropout_rate:g}) was chosen on the validation set only") in text
  assert (f"The config trains it for {config.train.steps} steps in packed rows of {data.pack_length} tokens, in the "
          "time of 3600 in rows of 128") in text
  assert f"which compiled searches a call needs (at most {config.eval.max_programs})" in text
