"""Checkpoints: rerunning resumes exactly, SIGTERM saves and exits 0 (on one host or two),
config mismatches are refused, unfinished checkpoint directories are ignored."""

import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import time

import jax
import numpy as np
import pytest
from conftest import REPO, communicate_all, free_port, make_config

from seq2seq import metrics, provenance
from seq2seq.training import checkpoint
from seq2seq.training.train import train_and_evaluate


def tiny(data_dir, cache, **train):
  config = make_config("tiny", data_dir, cache)
  config.train.update(dict(log_every=5, eval_every=0, checkpoint_every=10, peak_flops=2.5e11) | train)
  return config


def final_params(workdir):
  ckpts = checkpoint.Checkpoints(str(workdir))
  import orbax.checkpoint as ocp

  restored = ckpts.manager.restore(ckpts.latest_step(), args=ocp.args.Composite(state=ocp.args.StandardRestore()))
  ckpts.close()
  return restored.state


@pytest.fixture(scope="module")
def uninterrupted(data_dir, session_cache, tmp_path_factory):
  workdir = tmp_path_factory.mktemp("uninterrupted")
  train_and_evaluate(tiny(data_dir, session_cache, steps=30), str(workdir))
  return workdir


def test_provenance_names_the_commit_and_whether_the_source_had_changes(tmp_path):
  git = lambda *args: subprocess.run(["git", "-C", str(tmp_path / "src"), *args], check=True, capture_output=True,
                                     text=True).stdout.strip()
  assert provenance.source_commit(tmp_path) == (None, None)  # an installed copy: no checkout
  (tmp_path / "src").mkdir()
  git("init", "-q")
  (tmp_path / "src" / "code.py").write_text("x = 1\n")
  git("add", "code.py")
  git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "one")
  head = git("rev-parse", "HEAD")
  assert provenance.source_commit(tmp_path / "src") == (head, False)
  (tmp_path / "src" / "notes.txt").write_text("untracked files are not the code\n")
  assert provenance.source_commit(tmp_path / "src") == (head, False)
  (tmp_path / "src" / "code.py").write_text("x = 2\n")
  assert provenance.source_commit(tmp_path / "src") == (head, True)
  run = tmp_path / "run"
  run.mkdir()
  assert provenance.commit_of(run) == ""  # a run from before provenance was recorded
  starts = [{"commit": head, "changes": False}, {"commit": head, "changes": False}, {"commit": "f" * 40, "changes": True}]
  (run / provenance.FILE).write_text("".join(json.dumps(s) + "\n" for s in starts))
  assert provenance.commit_of(run) == f"{head[:7]},fffffff+changes"


def test_rerun_resumes_exactly_where_the_run_stopped(uninterrupted, data_dir, session_cache, tmp_path, monkeypatch):
  from seq2seq.model import flops

  monkeypatch.setattr(flops, "measure_matmul_peak", None)  # a configured peak is not measured
  (tmp_path / "train.lock").write_text("")  # a run that crashed before any checkpoint: its lock file, and
  (tmp_path / "metrics.jsonl").write_text('{"step": 7, "loss": 99.0}\n')  # from a crash before any checkpoint
  train_and_evaluate(tiny(data_dir, session_cache, steps=15), str(tmp_path), command="first")  # stops (and saves) at 15
  assert checkpoint.Checkpoints(str(tmp_path)).latest_step() == 15
  records = metrics.read(tmp_path)
  assert [r["step"] for r in records] == [5, 10, 15]  # the stale record is gone
  records[-1]["wall_time_s"] = 1e6  # as if the first run had taken that long
  (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
  before = time.perf_counter()
  train_and_evaluate(tiny(data_dir, session_cache, steps=30), str(tmp_path), command="second")  # the same, longer
  took = time.perf_counter() - before
  assert (tmp_path / "commands.txt").read_text() == "first\nsecond\n"
  starts = [json.loads(line) for line in (tmp_path / provenance.FILE).read_text().splitlines()]
  commit, changes = provenance.source_commit()  # this checkout's (CI tests a clone)
  assert [(s["command"], s["commit"], s["changes"], s["libraries"]["jax"], s["devices"]) for s in starts] == [
      (c, commit, changes, jax.__version__, f"{jax.device_count()} x cpu") for c in ("first", "second")]
  want = {r["step"]: r["loss"] for r in metrics.read(uninterrupted)}
  got = {r["step"]: r["loss"] for r in metrics.read(tmp_path)}
  assert sorted(got) == [5, 10, 15, 20, 25, 30]
  assert {r["peak_flops"] for r in metrics.read(tmp_path)} == {2.5e11}  # the configured MFU denominator
  wall = [r["wall_time_s"] for r in metrics.read(tmp_path) if r["step"] > 15]  # goes on from the first run's
  assert 1e6 < wall[0] < wall[1] < wall[2] < 1e6 + took
  assert {s: got[s] for s in (20, 25, 30)} == {s: want[s] for s in (20, 25, 30)}  # bit-identical
  a, b = final_params(uninterrupted), final_params(tmp_path)
  for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
    np.testing.assert_array_equal(x, y)


@pytest.mark.slow  # three short trainings with the loss kernel interpreted (~20 s)
def test_the_loss_kernel_resumes_exactly(uninterrupted, data_dir, session_cache, tmp_path, monkeypatch):
  """`train.loss_impl` picking the loss kernel (seq2seq/training/loss_kernel.py, interpreted here
  as a GPU would run it): a run stopped at step 5 and rerun ends bit-identical to the same run
  uninterrupted, and its losses are the XLA loss's run's up to float32 summation order."""
  import functools

  from seq2seq.training import loss_kernel

  traced = []  # the kernel's calls as the train steps are traced
  interpreted = functools.partial(loss_kernel.stats_and_grad, interpret=True)
  monkeypatch.setattr(loss_kernel, "chosen", lambda impl, *_: impl != "xla")
  monkeypatch.setattr(loss_kernel, "stats_and_grad", lambda *a, **k: traced.append(1) or interpreted(*a, **k))
  train_and_evaluate(tiny(data_dir, session_cache, steps=10), str(tmp_path / "whole"))
  assert traced
  train_and_evaluate(tiny(data_dir, session_cache, steps=5), str(tmp_path / "resumed"))
  train_and_evaluate(tiny(data_dir, session_cache, steps=10), str(tmp_path / "resumed"))
  whole, resumed, xla = ({r["step"]: r["loss"] for r in metrics.read(w) if r["step"] <= 10}
                         for w in (tmp_path / "whole", tmp_path / "resumed", uninterrupted))
  assert resumed == whole and sorted(whole) == [5, 10]
  np.testing.assert_allclose([whole[s] for s in sorted(whole)], [xla[s] for s in sorted(whole)], rtol=1e-5)
  for x, y in zip(jax.tree.leaves(final_params(tmp_path / "whole")), jax.tree.leaves(final_params(tmp_path / "resumed"))):
    np.testing.assert_array_equal(x, y)


def test_other_model_settings_are_refused(uninterrupted, data_dir, session_cache, tmp_path):
  workdir = tmp_path / "copy"
  shutil.copytree(uninterrupted, workdir)
  config = tiny(data_dir, session_cache, steps=40)
  config.model.d_ff = 256
  (workdir / "commands.txt").write_text("python train.py ...\n")
  before = (workdir / "config.json").read_text()
  with pytest.raises(ValueError, match=r"config\.model\.d_ff: checkpoint has 128, config has 256"):
    train_and_evaluate(config, str(workdir), command="refused")
  assert (workdir / "config.json").read_text() == before  # eval.py still loads the run's own config
  assert (workdir / "commands.txt").read_text() == "python train.py ...\n"  # the table shows how it was trained
  assert json.loads(before)["model"]["d_ff"] == 128


def test_unfinished_checkpoint_directory_is_ignored(uninterrupted, tmp_path):
  workdir = tmp_path / "copy"
  shutil.copytree(uninterrupted, workdir)
  # "<step>.orbax-checkpoint-tmp" is the name orbax gives a save that has not finished.
  shutil.copytree(workdir / "checkpoints" / "30", workdir / "checkpoints" / "40.orbax-checkpoint-tmp")
  assert checkpoint.Checkpoints(str(workdir)).latest_step() == 30


@pytest.mark.slow
def test_sigterm_saves_a_checkpoint_and_exits_zero(data_dir, session_cache, tmp_path):
  cmd = [sys.executable, "train.py", "--config=configs/tiny.py", f"--workdir={tmp_path}",
         f"--config.data.dir={data_dir}", f"--config.data.cache_dir={session_cache}",
         "--config.train.steps=100000", "--config.train.log_every=5", "--config.train.eval_every=0",
         "--config.train.checkpoint_every=100000"]
  proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
  deadline = time.monotonic() + 240
  while not metrics.read(tmp_path):  # wait for the first logged step: training is under way
    assert proc.poll() is None and time.monotonic() < deadline, proc.stdout.read() if proc.poll() else "timeout"
    time.sleep(0.2)
  proc.send_signal(signal.SIGTERM)
  out, _ = proc.communicate(timeout=240)
  assert proc.returncode == 0, out[-3000:]
  step = checkpoint.Checkpoints(str(tmp_path)).latest_step()
  assert step >= 5 and f"saved a checkpoint at step {step}" in out
  assert metrics.read(tmp_path)[-1]["step"] == step  # the steps since the last log_every are logged too
  resumed = subprocess.run(cmd[:-4] + [f"--config.train.steps={step + 2}", "--config.train.log_every=1",
                                       "--config.train.eval_every=0", "--config.train.checkpoint_every=100"],
                           cwd=REPO, capture_output=True, text=True, timeout=240)
  assert resumed.returncode == 0, resumed.stderr[-3000:]
  assert f"resumed from {tmp_path.resolve() / 'checkpoints' / str(step)}" in resumed.stdout
  assert [r["step"] for r in metrics.read(tmp_path)][-2:] == [step + 1, step + 2]
  recorded = [shlex.join(["python", *c[1:]]) for c in (cmd, resumed.args)]  # as typed, with `python`
  assert (tmp_path / "commands.txt").read_text().splitlines() == recorded


@pytest.mark.slow
def test_sigkill_after_a_checkpoint_and_during_a_save_then_rerun_equals_the_uninterrupted_run(
    uninterrupted, data_dir, session_cache, tmp_path):
  cmd = [sys.executable, "train.py", "--config=configs/tiny.py", f"--workdir={tmp_path}",
         f"--config.data.dir={data_dir}", f"--config.data.cache_dir={session_cache}", "--config.train.steps=30",
         "--config.train.log_every=5", "--config.train.eval_every=0", "--config.train.checkpoint_every=10"]
  ckpt_dir = tmp_path / "checkpoints"
  finished = lambda: [p.name for p in ckpt_dir.glob("*") if p.name.isdigit()]
  in_flight = lambda: [p.name for p in ckpt_dir.glob("*.orbax-checkpoint-tmp*") if int(p.name.split(".")[0]) > 10]

  def run_until(condition):
    proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 240
    while proc.poll() is None and not (ckpt_dir.is_dir() and condition()):
      assert time.monotonic() < deadline
      time.sleep(0.001)
    proc.send_signal(signal.SIGKILL)  # no chance to clean up
    proc.wait(timeout=60)

  run_until(finished)  # killed once the checkpoint at step 10 is complete
  run_until(in_flight)  # killed while a later save is being written (if the run is still going by then)
  rerun = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=300)
  assert rerun.returncode == 0, rerun.stderr[-3000:]
  assert "resumed from" in rerun.stdout
  want = {r["step"]: r["loss"] for r in metrics.read(uninterrupted)}
  got = {r["step"]: r["loss"] for r in metrics.read(tmp_path)}
  assert got == want  # every logged loss, before and after the kills
  for x, y in zip(jax.tree.leaves(final_params(uninterrupted)), jax.tree.leaves(final_params(tmp_path))):
    np.testing.assert_array_equal(x, y)


@pytest.mark.slow
def test_restore_on_another_mesh_continues_the_same_run(uninterrupted, data_dir, session_cache, tmp_path):
  """Saved on 1 device at step 10; restored on 8 (fake CPU) devices as a (2, 2, 2) mesh."""
  shutil.copytree(uninterrupted, tmp_path, dirs_exist_ok=True)
  for step in ("20", "30"):
    shutil.rmtree(tmp_path / "checkpoints" / step)
  env = dict(os.environ, XLA_FLAGS=os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8")
  cmd = [sys.executable, "train.py", "--config=configs/tiny.py", f"--workdir={tmp_path}",
         f"--config.data.dir={data_dir}", f"--config.data.cache_dir={session_cache}", "--config.train.steps=30",
         "--config.train.log_every=5", "--config.train.eval_every=0", "--config.train.checkpoint_every=10",
         "--config.mesh.data=2", "--config.mesh.fsdp=2", "--config.mesh.tensor=2"]
  out = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
  assert out.returncode == 0, out.stderr[-3000:]
  assert "resumed from" in out.stdout
  want = {r["step"]: r["loss"] for r in metrics.read(uninterrupted)}
  got = {r["step"]: r["loss"] for r in metrics.read(tmp_path)}
  assert sorted(got) == sorted(want)
  # The 10 steps after the restore match to 1e-5, the bound of the mesh-equivalence test;
  # beyond that, float32 reduction-order differences of 8 devices grow through Adam.
  np.testing.assert_allclose([got[15], got[20]], [want[15], want[20]], atol=1e-5)


def test_average_of_the_last_checkpoints_is_the_mean_of_their_parameters(uninterrupted, tmp_path):
  """--average_last=K [--checkpoint=STEP]: the mean of the K checkpoints ending there; --last is
  its old name (it works, with a deprecation line)."""
  import orbax.checkpoint as ocp

  from seq2seq import average

  workdir = tmp_path / "copy"
  shutil.copytree(uninterrupted, workdir)

  def run(*flags):
    return subprocess.run([sys.executable, "-m", "seq2seq.average", f"--workdir={workdir}", *flags], cwd=REPO,
                          capture_output=True, text=True, timeout=300)

  ckpts = checkpoint.Checkpoints(str(workdir))
  saved = {s: ckpts.manager.restore(s, args=ocp.args.Composite(state=ocp.args.StandardRestore())).state["params"]
           for s in (10, 20, 30)}
  ckpts.close()
  for flags, steps in ((["--last=2"], [20, 30]), (["--average_last=2", "--checkpoint=20"], [10, 20])):
    out = run(*flags)
    assert out.returncode == 0, out.stderr[-3000:]
    assert ("warning: --last=2 is deprecated; use --average_last=2" in out.stderr) == (flags == ["--last=2"])
    params, identity = average.load_average(workdir / "average" / "last2")
    assert identity["averaged_steps"] == steps
    leaves = list(zip(jax.tree.leaves(params), *(jax.tree.leaves(saved[s]) for s in steps)))
    assert len(leaves) > 10
    for avg, a, b in leaves:
      np.testing.assert_array_equal(avg, ((np.float64(a) + np.float64(b)) / 2).astype(np.float32))
    assert not np.array_equal(leaves[0][1], leaves[0][2])
  too_many = run("--average_last=3", "--checkpoint=20")
  assert too_many.returncode == 2 and too_many.stderr.splitlines()[-1].endswith(
      "has 2 checkpoint(s) up to step 20, fewer than --average_last=3 (raise config.train.keep_checkpoints to keep more)")


def test_nan_at_a_step_rolls_back_to_the_last_checkpoint_and_training_goes_on(data_dir, session_cache, tmp_path):
  config = tiny(data_dir, session_cache, steps=25, inject_nan_at_step=17, guard_lr_factor=0.5)
  last = train_and_evaluate(config, str(tmp_path))
  records = metrics.read(tmp_path)
  events = [r for r in records if r.get("event") == "rollback"]
  assert len(events) == 1
  assert events[0]["step"] == 17 and events[0]["to_step"] == 10 and events[0]["lr_scale"] == 0.5
  assert "non-finite" in events[0]["reason"]
  assert np.isfinite(last["loss"]) and last["step"] == 25
  params = final_params(tmp_path)
  assert all(np.all(np.isfinite(x)) for x in jax.tree.leaves(params))
  assert float(params["lr_scale"]) == 0.5


def test_divergence_before_any_checkpoint_is_a_clear_error(data_dir, session_cache, tmp_path):
  """...and the run's TensorBoard writer is closed on the way out (left open, its cleanup at
  interpreter exit prints a traceback on Python 3.12)."""
  import threading

  writers = lambda: sum(type(t).__name__ == "_EventLoggerThread" for t in threading.enumerate())
  before = writers()
  config = tiny(data_dir, session_cache, steps=25, inject_nan_at_step=5, guard_max_rollbacks=1)
  with pytest.raises(RuntimeError, match="before any checkpoint was saved"):
    train_and_evaluate(config, str(tmp_path))
  assert writers() == before


@pytest.mark.long
def test_divergence_after_the_allowed_rollbacks_stops_with_a_clear_error(data_dir, session_cache, tmp_path):
  # A spike factor below 1 flags every step once the running mean exists (10 steps).
  config = tiny(data_dir, session_cache, steps=25, guard_spike_factor=0.5, guard_max_rollbacks=2)
  with pytest.raises(RuntimeError, match=r"training diverged 3 times, the last at step 11 \(loss .* over 0.5 x"):
    train_and_evaluate(config, str(tmp_path))
  events = [r for r in metrics.read(tmp_path) if r.get("event") == "rollback"]
  assert [(e["step"], e["to_step"]) for e in events] == [(11, 10), (11, 10)]
  assert [e["lr_scale"] for e in events] == [0.5, 0.25]


def test_the_best_checkpoint_by_validation_loss_is_kept(tmp_path):
  import jax.numpy as jnp

  ckpts = checkpoint.Checkpoints(str(tmp_path), keep=1)
  identity = {"model": {}, "spm_sha256": "x"}
  writer = metrics.MetricsWriter(tmp_path)
  for step, val_loss in [(10, 5.0), (20, 3.0), (30, 4.0), (40, 6.0)]:
    ckpts.save(step, {"w": jnp.full((2,), float(step))}, {"seed": 0, "epoch": 0, "position": step}, identity,
               val_loss=val_loss)
    writer.write(step, {"val_loss": val_loss})
    ckpts.wait()
  writer.close()
  assert set(ckpts.manager.all_steps()) == {20, 40}  # the latest, and the best
  assert ckpts.best_step() == 20
  restored, data_state, step = ckpts.restore({"w": jnp.zeros((2,))}, identity, step=20)
  np.testing.assert_array_equal(restored["w"], [20.0, 20.0])
  assert step == 20
  assert data_state["position"] == 20
  ckpts.close()


def _two_hosts(workdir, data_dir, cache, *extra):
  """train.py as 2 processes of one run (gloo collectives on 127.0.0.1), one CPU device each."""
  port = free_port()
  cmd = [sys.executable, "train.py", "--config=configs/tiny.py", f"--workdir={workdir}",
         f"--config.data.dir={data_dir}", f"--config.data.cache_dir={cache}", "--config.train.log_every=1",
         "--config.train.eval_every=0", "--config.train.checkpoint_every=100000", *extra,
         f"--coordinator_address=127.0.0.1:{port}", "--num_processes=2"]
  env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}  # one device per process
  return [subprocess.Popen(cmd + [f"--process_id={i}"], cwd=REPO, env=env, stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, text=True) for i in range(2)]


def _finish(procs):
  outs = [out for out, _ in communicate_all(procs)]
  for p, out in zip(procs, outs):
    assert p.returncode == 0, out[-3000:]
  return outs


@pytest.mark.long  # two 2-process runs (the slow suite has SIGTERM on one host, and two hosts training)
def test_sigterm_to_one_host_stops_every_host_at_one_step_and_the_rerun_resumes_exactly(
    data_dir, session_cache, tmp_path):
  """Preemption reaches hosts at different times: a SIGTERM to process 1 alone makes both
  processes save the same step and exit 0 (without the agreement process 0 would wait in a
  collective forever); rerunning resumes and logs the losses of an uninterrupted run."""
  stopped = tmp_path / "stopped"
  procs = _two_hosts(stopped, data_dir, session_cache, "--config.train.steps=100000")
  deadline = time.monotonic() + 240
  while not [r for r in metrics.read(stopped) if r["step"] >= 3]:  # training is under way on both
    assert all(p.poll() is None for p in procs) and time.monotonic() < deadline, "a process ended or timeout"
    time.sleep(0.2)
  procs[1].send_signal(signal.SIGTERM)
  outs = _finish(procs)
  step = checkpoint.Checkpoints(str(stopped)).latest_step()
  assert f"saved a checkpoint at step {step}" in outs[0]
  assert [r["step"] for r in metrics.read(stopped)] == list(range(1, step + 1))
  end = step + 3  # tiny.py's rsqrt schedule does not depend on train.steps
  outs = _finish(_two_hosts(stopped, data_dir, session_cache, f"--config.train.steps={end}"))
  assert f"resumed from {stopped.resolve() / 'checkpoints' / str(step)}" in outs[0]
  straight = tmp_path / "straight"
  _finish(_two_hosts(straight, data_dir, session_cache, f"--config.train.steps={end}"))
  got = {r["step"]: r["loss"] for r in metrics.read(stopped)}
  want = {r["step"]: r["loss"] for r in metrics.read(straight)}
  assert sorted(got) == list(range(1, end + 1))
  assert got == want
  for x, y in zip(jax.tree.leaves(eval_params(stopped)), jax.tree.leaves(eval_params(straight))):
    np.testing.assert_array_equal(x, y)


def eval_params(workdir):
  """The latest parameters as eval.py loads them: one process, whatever mesh trained them."""
  from seq2seq import sharding
  from seq2seq.inference import load

  config = load.run_config(workdir)
  return load.load_params(workdir, config, sharding.make_mesh(config.mesh)).params


@pytest.mark.parametrize("num_processes, process_id", [(0, 0), (2, 2), (2, -1)])
def test_explicit_coordinator_needs_a_process_count_and_id(num_processes, process_id):
  from seq2seq.sharding import initialize_distributed

  with pytest.raises(ValueError, match=r"--num_processes >= 1 and 0 <= --process_id < num_processes"):
    initialize_distributed("127.0.0.1:1234", num_processes, process_id)


def test_a_checkpoint_deleted_while_eval_reads_it_is_skipped_not_reported_damaged(tmp_path):
  """A run keeping only its newest checkpoint deletes it under an evaluation reading it."""
  import jax.numpy as jnp

  identity = {"model": {}, "spm_sha256": "x"}
  ckpts = checkpoint.Checkpoints(str(tmp_path), keep=3)
  for step in (10, 20):
    ckpts.save(step, {"w": jnp.full((2,), float(step))}, {"position": step}, identity)
  ckpts.wait()
  restore = ckpts.manager.restore

  def deleting_restore(step, args):
    if step == 20:
      shutil.rmtree(ckpts.directory / "20")
      raise FileNotFoundError(f"{ckpts.directory / '20'}: Truncated Zstd-compressed stream")
    return restore(step, args=args)

  ckpts.manager.restore = deleting_restore
  restored, data_state, step = ckpts.restore({"w": jnp.zeros((2,))}, identity)
  assert step == 10 and data_state["position"] == 10 and ckpts.fallbacks == []
  ckpts.close()


def test_the_divergence_guard_falls_back_past_a_restored_state_that_is_itself_bad(tmp_path):
  import jax.numpy as jnp

  from seq2seq.training.guard import restore_finite
  from seq2seq.training.state import TrainState

  def state(value, step):
    return TrainState(params={"w": jnp.full((2,), value)}, opt_state={"mu": jnp.zeros((2,))}, step=jnp.int32(step),
                      lr_scale=jnp.float32(1.0))

  identity = {"model": {}, "spm_sha256": "x"}
  ckpts = checkpoint.Checkpoints(str(tmp_path), keep=3)
  for step, value in [(10, 1.0), (20, float("nan"))]:  # 20 verifies (its files are as written) but holds NaN
    ckpts.save(step, state(value, step).saved(), {"position": step}, identity)
  ckpts.wait()
  writer = metrics.MetricsWriter(tmp_path)
  restored = restore_finite(state(0.0, 0), ckpts, identity, writer, step=25)
  writer.close()
  assert int(restored.step) == 10
  events = [r for r in metrics.read(tmp_path) if r.get("event") == "restore_fallback"]
  assert [(e["step"], e["damaged_step"], e["problem"]) for e in events] == [(25, 20, "non-finite parameters")]
  assert ckpts.manager.all_steps() == [10] and (tmp_path / "damaged_checkpoints" / "20").is_dir()
  ckpts.close()


def test_the_retired_pad_id_loads_at_the_tokenizers_value_only():
  """Runs written before config.model.pad_id was retired have pad_id 0 in config.json and in
  their checkpoints' identity: both still load; another value is refused, naming the key."""
  from seq2seq.model.config import ModelConfig

  cfg = ModelConfig.from_config({"pad_id": 0, "d_model": 16, "num_heads": 2}, vocab_size=10)
  assert cfg == ModelConfig(vocab_size=10, d_model=16, num_heads=2)
  with pytest.raises(ValueError, match="config.model.pad_id is not a setting any more: the tokenizer fixes it"):
    ModelConfig.from_config({"pad_id": 3}, vocab_size=10)
  current = checkpoint.identity(cfg, b"spm")
  assert "pad_id" not in current["model"]
  checkpoint.check_identity(current | {"model": current["model"] | {"pad_id": 0}}, current, "old")
  with pytest.raises(checkpoint.IdentityError, match="config.model.pad_id: checkpoint has 3, config has 0"):
    checkpoint.check_identity(current | {"model": current["model"] | {"pad_id": 3}}, current, "old")


def test_the_logits_dtype_may_change_on_resume_and_runs_from_before_it_load():
  """`model.logits_dtype` is how one product is rounded, not what the parameters mean: like
  `attention_impl` it is no part of a checkpoint's identity, and identities written before
  the setting existed (no such key) match a config that has it."""
  from seq2seq.model.config import ModelConfig

  cfg = ModelConfig(vocab_size=10, d_model=16, num_heads=2, logits_dtype="bfloat16")
  current = checkpoint.identity(cfg, b"spm")
  assert "logits_dtype" not in current["model"] and "attention_impl" not in current["model"]
  older = checkpoint.identity(ModelConfig(vocab_size=10, d_model=16, num_heads=2), b"spm")
  checkpoint.check_identity(older, current, "old")
  with pytest.raises(ValueError, match="config.model.logits_dtype must be one of"):
    ModelConfig(vocab_size=10, logits_dtype="float16")


@pytest.mark.parametrize("section, key, value", [  # two short trainings per setting; CI runs the loss in chunks
    pytest.param("model", "logits_dtype", "bfloat16", marks=pytest.mark.long),
    pytest.param("train", "adam_mu_dtype", "bfloat16", marks=pytest.mark.long),
    pytest.param("train", "loss_chunk", 4, marks=pytest.mark.slow),
    pytest.param("train", "grad_norm", False, marks=pytest.mark.long)])
def test_the_speed_options_resume_exactly(uninterrupted, section, key, value, data_dir, session_cache, tmp_path):
  """bf16 logits, bf16 Adam first moments, the loss in chunks and no gradient norm (issue 62's
  options): a run stopped at step 15 and rerun ends bit-identical to the same run uninterrupted.
  The bf16 runs' losses are not the float32 run's (the option took effect); the chunked run's
  equal the unchunked run's up to float32 summation order; without the gradient norm, to the
  bit, and its records hold no grad_norm."""
  def config(steps):
    c = tiny(data_dir, session_cache, steps=steps)
    c[section][key] = value
    return c

  train_and_evaluate(config(30), str(tmp_path / "whole"))
  train_and_evaluate(config(15), str(tmp_path / "resumed"))
  train_and_evaluate(config(30), str(tmp_path / "resumed"))
  whole, resumed, f32 = ({r["step"]: r["loss"] for r in metrics.read(w)}
                         for w in (tmp_path / "whole", tmp_path / "resumed", uninterrupted))
  assert resumed == whole and sorted(whole) == [5, 10, 15, 20, 25, 30]
  if key == "loss_chunk":
    np.testing.assert_allclose([whole[s] for s in sorted(whole)], [f32[s] for s in sorted(whole)], rtol=1e-5)
  elif key == "grad_norm":
    assert whole == {s: f32[s] for s in whole}
    assert not any("grad_norm" in r for r in metrics.read(tmp_path / "whole"))
    assert all("grad_norm" in r for r in metrics.read(uninterrupted) if "loss" in r)
  else:
    assert whole[30] != f32[30]
  for x, y in zip(jax.tree.leaves(final_params(tmp_path / "whole")), jax.tree.leaves(final_params(tmp_path / "resumed"))):
    np.testing.assert_array_equal(x, y)
