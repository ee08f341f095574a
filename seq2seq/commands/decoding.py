"""What seq2seq-eval and seq2seq-translate share: the flags that choose the model (one
checkpoint, --checkpoint=latest|best|STEP as export and average name it too; an average of
the K ending there; an ensemble of runs) and the search (beam, length
limits, batch), and the code that turns them into a Translator. Either command's --help
lists them."""

from __future__ import annotations

import contextlib
import os
import pathlib
import stat
from typing import TYPE_CHECKING

from absl import flags

from seq2seq import cli
from seq2seq.errors import ConfigError
from seq2seq.inference import settings

if TYPE_CHECKING:  # imported where a Translator is made (JAX's 4 s): --help and a bad flag answer at once
  from seq2seq.inference import load
  from seq2seq.inference.translate import Translator

CHECKPOINT = flags.DEFINE_string("checkpoint", None, cli.CHECKPOINT_HELP)
AVERAGE_LAST = flags.DEFINE_integer("average_last", 0, cli.AVERAGE_LAST_HELP)
ENSEMBLE = flags.DEFINE_multi_string("ensemble", None, "Also load this run (repeatable) and decode the ensemble: the "
                                     "mean of the models' probabilities. Runs must share the sentencepiece model.")
BEAM_SIZE = flags.DEFINE_integer("beam_size", None, "Beam size (default: the config's eval.beam_size); 1 = greedy.")
ALPHA = flags.DEFINE_float("alpha", None, "Length penalty exponent (default: the config's eval.alpha).")
MAX_LEN_A = flags.DEFINE_float("max_len_a", None, "Max output length = a * source length + b (default: eval.max_len_a).")
MAX_LEN_B = flags.DEFINE_integer("max_len_b", None, "Max output length = a * source length + b (default: eval.max_len_b).")
BATCH_SIZE = flags.DEFINE_integer("batch_size", None, "Sentences per batch (default: the config's eval.batch_size).")
WORKERS = flags.DEFINE_integer("workers", None, "Batches decoded at once (default: 2 on a one-process CPU run, "
                               "where one search keeps the cores partly idle; 1 elsewhere).")
MAX_PROGRAMS = flags.DEFINE_integer("max_programs", None, "Compiled searches per test set or input (default: the "
                                    "config's eval.max_programs, 3); 0: one per source-length bucket.")
QUIET = flags.DEFINE_bool("quiet", False, "No progress lines on stderr (warnings and errors still show).")


def overrides() -> dict:
  """The search flags given (None: the config's eval setting)."""
  return dict(beam_size=BEAM_SIZE.value, alpha=ALPHA.value, max_len_a=MAX_LEN_A.value, max_len_b=MAX_LEN_B.value,
              batch_size=BATCH_SIZE.value, workers=WORKERS.value, max_programs=MAX_PROGRAMS.value)


def check_flags() -> None:
  """The model and search flags given, checked before anything loads: a ConfigError names
  the flag (seq2seq/inference/settings.py holds what each accepts)."""
  for key, value in overrides().items():
    if value is not None:
      settings.check(key, value, f"--{key}")
  if AVERAGE_LAST.value < 0:
    raise ConfigError(f"--average_last={AVERAGE_LAST.value}: the number of checkpoints to average must be >= 0")
  cli.checkpoint_choice(CHECKPOINT.value)


def check_output(path: str, flag: str, *, reads: dict[str, str | None] | None = None,
                 keep: dict[str, str | None] | None = None) -> None:
  """An output file that can be written once the work is done, checked before it starts: not
  a folder, in a folder that exists (or can be made) and can be written; not one of the
  files the command reads (`reads`: {flag: path}); not an existing file of a run or an
  exported model (`keep`: {folder: the subfolder where results may go, or None}). A device,
  a named pipe or /dev/fd/N is written to as it is (seq2seq.files.write_output)."""
  if not path:
    raise ConfigError(f"{flag} is empty; give a file's path, or - for stdout")
  with contextlib.suppress(OSError):
    if not stat.S_ISREG(os.stat(path).st_mode) and not stat.S_ISDIR(os.stat(path).st_mode):
      return  # a device, a named pipe, >(command): nothing there to replace
  target = pathlib.Path(os.path.realpath(path))
  if target.is_dir():
    raise ConfigError(f"{flag}={path} is a folder; give a file's path (the translations are written there)")
  for other_flag, other in (reads or {}).items():
    if other and other != "-" and target.exists() and os.path.exists(other) and os.path.samefile(target, other):
      raise ConfigError(f"{flag}={path} is the file {other_flag}={other} reads; give another output file")
  for folder, results in (keep or {}).items():
    if folder and target.is_relative_to(os.path.realpath(folder)) and (results is None or (
        target.exists() and not target.is_relative_to(os.path.realpath(os.path.join(folder, results))))):
      where = "the exported model's folder" if results is None else f"a file of the run (results may go in {results}/)"
      raise ConfigError(f"{flag}={path} is in {folder}, {where}; give a path outside it")
  parent = next((p for p in (target.parent, *target.parents) if p.exists()), None)
  if parent is None or not parent.is_dir():
    raise ConfigError(f"{flag}={path}: {parent} is not a folder")
  if not os.access(parent, os.W_OK | os.X_OK):
    raise ConfigError(f"{flag}={path}: cannot write in {parent} (permission denied)")


def load_run(workdir: str, config, mesh, checkpoint: None | str | int = None) -> load.Loaded:
  """A run's chosen checkpoint (None: the newest intact one, "best" or a step; --average_last
  averages the K ending there), with the --ensemble runs if given (each a different run)."""
  from seq2seq.inference import load

  members = [workdir, *(ENSEMBLE.value or [])]
  seen = {}
  for flag, member in zip(["--workdir", *["--ensemble"] * (len(members) - 1)], members):
    key = os.path.realpath(member)
    if key in seen:
      raise ConfigError(f"{flag}={member} is the run {seen[key]} names already: an ensemble's members are different "
                        "runs (to weigh one run more, train another seed)")
    seen[key] = f"{flag}={member}"
  if ENSEMBLE.value:
    return load.load_ensemble(members, config, mesh, checkpoint=checkpoint, average_last=AVERAGE_LAST.value)
  return load.load_params(workdir, config, mesh, checkpoint=checkpoint, average_last=AVERAGE_LAST.value)


def translator_for_run(workdir: str, config=None, checkpoint: None | str | int = None) -> tuple[Translator, load.Loaded]:
  """A Translator holding the run's chosen model(s) (`checkpoint`: see load_run), searching
  as the flags say, and what was loaded (the checkpoint, an ensemble's members). `config`:
  the run's (read from the workdir when None)."""
  from seq2seq import sharding
  from seq2seq.inference import load
  from seq2seq.inference.translate import Translator, search_settings

  config = load.run_config(workdir) if config is None else config
  mesh = sharding.make_mesh(config.mesh)
  loaded = load_run(workdir, config, mesh, checkpoint)
  translator = Translator(loaded.model_cfg, loaded.graphdef, loaded.tokenizer, mesh, params=loaded.params,
                          **search_settings(config.eval, **overrides()))
  translator.checkpoint, translator.config = loaded.checkpoint.label, config
  return translator, loaded


def translator_for_export(model_dir: str) -> Translator:
  """A Translator holding an exported model (`python -m seq2seq.export`), searching as the flags say."""
  from seq2seq.inference.translate import Translator

  if ENSEMBLE.value or AVERAGE_LAST.value or CHECKPOINT.value is not None:
    raise ConfigError("--checkpoint, --average_last and --ensemble choose among a run's checkpoints (--workdir); an "
                      "exported --model holds one set of parameters")
  return Translator.from_pretrained(model_dir, compilation_cache=flags.FLAGS.compilation_cache, **overrides())
