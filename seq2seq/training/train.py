"""The training loop: config -> data -> model on a device mesh -> jitted, sharded train
step (optax, label smoothing, gradient accumulation) -> metrics.jsonl / TensorBoard.

`train_and_evaluate(config, workdir)` is what `python train.py` runs.
"""

from __future__ import annotations

import functools
import pathlib
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from seq2seq import data, metrics, sharding
from seq2seq.data.batching import BatchIterator, epoch_plan, make_batch
from seq2seq.data.prefetch import Prefetch
from seq2seq.files import write_atomic
from seq2seq.inference.score import score
from seq2seq.inference.translate import Translator, search_settings
from seq2seq.model import flops, transformer
from seq2seq.model.config import ModelConfig
from seq2seq.training import checkpoint, lock, optimizer, preflight, report
from seq2seq.training.guard import DivergenceGuard, roll_back
from seq2seq.training.loss import cross_entropy_sums, summarize

BATCH_KEYS = ("src_bs", "src_segments_bs", "src_positions_bs", "tgt_in_bt", "tgt_out_bt", "tgt_segments_bt",
              "tgt_positions_bt")
State = dict  # {"params": nnx.State, "opt_state": optax state, "step": int32 scalar, "lr_scale": f32 scalar}


# -- state -------------------------------------------------------------------------------
def _initializer(model_cfg: ModelConfig, tx: optax.GradientTransformation, seed: int):
  def init() -> State:
    params = nnx.state(transformer.Transformer(model_cfg, rngs=nnx.Rngs(seed)), nnx.Param)
    return {"params": params, "opt_state": tx.init(params), "step": jnp.zeros((), jnp.int32),
            "lr_scale": jnp.ones((), jnp.float32)}  # lowered by the divergence guard
  return init


def init_state(model_cfg: ModelConfig, tx: optax.GradientTransformation, mesh, seed: int):
  """Parameters and optimizer state created directly in their shardings on `mesh`."""
  state, shardings = sharding.init_on_mesh(_initializer(model_cfg, tx, seed), mesh)
  return transformer.graphdef(model_cfg), state, shardings


def abstract_state(model_cfg: ModelConfig, tx: optax.GradientTransformation, mesh, seed: int):
  """`init_state`'s state as sharded shapes, and its shardings; nothing is allocated."""
  init = _initializer(model_cfg, tx, seed)
  shardings = sharding.state_shardings(jax.eval_shape(init), mesh)
  return jax.jit(init, out_shardings=shardings).eval_shape(), shardings


# -- steps -------------------------------------------------------------------------------
def _loss(params, graphdef, batch, dropout_rng, label_smoothing, poison=False, packed=True):
  model = nnx.merge(graphdef, params)
  logits_btv = model(batch["src_bs"], batch["tgt_in_bt"], src_segments_bs=batch["src_segments_bs"],
                     tgt_segments_bt=batch["tgt_segments_bt"], src_positions_bs=batch["src_positions_bs"],
                     tgt_positions_bt=batch["tgt_positions_bt"], dropout_rng=dropout_rng, packed=packed)
  sums = cross_entropy_sums(logits_btv, batch["tgt_out_bt"], batch["tgt_segments_bt"] > 0, label_smoothing)
  loss = sums["loss_sum"] * jnp.where(poison, jnp.nan, 1.0)  # `train.inject_nan_at_step`: NaN gradients
  return loss, sums | {"loss_sum": loss}


def dropout_key(seed: int, step, micro: int = 0, impl: str = "threefry2x32"):
  """The dropout key of (seed, step, micro-batch): the same on every restart."""
  return jax.random.fold_in(jax.random.fold_in(jax.random.key(seed, impl=impl), step), micro)


def grad_sums(params, batch, key, *, graphdef, label_smoothing, poison=False, packed=True):
  """Gradient of the summed (not averaged) token loss, and the metric sums. `packed=False`:
  every row holds one pair (lets GPUs use cuDNN attention; seq2seq/model/attention.py)."""
  grads, sums = jax.grad(_loss, has_aux=True)(params, graphdef, batch, key, label_smoothing, poison, packed)
  return grads, sums


def apply_gradients(state: State, grads, sums, *, tx, schedule):
  """One optimizer update from summed gradients: divides by the target token count."""
  grads = jax.tree.map(lambda g: g / jnp.maximum(sums["tokens"], 1.0), grads)
  updates, opt_state = tx.update(grads, state["opt_state"], state["params"])
  updates = jax.tree.map(lambda u: u * state["lr_scale"], updates)
  new_state = {"params": optax.apply_updates(state["params"], updates), "opt_state": opt_state,
               "step": state["step"] + 1, "lr_scale": state["lr_scale"]}
  return new_state, sums | {"grad_norm": optax.tree.norm(grads),
                            "learning_rate": schedule(state["step"]) * state["lr_scale"]}


def train_step(state: State, batch, poison=False, *, seed, rng_impl, graphdef, label_smoothing, tx, schedule,
               packed=True):
  """A full update on one batch (no accumulation): forward, backward, optimizer."""
  key = dropout_key(seed, state["step"], 0, rng_impl)
  grads, sums = grad_sums(state["params"], batch, key, graphdef=graphdef, label_smoothing=label_smoothing,
                          poison=poison, packed=packed)
  return apply_gradients(state, grads, sums, tx=tx, schedule=schedule)


def accumulate(acc, params, batch, step, micro, *, seed, rng_impl, graphdef, label_smoothing, packed=True):
  """Adds one micro-batch's summed gradients and metric sums to `acc`."""
  key = dropout_key(seed, step, micro, rng_impl)
  grads, sums = grad_sums(params, batch, key, graphdef=graphdef, label_smoothing=label_smoothing, packed=packed)
  if acc is None:
    return grads, sums
  return jax.tree.map(jnp.add, acc[0], grads), jax.tree.map(jnp.add, acc[1], sums)


def eval_sums(params, batch, *, graphdef, packed=True):
  return _loss(params, graphdef, batch, None, 0.0, packed=packed)[1]


class Steps:
  """The jitted functions of a run, with explicit shardings; state is donated."""

  def __init__(self, config, graphdef, shardings, mesh, tx, schedule):
    t = config.train
    # Rows hold one pair each unless batches fill them up or pack them (seq2seq/data/batching.py).
    data_cfg = config.get("data", {})
    packed = bool(data_cfg.get("packing", False) or data_cfg.get("fill_rows", True))
    common = dict(seed=config.seed, rng_impl=t.get("rng_impl", "threefry2x32"), graphdef=graphdef,
                  label_smoothing=t.label_smoothing, packed=packed)
    batch_sh = sharding.batch_sharding(mesh)
    self.accum_steps = max(int(t.get("accum_steps", 1)), 1)
    on_mesh = lambda fn: sharding.with_activation_mesh(fn, mesh)  # activations laid out by logical axes
    self.train = jax.jit(on_mesh(functools.partial(train_step, tx=tx, schedule=schedule, **common)),
                         in_shardings=(shardings, batch_sh, None), out_shardings=(shardings, None), donate_argnums=0)
    self.accumulate = jax.jit(on_mesh(functools.partial(accumulate, **common)))
    self.apply = jax.jit(functools.partial(apply_gradients, tx=tx, schedule=schedule),
                         out_shardings=(shardings, None), donate_argnums=(0, 1))
    self.eval = jax.jit(on_mesh(functools.partial(eval_sums, graphdef=graphdef, packed=packed)))

  def update(self, state: State, batches: list, poison: bool = False) -> tuple[State, dict]:
    """One optimizer update; `poison` makes its gradients NaN (to test the divergence guard)."""
    if len(batches) == 1:
      return self.train(state, batches[0], poison)
    acc = None
    for micro, batch in enumerate(batches):
      acc = self.accumulate(acc, state["params"], batch, state["step"], micro)
    return self.apply(state, *acc)


# -- evaluation --------------------------------------------------------------------------
def validation_batches(config, tok, mesh) -> list[dict]:
  """The validation split as fixed, deterministic batches (this process's rows)."""
  corpus = data.load_corpus(config, config.data.validation_split, tok)
  plan = epoch_plan(corpus.src_lengths, corpus.tgt_lengths, data.batching_config(config), seed=0, epoch=0)
  return [make_batch(corpus, p, jax.process_index(), jax.process_count()) for p in plan]


def evaluate(steps: Steps, params, batches: list[dict], mesh) -> dict[str, float]:
  totals = None
  for local in batches:
    sums = steps.eval(params, sharding.put_batch(local, mesh))
    totals = sums if totals is None else jax.tree.map(jnp.add, totals, sums)
  return summarize(jax.device_get(totals))


def bleu_validator(config, model_cfg, graphdef, tok, mesh):
  """A function params -> {"bleu", "chrf", "bleu_seconds"} on the first `eval.val_bleu_sentences`
  validation pairs (the same decoding as eval.py), or None when that is 0. bleu_seconds is
  the cost of translating and scoring them (the first call compiles). With `val_beam_size`
  equal to `beam_size` its search programs are eval.py's, so the compilation cache they go
  into spares eval.py compiling them (`validate.translator`)."""
  e = config.eval
  n = e.get("val_bleu_sentences", 0)
  if not n:
    return None
  pairs = data.eval_pairs(config, config.data.validation_split)[:n]
  translator = Translator(model_cfg, graphdef, tok, mesh, **search_settings(e, beam_size=e.get("val_beam_size", 1)))

  def validate(params) -> dict[str, float]:
    start = time.perf_counter()
    result = score(translator(params, [s for s, _ in pairs]), [t for _, t in pairs])
    return {"bleu": result["bleu"], "chrf": result["chrf"], "bleu_seconds": time.perf_counter() - start}

  validate.translator = translator
  return validate


# -- the loop ----------------------------------------------------------------------------
def train_and_evaluate(config, workdir: str, command: str = "") -> dict:
  """Trains `config` in `workdir`; returns the last logged metrics. `command`, the command
  line that started this run or restart, is added to DIR/commands.txt once it goes ahead."""
  preflight.absolute_paths(config)  # config.json's paths mean the same from any directory
  mesh = preflight.check(config)  # settings that cannot work end here, before anything is written
  # One writer per workdir (a requeued job's second copy stops here); a run that fails before
  # writing anything leaves no workdir behind.
  with lock.hold(workdir, jax.process_index(), command):
    return _train(config, workdir, command, mesh)


def _train(config, workdir: str, command: str, mesh) -> dict:
  workdir_path = pathlib.Path(workdir)
  is_main = jax.process_index() == 0
  tok = data.load_tokenizer(config, workdir, write=False)
  model_cfg = ModelConfig.from_config(config.model, vocab_size=tok.vocab_size)
  tx, schedule = optimizer.make(config.train, d_model=model_cfg.d_model)
  train_iter: BatchIterator = data.train_iterator(config, tok, process_index=jax.process_index(),
                                                  process_count=jax.process_count())
  if is_main:  # the data loaded: the run's vocabulary goes into the workdir
    data.save_tokenizer(config, workdir, tok)
  graphdef, state, shardings = init_state(model_cfg, tx, mesh, config.seed)
  steps = Steps(config, graphdef, shardings, mesh, tx, schedule)
  val_batches = validation_batches(config, tok, mesh) if config.train.eval_every else []
  val_bleu = bleu_validator(config, model_cfg, graphdef, tok, mesh) if config.train.eval_every else None
  # MFU's denominator: the configured peak, else the device's nominal peak for the compute
  # dtype, else (a CPU) an f32 matmul measured now and again at each evaluation (training
  # paused). Load from other processes only slows a matmul down, so the fastest measurement so
  # far is the best estimate; every metrics row records the one it used and its source.
  device = jax.devices()[0]
  peak = flops.peak_flops(device.device_kind, device.platform, model_cfg.dtype, jax.device_count(),
                          float(config.train.get("peak_flops", 0.0)))

  ckpts = checkpoint.Checkpoints(workdir, keep=config.train.get("keep_checkpoints", 3),
                                 allow_data_change=config.train.get("allow_data_change", False), writer=True)
  run_identity = checkpoint.identity(model_cfg, tok.model_bytes,
                                     data.resume_settings(config) | {"train_corpus": train_iter.corpus.fingerprint})
  fallbacks = []
  if ckpts.latest_step() is not None:  # rerunning the same command resumes, from the newest intact checkpoint
    state, data_state, restored = ckpts.restore(state, run_identity)
    fallbacks = ckpts.fallbacks
    ckpts.quarantine([f["step"] for f in fallbacks])  # training will save those steps again
    train_iter.restore(data_state)
    if is_main:
      for f in fallbacks:
        print(f"warning: checkpoint {f['step']} is damaged and was skipped: {f['problem']}", flush=True)
      for change in ckpts.data_changes:
        print(f"warning: resuming with changed data (config.train.allow_data_change): {change}", flush=True)
      print(f"resumed from {ckpts.directory / str(restored)}", flush=True)
      if int(state["step"]) >= config.train.steps:
        print(f"this run is finished: it trained {int(state['step'])} of config.train.steps={config.train.steps} "
              f"steps. To train longer, run the same command with --config.train.steps=N (N > "
              f"{int(state['step'])}); it goes on from here.", flush=True)
  if is_main:
    peak_lr = report.peak_learning_rate(schedule, int(config.train.get("warmup_steps", 0)), int(config.train.steps))
    print(report.summary(config, model_cfg, mesh, workdir, peak_lr=peak_lr), flush=True)
    if report.unused_gpu(jax.default_backend()):
      print(report.unused_gpu(jax.default_backend()), file=sys.stderr, flush=True)
  if is_main:  # only once the run goes ahead: a refused restart leaves the run's config and commands as they were
    write_atomic(workdir_path / "config.json", config.to_json_best_effort(indent=1, sort_keys=True).encode())
    if command:
      with open(workdir_path / "commands.txt", "a", encoding="utf-8") as f:  # every start and restart
        f.write(command + "\n")
  # Records past the restored step (or any, on a fresh start) are redone.
  kept = metrics.truncate_after(workdir, int(state["step"])) if is_main else []

  writer = metrics.MetricsWriter(workdir, enabled=is_main)
  try:  # the event file is closed however the run ends (at interpreter exit, Python 3.12 cannot)
    for f in fallbacks:
      writer.write(int(state["step"]), {"event": "restore_fallback", "damaged_step": f["step"], "problem": f["problem"]})
    for change in ckpts.data_changes:
      writer.write(int(state["step"]), {"event": "data_change", "change": change})
    t = config.train
    guard = DivergenceGuard(spike_factor=t.get("guard_spike_factor", 0.0)) if t.get("guard_max_rollbacks", 3) else None
    rollbacks = 0
    step = int(state["step"])
    bar = report.progress(config.train.steps, step)
    window = _new_window(step)
    last = {}
    # wall_time_s counts across restarts: it goes on from the last one logged at or before the restored step.
    logged = [r["wall_time_s"] for r in kept if "wall_time_s" in r]
    start_time = time.perf_counter() - (logged[-1] if logged else 0.0)
    data_state = train_iter.state  # after the last batch a step consumed: what a checkpoint records
    # Steps that neither log, evaluate nor checkpoint read nothing back from the devices: the
    # host runs ahead, queueing steps. `train.transfer_guard="disallow"` makes any such read an error.
    quiet_guard = t.get("transfer_guard", "allow")
    with checkpoint.StopSignal() as stop, Prefetch(_feed(train_iter, mesh, model_cfg), depth=2) as feed:
      while step < config.train.steps:
        due = _due(step + 1, config.train)
        with jax.transfer_guard_device_to_host("allow" if due else quiet_guard):
          wait_start = time.perf_counter()
          fed = [next(feed) for _ in range(steps.accum_steps)]
          window["wait"] += time.perf_counter() - wait_start
          data_state = fed[-1]["state"]
          poison = step + 1 == t.get("inject_nan_at_step", -1) and not rollbacks
          state, step_metrics = steps.update(state, [f["batch"] for f in fed], poison)
          step += 1
          _account(window, step_metrics, fed)
          bar.update(1)
          ckpts.check()  # a failed asynchronous save stops training now, not a checkpoint interval later
        # One host stops on its own signal; several agree at the steps they synchronise anyway
        # (log, evaluation, checkpoint), so a stop waits at most log_every steps.
        stopping = stop.received is not None if jax.process_count() == 1 else bool(due) and _agree(
            stop.received is not None)
        if not (due or stopping):
          continue
        # The divergence guard sees every step since the last check before anything is logged,
        # evaluated or saved: a non-finite state never reaches a checkpoint.
        reason, bad_step = _check(guard, window)
        if reason:  # roll back to the last good checkpoint; the data that led here is skipped
          rollbacks += 1
          state = roll_back(state, bad_step, step, reason, rollbacks, t, ckpts, run_identity, shardings, writer, bar,
                            is_main)
          step = int(state["step"])
          window = _new_window(step)
          continue
        if "log" in due or (stopping and window["sums"]):  # with a stop: the steps since the last record
          last = _log(step, window, writer, bar, peak, start_time)
          window = _new_window(step)
        if "eval" in due:
          eval_start = time.perf_counter()
          val = evaluate(steps, state["params"], val_batches, mesh) | (val_bleu(state["params"]) if val_bleu else {})
          val = {f"val_{k}": v for k, v in val.items()}
          if peak[1] == flops.MEASURED:
            peak = (max(peak[0], flops.measure_matmul_peak(repeats=3) * jax.device_count()), peak[1])
          window["start"] += time.perf_counter() - eval_start  # throughput counts training time only
          writer.write(step, val)
          last |= val | {"val_step": step}
          report.say(bar, f"step {step}: " + " ".join(f"{k}={v:.4g}" for k, v in val.items()))
        if "checkpoint" in due or stopping:
          val_loss = last.get("val_loss") if last.get("val_step") == step else None
          ckpts.save(step, state, data_state, run_identity, val_loss=val_loss)
          report.say(bar, f"step {step}: checkpoint saving to {ckpts.directory / str(step)}")
        if stopping:
          ckpts.wait()
          if is_main:
            bar.write(f"signal {stop.received}: saved a checkpoint at step {step} in {ckpts.directory}; "
                      "rerun the same command to resume")
          break
    bar.close()
    ckpts.close()
  finally:
    writer.close()
  return last


def _due(step: int, t) -> set[str]:
  """What step `step` does besides training: "log", "eval", "checkpoint" (the last step all three)."""
  final = step == t.steps
  due = set()
  if step % t.log_every == 0 or final:
    due.add("log")
  if t.eval_every and (step % t.eval_every == 0 or final):
    due.add("eval")
  if step % t.checkpoint_every == 0 or final:
    due.add("checkpoint")
  return due


def _check(guard: DivergenceGuard | None, window: dict) -> tuple[str | None, int]:
  """(reason, step) of the first step since the last check that diverged, or (None, 0).
  Reads the window's per-step loss and gradient norm back from the devices in one transfer."""
  unchecked, first = window["sums"][window["checked"]:], window["first_step"] + window["checked"]
  window["checked"] = len(window["sums"])
  if guard is None or not unchecked:
    return None, 0
  return guard.first_divergence(jax.device_get([(m["loss_sum"], m["tokens"], m["grad_norm"]) for m in unchecked]),
                                first)


def _agree(flag: bool) -> bool:
  """True on every process if any process got a stop signal (multi-host preemption)."""
  if jax.process_count() == 1:
    return flag
  from jax.experimental import multihost_utils

  return bool(np.max(multihost_utils.process_allgather(np.int32(flag))))


def _new_window(step: int) -> dict:
  """Per-step metrics (on the devices) and host counts of the steps after `step`."""
  return {"sums": [], "checked": 0, "first_step": step + 1, "tokens": 0, "slots": 0, "real": 0, "flops": 0.0,
          "wait": 0.0, "start": time.perf_counter()}


def _feed(train_iter: BatchIterator, mesh, model_cfg):
  """Training batches ready for a step (run ahead of the loop by `Prefetch`): on the devices,
  with the counts the metrics need and the iterator state after the batch."""
  for local in train_iter:
    rows = local["src_bs"].shape[0] * jax.process_count()
    counts = {"tokens": int((local["tgt_segments_bt"] > 0).sum()) * jax.process_count(),
              "real": int((local["src_segments_bs"] > 0).sum() + (local["tgt_segments_bt"] > 0).sum()),
              "slots": local["src_bs"].size + local["tgt_out_bt"].size,
              "flops": flops.train_step_flops(model_cfg, rows, local["src_bs"].shape[1], local["tgt_out_bt"].shape[1])}
    yield {"batch": sharding.put_batch(local, mesh), "counts": counts, "state": train_iter.state}


def _account(window, step_metrics, fed) -> None:
  window["sums"].append(step_metrics)
  for f in fed:
    for k, v in f["counts"].items():
      window[k] += v


def _log(step, window, writer, bar, peak: tuple[float, str], start_time) -> dict:
  fetched = jax.device_get(window["sums"])
  totals = {k: sum(float(m[k]) for m in fetched) for k in ("loss_sum", "nll_sum", "tokens", "correct")}
  elapsed = time.perf_counter() - window["start"]
  values = summarize(totals) | {
      "learning_rate": float(fetched[-1]["learning_rate"]),
      "grad_norm": float(fetched[-1]["grad_norm"]),
      "target_tokens_per_s": window["tokens"] / elapsed,
      "padding_fraction": 1.0 - window["real"] / max(window["slots"], 1),
      "mfu": window["flops"] / elapsed / peak[0],
      "data_wait_fraction": window["wait"] / elapsed,  # the loop waiting for its next batch
      "peak_flops": peak[0],  # mfu's denominator: configured, nominal, or the fastest matmul measured so far
      "peak_source": peak[1],  # "config", "table:KIND DTYPE" or "measured f32 matmul"
      "wall_time_s": time.perf_counter() - start_time,
  }
  writer.write(step, values)
  report.log_line(bar, step, values)
  return values | {"step": step}
