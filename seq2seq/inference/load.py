"""Loading a trained run for inference: its resolved config, and the parameters of a chosen
checkpoint (latest intact, a step, the best by validation loss, an average of the K ending there, or
several runs as an ensemble) laid out on a device mesh, with the run's tokenizer."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import pathlib
import sys
from typing import Any, Literal

import jax
import ml_collections
from flax import nnx

from seq2seq.errors import CheckpointError, ConfigError
from seq2seq import average, data, errors, metrics, sharding
from seq2seq.data.tokenizer import Tokenizer
from seq2seq.model import transformer
from seq2seq.model.config import ModelConfig
from seq2seq.training import checkpoint as checkpoints


@dataclasses.dataclass(frozen=True)
class Checkpoint:
  """Which parameters were loaded: checkpoint `step` ("step"), the kept one with the lowest
  validation loss ("best", at `step`) or the average of the last `averaged` ("average", the
  newest at `step`); an ensemble's (`members` runs, `digest` naming them) is its first run's."""

  kind: Literal["step", "best", "average"]
  step: int
  averaged: int = 0
  members: int = 1
  digest: str = ""

  @property
  def label(self) -> str:
    """How result files, tables and exports name it: step60, best40, average5-20000, and for
    an ensemble e.g. step40+ensemble2-1a2b3c4d."""
    name = f"average{self.averaged}-{self.step}" if self.kind == "average" else f"{self.kind}{self.step}"
    return name + (f"+ensemble{self.members}-{self.digest}" if self.digest else "")


@dataclasses.dataclass(frozen=True)
class Loaded:
  """A run's model ready to decode. An ensemble's has a list of model configs, graphdefs and
  parameters, one per run, and `members`: each run's workdir, checkpoint label and summary."""

  model_cfg: ModelConfig | list[ModelConfig]
  graphdef: Any
  params: Any  # on the mesh
  tokenizer: Tokenizer
  checkpoint: Checkpoint
  members: list[dict] | None = None


def run_config(workdir: str | os.PathLike) -> ml_collections.ConfigDict:
  """The resolved config the run wrote at start; $SEQ2SEQ_DATA_DIR overrides its data folder."""
  path = pathlib.Path(workdir) / "config.json"
  if not path.is_file():
    raise ConfigError(f"{path} not found: is {workdir} a training directory ({errors.command('train')} "
                      "--workdir=...)?")
  try:
    config = ml_collections.ConfigDict(json.loads(path.read_text(encoding="utf-8")))
  except (json.JSONDecodeError, UnicodeDecodeError) as err:
    raise ConfigError(f"{path}: not a JSON config ({err}); the training run writes it at start: rerun its "
                      "command to write it again") from None
  if os.environ.get("SEQ2SEQ_DATA_DIR"):
    config.data.dir = os.path.abspath(os.path.expanduser(os.environ["SEQ2SEQ_DATA_DIR"]))
  return config


def load_params(workdir, config, mesh, *, checkpoint: None | str | int = None, average_last: int = 0):
  """The model of a run's checkpoint (a step, "best", else (None) the newest intact one), or with
  `average_last` K the mean of the K checkpoints ending there; its parameters laid out on `mesh`."""
  best, step = checkpoint == "best", checkpoint if isinstance(checkpoint, int) else None
  tok_path = pathlib.Path(workdir) / data.SPM_FILE
  if not tok_path.is_file():
    raise CheckpointError(f"{tok_path} not found: the run's sentencepiece model is needed to translate")
  tok = Tokenizer.load(tok_path)
  model_cfg = ModelConfig.from_config(config.model, vocab_size=tok.vocab_size)
  run_identity = checkpoints.identity(model_cfg, tok.model_bytes)

  def init():
    return nnx.state(transformer.Transformer(model_cfg, rngs=nnx.Rngs(0)), nnx.Param)

  target, _ = sharding.init_on_mesh(init, mesh)
  graphdef = transformer.graphdef(model_cfg)
  if average_last:
    path = average.directory(workdir, average_last)
    steps = average.newest_steps(workdir, average_last, "best" if best else step)
    if average.averaged_steps(path) != steps:  # none yet, or stale
      average.save_average(workdir, steps)
    params, saved = average.load_average(path, target)
    checkpoints.check_identity(saved, run_identity, str(path))
    return Loaded(model_cfg, graphdef, params, tok, Checkpoint("average", saved["averaged_steps"][-1], average_last))
  try:
    return _restore(workdir, model_cfg, graphdef, target, run_identity, tok, step, best)
  except FileNotFoundError as err:  # a checkpoint deleted under us by a training run keeping only its newest
    raise CheckpointError(f"{err.filename or workdir}: deleted while being read (a run is training in {workdir}?); "
                          "run the command again") from None


def _restore(workdir, model_cfg, graphdef, target, run_identity, tok, step, best):
  ckpts = checkpoints.Checkpoints(workdir, asynchronous=False)
  try:
    chosen = ckpts.best_step() if best else step  # None: the newest intact one
    if (best or step is not None) and (chosen is None or chosen not in ckpts.manager.all_steps()):
      what = "a validated checkpoint (best)" if best else f"checkpoint {step}"
      raise CheckpointError(f"{ckpts.directory} has no {what}; it has steps {list(ckpts.manager.all_steps())}")
    if not ckpts.manager.all_steps():
      raise CheckpointError(f"{ckpts.directory} has no checkpoint")
    params, chosen = ckpts.restore_params(target, run_identity, chosen)
    if ckpts.fallbacks and jax.process_index() == 0:
      skipped = "; ".join(f"{f['step']} ({f['problem']})" for f in ckpts.fallbacks)
      print(f"warning: damaged checkpoints skipped: {skipped}; evaluating checkpoint {chosen}, the newest intact one",
            file=sys.stderr, flush=True)
  finally:
    ckpts.close()
  return Loaded(model_cfg, graphdef, params, tok, Checkpoint("best" if best else "step", chosen))


def load_ensemble(workdirs: list[str], config, mesh, *, checkpoint: None | str | int = None,
                  average_last: int = 0) -> Loaded:
  """Several runs decoded as one ensemble (model configs, graphdefs and parameters listed per
  run). The first run's checkpoint is `checkpoint` (as load_params takes it); the others' are
  their best with "best", else their newest; each averaged with `average_last`. The runs must
  share the sentencepiece model."""
  runs, members = [], []
  for i, workdir in enumerate(workdirs):
    member_config = config if i == 0 else run_config(workdir)
    run = load_params(workdir, member_config, mesh, average_last=average_last,
                      checkpoint=checkpoint if i == 0 or checkpoint == "best" else None)
    if runs and run.tokenizer.model_bytes != runs[0].tokenizer.model_bytes:
      raise ConfigError(f"{pathlib.Path(workdir) / data.SPM_FILE} differs from {pathlib.Path(workdirs[0]) / data.SPM_FILE}: "
                       "ensembled runs must share one sentencepiece model")
    runs.append(run)
    members.append({"workdir": str(pathlib.Path(workdir).resolve()), "checkpoint": run.checkpoint.label}
                   | metrics.training_summary(workdir))
  digest = hashlib.sha1(json.dumps([[m["workdir"], m["checkpoint"]] for m in members]).encode()).hexdigest()[:8]
  chosen = dataclasses.replace(runs[0].checkpoint, members=len(members), digest=digest)  # one result file per set
  return Loaded([r.model_cfg for r in runs], [r.graphdef for r in runs], [r.params for r in runs], runs[0].tokenizer,
                chosen, members)
