"""Faults that used to pass silently or wedge a run: bit rot, truncation or a lost file in the
newest checkpoint, a torn metrics line, a save that fails. Each run is a real tiny training
run; a resumed run must end exactly where an uninterrupted one does."""

import os
import pathlib
import shutil
import subprocess
import sys

import jax
import numpy as np
import pytest
from conftest import REPO, make_config, optimized_env

from seq2seq import metrics, sharding
from seq2seq.inference import load
from seq2seq.training import checkpoint
from seq2seq.training.train import train_and_evaluate



def tiny(data_dir, cache, **train):
  config = make_config("tiny", data_dir, cache)
  config.train.update(dict(log_every=5, eval_every=0, checkpoint_every=10, peak_flops=2.5e11) | train)
  return config


def params_of(workdir, step=None):
  config = load.run_config(workdir)
  return load.load_params(workdir, config, sharding.make_mesh(config.mesh), checkpoint=step)


@pytest.fixture(scope="module")
def straight(data_dir, session_cache, tmp_path_factory):
  """30 uninterrupted steps, checkpoints at 10, 20, 30."""
  workdir = tmp_path_factory.mktemp("straight")
  train_and_evaluate(tiny(data_dir, session_cache, steps=30), str(workdir))
  return workdir


@pytest.fixture(scope="module")
def twenty(data_dir, session_cache, tmp_path_factory):
  """The same run stopped after 20 steps (checkpoints at 10, 20); tests damage a copy."""
  workdir = tmp_path_factory.mktemp("twenty")
  train_and_evaluate(tiny(data_dir, session_cache, steps=20), str(workdir))
  return workdir


def _largest_file(step_dir: pathlib.Path) -> pathlib.Path:
  return max((p for p in step_dir.rglob("*") if p.is_file() and p.name != checkpoint.CHECKSUMS),
             key=lambda p: p.stat().st_size)


def flip_bytes(path: pathlib.Path, count: int = 15) -> None:
  """`count` bytes inverted in the middle of the file; the size stays the same."""
  data = bytearray(path.read_bytes())
  middle = len(data) // 2
  for i in range(middle, middle + count):
    data[i] ^= 0xFF
  path.write_bytes(bytes(data))


DAMAGE = {
    "bit_rot": flip_bytes,
    "truncated": lambda path: os.truncate(path, path.stat().st_size // 2),
}


@pytest.mark.parametrize("damage", [  # real training runs; CI runs one damage
    pytest.param("bit_rot", marks=pytest.mark.long), pytest.param("truncated", marks=pytest.mark.slow),
    pytest.param("lost_metadata", marks=pytest.mark.long)])
def test_a_damaged_newest_checkpoint_is_skipped_by_eval_and_by_training_which_ends_as_if_it_were_not(
    damage, straight, twenty, data_dir, session_cache, tmp_path):
  """Train 20 steps (checkpoints 10, 20), damage checkpoint 20, rerun to 30: training resumes
  from 10 with a warning and a `restore_fallback` event naming the file, and its parameters
  equal the uninterrupted run's. Before that, eval skips 20 and says so; --step=20 is refused."""
  workdir = shutil.copytree(twenty, tmp_path / "run")
  step_dir = workdir / "checkpoints" / "20"
  if damage == "lost_metadata":  # and no checksums to tell: only reading it fails
    (step_dir / checkpoint.CHECKSUMS).unlink()
    (step_dir / "state" / "_METADATA").unlink()
    named = "cannot be read"
  else:
    target = _largest_file(step_dir)
    DAMAGE[damage](target)
    named = str(target)

  label = params_of(workdir).checkpoint.label
  assert label == "step10"
  with pytest.raises(checkpoint.CheckpointError, match=r"checkpoint 20 .* is damaged"):
    params_of(workdir, step=20)

  train_and_evaluate(tiny(data_dir, session_cache, steps=30), str(workdir))
  events = [r for r in metrics.read(workdir) if r.get("event") == "restore_fallback"]
  assert [(e["step"], e["damaged_step"]) for e in events] == [(10, 20)] and named in events[0]["problem"]
  assert [r["step"] for r in metrics.read(workdir) if "loss" in r] == [5, 10, 15, 20, 25, 30]
  for x, y in zip(jax.tree.leaves(params_of(workdir).params), jax.tree.leaves(params_of(straight).params)):
    np.testing.assert_array_equal(x, y)

@pytest.mark.slow  # real training runs
def test_every_checkpoint_damaged_is_an_error_naming_each(twenty, data_dir, session_cache, tmp_path):
  workdir = shutil.copytree(twenty, tmp_path / "run")
  for step in (10, 20):
    flip_bytes(_largest_file(workdir / "checkpoints" / str(step)))
  with pytest.raises(checkpoint.CheckpointError, match=r"no intact checkpoint .*\(20: .*; 10: .*\)"):
    train_and_evaluate(tiny(data_dir, session_cache, steps=30), str(workdir))

@pytest.mark.long  # real training runs
def test_a_torn_last_metrics_line_is_dropped_with_a_warning_naming_the_file(
    straight, twenty, data_dir, session_cache, tmp_path, caplog):
  workdir = shutil.copytree(twenty, tmp_path / "run")
  with open(workdir / "metrics.jsonl", "a", encoding="utf-8") as f:
    f.write('{"step": 25, "loss": 4.1')  # the disk filled up mid-line
  train_and_evaluate(tiny(data_dir, session_cache, steps=30), str(workdir))
  assert f"{workdir / 'metrics.jsonl'}:5: dropped a torn last line" in caplog.text
  got = {r["step"]: r["loss"] for r in metrics.read(workdir) if "loss" in r}
  assert got == {r["step"]: r["loss"] for r in metrics.read(straight) if "loss" in r}
  (workdir / "metrics.jsonl").write_text('{"step": 1}\n{"step": 2, "lo\n{"step": 3}\n')
  with pytest.raises(ValueError, match=r"metrics.jsonl:2: not a JSON record"):
    metrics.read(workdir)

@pytest.mark.slow  # real training runs
def test_a_failed_save_stops_training_at_once_and_the_last_good_checkpoint_stays_intact(
    data_dir, session_cache, tmp_path):
  """Files over 256 KiB cannot be written (ulimit -f) once checkpoint 10 exists: the save of
  20 fails, training stops with an error naming it and the intact checkpoint 10."""
  train_and_evaluate(tiny(data_dir, session_cache, steps=10), str(tmp_path))
  assert _largest_file(tmp_path / "checkpoints" / "10").stat().st_size > 256 * 1024
  cmd = (f"ulimit -f 256 && {sys.executable} train.py --config=configs/tiny.py --workdir={tmp_path} "
         f"--config.data.dir={data_dir} --config.data.cache_dir={session_cache} --config.train.steps=40 "
         "--config.train.log_every=5 --config.train.eval_every=0 --config.train.checkpoint_every=10 "
         "--config.train.peak_flops=2.5e11")
  out = subprocess.run(["bash", "-c", cmd], cwd=REPO, capture_output=True, text=True, timeout=600)
  assert out.returncode != 0
  assert "saving checkpoint 20" in out.stderr and "the last good checkpoint is 10" in out.stderr
  steps = [r["step"] for r in metrics.read(tmp_path) if "loss" in r]
  assert max(steps) < 30, "training went on past the failed save"
  ckpts = checkpoint.Checkpoints(str(tmp_path))
  assert ckpts.manager.all_steps() == [10] and ckpts.problem(10) is None
  ckpts.close()


@pytest.mark.long  # 150 steps killed ten times (the slow suite kills a run after and during a save)
@pytest.mark.longest
def test_soak_ten_sigkills_at_seeded_moments_end_bit_identical(data_dir, session_cache, tmp_path):
  """A 150-step tiny run killed (SIGKILL) at 10 seeded random moments, some inside saves
  (checkpoints every 10 steps, asynchronous), then run to the end: every logged loss and the
  final parameters equal an uninterrupted run's. The killed runs compile with XLA's usual
  optimization (their programs come from the compilation cache after the first)."""
  import signal
  import time

  straight_dir, workdir = tmp_path / "straight", tmp_path / "soak"
  command = lambda workdir: [
      sys.executable, "train.py", "--config=configs/tiny.py", f"--workdir={workdir}", f"--config.data.dir={data_dir}",
      f"--config.data.cache_dir={session_cache}", "--config.train.eval_every=0", "--config.train.peak_flops=2.5e11",
      "--config.train.steps=150", "--config.train.log_every=5", "--config.train.checkpoint_every=10"]
  straight = subprocess.run(command(straight_dir), cwd=REPO, capture_output=True, text=True, timeout=600,
                            env=optimized_env())
  assert straight.returncode == 0, straight.stderr[-3000:]
  cmd = command(workdir)
  rng = np.random.default_rng(0)
  logged = lambda: max((r["step"] for r in metrics.read(workdir) if "loss" in r), default=0)
  kills = 0
  for target in sorted(rng.choice(np.arange(10, 145), size=10, replace=False)):
    proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=optimized_env())
    extra = rng.uniform(0.0, 0.3)  # seconds past the logged step: lands anywhere, saves included
    deadline = time.monotonic() + 300
    while proc.poll() is None and logged() < target:
      assert time.monotonic() < deadline
      time.sleep(0.005)
    time.sleep(extra)
    if proc.poll() is None:
      proc.send_signal(signal.SIGKILL)
      kills += 1
    proc.wait(timeout=60)
  final = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=600, env=optimized_env())
  assert final.returncode == 0, final.stderr[-3000:]
  assert kills >= 8
  got = {r["step"]: r["loss"] for r in metrics.read(workdir) if "loss" in r}
  assert got == {r["step"]: r["loss"] for r in metrics.read(straight_dir) if "loss" in r}
  for x, y in zip(jax.tree.leaves(params_of(workdir).params), jax.tree.leaves(params_of(straight_dir).params)):
    np.testing.assert_array_equal(x, y)
