"""The training settings as a frozen dataclass, checked and built once from `config.train`.

Every key is set in configs/default.py (the one place for their defaults, with a comment
each); the loop, the optimizer and the divergence guard read this object, never the dict.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

from seq2seq.compilation import KERNEL_IMPLEMENTATIONS
from seq2seq.errors import ConfigError

TRANSFER_GUARDS = ("allow", "log", "disallow")


@dataclasses.dataclass(frozen=True)
class TrainConfig:
  """`config.train`: how long, how often, the optimizer, the divergence guard."""

  steps: int
  checkpoint_every: int
  keep_checkpoints: int
  log_every: int
  eval_every: int  # 0: never
  learning_rate: float
  schedule: str  # seq2seq.training.optimizer.SCHEDULES
  warmup_steps: int
  end_lr_fraction: float
  label_smoothing: float
  loss_chunk: int  # target positions projected and scored at a time; 0: all
  loss_impl: str  # compilation.KERNEL_IMPLEMENTATIONS (seq2seq/training/loss_kernel.py)
  adam_b1: float
  adam_b2: float
  adam_eps: float
  weight_decay: float
  adam_mu_dtype: str  # "": the parameters' dtype
  grad_clip_norm: float  # 0: off
  grad_norm: bool  # the gradient's global norm each step (logged, guarded); False: not computed
  accum_steps: int  # micro-batches per update
  rng_impl: str  # dropout key PRNG
  peak_flops: float  # MFU's denominator; 0: the device's nominal peak (seq2seq.model.flops)
  guard_max_rollbacks: int  # 0: no divergence guard
  guard_spike_factor: float  # 0: only non-finite values count
  guard_lr_factor: float  # learning-rate multiplier applied at each rollback
  inject_nan_at_step: int  # testing: this step's gradients are NaN (-1: none)
  transfer_guard: str  # TRANSFER_GUARDS: device reads on steps that neither log, evaluate nor save
  allow_data_change: bool  # resume although the data settings differ from the checkpoint's

  def __post_init__(self):
    for key in ("steps", "checkpoint_every", "log_every", "keep_checkpoints", "accum_steps"):
      if int(getattr(self, key)) < 1:
        raise ConfigError(f"config.train.{key} must be at least 1, got {getattr(self, key)}")
    if int(self.loss_chunk) < 0:
      raise ConfigError(f"config.train.loss_chunk must be 0 (all positions at once) or positive, got {self.loss_chunk}")
    if self.loss_impl not in KERNEL_IMPLEMENTATIONS:
      raise ConfigError(f"config.train.loss_impl must be one of {KERNEL_IMPLEMENTATIONS}, got {self.loss_impl!r}")
    if int(self.eval_every) < 0:
      raise ConfigError(f"config.train.eval_every must be 0 (off) or positive, got {self.eval_every}")
    for field in dataclasses.fields(self):  # a NaN or infinite rate trains nothing but NaN
      value = getattr(self, field.name)
      if isinstance(value, float) and not math.isfinite(value):
        raise ConfigError(f"config.train.{field.name}={value} is not a finite number")
    if self.learning_rate <= 0:
      raise ConfigError(f"config.train.learning_rate must be positive, got {self.learning_rate}")
    if self.transfer_guard not in TRANSFER_GUARDS:
      raise ConfigError(f"config.train.transfer_guard must be one of {TRANSFER_GUARDS}, got {self.transfer_guard!r}")

  @classmethod
  def from_config(cls, train_cfg: Any) -> TrainConfig:
    """Builds from the `config.train` section (a ConfigDict or dict); unknown and missing keys
    are errors (a config starts from configs/default.py, which sets them all)."""
    values = dict(train_cfg.items())
    known = [f.name for f in dataclasses.fields(cls)]
    unknown = sorted(set(values) - set(known))
    if unknown:
      raise ConfigError(f"unknown key(s) config.train.{', config.train.'.join(unknown)}; known: {sorted(known)}")
    missing = [k for k in known if k not in values]
    if missing:
      raise ConfigError(f"config.train lacks {', '.join(missing)}: start the config from configs/default.py "
                        "(default.get_config()), which sets every key")
    return cls(**values)
