"""Loading a trained run for inference: its resolved config, and the parameters of a chosen
checkpoint (latest intact, a step, the best by validation loss, an average of the last K, or
several runs as an ensemble) laid out on a device mesh, with the run's tokenizer."""

from __future__ import annotations

import hashlib
import json
import os
import pathlib
import sys

import jax
import ml_collections
from flax import nnx

from seq2seq.errors import CheckpointError, ConfigError
from seq2seq import average, data, errors, metrics, sharding
from seq2seq.data.tokenizer import Tokenizer
from seq2seq.model import transformer
from seq2seq.model.config import ModelConfig
from seq2seq.training import checkpoint


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


def load_params(workdir, config, mesh, *, step: int | None = None, best: bool = False, average_last: int = 0):
  """(model config, graphdef, parameters on `mesh`, tokenizer, label) of a run's checkpoint."""
  tok_path = pathlib.Path(workdir) / data.SPM_FILE
  if not tok_path.is_file():
    raise CheckpointError(f"{tok_path} not found: the run's sentencepiece model is needed to translate")
  tok = Tokenizer.load(tok_path)
  model_cfg = ModelConfig.from_config(config.model, vocab_size=tok.vocab_size)
  run_identity = checkpoint.identity(model_cfg, tok.model_bytes)

  def init():
    return nnx.state(transformer.Transformer(model_cfg, rngs=nnx.Rngs(0)), nnx.Param)

  target, _ = sharding.init_on_mesh(init, mesh)
  graphdef = transformer.graphdef(model_cfg)
  if average_last:
    path = average.directory(workdir, average_last)
    steps = average.newest_steps(workdir, average_last)
    if average.averaged_steps(path) != steps:  # none yet, or stale
      average.save_average(workdir, steps)
    params, saved = average.load_average(path, target)
    checkpoint.check_identity(saved, run_identity, str(path))
    return model_cfg, graphdef, params, tok, f"average{average_last}-{saved['averaged_steps'][-1]}"
  try:
    return _restore(workdir, model_cfg, graphdef, target, run_identity, tok, step, best)
  except FileNotFoundError as err:  # a checkpoint deleted under us by a training run keeping only its newest
    raise CheckpointError(f"{err.filename or workdir}: deleted while being read (a run is training in {workdir}?); "
                          "run the command again") from None


def _restore(workdir, model_cfg, graphdef, target, run_identity, tok, step, best):
  ckpts = checkpoint.Checkpoints(workdir, asynchronous=False)
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
  return model_cfg, graphdef, params, tok, f"{'best' if best else 'step'}{chosen}"


def load_ensemble(workdirs: list[str], config, mesh, *, step: int | None = None, best: bool = False,
                  average_last: int = 0):
  """(model configs, graphdefs, parameters, tokenizer, label, members) of several runs decoded
  as one ensemble. The first run's checkpoint is chosen by `step`; every run's by `best` or
  `average_last` (else its latest). The runs must share the sentencepiece model."""
  cfgs, graphdefs, params, members = [], [], [], []
  tok = None
  for i, workdir in enumerate(workdirs):
    member_config = config if i == 0 else run_config(workdir)
    cfg, graphdef, p, run_tok, label = load_params(workdir, member_config, mesh, step=step if i == 0 else None,
                                                   best=best, average_last=average_last)
    if tok is not None and run_tok.model_bytes != tok.model_bytes:
      raise ConfigError(f"{pathlib.Path(workdir) / data.SPM_FILE} differs from {pathlib.Path(workdirs[0]) / data.SPM_FILE}: "
                       "ensembled runs must share one sentencepiece model")
    tok = tok or run_tok
    cfgs.append(cfg)
    graphdefs.append(graphdef)
    params.append(p)
    members.append({"workdir": str(pathlib.Path(workdir).resolve()), "checkpoint": label}
                   | metrics.training_summary(workdir))
  digest = hashlib.sha1(json.dumps([[m["workdir"], m["checkpoint"]] for m in members]).encode()).hexdigest()[:8]
  label = f"{members[0]['checkpoint']}+ensemble{len(members)}-{digest}"  # one result file per set of members
  return cfgs, graphdefs, params, tok, label, members
