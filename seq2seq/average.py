"""Checkpoint averaging: the mean of the parameters of the last K checkpoints, saved as a
checkpoint of its own that evaluation can load.

  python -m seq2seq.average --workdir=DIR --average_last=5                    # the newest 5
  python -m seq2seq.average --workdir=DIR --average_last=5 --checkpoint=best  # the 5 ending at the best

It writes DIR/average/lastK, which holds the average last made for K (its steps are recorded
in it: seq2seq-eval --average_last=K [--checkpoint=...] uses it when they are the ones asked
for, and makes it again when not). --last=K is --average_last's old name.
"""

from __future__ import annotations

import pathlib

from seq2seq import cli


def define_flags():
  """The flags of `python -m seq2seq.average`, above JAX's import: --help answers without it."""
  from absl import flags

  return (flags.DEFINE_string("workdir", None, "The run's directory.", required=True),
          flags.DEFINE_integer("average_last", None, "How many checkpoints to average (default 5)."),
          flags.DEFINE_string("checkpoint", None, "The newest of them: latest (the default), best or a step."),
          flags.DEFINE_integer("last", None, "The old name of --average_last."))


cli.answer_before_imports(__name__, define_flags)

import jax
import numpy as np
import orbax.checkpoint as ocp

from seq2seq.errors import CheckpointError, ConfigError
from seq2seq.training.checkpoint import Checkpoints, restore_layout


def newest_steps(workdir: str, last: int, end: None | str | int = None) -> list[int]:
  """The steps of the `last` checkpoints ending at `end` (None: the newest; "best": the kept
  one with the lowest validation loss; a step), oldest first; an error if there are fewer."""
  ckpts = Checkpoints(workdir, asynchronous=False)
  try:
    steps = sorted(ckpts.manager.all_steps())
    stop = ckpts.best_step() if end == "best" else end
  finally:
    ckpts.close()
  if end is not None and stop not in steps:
    what = "validated checkpoint (best)" if end == "best" else f"checkpoint {end}"
    raise CheckpointError(f"{ckpts.directory} has no {what}; it has steps {steps}")
  if stop is not None:
    steps = [s for s in steps if s <= stop]
  if len(steps) < last:
    ending = "" if end is None else f" up to {'the best, ' if end == 'best' else ''}step {stop}"
    raise CheckpointError(f"{ckpts.directory} has {len(steps)} checkpoint(s){ending}, fewer than --average_last={last} "
                          "(raise config.train.keep_checkpoints to keep more)")
  return steps[-last:]


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
  workdir, average_last, checkpoint, last = define_flags()

  def run(_):
    if last.value is not None and average_last.value is not None:
      raise ConfigError("--last is the old name of --average_last: give one of them")
    if last.value is not None:
      cli.deprecated(f"--last={last.value}", f"--average_last={last.value}")
    k = next((v for v in (average_last.value, last.value) if v is not None), 5)
    if k < 1:
      raise ConfigError(f"--average_last={k}: the number of checkpoints to average must be >= 1")
    steps = newest_steps(workdir.value, k, cli.checkpoint_choice(checkpoint.value))
    out = save_average(workdir.value, steps)
    print(f"averaged checkpoints {', '.join(map(str, steps))} into {out}")

  cli.run(run, __name__, argv)


if __name__ == "__main__":
  main()
