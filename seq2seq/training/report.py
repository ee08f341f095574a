"""What a training run prints (process 0 only): a summary of the run at its start, then a
progress bar with loss, tokens/s and ETA on a terminal, or one line per logged step off a
terminal (a log file, a cluster job), and a line per evaluation and checkpoint. Library logs
stay quiet unless --log_level asks for them (seq2seq/cli.py)."""

from __future__ import annotations

import sys

import jax

from seq2seq.model import transformer
from seq2seq.model.config import ModelConfig


def progress(total: int, initial: int):
  from tqdm import tqdm

  return tqdm(total=total, initial=initial, unit="step", dynamic_ncols=True,
              disable=not sys.stderr.isatty() or jax.process_index() != 0)


def say(bar, text: str) -> None:
  """A line above the progress bar (or on its own off a terminal), from process 0."""
  if jax.process_index() == 0:
    bar.write(text)
    sys.stdout.flush()


def summary(config, model_cfg: ModelConfig, mesh, workdir: str) -> str:
  """One paragraph: the model, the data, the schedule and where it runs."""
  c, d, t = model_cfg, config.data, config.train
  devices = jax.devices()
  return (f"model: {transformer.count_params(c) / 1e6:.1f}M parameters, d_model {c.d_model}, "
          f"{c.num_encoder_layers}+{c.num_decoder_layers} layers, {c.norm_position}-{c.norm}, {c.activation}, "
          f"{c.positions} positions, vocabulary {c.vocab_size}, {c.dtype}\n"
          f"data: {d.source} {d.src_lang}->{d.tgt_lang}, {d.max_tokens} tokens per batch"
          f"{', packed' if d.get('packing') else ''}\n"
          f"training: {t.steps} steps, {t.get('schedule', '')} schedule, peak lr {t.learning_rate:g}, "
          f"checkpoint every {t.checkpoint_every}, eval every {t.eval_every or 'never'}\n"
          f"devices: {len(devices)} x {devices[0].device_kind} in {jax.process_count()} process(es), mesh "
          f"{dict(mesh.shape)}; workdir {workdir}")


def log_line(bar, step: int, values: dict) -> None:
  bar.set_postfix(loss=f"{values['loss']:.3f}", tok_s=f"{values['target_tokens_per_s']:.0f}")
  if bar.disable and jax.process_index() == 0:
    print(f"step {step}: loss {values['loss']:.4f} acc {values['accuracy']:.3f} ppl {values['perplexity']:.2f} "
          f"lr {values['learning_rate']:.3g} gnorm {values['grad_norm']:.3g} "
          f"tok/s {values['target_tokens_per_s']:.0f} mfu {values['mfu']:.1%}", flush=True)
