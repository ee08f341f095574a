"""The console commands (seq2seq-train, seq2seq-eval, seq2seq-translate) and what every
command shares: configs by name from any directory, quiet logs unless asked, --help."""

import json
import os
import pathlib
import re
import shutil
import subprocess
import sys

import pytest
from conftest import REPO

from seq2seq import Translator, configs, export

BIN = pathlib.Path(sys.executable).parent
ABSL_LINE = re.compile(r"^[IWEF]\d{4} ")  # absl's log format: I1124 18:37:02.123 ...


def command(name: str) -> list[str]:
  """The installed console script, else the module it runs (same code)."""
  script = BIN / name if (BIN / name).is_file() else shutil.which(name)
  return [str(script)] if script else [sys.executable, "-m", f"seq2seq.commands.{name.split('-')[1]}"]


def run(args, cwd, stdin=None, env=None):
  return subprocess.run(args, cwd=cwd, capture_output=True, text=True, input=stdin, timeout=600,
                        env={**os.environ, **(env or {})})


def test_translate_reads_stdin_and_writes_one_line_per_line(tiny_run, tmp_path):
  lines = ["A man is riding a bike.", "", "Two dogs play in the snow.", "Hello."]
  out = run(command("seq2seq-translate") + [f"--workdir={tiny_run}", "--beam_size=2"], tmp_path,
            stdin="".join(line + "\n" for line in lines))
  assert out.returncode == 0, out.stderr
  assert out.stdout.split("\n")[:-1] == Translator.from_workdir(tiny_run, beam_size=2).translate(lines)
  assert not [line for line in out.stderr.splitlines() if ABSL_LINE.match(line)]
  assert out.stderr.splitlines() == ["compiling 1 search program"]  # piped: progress lines, none after 10 s


@pytest.mark.long
def test_translate_writes_the_n_best_with_line_numbers_and_scores(tiny_run, tmp_path):
  lines = ["A man is riding a bike.", "Two dogs play in the snow."]
  out = run(command("seq2seq-translate") + [f"--workdir={tiny_run}", "--beam_size=3", "--nbest=3"], tmp_path,
            stdin="".join(line + "\n" for line in lines))
  assert out.returncode == 0, out.stderr
  rows = [line.split("\t") for line in out.stdout.splitlines()]
  hyps, scores = Translator.from_workdir(tiny_run, beam_size=3).translate(lines, return_scores=True, nbest=3)
  assert rows == [[str(n), f"{s:.4f}", h] for n, (best, best_scores) in enumerate(zip(hyps, scores), 1)
                  for h, s in zip(best, best_scores)]
  assert [h[0] for h in hyps] == Translator.from_workdir(tiny_run, beam_size=3).translate(lines)


@pytest.mark.long
def test_translate_an_exported_model_with_scores(tiny_run, tmp_path):
  model_dir = export.export(tiny_run, tmp_path / "model")
  lines = ["A man is riding a bike.", "Two dogs play in the snow."]
  stdin = "".join(line + "\n" for line in lines)
  by_model = run(command("seq2seq-translate") + [f"--model={model_dir}", "--scores"], tmp_path, stdin=stdin)
  assert by_model.returncode == 0, by_model.stderr
  hyps, scores = Translator.from_workdir(tiny_run).translate(lines, return_scores=True)
  assert by_model.stdout == "".join(f"{s:.4f}\t{h}\n" for h, s in zip(hyps, scores))
  both = run(command("seq2seq-translate") + [f"--model={model_dir}", f"--workdir={tiny_run}"], tmp_path, stdin=stdin)
  assert both.returncode == 2 and both.stderr.startswith("error: give one of --workdir")


def test_configs_by_name_and_by_path_from_any_directory(data_dir, session_cache, tmp_path, monkeypatch):
  """--config=NAME, --config=configs/NAME.py and a full path all load the shipped config
  outside the repository; a wrong name is an error listing the shipped ones."""
  env = {"SEQ2SEQ_DATA_DIR": str(data_dir)}
  outputs = []
  for config in ("tiny", "configs/tiny.py", str(REPO / "configs" / "tiny.py")):
    out = run([sys.executable, "-m", "seq2seq.data", f"--config={config}", "--json",
               f"--config.data.cache_dir={session_cache}"], tmp_path, env=env)
    assert out.returncode == 0, out.stderr
    outputs.append(out.stdout)
  assert outputs[0] == outputs[1] == outputs[2] and '"batches"' in outputs[0]
  wrong = run([sys.executable, "-m", "seq2seq.data", "--config=tiny_typo"], tmp_path, env=env)
  assert wrong.returncode == 2 and "tiny_typo" in wrong.stderr and not wrong.stdout
  monkeypatch.chdir(tmp_path)
  assert configs.resolve("multi30k") == str(configs.DIRECTORY / "multi30k.py")
  assert configs.resolve("configs/multi30k.py:arg") == f"{configs.DIRECTORY / 'multi30k.py'}:arg"


def test_help_lists_the_commands_flags_and_the_log_switches(tmp_path):
  out = run(command("seq2seq-eval") + ["--help"], tmp_path)  # usage on stdout, exit status 0
  assert out.returncode == 0, out.stderr
  for flag in ("--workdir", "--beam_size", "--ensemble", "--log_level", "--verbosity", "--coordinator_address"):
    assert flag in out.stdout, flag


@pytest.mark.long
def test_a_run_prints_only_its_own_lines_unless_asked(data_dir, session_cache, tmp_path):
  """By default: the summary, one line per log step, evaluations, checkpoints (off a terminal).
  With --log_level=INFO the libraries' INFO lines appear too."""
  workdir = tmp_path / "run"
  args = command("seq2seq-train") + ["--config=tiny", f"--workdir={workdir}", f"--config.data.cache_dir={session_cache}",
                                     "--config.train.log_every=10", "--config.train.eval_every=20",
                                     "--config.train.checkpoint_every=20"]
  env = {"SEQ2SEQ_DATA_DIR": str(data_dir)}
  quiet = run(args + ["--config.train.steps=20"], tmp_path, env=env)
  assert quiet.returncode == 0, quiet.stderr
  lines = (quiet.stdout + quiet.stderr).splitlines()
  own = re.compile(r"^(model|data|training|devices): |^step (10|20): (loss |val_loss=|checkpoint saving to )|"
                   r"^compiling the train step: |^warning: config\.train\.warmup_steps=50 is more than config\.train\.steps=20: "
                   r"|^preparing the data: ")
  assert [line for line in lines if not own.match(line)] == []
  assert lines[0].startswith("preparing the data: ")  # before the minutes a first run spends on its vocabulary
  assert [line.split(":")[0] for line in lines[1:5]] == ["model", "data", "training", "devices"]
  assert sum(line.startswith("step 20: ") for line in lines) == 3  # log, evaluation, checkpoint
  verbose = run(args + ["--config.train.steps=30", "--log_level=INFO"], tmp_path, env=env)  # resumes
  assert verbose.returncode == 0, verbose.stderr
  assert [line for line in verbose.stderr.splitlines() if ABSL_LINE.match(line)]
  assert f"resumed from {workdir / 'checkpoints' / '20'}" in verbose.stdout
  assert (workdir / "commands.txt").read_text().splitlines()[0].startswith(
      "seq2seq-train --config=tiny" if command("seq2seq-train")[0].endswith("seq2seq-train") else "python ")


@pytest.mark.long  # CI runs the same path for real: .ci/user_path (a plain `pip install .`, commands in the clone)
def test_a_non_editable_install_runs_from_any_directory_the_clone_included(data_dir, session_cache, tmp_path):
  """`pip install .` (not editable) ships the configs: a shipped config by name, and the
  console commands, work from a directory with no checkout in it, and the `python -m` commands
  and train.py/eval.py from inside the clone, whose seq2seq/ (configs included) is the one
  Python finds there (it lacked seq2seq.configs: an ImportError)."""
  source = tmp_path / "source"  # a clone: what git checks out
  source.mkdir()
  for name in ("pyproject.toml", "README.md", "LICENSE", "train.py", "eval.py"):
    shutil.copy(REPO / name, source / name)
  shutil.copytree(REPO / "seq2seq", source / "seq2seq", ignore=shutil.ignore_patterns("__pycache__"))
  os.symlink(os.readlink(REPO / "configs"), source / "configs")
  target = tmp_path / "installed"
  pip = run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--target", str(target), str(source)],
            tmp_path)
  assert pip.returncode == 0, pip.stderr
  elsewhere = tmp_path / "elsewhere"
  elsewhere.mkdir()
  env = {"PYTHONPATH": str(target), "SEQ2SEQ_DATA_DIR": str(data_dir)}
  where = run([sys.executable, "-c", "import seq2seq, seq2seq.configs as c; print(seq2seq.__file__); "
               "print(c.__file__); print(' '.join(c.names()))"], elsewhere, env=env)
  assert where.returncode == 0, where.stderr
  package, shipped, names = where.stdout.splitlines()
  assert package.startswith(str(target)) and shipped == str(target / "seq2seq" / "configs" / "__init__.py")
  assert {"tiny", "multi30k", "wmt14_base", "wmt14_big"} <= set(names.split())
  for cwd in (elsewhere, source):
    stats = run([sys.executable, "-m", "seq2seq.data", "--config=tiny", "--json",
                 f"--config.data.cache_dir={session_cache}"], cwd, env=env)
    assert stats.returncode == 0, (cwd, stats.stderr)
    assert json.loads(stats.stdout)["pairs"] > 0, stats.stdout[:300]
  for script in ("seq2seq-train", "seq2seq-eval", "seq2seq-translate"):
    helped = run([sys.executable, str(target / "bin" / script), "--help"], elsewhere, env=env)
    assert "--log_level" in helped.stdout and "--workdir" in helped.stdout, (script, helped.stderr)
  for command in (["train.py"], ["eval.py"], ["-m", "seq2seq.export"], ["-m", "seq2seq.average"]):
    helped = run([sys.executable, *command, "--help"], source, env=env)  # inside the clone
    assert helped.returncode == 0 and "--workdir" in helped.stdout, (command, helped.stderr)


def test_the_license_file_is_the_one_pyproject_names():
  import tomllib

  license_text = (REPO / "LICENSE").read_text()
  assert license_text.lstrip().startswith("Apache License") and "Version 2.0, January 2004" in license_text
  project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
  assert project["license"] == "Apache-2.0" and project["license-files"] == ["LICENSE"]  # SPDX
  assert project["scripts"] == {"seq2seq-train": "seq2seq.commands.train:run", "seq2seq-eval": "seq2seq.commands.eval:run",
                                "seq2seq-translate": "seq2seq.commands.translate:run"}


def test_pyproject_admits_the_tested_jax_and_flax_and_not_the_pair_that_fails():
  """flax 0.12.8 fails at import with jax 0.11 and newer, which install on Python 3.12 and newer
  only: there the declared range starts at flax 0.12.10. The versions CI tests are admitted."""
  import tomllib

  from packaging.requirements import Requirement

  requirements = [Requirement(r) for r in tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]]

  def admitted(name: str, version: str, python: str) -> bool:
    return any(r.name == name and (r.marker is None or r.marker.evaluate({"python_version": python}))
               and r.specifier.contains(version) for r in requirements)

  assert admitted("jax", "0.10.2", "3.11") and admitted("flax", "0.12.8", "3.11")
  assert admitted("jax", "0.12.0.1", "3.12") and admitted("flax", "0.12.12", "3.12")
  assert admitted("jax", "0.11.2", "3.12") and admitted("flax", "0.12.10", "3.13")
  assert not admitted("flax", "0.12.8", "3.12") and not admitted("flax", "0.12.9", "3.13")
  assert not admitted("jax", "0.13.0", "3.12") and not admitted("flax", "0.13.0", "3.12")  # untested


@pytest.mark.long
def test_a_second_run_loads_its_compiled_programs_from_the_cache(tiny_run, tmp_path):
  """--compilation_cache keeps compiled programs between runs: the second translation loads
  the search program instead of compiling it; an empty value turns the cache off."""
  cache = tmp_path / "xla"
  env = {k: v for k, v in os.environ.items() if k != "JAX_COMPILATION_CACHE_DIR"}
  hit = "Persistent compilation cache hit for 'jit__search_fn'"
  outs = []
  for flag in (f"--compilation_cache={cache}", f"--compilation_cache={cache}", "--compilation_cache="):
    out = subprocess.run(command("seq2seq-translate") + [f"--workdir={tiny_run}", flag, "--log_level=DEBUG"],
                         cwd=tmp_path, capture_output=True, text=True, input="A man is riding a bike.\n", timeout=600,
                         env=env)
    assert out.returncode == 0, out.stderr[-2000:]
    outs.append(out)
    if len(outs) == 1:
      entries = sorted(p.name for p in cache.iterdir())
      assert any("_search_fn" in name for name in entries), entries
  assert hit not in outs[0].stderr and hit in outs[1].stderr and hit not in outs[2].stderr
  assert outs[0].stdout == outs[1].stdout == outs[2].stdout
  # Nothing compiled again: the second run adds no search program. (A small program near
  # compilation.MIN_COMPILE_SECONDS may be kept by one run and not by another: that is timing.)
  added = {p.name for p in cache.iterdir()} - set(entries)
  assert set(entries) <= {p.name for p in cache.iterdir()} and not [n for n in added if "_search_fn" in n], added
