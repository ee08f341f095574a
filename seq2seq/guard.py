"""The divergence guard: decides when a training step went bad (NaN/inf loss or gradient
norm, or a loss spike over `spike_factor` times its running mean)."""

from __future__ import annotations

import math


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
