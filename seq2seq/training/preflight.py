"""The checks of a run's settings that need no data: made before anything is written, so a
setting that cannot work ends the command at once with one `error:` line naming its key."""

from __future__ import annotations

import os

from seq2seq import data, sharding
from seq2seq.errors import ConfigError
from seq2seq.model.config import ModelConfig
from seq2seq.training.config import TrainConfig

MIN_VOCAB_SIZE = 8  # pad, eos and unk, and a few pieces: sentencepiece needs more for real text (it says how many)


PATH_KEYS = ("dir", "cache_dir", "spm_model")  # config.data's folders and files


def absolute_paths(config) -> None:
  """Makes config.data's paths absolute (~ expanded), in place: the run's config.json then
  means the same from any directory (`seq2seq-eval` run elsewhere finds the data)."""
  for key in PATH_KEYS:
    value = config.data.get(key)
    if value:
      config.data[key] = os.path.abspath(os.path.expanduser(str(value)))


def check(config):
  """Raises ConfigError for the first setting that cannot work; returns the device mesh."""
  model_cfg = ModelConfig.from_config(config.model, vocab_size=config.data.vocab_size)  # names a bad model key
  TrainConfig.from_config(config.train)  # names a bad train key
  d = config.data
  if not d.get("spm_model") and d.vocab_size < MIN_VOCAB_SIZE:
    raise ConfigError(f"config.data.vocab_size={d.vocab_size} is too small for a sentencepiece model "
                      f"(at least {MIN_VOCAB_SIZE}, and enough pieces for every character of the text)")
  if d.max_len < 2:
    raise ConfigError(f"config.data.max_len={d.max_len}: a side holds at least one token and eos (2)")
  longest = max(d.max_len, (d.get("pack_length") or d.max_len) if d.get("packing") else 0)
  if model_cfg.positions == "learned" and model_cfg.max_len < longest:
    raise ConfigError(f"config.model.max_len={model_cfg.max_len}, the learned position table, is shorter than the "
                      f"rows it must cover ({longest} tokens: config.data.max_len"
                      + (", pack_length" if d.get("packing") else "") + "); positions past it would share one "
                      f"embedding. Set config.model.max_len to at least {longest}")
  batching = data.batching_config(config)
  for length in batching.lengths():
    batching.rows(length)  # max_tokens must hold batch_multiple rows of every row length
  mesh = sharding.make_mesh(config.mesh)
  dp = sharding.data_parallel_size(mesh)
  if d.batch_multiple % dp:
    raise ConfigError(f"config.data.batch_multiple={d.batch_multiple} must be a multiple of the "
                      f"{dp} devices the batch is split over (mesh data x fsdp)")
  return mesh
