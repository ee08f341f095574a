"""Checkpoint averaging: the mean of the parameters of the last k checkpoints, saved as a
checkpoint of its own that evaluation can load.

  python -m seq2seq.average --workdir=DIR --last=5      # writes DIR/average/last5
"""

from __future__ import annotations

import pathlib

from seq2seq import cli

cli.version_before_imports(__name__)

import jax
import numpy as np
import orbax.checkpoint as ocp

from seq2seq.errors import CheckpointError
from seq2seq.training.checkpoint import Checkpoints, restore_layout


def newest_steps(workdir: str, last: int) -> list[int]:
  """The steps of the newest `last` checkpoints (an error if there are fewer)."""
  ckpts = Checkpoints(workdir, asynchronous=False)
  try:
    steps = sorted(ckpts.manager.all_steps())[-last:]
  finally:
    ckpts.close()
  if len(steps) < last:
    raise CheckpointError(f"{ckpts.directory} has {len(steps)} checkpoint(s), fewer than --last={last} "
                     "(raise config.train.keep_checkpoints to keep more)")
  return steps


def averaged_steps(path: str | pathlib.Path) -> list[int] | None:
  """The steps an averaged checkpoint at `path` was made from (None if there is none)."""
  path = pathlib.Path(path).resolve()
  if not path.is_dir():
    return None
  restored = ocp.Checkpointer(ocp.CompositeCheckpointHandler()).restore(
      path, args=ocp.args.Composite(identity=ocp.args.JsonRestore()))
  return list(restored.identity.get("averaged_steps", []))


def average_params(workdir: str, steps: list[int]) -> tuple[dict, dict]:
  """(mean parameters, the run identity) of the checkpoints at `steps` (see newest_steps)."""
  ckpts = Checkpoints(workdir, asynchronous=False)
  try:
    total, identity = None, None
    for step in steps:
      restored = ckpts.manager.restore(step, args=ocp.args.Composite(
          state=ocp.args.StandardRestore(), identity=ocp.args.JsonRestore()))
      params = jax.tree.map(lambda x: np.asarray(x, np.float64), restored.state["params"])
      total = params if total is None else jax.tree.map(np.add, total, params)
      identity = restored.identity
  finally:
    ckpts.close()
  mean = jax.tree.map(lambda x: (x / len(steps)).astype(np.float32), total)
  return mean, identity


def directory(workdir: str | pathlib.Path, k: int) -> pathlib.Path:
  """Where the mean of the newest `k` checkpoints is kept: DIR/average/lastK."""
  return pathlib.Path(workdir).resolve() / "average" / f"last{k}"


def save_average(workdir: str, steps: list[int]) -> pathlib.Path:
  """Writes the mean of the checkpoints at `steps` (the newest ones) to DIR/average/lastK."""
  params, identity = average_params(workdir, steps)
  out = directory(workdir, len(steps))
  checkpointer = ocp.Checkpointer(ocp.CompositeCheckpointHandler())
  checkpointer.save(out, args=ocp.args.Composite(
      state=ocp.args.StandardSave({"params": params}),
      identity=ocp.args.JsonSave(identity | {"averaged_steps": steps})), force=True)
  return out


def load_average(path: str | pathlib.Path, target_params=None) -> tuple[dict, dict]:
  """(parameters, identity) of an averaged checkpoint; laid out like `target_params` if given
  (an average of checkpoints with separate q/k/v attention weights is fused: `restore_layout`)."""
  path, checkpointer = pathlib.Path(path).resolve(), ocp.Checkpointer(ocp.CompositeCheckpointHandler())
  identity = checkpointer.restore(path, args=ocp.args.Composite(identity=ocp.args.JsonRestore())).identity

  def read(target):
    return checkpointer.restore(path, args=ocp.args.Composite(state=ocp.args.StandardRestore(target))).state
  params = read(None) if target_params is None else restore_layout(read, path / "state", {"params": target_params})
  return params["params"], identity


def main(argv=None) -> None:
  from absl import flags

  workdir = flags.DEFINE_string("workdir", None, "The run's directory.", required=True)
  last = flags.DEFINE_integer("last", 5, "How many of the newest checkpoints to average.")

  def run(_):
    try:
      out = save_average(workdir.value, newest_steps(workdir.value, last.value))
    except ValueError as e:
      cli.fail(str(e))
    print(f"averaged the last {last.value} checkpoints into {out}")

  cli.run(run, __name__, argv)


if __name__ == "__main__":
  main()
