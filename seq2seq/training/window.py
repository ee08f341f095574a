"""`Window`: the steps since the last logged record, as the loop runs them.

Each step adds its metrics (still on the devices: a step that does not log reads nothing
back) and its batches' host-side counts; the divergence guard reads the steps it has not
seen yet (`unchecked`), and `summary` makes the record metrics.jsonl gets.
"""

from __future__ import annotations

import dataclasses
import time

from seq2seq.training.loss import summarize


@dataclasses.dataclass
class Window:
  first_step: int  # the step of sums[0]
  sums: list = dataclasses.field(default_factory=list)  # per step: the train step's metrics, on the devices
  checked: int = 0  # how many of `sums` the divergence guard has seen
  tokens: int = 0  # target tokens (all processes)
  real: int = 0  # source and target tokens that are not padding (this process)
  slots: int = 0  # source and target token slots (this process)
  flops: float = 0.0  # model FLOPs of the steps (all processes)
  wait: float = 0.0  # seconds the loop waited for its next batch
  start: float = dataclasses.field(default_factory=time.perf_counter)  # training time counts from here

  @classmethod
  def after(cls, step: int) -> Window:
    """An empty window for the steps after `step`."""
    return cls(first_step=step + 1)

  def add(self, step_metrics: dict, counts: list[dict], wait: float) -> None:
    """One step: its metrics, the counts of the batches it consumed, the time spent waiting for them."""
    self.sums.append(step_metrics)
    for c in counts:
      self.tokens += c["tokens"]
      self.real += c["real"]
      self.slots += c["slots"]
      self.flops += c["flops"]
    self.wait += wait

  def exclude(self, seconds: float) -> None:
    """Leaves time spent on something else (an evaluation) out of the throughput."""
    self.start += seconds

  def unchecked(self) -> tuple[list[dict], int]:
    """The steps the guard has not seen, and the step number of the first; marks them seen."""
    steps, first = self.sums[self.checked:], self.first_step + self.checked
    self.checked = len(self.sums)
    return steps, first

  def summary(self, fetched: list[dict], peak: tuple[float, str], wall_time_s: float) -> dict:
    """The logged record from the steps' metrics read back (`fetched`, one per step)."""
    totals = {k: sum(float(m[k]) for m in fetched) for k in ("loss_sum", "nll_sum", "tokens", "correct")}
    elapsed = time.perf_counter() - self.start
    return summarize(totals) | {
        "learning_rate": float(fetched[-1]["learning_rate"]),
        **({"grad_norm": float(fetched[-1]["grad_norm"])} if "grad_norm" in fetched[-1] else {}),  # train.grad_norm
        "target_tokens_per_s": self.tokens / elapsed,
        "padding_fraction": 1.0 - self.real / max(self.slots, 1),
        "mfu": self.flops / elapsed / peak[0],
        "data_wait_fraction": self.wait / elapsed,  # the loop waiting for its next batch
        "peak_flops": peak[0],  # mfu's denominator: configured, nominal, or the fastest matmul measured so far
        "peak_source": peak[1],  # "config", "table:KIND DTYPE" or "measured f32 matmul"
        "wall_time_s": wall_time_s,
    }
