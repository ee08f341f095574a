"""The divergence guard: decides when a training step went bad (NaN/inf loss or gradient
norm, or a loss spike over `spike_factor` times its running mean), and rolls training back
to the newest intact checkpoint with finite parameters."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp

from seq2seq.errors import TrainingDiverged
from seq2seq.training.state import TrainState


class DivergenceGuard:
  def __init__(self, *, spike_factor: float = 0.0, ema_decay: float = 0.9, warmup_steps: int = 10):
    self.spike_factor, self.ema_decay, self.warmup_steps = spike_factor, ema_decay, warmup_steps
    self.mean, self.seen = None, 0

  def check(self, loss: float, grad_norm: float) -> str | None:
    """The reason this step diverged, or None (then the step joins the running mean)."""
    if not math.isfinite(loss) or not math.isfinite(grad_norm):
      return f"non-finite loss {loss} or gradient norm {grad_norm}"
    if self.spike_factor and self.seen >= self.warmup_steps and loss > self.spike_factor * self.mean:
      return f"loss {loss:.4g} over {self.spike_factor} x its running mean {self.mean:.4g}"
    self.mean = loss if self.mean is None else self.ema_decay * self.mean + (1 - self.ema_decay) * loss
    self.seen += 1
    return None

  def first_divergence(self, steps, first_step: int) -> tuple[str | None, int]:
    """Checks consecutive steps, given as (loss sum, tokens, gradient norm) from `first_step`
    on, in order: (reason, step) of the first that diverged, or (None, 0)."""
    for i, (loss_sum, tokens, grad_norm) in enumerate(steps):
      reason = self.check(float(loss_sum) / max(float(tokens), 1.0), float(grad_norm))
      if reason:
        return reason, first_step + i
    return None, 0


class Rollback:
  """Rolls a diverged run back to its newest intact checkpoint with finite parameters, at a
  lower learning-rate scale (`lr_factor` per rollback, compounding); the data that led there
  is skipped. Stops with TrainingDiverged after `max_rollbacks`."""

  def __init__(self, *, max_rollbacks: int, lr_factor: float, ckpts, run_identity: dict, shardings, writer, say):
    self.max_rollbacks, self.lr_factor = max_rollbacks, lr_factor
    self.ckpts, self.run_identity, self.shardings, self.writer, self.say = ckpts, run_identity, shardings, writer, say
    self.count = 0  # rollbacks so far in this process

  def __call__(self, state: TrainState, *, bad_step: int, detected_at: int, reason: str) -> TrainState:
    """The last good checkpoint's state with the lowered scale; logs a `rollback` event at
    `bad_step`, the step that diverged (found at step `detected_at`)."""
    self.count += 1
    if self.count > self.max_rollbacks:
      raise TrainingDiverged(f"training diverged {self.count} times, the last at step {bad_step} ({reason}); "
                             "stopping. Lower config.train.learning_rate or see metrics.jsonl")
    self.ckpts.wait()
    if self.ckpts.latest_step() is None:
      raise TrainingDiverged(f"training diverged at step {bad_step} ({reason}) before any checkpoint was saved; lower "
                             "config.train.learning_rate, or save a checkpoint sooner (config.train.checkpoint_every)")
    lr_scale = float(state.lr_scale) * self.lr_factor
    restored = restore_finite(state, self.ckpts, self.run_identity, self.writer, bad_step)
    state = restored.replace(lr_scale=jax.device_put(jnp.float32(lr_scale), self.shardings.lr_scale))
    event = {"event": "rollback", "reason": reason, "to_step": int(state.step), "lr_scale": lr_scale,
             "detected_at": detected_at}
    self.writer.write(bad_step, event)
    self.say(f"step {bad_step}: {reason}; rolled back to step {event['to_step']}, lr scale {lr_scale}")
    return state


def restore_finite(state: TrainState, ckpts, run_identity, writer, step) -> TrainState:
  """The newest intact checkpoint whose parameters are all finite; older ones when a
  restored state is itself bad (each skipped one is a `restore_fallback` event)."""
  bad = []
  while True:
    saved, _, restored_step = ckpts.restore(state.saved(), run_identity, skip=bad)
    restored = TrainState.from_saved(saved)
    finite = _finite(restored)
    skipped = ckpts.fallbacks + ([] if finite else [{"step": restored_step, "problem": "non-finite parameters"}])
    for f in skipped:
      writer.write(step, {"event": "restore_fallback", "damaged_step": f["step"], "problem": f["problem"]})
    ckpts.quarantine([f["step"] for f in skipped])
    if finite:
      return restored
    bad += [f["step"] for f in skipped]


def _finite(state: TrainState) -> bool:
  leaves = [x for x in jax.tree.leaves(state.params) if jnp.issubdtype(x.dtype, jnp.floating)]
  return bool(jax.device_get(jnp.all(jnp.stack([jnp.all(jnp.isfinite(x)) for x in leaves]))))
