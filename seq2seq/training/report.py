"""What a training run prints (process 0 only): a summary of the run at its start, then a
progress bar with loss, tokens/s and ETA on a terminal, or one line per logged step off a
terminal (a log file, a cluster job), and a line per evaluation and checkpoint. Library logs
stay quiet unless --log_level asks for them (seq2seq/cli.py)."""

from __future__ import annotations

import os
import pathlib
import sys

import jax

from seq2seq import provenance
from seq2seq.files import write_atomic
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


# Files that exist where an NVIDIA driver is loaded: cheap to test, no CUDA library needed.
NVIDIA_PROBES = ("/proc/driver/nvidia/version", "/dev/nvidia0")


def unused_gpu(platform: str, probes=NVIDIA_PROBES) -> str | None:
  """A warning when JAX runs on the CPU of a machine with an NVIDIA driver (a CPU-only
  jaxlib, or CUDA libraries JAX cannot load), else None."""
  if platform != "cpu" or not any(os.path.exists(p) for p in probes):
    return None
  return ("warning: JAX is running on the CPU, but this machine has an NVIDIA GPU (its driver is loaded): install "
          "the GPU build, pip install \".[cuda12]\" (or \".[cuda13]\"), and check with "
          "python -c \"import jax; print(jax.devices())\"")


def peak_learning_rate(schedule, warmup_steps: int, steps: int) -> float:
  """The schedule's largest rate: at the end of warmup for the shipped schedules (checked
  around it and at both ends)."""
  points = {0, max(warmup_steps - 1, 0), warmup_steps, warmup_steps + 1, max(steps - 1, 0)}
  return max(float(schedule(s)) for s in points)


def skips_validation_bleu(t, bleu_sentences: int) -> bool:
  """Whether the run's one validation, at its last step, leaves BLEU out: a run shorter than
  config.train.eval_every (a smoke run) never reaches a scheduled evaluation, and decoding an
  undertrained model to its length limit took longer than the run (74 s after 30 steps of
  multi30k, for BLEU 0). The validation loss is still computed."""
  return bool(bleu_sentences) and 0 < t.steps < t.eval_every


def short_run_warnings(t, schedule, bleu_sentences: int = 0) -> list[str]:
  """What a run shorter than its own settings should be told: a warmup it never finishes
  (the rate never reaches its peak), a log interval it never reaches, and that its final
  validation leaves out BLEU (`skips_validation_bleu`)."""
  said = []
  if t.warmup_steps > t.steps:
    said.append(f"warning: config.train.warmup_steps={t.warmup_steps} is more than config.train.steps={t.steps}: "
                f"the learning rate never reaches its peak (it ends at {float(schedule(t.steps - 1)):.3g}); set "
                f"--config.train.warmup_steps to a fraction of the steps")
  if t.log_every > t.steps:
    said.append(f"warning: config.train.log_every={t.log_every} is more than config.train.steps={t.steps}: only "
                f"the last step is logged; set --config.train.log_every")
  if skips_validation_bleu(t, bleu_sentences):
    said.append(f"note: config.train.eval_every={t.eval_every} is more than config.train.steps={t.steps}: the "
                f"validation at step {t.steps} computes the loss only, not BLEU (a run this short scores about 0 and "
                f"decodes slowly); seq2seq-eval scores any checkpoint")
  return said


def summary(config, model_cfg: ModelConfig, mesh, workdir: str, peak_lr: float | None = None) -> str:
  """One paragraph: the model, the data (its training split's spec), the schedule (its real
  peak rate when given) and where it runs."""
  c, d, t = model_cfg, config.data, config.train
  devices = jax.devices()
  split = d.train_split if ":" in d.train_split else f"{d.source}:{d.train_split}"
  return (f"model: {transformer.count_params(c) / 1e6:.1f}M parameters, d_model {c.d_model}, "
          f"{c.num_encoder_layers}+{c.num_decoder_layers} layers, {c.norm_position}-{c.norm}, {c.activation}, "
          f"{c.positions} positions, vocabulary {c.vocab_size}, {c.dtype}\n"
          f"data: {split} {d.src_lang}->{d.tgt_lang}, {d.max_tokens} tokens per batch"
          f"{', packed' if d.get('packing') else ''}\n"
          f"training: {t.steps} steps, {t.schedule} schedule, peak lr "
          f"{t.learning_rate if peak_lr is None else peak_lr:.3g}, "
          f"checkpoint every {t.checkpoint_every}, eval every {t.eval_every or 'never'}\n"
          f"devices: {len(devices)} x {devices[0].device_kind} in {jax.process_count()} process(es), mesh "
          f"{dict(mesh.shape)}; workdir {workdir}")


def log_line(bar, step: int, values: dict) -> None:
  bar.set_postfix(loss=f"{values['loss']:.3f}", tok_s=f"{values['target_tokens_per_s']:.0f}")
  if bar.disable and jax.process_index() == 0:
    gnorm = f"gnorm {values['grad_norm']:.3g} " if "grad_norm" in values else ""  # absent: train.grad_norm off
    print(f"step {step}: loss {values['loss']:.4f} acc {values['accuracy']:.3f} ppl {values['perplexity']:.2f} "
          f"lr {values['learning_rate']:.3g} {gnorm}"
          f"tok/s {values['target_tokens_per_s']:.0f} mfu {values['mfu']:.1%}", flush=True)


def announce(config, t, model_cfg: ModelConfig, mesh, workdir: str, schedule, command: str) -> None:
  """Prints the run's summary; writes its config.json, and `command` to commands.txt with its
  provenance (seq2seq/provenance.py)."""
  peak_lr = peak_learning_rate(schedule, t.warmup_steps, t.steps)
  print(summary(config, model_cfg, mesh, workdir, peak_lr=peak_lr), flush=True)
  for warning in short_run_warnings(t, schedule, config.eval.val_bleu_sentences):
    print(warning, flush=True)
  print("compiling the train step: the first step waits for it", flush=True)
  if unused_gpu(jax.default_backend()):
    print(unused_gpu(jax.default_backend()), file=sys.stderr, flush=True)
  write_atomic(pathlib.Path(workdir) / "config.json", config.to_json_best_effort(indent=1, sort_keys=True).encode())
  if command:  # every start and restart: its command, and the code and libraries it runs
    provenance.append(workdir, command, f"{jax.device_count()} x {jax.devices()[0].device_kind}")
