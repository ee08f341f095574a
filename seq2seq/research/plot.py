"""Plots of a run from its metrics.jsonl: training/validation loss, learning rate,
validation BLEU and throughput over steps, one PNG each.

  python -m seq2seq.research.plot DIR [--out=DIR/plots]
"""

from __future__ import annotations

import pathlib

from seq2seq.errors import DataError
from seq2seq import metrics

# file name -> (title, y label, [(metrics key, legend label)])
PANELS = {
    "loss": ("Cross entropy (no label smoothing)", "nats / target token",
             [("nll", "training (with dropout)"), ("val_nll", "validation")]),
    "learning_rate": ("Learning rate", "learning rate", [("learning_rate", "learning rate")]),
    "bleu": ("Validation BLEU", "sacreBLEU", [("val_bleu", "BLEU"), ("val_chrf", "chrF")]),
    "throughput": ("Throughput", "target tokens / s", [("target_tokens_per_s", "tokens/s")]),
}


def series(records: list[dict], key: str) -> tuple[list[int], list[float]]:
  points = [(r["step"], r[key]) for r in records if key in r]
  return [s for s, _ in points], [v for _, v in points]


def plot(workdir: str | pathlib.Path, out: str | pathlib.Path | None = None) -> list[pathlib.Path]:
  """Writes one PNG per panel that has data; returns their paths."""
  import matplotlib

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  records = metrics.read(workdir)
  if not records:
    raise DataError(f"{pathlib.Path(workdir) / 'metrics.jsonl'} is missing or empty")
  out = pathlib.Path(out) if out else pathlib.Path(workdir) / "plots"
  out.mkdir(parents=True, exist_ok=True)
  written = []
  for name, (title, ylabel, keys) in PANELS.items():
    lines = [(label, *series(records, key)) for key, label in keys]
    lines = [line for line in lines if line[1]]
    if not lines:
      continue
    fig, ax = plt.subplots(figsize=(6, 3.5), dpi=100)
    for label, steps, values in lines:
      ax.plot(steps, values, marker="o" if len(steps) < 30 else None, markersize=3, label=label)
    ax.set(title=title, xlabel="step", ylabel=ylabel)
    ax.grid(alpha=0.3)
    if len(lines) > 1:
      ax.legend()
    fig.tight_layout()
    path = out / f"{name}.png"
    fig.savefig(path)
    plt.close(fig)
    written.append(path)
  return written


def main(argv: list[str] | None = None) -> None:
  from absl import app, flags

  from seq2seq import cli

  out = flags.DEFINE_string("out", None, "Output folder (default: WORKDIR/plots).")

  def run(args):
    if len(args) != 2:
      raise app.UsageError("give one WORKDIR: python -m seq2seq.research.plot WORKDIR [--out=DIR]")
    for path in plot(args[1], out.value):
      print(path)

  cli.run(run, __name__, argv)


if __name__ == "__main__":
  main()
