"""Checkpoints in DIR/checkpoints with orbax: the train state (params, optimizer state,
step), the data iterator's position and the run's identity (model settings, vocabulary),
saved asynchronously. Orbax writes each step to a temporary directory and renames it when
complete, so restore only ever sees finished checkpoints. Nothing is pickled.
"""

from __future__ import annotations

import dataclasses
import hashlib
import pathlib
import signal

import orbax.checkpoint as ocp
from orbax.checkpoint.checkpoint_managers import preservation_policy as policies

from seq2seq import metrics
from seq2seq.config import ModelConfig


# Model settings that choose how the same function is computed, not what the parameters mean:
# a run may resume or be evaluated with another value (e.g. on another platform).
NOT_IDENTITY = ("attention_impl",)


def identity(model_cfg: ModelConfig, spm_model: bytes) -> dict:
  """What must match between a checkpoint and the run restoring it."""
  model = {k: v for k, v in dataclasses.asdict(model_cfg).items() if k not in NOT_IDENTITY}
  return {"model": model, "spm_sha256": hashlib.sha256(spm_model).hexdigest()}


def check_identity(saved: dict, current: dict, where: str) -> None:
  """Raises a ValueError listing every setting that differs from the checkpoint's."""
  diffs = [f"config.model.{k}: checkpoint has {v!r}, config has {current['model'].get(k)!r}"
           for k, v in saved["model"].items() if current["model"].get(k) != v]
  if saved["spm_sha256"] != current["spm_sha256"]:
    diffs.append("the sentencepiece model (vocabulary) differs from the one the checkpoint was trained with")
  if diffs:
    raise ValueError(f"{where} does not match this run's config; restoring it would give garbage:\n  "
                     + "\n  ".join(diffs))


class Checkpoints:
  """Saves when asked; keeps the last `keep` and the one with the
  lowest validation loss; restores the latest."""

  def __init__(self, workdir: str, *, keep: int = 3, asynchronous: bool = True):
    self.workdir = pathlib.Path(workdir).resolve()
    self.directory = self.workdir / "checkpoints"
    keep_policy = policies.AnyPreservationPolicy([
        policies.LatestN(n=keep),
        policies.BestN(get_metric_fn=lambda m: -m["val_loss"], n=1, keep_checkpoints_without_metrics=False)])
    options = ocp.CheckpointManagerOptions(preservation_policy=keep_policy, create=True,
                                           enable_async_checkpointing=asynchronous)
    self.manager = ocp.CheckpointManager(self.directory, options=options)

  def latest_step(self) -> int | None:
    return self.manager.latest_step()

  def best_step(self) -> int | None:
    """The kept checkpoint with the lowest validation loss in metrics.jsonl."""
    kept = set(self.manager.all_steps())
    scored = [(r["val_loss"], r["step"]) for r in metrics.read(self.workdir) if "val_loss" in r and r["step"] in kept]
    return min(scored)[1] if scored else None

  def save(self, step: int, state, data_state: dict, run_identity: dict, val_loss: float | None = None) -> None:
    """Saves asynchronously; `val_loss` (when validation ran at this step) ranks it for "best"."""
    self.manager.save(step, args=ocp.args.Composite(
        state=ocp.args.StandardSave(state), data=ocp.args.JsonSave(data_state),
        identity=ocp.args.JsonSave(run_identity)), metrics=None if val_loss is None else {"val_loss": val_loss},
        force=True)

  def restore(self, target_state, run_identity: dict, step: int | None = None):
    """(state, data_state) of `step` (default: the latest), laid out like `target_state`."""
    step = self.latest_step() if step is None else step
    where = self.directory / str(step)
    saved = self.manager.restore(step, args=ocp.args.Composite(identity=ocp.args.JsonRestore()))
    check_identity(saved.identity, run_identity, str(where))
    restored = self.manager.restore(step, args=ocp.args.Composite(
        state=ocp.args.StandardRestore(target_state), data=ocp.args.JsonRestore()))
    return restored.state, restored.data

  def restore_params(self, target_params, run_identity: dict, step: int):
    """Only the parameters of `step` (no optimizer state), laid out like `target_params`."""
    saved = self.manager.restore(step, args=ocp.args.Composite(identity=ocp.args.JsonRestore()))
    check_identity(saved.identity, run_identity, str(self.directory / str(step)))
    target = {"params": target_params}
    restored = self.manager.restore(step, args=ocp.args.Composite(state=ocp.args.PyTreeRestore(
        target, restore_args=ocp.checkpoint_utils.construct_restore_args(target), partial_restore=True)))
    return restored.state["params"]

  def wait(self) -> None:
    self.manager.wait_until_finished()

  def close(self) -> None:
    self.manager.wait_until_finished()
    self.manager.close()


class StopSignal:
  """Turns SIGTERM / SIGINT (preemption, Ctrl-C) into a flag the loop checks after each step."""

  def __init__(self):
    self.received: int | None = None
    self._previous = {}

  def __enter__(self):
    for sig in (signal.SIGTERM, signal.SIGINT):
      self._previous[sig] = signal.signal(sig, self._handle)
    return self

  def _handle(self, signum, _frame):
    self.received = signum

  def __exit__(self, *exc):
    for sig, handler in self._previous.items():
      signal.signal(sig, handler)
