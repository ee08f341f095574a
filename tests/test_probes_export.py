"""Probes of `python -m seq2seq.export --out=...` as a user pokes it (issue 59): --overwrite
never deletes what an export did not write, an --out that cannot be replaced is one `error:`
line naming it (decided before the checkpoint loads), and a kill -9 at any point of an export
leaves the earlier export or the new one whole.

Cases that only exercise the --out checks call `export.export` in-process (a ConfigError); a
few go through the command. Each asserts that nothing outside the export's own files changed."""

import hashlib
import os
import pathlib
import re
import shutil
import signal
import subprocess
import sys

import pytest

from seq2seq import export, files
from seq2seq.errors import ConfigError

OLD, NEW = "step20", "step60"  # the earlier export's checkpoint, and the one a plain export takes


@pytest.fixture(scope="module")
def earlier(tiny_run, tmp_path_factory):
  """An earlier export of the tiny run (checkpoint 20): tests copy it."""
  return export.export(tiny_run, tmp_path_factory.mktemp("earlier") / "model", 20)


def tree(root: pathlib.Path) -> dict[str, tuple]:
  """{path under root: ("dir",) | ("link", target) | ("file", sha256)}: what a probe must leave as it was."""
  out = {}
  for folder, dirs, names in os.walk(root):
    for name in dirs + names:
      path = pathlib.Path(folder, name)
      key = str(path.relative_to(root))
      if path.is_symlink():
        out[key] = ("link", os.readlink(path))
      elif path.is_dir():
        out[key] = ("dir",)
      else:
        out[key] = ("file", hashlib.sha256(path.read_bytes()).hexdigest())
  return out


def label(model_dir) -> str:
  """The checkpoint an export holds, its files verified against export.json first."""
  return export.read_model_dir(model_dir)[3]


def earlier_copy(earlier, where: pathlib.Path) -> pathlib.Path:
  return shutil.copytree(earlier, where)


# In-process: each case builds its --out under tmp_path (t) from the earlier export (e) and the run, and returns
# (out, overwrite, cwd or None, message regex, and the workdir where it is not the tiny run).
def a_file(t, e, run):
  (t / "model.bin").write_bytes(b"precious")
  return t / "model.bin", True, None, r"is a file, not a folder"


def a_file_no_overwrite(t, e, run):
  (t / "notes").write_text("precious")
  return t / "notes", False, None, r"is a file, not a folder"


def a_link_to_a_file(t, e, run):
  (t / "notes").write_text("precious")
  (t / "link").symlink_to("notes")
  return t / "link", True, None, rf"\({re.escape(str(t / 'notes'))}\): is a file, not a folder"


def inside_a_file(t, e, run):
  (t / "notes").write_text("precious")
  return t / "notes" / "model", False, None, rf"{re.escape(str(t / 'notes'))} is a file, not a folder"


def dot_in_an_export(t, e, run):
  return pathlib.Path("."), True, earlier_copy(e, t / "model"), r"is the current directory.*another directory"


def dot_in_an_empty_folder(t, e, run):
  (t / "empty").mkdir()
  return pathlib.Path("."), False, t / "empty", r"is the current directory"


def a_folder_holding_the_cwd(t, e, run):
  model = earlier_copy(e, t / "model")
  (model / "work").mkdir()
  return model, True, model / "work", r"holds the current directory"


def the_workdir(t, e, run):
  return shutil.copytree(run, t / "run"), True, None, r"is the run's --workdir", t / "run"


def a_parent_of_the_workdir(t, e, run):  # one with a model.safetensors (an export was written there first)
  (t / "exp").mkdir()
  shutil.copy(e / "model.safetensors", t / "exp")
  shutil.copytree(run, t / "exp" / "run")
  return t / "exp", True, None, r"holds the run's --workdir", t / "exp" / "run"


def unknown_file_beside_the_parameters(t, e, run):
  model = t / "model"
  model.mkdir()
  shutil.copy(e / "model.safetensors", model)
  (model / "precious.txt").write_text("keep me")
  return model, True, None, r"holds precious\.txt, which an export does not write"


def unknown_files_beside_an_export(t, e, run):
  model = earlier_copy(e, t / "model")
  for name in ("a.txt", "b.txt", "c.txt", "d.txt", "e.txt"):
    (model / name).write_text(name)
  (model / "runs").mkdir()
  return model, True, None, r"holds a\.txt, b\.txt, c\.txt, d\.txt and 2 more, which an export does not write"


def a_subfolder_in_an_export(t, e, run):
  model = earlier_copy(e, t / "model")
  (model / "runs").mkdir()
  (model / "runs" / "x").write_text("keep me")
  return model, True, None, r"holds runs/, which"


def an_older_export_without_manifest(t, e, run):
  model = earlier_copy(e, t / "model")
  (model / "export.json").unlink()
  return model, True, None, r"has no export\.json.*delete the folder yourself or choose a new --out"


def an_export_with_a_foreign_manifest(t, e, run):
  model = earlier_copy(e, t / "model")
  (model / "export.json").write_text('{"format": "other"}')
  return model, True, None, r"export\.json: not a seq2seq-model-1 manifest"


def an_export_without_overwrite(t, e, run):
  return earlier_copy(e, t / "model"), False, None, r"exists and is not empty; choose a new --out \(or --overwrite"


REFUSED = [a_file, a_file_no_overwrite, a_link_to_a_file, inside_a_file, dot_in_an_export, dot_in_an_empty_folder,
           a_folder_holding_the_cwd, the_workdir, a_parent_of_the_workdir, unknown_file_beside_the_parameters,
           unknown_files_beside_an_export, a_subfolder_in_an_export, an_older_export_without_manifest,
           an_export_with_a_foreign_manifest, an_export_without_overwrite]


@pytest.mark.parametrize("case", REFUSED, ids=[c.__name__ for c in REFUSED])
def test_an_out_that_cannot_be_replaced_is_refused_and_left_as_it_was(case, tiny_run, earlier, tmp_path, monkeypatch):
  out, overwrite, cwd, message, *run = case(tmp_path, earlier, tiny_run)
  run = run[0] if run else tiny_run
  monkeypatch.chdir(cwd or tmp_path)
  before = tree(tmp_path)
  with pytest.raises(ConfigError, match=rf"^--out={re.escape(str(out))}(?=:| \().*{message}"):
    export.export(run, out, overwrite=overwrite)
  assert tree(tmp_path) == before


def test_a_link_to_a_folder_is_followed_and_stays(tiny_run, tmp_path):
  (tmp_path / "real").mkdir()
  (tmp_path / "link").symlink_to("real")
  assert export.export(tiny_run, tmp_path / "link") == tmp_path / "link"
  assert os.readlink(tmp_path / "link") == "real" and label(tmp_path / "real") == NEW
  assert sorted(p.name for p in tmp_path.iterdir()) == ["link", "real"]


def command(args, cwd) -> subprocess.CompletedProcess:
  return subprocess.run([sys.executable, "-m", "seq2seq.export", *args], cwd=cwd, capture_output=True, text=True,
                        timeout=300)


# Through the command: (name, setup(tmp, earlier) -> (args, cwd), exit status, last stderr line regex or None).
def cmd_dot_in_an_export(t, e):
  return ["--out=.", "--overwrite"], earlier_copy(e, t / "model")


def cmd_unknown_file(t, e):
  (t / "model").mkdir()
  shutil.copy(e / "model.safetensors", t / "model")
  (t / "model" / "precious.txt").write_text("keep me")
  return [f"--out={t / 'model'}", "--overwrite"], t


def cmd_a_file(t, e):
  (t / "model").write_text("keep me")
  return [f"--out={t / 'model'}", "--overwrite"], t


def cmd_a_link_to_an_export(t, e):
  earlier_copy(e, t / "real")
  (t / "link").symlink_to("real")
  return ["--out=link", "--overwrite"], t


COMMANDS = [(cmd_dot_in_an_export, 2, r"error: --out=\.: is the current directory"),
            (cmd_unknown_file, 2, r"error: --out=\S+/model: not replaced: .* holds precious\.txt"),
            (cmd_a_file, 2, r"error: --out=\S+/model: is a file, not a folder"),
            (cmd_a_link_to_an_export, 0, None)]


@pytest.mark.parametrize("case, status, last", COMMANDS, ids=[c[0].__name__ for c in COMMANDS])
def test_export_command_probes(case, status, last, tiny_run, earlier, tmp_path):
  args, cwd = case(tmp_path, earlier)
  before = tree(tmp_path)
  out = command([f"--workdir={tiny_run}", *args], cwd)
  assert out.returncode == status, out.stderr
  assert "Traceback" not in out.stderr + out.stdout
  lines = out.stderr.strip().splitlines()
  if last is None:
    assert not [line for line in lines if line.startswith("error:")], out.stderr
    assert label(tmp_path / "real") == NEW and os.readlink(tmp_path / "link") == "real"
    before = {k: v for k, v in before.items() if not k.startswith("real/")}
    assert {k: v for k, v in tree(tmp_path).items() if not k.startswith("real/")} == before
  else:
    assert re.match(last, lines[-1]) and sum(line.startswith("error:") for line in lines) == 1, out.stderr
    assert tree(tmp_path) == before


# Kill -9 at named points: files.step stops the process there (SIGSTOP), the test kills it.
STOPPING = """
import os, runpy, signal, sys
from seq2seq import files
stage, exchange = sys.argv.pop(1), sys.argv.pop(1) == "1"
files.step = lambda name: os.kill(os.getpid(), signal.SIGSTOP) if name == stage else None
if not exchange:  # as where renameat2 is missing: the two renames through a backup
  files._exchange = lambda a, b: False
if sys.argv[1] == "swap":  # files alone: the new folder holds one file
  parent = __import__("pathlib").Path(sys.argv[2])
  with files.staging_dir(parent, "model") as staging:
    (staging / "v").write_text("new")
    files.swap_in(staging, parent / "model")
else:
  runpy.run_module("seq2seq.export", run_name="__main__", alter_sys=True)
"""


def killed_at(stage: str, exchange: bool, args: list[str], cwd) -> None:
  """Runs STOPPING until it stops at `stage`, then kills it (SIGKILL)."""
  with open(cwd / "stderr.txt", "w+") as err:
    proc = subprocess.Popen([sys.executable, "-c", STOPPING, stage, "1" if exchange else "0", *args], cwd=cwd,
                            stdout=subprocess.DEVNULL, stderr=err)
    try:
      _, status = os.waitpid(proc.pid, os.WUNTRACED)
      err.seek(0)
      assert os.WIFSTOPPED(status), f"exited before {stage}: {err.read()}"
      proc.send_signal(signal.SIGKILL)
    finally:
      proc.kill()
      proc.wait()
  (cwd / "stderr.txt").unlink()


SWAP_STAGES = [("swap", True, "old"), ("exchanged", True, "new"), ("aside", False, "old"), ("moved", False, "new")]


@pytest.mark.parametrize("stage, exchange, left", SWAP_STAGES)
def test_a_swap_killed_at_any_step_leaves_the_old_folder_or_the_new(stage, exchange, left, tmp_path):
  parent = tmp_path / "models"
  (parent / "model").mkdir(parents=True)
  (parent / "model" / "v").write_text("old")
  killed_at(stage, exchange, ["swap", str(parent)], tmp_path)
  if exchange or stage != "aside":
    assert (parent / "model" / "v").read_text() == left
  else:  # between the two renames: the old folder is in the backup, which the next cleanup puts back
    assert not (parent / "model").exists()
  files.remove_stale(parent)
  assert [p.name for p in parent.iterdir()] == ["model"] and (parent / "model" / "v").read_text() == left


EXPORT_STAGES = [("wrote model.safetensors", True, OLD), ("wrote export.json", True, OLD), ("swap", True, OLD),
                 ("exchanged", True, NEW), ("aside", False, OLD), ("moved", False, NEW)]


@pytest.mark.long  # six exports killed (the fast suite stops the swap at each of its steps)
def test_an_export_killed_at_any_point_leaves_the_earlier_export_or_the_new(tiny_run, earlier, tmp_path):
  parent = tmp_path / "models"
  for stage, exchange, left in EXPORT_STAGES:
    shutil.rmtree(parent, ignore_errors=True)
    earlier_copy(earlier, parent / "model")
    killed_at(stage, exchange, [f"--workdir={tiny_run}", f"--out={parent / 'model'}", "--overwrite"], tmp_path)
    if exchange or stage != "aside":
      assert label(parent / "model") == left, stage
    out = command([f"--workdir={tiny_run}", f"--out={parent / 'model'}", "--checkpoint=40"], tmp_path)
    assert out.returncode == 2 and "--overwrite to replace this earlier export" in out.stderr, out.stderr
    assert [p.name for p in parent.iterdir()] == ["model"] and label(parent / "model") == left, stage
