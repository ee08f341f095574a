"""Issue 47: what a user meets in the first hour: the install's name and version, the
command-line conventions (--help, -h, --version, --config NAME), file modes that follow the
umask, paths in config.json that mean the same from any directory, and header lines that
tell the truth."""

import importlib.metadata
import json
import os
import pathlib
import re
import stat
import subprocess
import sys
import tomllib

import pytest

import seq2seq
from seq2seq import cli, configs, files
from seq2seq.training import optimizer, preflight, report

REPO = pathlib.Path(__file__).resolve().parents[1]
COMMANDS = ["seq2seq.commands.train", "seq2seq.commands.eval", "seq2seq.commands.translate", "seq2seq.export",
            "seq2seq.data", "seq2seq.research.sweep"]


def python_m(module: str, *args, cwd=None, env=None, umask=None):
  return subprocess.run([sys.executable, "-m", module, *args], capture_output=True, text=True, timeout=600, cwd=cwd,
                        env={**os.environ, **(env or {})}, preexec_fn=(lambda: os.umask(umask)) if umask else None)


def test_one_version_and_the_distribution_name():
  project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
  assert project["name"] == seq2seq.DISTRIBUTION == "seq2seq-jax" and project["dynamic"] == ["version"]
  assert importlib.metadata.version(seq2seq.DISTRIBUTION) == seq2seq.__version__  # the installed metadata agrees
  assert project["license"] == "Apache-2.0" and "Typing :: Typed" in project["classifiers"]
  assert {"cuda12", "cuda13", "tpu", "dev", "notebook"} <= set(project["optional-dependencies"])
  # The notebook opens after one install line the README gives (it needed tools no extra had).
  notebook = " ".join(project["optional-dependencies"]["notebook"])
  assert "jupyterlab" in notebook and "ipykernel" in notebook
  assert 'pip install ".[notebook]"                # the notebook: jupyter lab notebooks/quickstart.ipynb' in \
      (REPO / "README.md").read_text()
  assert f"## {seq2seq.__version__}" in (REPO / "CHANGELOG.md").read_text()
  assert re.search(rf"^version: {re.escape(seq2seq.__version__)}$", (REPO / "CITATION.cff").read_text(), re.M)
  assert (REPO / "seq2seq" / "py.typed").is_file()


@pytest.mark.parametrize("module", [m if m != "seq2seq.research.sweep" else pytest.param(m, marks=pytest.mark.long)
                                    for m in COMMANDS])  # the sweep's --help is also checked fast, by test_layout
def test_help_and_h_print_usage_and_exit_0_and_version_prints_it(module):
  for flag in ("--help", "-h") if module == COMMANDS[0] else ("--help",):  # -h is --help (cli.HELP_FLAGS): once
    out = python_m(module, flag)
    assert out.returncode == 0 and out.stderr == "", (flag, out.stderr[-2000:])
    assert "--log_level" in out.stdout and "--version" in out.stdout
  if module in ("seq2seq.commands.train", "seq2seq.data", "seq2seq.research.sweep"):  # the commands that take --config
    assert "--config.KEY=VALUE" in out.stdout and "tiny, " in out.stdout
  version = python_m(module, "--version")  # named as typed (it was `export.py 0.2.0`)
  assert version.returncode == 0 and version.stdout == \
      f"python -m {module} {seq2seq.__version__} (seq2seq-jax, installed {seq2seq.__version__})\n"


@pytest.mark.parametrize("command", [["-m", "seq2seq.commands.train"], ["-m", "seq2seq.commands.eval"],
                                     ["-m", "seq2seq.commands.translate"], ["-m", "seq2seq.export"],
                                     ["-m", "seq2seq.average"], ["-m", "seq2seq.research.sweep"],
                                     ["-m", "seq2seq.research.positions"], ["train.py"], ["eval.py"]])
def test_version_and_help_answer_before_jax_is_imported(command):
  """--version and --help took 4 to 5.5 s: each command imported JAX first."""
  for flag in ("--version", "--help"):
    out = subprocess.run([sys.executable, "-X", "importtime", *command, flag], capture_output=True, text=True,
                         cwd=REPO, timeout=60)
    assert out.returncode == 0, out.stderr[-2000:]
    assert (out.stdout.split()[-4] == seq2seq.__version__) if flag == "--version" else ("--log_level" in out.stdout)
    imported = {line.rsplit("|", 1)[-1].strip() for line in out.stderr.splitlines() if line.startswith("import time:")}
    heavy = {"jax", "flax", "orbax"} | ({"numpy"} if flag == "--version" else set())  # export's --help: numpy (ct2)
    assert "seq2seq.errors" in imported and not heavy & imported, flag


def test_config_name_with_a_space_or_equals_and_an_unknown_one_lists_the_shipped(capsys):
  path = str(configs.DIRECTORY / "tiny.py")
  assert cli.resolve_config(["prog", "--config", "tiny", "--config.train.steps=3"]) == [
      "prog", f"--config={path}", "--config.train.steps=3"]
  assert cli.resolve_config(["prog", "--config=tiny"]) == ["prog", f"--config={path}"]
  with pytest.raises(SystemExit) as stop:
    cli.resolve_config(["prog", "--config=tinyy"])
  err = capsys.readouterr().err
  assert stop.value.code == 2 and err.startswith("error: --config=tinyy: ") and "did you mean tiny?" in err
  assert err.rstrip().endswith("shipped configs: " + ", ".join(configs.names()))


def test_written_files_follow_the_umask_and_not_the_temporary_files_private_mode(tmp_path):
  old = os.umask(0o022)
  try:
    files.write_atomic(tmp_path / "a" / "x.json", "{}")
    with files.staging_dir(tmp_path, "export") as folder:
      files.write_atomic(folder / "y", b"1")
      assert stat.S_IMODE(folder.stat().st_mode) == 0o755
    os.umask(0o027)
    files.write_atomic(tmp_path / "z", "2")
  finally:
    os.umask(old)
  assert stat.S_IMODE((tmp_path / "a" / "x.json").stat().st_mode) == 0o644
  assert stat.S_IMODE((tmp_path / "a").stat().st_mode) == 0o755
  assert stat.S_IMODE((tmp_path / "z").stat().st_mode) == 0o640


def test_config_paths_are_stored_absolute(tmp_path, monkeypatch):
  monkeypatch.chdir(tmp_path)
  config = configs.get("tiny")
  config.data.update(dir="../data", cache_dir="~/cache", spm_model="models/spm.model")
  preflight.absolute_paths(config)
  assert config.data.dir == str(tmp_path.parent / "data")
  assert config.data.cache_dir == os.path.expanduser("~/cache") and config.data.spm_model == str(
      tmp_path / "models" / "spm.model")


def test_the_header_shows_the_real_peak_rate_and_the_training_split_and_warns_of_an_unused_gpu(tmp_path):
  config = configs.get("tiny")
  config.data.train_split = "files:/data/big.{lang}"
  _, schedule = optimizer.make(config.train, d_model=64)
  peak = report.peak_learning_rate(schedule, config.train.warmup_steps, config.train.steps)
  assert peak == pytest.approx(config.train.learning_rate * 64**-0.5 * config.train.warmup_steps**-0.5, rel=1e-6)

  class Mesh:
    shape = {"data": 1}

  from seq2seq.model.config import ModelConfig

  text = report.summary(config, ModelConfig.from_config(config.model, vocab_size=1000), Mesh(), "/w", peak_lr=peak)
  assert f"peak lr {peak:.3g}," in text and "data: files:/data/big.{lang} en->de" in text
  config.data.train_split = "train"
  assert "data: multi30k:train en->de" in report.summary(config, ModelConfig.from_config(
      config.model, vocab_size=1000), Mesh(), "/w")
  probe = tmp_path / "nvidia"
  assert report.unused_gpu("cpu", probes=(str(probe),)) is None  # no driver: nothing to say
  probe.write_text("NVRM version: 580")
  assert "pip install \".[cuda12]\"" in report.unused_gpu("cpu", probes=(str(probe),))
  assert report.unused_gpu("gpu", probes=(str(probe),)) is None


@pytest.mark.long  # a training and its commands (CI's user path runs the Quick start from elsewhere)
def test_a_run_eval_export_and_translation_from_elsewhere_with_a_relative_data_dir_and_umask_022(data_dir, tmp_path):
  """Train with SEQ2SEQ_DATA_DIR relative to the working directory, then evaluate, export
  and translate from another directory: config.json holds the absolute data folder, and
  every file and folder written is 0644 / 0755 under umask 022."""
  home = tmp_path / "home"
  home.mkdir()
  (home / "corpus").symlink_to(data_dir)
  env = {"SEQ2SEQ_DATA_DIR": "corpus", "SEQ2SEQ_CACHE": str(tmp_path / "cache")}
  run = tmp_path / "run"
  out = python_m("seq2seq.commands.train", "--config", "tiny", f"--workdir={run}", "--config.train.steps=4",
                 "--config.train.eval_every=0", "--config.train.checkpoint_every=4", cwd=home, env=env, umask=0o022)
  assert out.returncode == 0, out.stderr[-3000:]
  assert json.loads((run / "config.json").read_text())["data"]["dir"] == str(home / "corpus")
  elsewhere = tmp_path / "elsewhere"
  elsewhere.mkdir()
  no_env = {"SEQ2SEQ_DATA_DIR": "", "SEQ2SEQ_CACHE": str(tmp_path / "cache")}
  evaluated = python_m("seq2seq.commands.eval", f"--workdir={run}", "--beam_size=1", "--quiet", cwd=elsewhere,
                       env=no_env, umask=0o022)
  assert evaluated.returncode == 0, evaluated.stderr[-3000:]
  exported = python_m("seq2seq.export", f"--workdir={run}", f"--out={tmp_path / 'model'}", cwd=elsewhere, env=no_env,
                      umask=0o022)
  assert exported.returncode == 0, exported.stderr[-3000:]
  (elsewhere / "in.en").write_text("A man rides a bike.\n")
  translated = python_m("seq2seq.commands.translate", f"--model={tmp_path / 'model'}", "--input=in.en",
                        "--output=out.de", "--quiet", cwd=elsewhere, env=no_env, umask=0o022)
  assert translated.returncode == 0, translated.stderr[-3000:]
  for root in (run, tmp_path / "model", elsewhere / "out.de"):
    paths = [root, *root.rglob("*")] if root.is_dir() else [root]
    for path in paths:
      if path.name.endswith(".owner"):  # a staging folder's lock, gone once the folder is in place
        continue
      mode = stat.S_IMODE(path.stat().st_mode)
      assert mode == (0o755 if path.is_dir() else 0o644), (str(path), oct(mode))


@pytest.mark.long
def test_a_wheel_built_with_pip_installs_under_its_name_with_its_configs_and_types(tmp_path):
  out = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", str(REPO),
                        "-w", str(tmp_path)], capture_output=True, text=True, timeout=600)
  assert out.returncode == 0, out.stderr[-3000:]
  (wheel,) = tmp_path.glob("seq2seq_jax-*.whl")
  import zipfile

  names = zipfile.ZipFile(wheel).namelist()
  assert "seq2seq/py.typed" in names and "seq2seq/configs/tiny.py" in names
  metadata = zipfile.ZipFile(wheel).read(next(n for n in names if n.endswith("METADATA"))).decode()
  assert "Name: seq2seq-jax" in metadata and f"Version: {seq2seq.__version__}" in metadata
  assert "License-Expression: Apache-2.0" in metadata and "Provides-Extra: cuda12" in metadata


def test_a_finished_run_says_so_and_how_to_go_on(tiny_run, tmp_path, capsys):
  import shutil

  from seq2seq.inference import load
  from seq2seq.training.train import train_and_evaluate

  run = shutil.copytree(tiny_run, tmp_path / "run")
  train_and_evaluate(load.run_config(run), str(run))
  out = capsys.readouterr().out
  assert "this run is finished: it trained 60 of config.train.steps=60 steps" in out
  assert "--config.train.steps=N (N > 60)" in out


def test_hints_name_the_command_the_user_ran(monkeypatch):
  from seq2seq import errors

  monkeypatch.setattr(sys, "argv", ["/venv/bin/seq2seq-eval", "--workdir=x"])
  assert errors.command("train") == "seq2seq-train"
  monkeypatch.setattr(sys, "argv", ["eval.py", "--workdir=x"])
  assert errors.command("eval") == "python eval.py"
  # `python -m seq2seq.export` (argv[0] is the module's file): the console command, as translate's hint says.
  monkeypatch.setattr(sys, "argv", [str(REPO / "seq2seq" / "export.py"), "--workdir=x"])
  assert errors.command("train") == "seq2seq-train"
  monkeypatch.setattr(sys, "argv", [str(REPO / "seq2seq" / "commands" / "train.py"), "--workdir=x"])
  assert errors.command("train") == "seq2seq-train"
