"""Config files: each loads, starts with the command that runs it, the result it should reach
and what it sets, and builds a model."""

import ast
import dataclasses
import importlib
import itertools
import pathlib
import re

import pytest

from conftest import REPO
import report_tables

from seq2seq.model.config import ModelConfig
from seq2seq.model.transformer import count_params

CONFIG_DIR = pathlib.Path(__file__).resolve().parents[1] / "configs"
NAMES = sorted(p.stem for p in CONFIG_DIR.glob("*.py") if p.stem != "__init__")  # every config file


def load(name):
  return importlib.import_module(f"configs.{name}").get_config()


@pytest.mark.parametrize("name", NAMES)
def test_config_has_sections_and_contract_keys(name):
  config = load(name)
  for section in ("model", "data", "train", "mesh", "eval"):
    assert section in config, section
  assert isinstance(config.seed, int)
  for key in ("steps", "checkpoint_every"):
    assert key in config.train
  assert "dir" in config.data
  ModelConfig.from_config(config.model, vocab_size=config.data.vocab_size)  # every key is a model setting


@pytest.mark.parametrize("name", NAMES)
def test_config_file_starts_with_its_command_and_expected_result(name):
  lines = (CONFIG_DIR / f"{name}.py").read_text().splitlines()
  assert lines[0].startswith("# ")
  assert any(f"python train.py --config=configs/{name}.py --workdir=" in line for line in lines[:4])
  assert any(line.startswith("# Expected") for line in lines[:5])


@pytest.mark.parametrize("name", NAMES)
def test_config_opens_with_its_command_its_result_and_what_it_sets(name):
  """The form of every shipped config (configs/__init__.py): a comment of at most 8 lines with
  a command that names the file itself and one `# Expected: ` line (the measured result, or
  what it is for where none exists), then the docstring: what the config sets, starting from
  the config it imports. Run history belongs in docs/results.md and docs/history.md, so no docstring
  names a run."""
  text = (CONFIG_DIR / f"{name}.py").read_text()
  header = list(itertools.takewhile(lambda line: line.startswith("#"), text.splitlines()))
  assert 3 <= len(header) <= 8, f"configs/{name}.py: a header of 3 to 8 comment lines, not {len(header)}"
  assert any(re.search(rf"(python train\.py|python -m seq2seq\.[\w.]+) .*--config=configs/{name}\.py ", line)
             for line in header[1:]), f"configs/{name}.py: no command that runs configs/{name}.py"
  assert sum(line.startswith("# Expected: ") for line in header) == 1, f"configs/{name}.py: one '# Expected: ' line"
  tree = ast.parse(text)
  docstring = ast.get_docstring(tree)
  assert docstring and tree.body[0].lineno == len(header) + 1, f"configs/{name}.py: the docstring follows the header"
  base = [node.names[0].name for node in tree.body if isinstance(node, ast.ImportFrom)
          and node.module == "seq2seq.configs"]
  assert not base or docstring.startswith(f"{base[0]}.py "), f"configs/{name}.py: say what it sets on {base}"
  results = "".join((CONFIG_DIR.parent / "docs" / page).read_text(encoding="utf-8") for page in ("results.md", "history.md"))
  from seq2seq.research import variants

  # The runs' names, not the configs' nor the sweep variants' (history.md keeps the grid's old table).
  runs = set(re.findall(r"^\| `(\w+)` \|", results, re.M)) - set(NAMES) - set(variants.VARIANTS)
  assert runs and not {run for run in runs if f"`{run}`" in docstring or f" {run} " in docstring}, name


def test_default_model_section_mirrors_model_config():
  defaults = {f.name: f.default for f in dataclasses.fields(ModelConfig) if f.name != "vocab_size"}
  assert dict(load("default").model) == defaults


def test_wmt14_configs_are_vaswani_base_and_big():
  base, big = load("wmt14_base"), load("wmt14_big")
  assert (base.model.d_model, base.model.num_heads, base.model.num_encoder_layers, base.model.d_ff,
          base.model.dropout_rate) == (512, 8, 6, 2048, 0.1)
  assert (big.model.d_model, big.model.num_heads, big.model.num_decoder_layers, big.model.d_ff,
          big.model.dropout_rate) == (1024, 16, 6, 4096, 0.3)
  base_cfg = ModelConfig.from_config(base.model, vocab_size=base.data.vocab_size)
  assert abs(count_params(base_cfg) / 65e6 - 1) < 0.05


# Settings added after the main job's records were written, with the default that every one of
# those runs trained with (the code before the setting computed just that).
ADDED_SINCE_THE_RECORDS = {("model", "logits_dtype"): "float32", ("model", "norm_impl"): "auto", ("train", "loss_chunk"): 0,
                           ("train", "grad_norm"): True, ("train", "loss_impl"): "auto"}


def multi30k_settings() -> dict:
  """configs/multi30k.py as a run record holds its settings: JSON types, less the data paths
  and the settings added since the records (which must be at their defaults)."""
  import json

  today = json.loads(json.dumps(load("multi30k").to_dict()))
  for key in ("dir", "cache_dir"):
    today["data"].pop(key, None)
  for (section, key), default in ADDED_SINCE_THE_RECORDS.items():
    assert today[section].pop(key) == default, f"configs/multi30k.py sets {section}.{key}"
  return today


def test_multi30k_is_the_recipe_the_search_confirmed():
  """configs/multi30k.py is, setting for setting, what the confirmatory seeds of the main-job
  recipe search trained (docs/runs/main_job_search.jsonl, docs/results.md#choosing-the-main-job-recipe),
  but for the beam's alpha, chosen afterwards on validation (1.5; the search decoded with 1.2),
  the output limit (source + 18, the longest training target under the pinned sentencepiece
  0.2.2; the search decoded with + 17, set under 0.2.3), the row length (64 tokens instead of
  128: the same numbers per sentence, a faster step on the CPU) and the schedule's length: 4200
  steps instead of 7000 (validation every 1050, a checkpoint every 525, 8 kept), to train in the
  time of 3600 steps in rows of 128, within 40 minutes on the 2-core Intel Xeon."""

  from seq2seq.research import recipe_search

  today = multi30k_settings()
  chosen = [r for r in recipe_search.load(REPO / "docs" / "runs" / "main_job_search.jsonl")
            if r.run.startswith(recipe_search.CHOSEN)]
  assert len(chosen) == 3
  assert (today["eval"]["alpha"], today["eval"]["max_len_b"]) == (1.5, 18)
  for record in chosen:
    assert (record.settings["eval"]["alpha"], record.settings["eval"]["max_len_b"]) == (1.2, 17)
    assert record.settings["train"]["steps"] == 7000
    assert record.settings["data"]["pack_length"] == 128
    short = {"steps": 4200, "eval_every": 1050, "checkpoint_every": 525, "keep_checkpoints": 8}
    decoding = record.settings["eval"] | {"alpha": 1.5, "max_len_b": 18}
    settings = record.settings | {"seed": today["seed"], "eval": decoding, "data": record.settings["data"] | {
        "pack_length": 64}, "train": record.settings["train"] | short}
    assert settings == today, record.run


def test_multi30k_is_what_its_reported_seeds_trained():
  """The main job's reported runs (seed 0, the README's row, and seeds 1 and 2: the records
  named recipe_search.ROWS64) trained configs/multi30k.py as it is, setting for setting, with
  no override but the seed."""

  from seq2seq.research import recipe_search

  today = multi30k_settings()
  runs = [r for r in recipe_search.load(REPO / "docs" / "runs" / "main_job_search.jsonl")
          if r.run.startswith(recipe_search.ROWS64)]
  assert sorted(r.seed for r in runs) == [0, 1, 2]
  for record in runs:
    assert record.overrides == [] and record.reached == record.steps == 4200, record.run
    assert record.settings | {"seed": today["seed"]} == today, record.run


def test_multi30k_row_length_figures_are_the_cpu_profiles():
  """The row length's reasons in configs/multi30k.py are benchmarks/results/profile_cpu2_multi30k.json
  (the train step profiled on the 2-core CPU in rows of 128 and of 64, one run after the other):
  attention's share of the step in each, the step ratio, and that 4200 steps in rows of 64 cost
  no more than 3600 in rows of 128 at that ratio."""
  import json

  profile = json.loads((REPO / "benchmarks" / "results" / "profile_cpu2_multi30k.json").read_text())
  rows = profile["rows"]
  assert (rows["128"]["shape"], rows["64"]["shape"]) == ([16, 128, 128], [32, 64, 64])  # 2048 tokens a batch each
  speedup = rows["128"]["step_ms_untraced"] / rows["64"]["step_ms_untraced"]
  assert f"{speedup:.3f}" == f"{profile['step_speedup_64_over_128']:.3f}"
  text = " ".join(line.strip().lstrip("#").strip() for line in (CONFIG_DIR / "multi30k.py").read_text().splitlines())
  assert (f"attention took {rows['128']['attention_share']:.0%} of the step in rows of 128 and "
          f"{rows['64']['attention_share']:.0%} in rows of 64") in text
  assert f"the step runs {speedup:.2f}x as fast" in text
  config = load("multi30k")
  assert (config.data.pack_length, config.train.steps) == (64, 4200)
  cost = config.train.steps / speedup / 3600
  assert cost <= 1 and f"makes them {cost:.2f}x its time" in text
  # The README and docs/results.md quote the same profile.
  words = lambda name: " ".join((REPO / name).read_text(encoding="utf-8").split())
  assert f"(its CPU step is {speedup:.2f}x as fast:" in words("README.md")
  assert (f"attention and its elementwise work take {rows['128']['attention_share']:.0%} of the step in rows of 128 and "
          f"{rows['64']['attention_share']:.0%} in rows of 64, and the step takes {rows['128']['step_ms_untraced']:.0f} "
          f"against {rows['64']['step_ms_untraced']:.0f} ms ({speedup:.2f}x)") in words("docs/results.md")
  # Its time paragraph: the ratio, and each run's train time and machine as the results table gives them.
  from seq2seq.research import recipe_search

  (former,) = [r for r in recipe_search.load(REPO / "docs" / "runs" / "main_job_search.jsonl")
               if r.run == "m30k_3600_readme"]
  assert (former.settings["data"]["pack_length"], former.steps, former.overrides) == (128, 3600, [])
  table = {run: rows[0] for run, rows in report_tables.results_table().items()}
  when = lambda run: f"{table[run][8]} (`{run}`)"
  machine = lambda run: table[run][10]
  assert machine("m30k_p64_readme") == machine("m30k_fresh") == "2-core Intel(R) Xeon(R) Processor"
  assert machine("m30k_3600_readme") == "2-core AMD EPYC" and table["m30k_3600_readme"][7] == "3600"
  assert (f"**Time.** {config.train.steps} steps are {config.train.steps / 3600:.2f}x 3600, and the step in rows of 64 runs {speedup:.2f}x as fast, "
          f"so at that ratio the job takes {cost:.2f}x the former one's time. Its runs trained for "
          f"{when('m30k_p64_readme')} and {when('m30k_fresh')} on the 2-core Xeon (the table's time column); the former "
          f"main job's README run took {when('m30k_3600_readme')} on the 2-core AMD EPYC, another machine") in words(
              "docs/results.md")


def test_the_sweep_config_is_what_its_reports_were_made_with():
  """Every sweep report (docs/ablations*.md, docs/positions.md through multi30k_positions)
  was trained and decoded with these settings (tests/fixtures/multi30k_sweep_settings.json,
  taken from the config as it was before the main job's recipe changed). multi30k_sweep
  starts from multi30k, so a new main-job recipe must not leak into it: it once did, the beam's
  alpha (1.2 -> 1.5). Settings added since keep the old behaviour by default, so only the
  snapshot's keys are compared; changing one is a deliberate act that reruns the reports."""
  import json

  snapshot = json.loads((REPO / "tests" / "fixtures" / "multi30k_sweep_settings.json").read_text())
  today = json.loads(json.dumps(load("multi30k_sweep").to_dict()))
  def settings(config: dict) -> dict:  # (section, key) -> value; (key, None) for a top-level value
    return {(name, key): value for name, section in config.items()
            for key, value in (section.items() if isinstance(section, dict) else [(None, section)])}

  now = settings(today)
  differ = [f"{name}{'.' + key if key else ''}: {value!r} in the snapshot, {now.get((name, key))!r} now"
            for (name, key), value in settings(snapshot).items() if now.get((name, key)) != value]
  assert not differ, "\n".join(differ)
