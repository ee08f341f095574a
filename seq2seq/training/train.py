"""The training loop: config -> data -> model on a device mesh -> jitted, sharded train
step (optax, label smoothing, gradient accumulation) -> metrics.jsonl / TensorBoard.

`train_and_evaluate(config, workdir)` is what `python train.py` runs: `_train` builds the
run's parts once (a `Run`), `_loop` steps, and `_log`, `_evaluate`, `_save` and `_stop` do
what a step is due for. The state is a `TrainState` (seq2seq/training/state.py); the metrics
since the last record a `Window`; a divergence is undone by a `Rollback` (guard.py).
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import logging
import time
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from seq2seq import data, errors, metrics, sharding
from seq2seq.data.batching import BatchIterator
from seq2seq.data.prefetch import Prefetch
from seq2seq.model import flops
from seq2seq.model.config import ModelConfig
from seq2seq.training import checkpoint, lock, optimizer, preflight, quiet, report
from seq2seq.training.config import TrainConfig
from seq2seq.training.guard import DivergenceGuard, Rollback
from seq2seq.training.loss import chunked_cross_entropy_sums, cross_entropy_sums, loss_plan
from seq2seq.training.state import TrainState, init_state
from seq2seq.training.validation import Validation
from seq2seq.training.window import Window

# Steps queued on the devices ahead of the one finishing: enough that the host prepares and
# dispatches the next step while the devices compute, few enough that a stop (SIGTERM from a
# preemption notice) saves within STEPS_IN_FLIGHT + 1 steps of where the devices were.
STEPS_IN_FLIGHT = 2
BATCH_KEYS = ("src_bs", "src_segments_bs", "src_positions_bs", "tgt_in_bt", "tgt_out_bt", "tgt_segments_bt",
              "tgt_positions_bt")


# -- steps -------------------------------------------------------------------------------
def _loss(params, graphdef, batch, dropout_rng, label_smoothing, poison=False, packed=True, loss_chunk=0,
          loss_impl="xla"):
  model = nnx.merge(graphdef, params)
  labels_bt, weights_bt = batch["tgt_out_bt"], batch["tgt_segments_bt"] > 0
  w, tied = model.output_projection()
  loss_chunk, kernel = loss_plan(loss_chunk, loss_impl, labels_bt.shape, w, tied, model.cfg.logits_dtype)
  out = model(batch["src_bs"], batch["tgt_in_bt"], src_segments_bs=batch["src_segments_bs"],
              tgt_segments_bt=batch["tgt_segments_bt"], src_positions_bs=batch["src_positions_bs"],
              tgt_positions_bt=batch["tgt_positions_bt"], dropout_rng=dropout_rng, packed=packed,
              project=not loss_chunk)
  if loss_chunk:  # out: the decoder's states [b, t, d], projected a chunk of positions at a time
    sums = chunked_cross_entropy_sums(out, w, labels_bt, weights_bt, tied=tied, chunk=loss_chunk,
                                      label_smoothing=label_smoothing, logits_dtype=model.cfg.logits_dtype,
                                      kernel=kernel)
  else:  # out: the logits [b, t, v]
    sums = cross_entropy_sums(out, labels_bt, weights_bt, label_smoothing)
  loss = sums["loss_sum"] * jnp.where(poison, jnp.nan, 1.0)  # `train.inject_nan_at_step`: NaN gradients
  return loss, sums | {"loss_sum": loss}


def dropout_key(seed: int, step, micro: int = 0, impl: str = "threefry2x32"):
  """The dropout key of (seed, step, micro-batch): the same on every restart."""
  return jax.random.fold_in(jax.random.fold_in(jax.random.key(seed, impl=impl), step), micro)


def grad_sums(params, batch, key, *, graphdef, label_smoothing, poison=False, packed=True, loss_chunk=0,
              loss_impl="xla"):
  """Gradient of the summed (not averaged) token loss, and the metric sums. `packed=False`:
  every row holds one pair (lets GPUs use cuDNN attention; seq2seq/model/attention.py).
  `loss_chunk`, `loss_impl`: `train.loss_chunk` (target positions scored at a time), `train.loss_impl`."""
  grads, sums = jax.grad(_loss, has_aux=True)(params, graphdef, batch, key, label_smoothing, poison, packed,
                                             loss_chunk, loss_impl)
  return grads, sums


def apply_gradients(state: TrainState, grads, sums, *, tx, schedule, grad_norm=True):
  """One optimizer update from summed gradients: divides by the target token count.
  `grad_norm`: the metrics include the gradient's global norm (`train.grad_norm`)."""
  grads = jax.tree.map(lambda g: g / jnp.maximum(sums["tokens"], 1.0), grads)
  updates, opt_state = tx.update(grads, state.opt_state, state.params)
  updates = jax.tree.map(lambda u: u * state.lr_scale, updates)
  new_state = state.replace(params=optax.apply_updates(state.params, updates), opt_state=opt_state,
                            step=state.step + 1)
  norm = {"grad_norm": optimizer.global_norm(grads)} if grad_norm else {}
  return new_state, sums | norm | {"learning_rate": schedule(state.step) * state.lr_scale}


def train_step(state: TrainState, batch, poison=False, *, seed, rng_impl, graphdef, label_smoothing, tx, schedule,
               packed=True, loss_chunk=0, loss_impl="xla", grad_norm=True):
  """A full update on one batch (no accumulation): forward, backward, optimizer."""
  key = dropout_key(seed, state.step, 0, rng_impl)
  grads, sums = grad_sums(state.params, batch, key, graphdef=graphdef, label_smoothing=label_smoothing,
                          poison=poison, packed=packed, loss_chunk=loss_chunk, loss_impl=loss_impl)
  return apply_gradients(state, grads, sums, tx=tx, schedule=schedule, grad_norm=grad_norm)


def accumulate(acc, params, batch, step, micro, *, seed, rng_impl, graphdef, label_smoothing, packed=True,
               loss_chunk=0, loss_impl="xla"):
  """Adds one micro-batch's summed gradients and metric sums to `acc`."""
  key = dropout_key(seed, step, micro, rng_impl)
  grads, sums = grad_sums(params, batch, key, graphdef=graphdef, label_smoothing=label_smoothing, packed=packed,
                          loss_chunk=loss_chunk, loss_impl=loss_impl)
  return (grads, sums) if acc is None else jax.tree.map(jnp.add, acc, (grads, sums))


def eval_sums(params, batch, *, graphdef, packed=True, loss_chunk=0):
  return _loss(params, graphdef, batch, None, 0.0, packed=packed, loss_chunk=loss_chunk)[1]


class Steps:
  """The jitted functions of a run, with explicit shardings; state is donated."""

  def __init__(self, config, graphdef, shardings, mesh, tx, schedule):
    t = TrainConfig.from_config(config.train)
    # Rows hold one pair each unless batches fill them up or pack them (seq2seq/data/batching.py).
    packed = bool(config.data.packing or config.data.fill_rows)
    common = dict(seed=config.seed, rng_impl=t.rng_impl, graphdef=graphdef, label_smoothing=t.label_smoothing,
                  packed=packed, loss_chunk=t.loss_chunk, loss_impl=t.loss_impl)
    batch_sh = sharding.batch_sharding(mesh)
    self.accum_steps = t.accum_steps
    on_mesh = lambda fn: sharding.with_activation_mesh(fn, mesh)  # activations laid out by logical axes
    self.train = jax.jit(on_mesh(functools.partial(train_step, tx=tx, schedule=schedule, grad_norm=t.grad_norm,
                                                   **common)),
                         in_shardings=(shardings, batch_sh, None), out_shardings=(shardings, None), donate_argnums=0)
    self.accumulate = jax.jit(on_mesh(functools.partial(accumulate, **common)))
    # the state is donated (its buffers become the new state's); the summed gradients are not:
    # no output has their shapes to reuse them, and XLA warned so at every compile
    self.apply = jax.jit(functools.partial(apply_gradients, tx=tx, schedule=schedule, grad_norm=t.grad_norm),
                         out_shardings=(shardings, None), donate_argnums=0)
    self.eval = jax.jit(on_mesh(functools.partial(eval_sums, graphdef=graphdef, packed=packed,
                                                  loss_chunk=t.loss_chunk)))

  def update(self, state: TrainState, batches: list, poison: bool = False) -> tuple[TrainState, dict]:
    """One optimizer update; `poison` makes its gradients NaN (to test the divergence guard)."""
    if len(batches) == 1:
      return self.train(state, batches[0], poison)
    acc = None
    for micro, batch in enumerate(batches):
      acc = self.accumulate(acc, state.params, batch, state.step, micro)
    return self.apply(state, *acc)


# -- the loop ----------------------------------------------------------------------------
def train_and_evaluate(config, workdir: str, command: str = "") -> dict:
  """Trains `config` in `workdir`; returns the last logged metrics. `command`, the command
  line that started this run or restart, is added to DIR/commands.txt once it goes ahead."""
  preflight.absolute_paths(config)  # config.json's paths mean the same from any directory
  mesh = preflight.check(config)  # settings that cannot work end here, before anything is written
  data.cache_dir(config)  # and a cache folder that is a file
  # One writer per workdir (a requeued job's second copy stops here); a run that fails before
  # writing anything leaves no workdir behind.
  with lock.take(workdir, jax.process_index(), command) as held:
    return _train(config, workdir, command, mesh, held)


@dataclasses.dataclass
class Run:
  """What the loop works with, built once by `_train`."""
  t: TrainConfig
  steps: Steps
  ckpts: checkpoint.Checkpoints
  lock: lock.WorkdirLock  # checked before the run writes its logs and checkpoints
  run_identity: dict  # what a checkpoint must match to be restored
  writer: metrics.MetricsWriter
  bar: Any  # the progress bar (report.progress)
  validation: Validation | None  # None: config.train.eval_every = 0
  peak: tuple[float, str]  # MFU's denominator (FLOP/s) and where it comes from
  start_time: float  # perf_counter() at wall time 0 (restarts go on from the last logged wall_time_s)
  skip_bleu: bool = False  # validation leaves BLEU out (report.skips_validation_bleu: a run shorter than eval_every)


def _train(config, workdir: str, command: str, mesh, held: lock.WorkdirLock) -> dict:
  quiet.library_errors_to_log()  # a failed save is one error line, not the libraries' tracebacks
  t = TrainConfig.from_config(config.train)
  if jax.process_index() == 0:  # the first run of a config trains its vocabulary and tokenizes its corpus: minutes
    print(f"preparing the data: the sentencepiece model and the tokenized training corpus (cached in "
          f"{data.cache_dir(config)} for later runs)", flush=True)
  tok = data.load_tokenizer(config, workdir, write=False)
  model_cfg = ModelConfig.from_config(config.model, vocab_size=tok.vocab_size)
  tx, schedule = optimizer.make(t, d_model=model_cfg.d_model)
  train_iter = data.train_iterator(config, tok, process_index=jax.process_index(), process_count=jax.process_count())
  sharding.check_same_on_every_process(  # hosts that each made their own must have made the same
      {"sentencepiece models": tok.model_bytes, "tokenized training corpora": train_iter.corpus.fingerprint.encode()},
      "each host made its own: give them one config.data.cache_dir, or config.data.spm_model, and one sentencepiece")
  _still_ours(held, None)  # loading the data took a while: the workdir may have been moved meanwhile
  if jax.process_index() == 0:  # the data loaded: the run's vocabulary goes into the workdir
    data.save_tokenizer(config, workdir, tok)
  graphdef, state, shardings = init_state(model_cfg, tx, mesh, config.seed)
  steps = Steps(config, graphdef, shardings, mesh, tx, schedule)
  validation = Validation(config, model_cfg, graphdef, tok, mesh, steps) if t.eval_every else None
  ckpts = checkpoint.Checkpoints(workdir, keep=t.keep_checkpoints, allow_data_change=t.allow_data_change,
                                 writer=True, root=held.anchor)  # saves go on into the held directory only
  run_identity = checkpoint.identity(model_cfg, tok.model_bytes,
                                     data.resume_settings(config) | {"train_corpus": train_iter.corpus.fingerprint})
  if ckpts.latest_step() is not None:  # rerunning the same command resumes, from the newest intact checkpoint
    state = _resume(ckpts, state, run_identity, train_iter, t)
  _still_ours(held, ckpts.last_good())
  if jax.process_index() == 0:  # only once the run goes ahead: a refused restart leaves the workdir as it was
    report.announce(config, t, model_cfg, mesh, workdir, schedule, command)
  step = int(state.step)
  kept = metrics.truncate_after(workdir, step) if jax.process_index() == 0 else []  # later records are redone
  logged = [r["wall_time_s"] for r in kept if "wall_time_s" in r]
  run = Run(t, steps, ckpts, held, run_identity, metrics.MetricsWriter(workdir, enabled=jax.process_index() == 0),
            report.progress(t.steps, step), validation, _peak(model_cfg, t),
            time.perf_counter() - (logged[-1] if logged else 0.0),
            report.skips_validation_bleu(t, config.eval.val_bleu_sentences))
  try:  # the event file is closed however the run ends (at interpreter exit, Python 3.12 cannot)
    for f in ckpts.fallbacks:
      run.writer.write(step, {"event": "restore_fallback", "damaged_step": f["step"], "problem": f["problem"]})
    for change in ckpts.data_changes:
      run.writer.write(step, {"event": "data_change", "change": change})
    rollback = Rollback(max_rollbacks=t.guard_max_rollbacks, lr_factor=t.guard_lr_factor, ckpts=ckpts,
                        run_identity=run_identity, shardings=shardings, writer=run.writer,
                        say=lambda text: report.say(run.bar, text))
    with Prefetch(_feed(train_iter, mesh, model_cfg), depth=2) as feed:
      last = _loop(run, state, feed, rollback)
    run.bar.close()
    ckpts.close()
  except BaseException as err:
    _close_events(run, failing=True)
    ckpts.settle()  # a save in flight ends before the workdir's lock and directory are let go
    if isinstance(err, (errors.CheckpointError, errors.ResourceError)):
      held.check(ckpts.last_good())  # a save that failed because the workdir went away says so (WorkdirGone)
    if isinstance(err, OSError) and (stopped := ckpts.stopped(err)) is not err:  # a full disk under metrics.jsonl
      raise stopped from err
    raise
  _close_events(run, failing=False)
  return last


def _still_ours(held: lock.WorkdirLock, last_good: str | None) -> None:
  """Stops the run (WorkdirGone) if its workdir was moved or replaced, before it writes there."""
  if note := held.check(last_good):
    print(note, flush=True)


def _close_events(run: Run, failing: bool) -> None:
  """Closes the TensorBoard event file. Where the run is failing already, an error closing it
  too (the same full disk) goes to the log: the first failure is the one to report."""
  try:
    run.writer.close()
  except OSError as err:
    if not failing:
      raise run.ckpts.stopped(OSError(err.errno, err.strerror, f"the TensorBoard event file in {run.writer.path.parent}"
                                      )) from err
    logging.getLogger(__name__).info("closing the TensorBoard event file failed too: %s", err)


def _loop(run: Run, state: TrainState, feed, rollback: Rollback) -> dict:
  """Steps until config.train.steps or a stop signal; logs, evaluates and saves when due.
  Returns the last logged metrics."""
  t = run.t
  guard = DivergenceGuard(spike_factor=t.guard_spike_factor) if t.guard_max_rollbacks else None
  step = int(state.step)
  window, last = Window.after(step), {}
  data_state = None  # the iterator's state after the last batch a step consumed: what a checkpoint records
  in_flight = collections.deque()  # the metrics of the steps dispatched and perhaps not finished
  with checkpoint.StopSignal() as stop:
    while step < t.steps:
      due = _due(step + 1, t)
      # Steps that neither log, evaluate nor save read nothing back from the devices: the host
      # runs ahead, queueing steps (config.train.transfer_guard="disallow" makes a read an error).
      with jax.transfer_guard_device_to_host("allow" if due else t.transfer_guard):
        wait_start = time.perf_counter()
        fed = [next(feed) for _ in range(run.steps.accum_steps)]
        wait = time.perf_counter() - wait_start
        data_state = fed[-1]["state"]
        poison = step + 1 == t.inject_nan_at_step and not rollback.count
        state, step_metrics = run.steps.update(state, [f["batch"] for f in fed], poison)
        step += 1
        in_flight.append(step_metrics)
        while len(in_flight) > STEPS_IN_FLIGHT:  # waits for a step to finish; reads nothing back
          jax.block_until_ready(in_flight.popleft())
        window.add(step_metrics, [f["counts"] for f in fed], wait)
        run.bar.update(1)
        run.ckpts.check()  # a failed asynchronous save stops training now, not a checkpoint interval later
      stopping = _stopping(stop, due)
      if not (due or stopping):
        continue
      # The guard sees every step since its last check before anything is logged, evaluated or
      # saved: a non-finite state never reaches a checkpoint.
      reason, bad_step = _check(guard, window)
      if reason:  # back to the last good checkpoint; the data that led here is skipped
        state = rollback(state, bad_step=bad_step, detected_at=step, reason=reason)
        step = int(state.step)
        window = Window.after(step)
        continue
      if note := run.lock.check(run.ckpts.last_good()):  # still this run's workdir, before writing into it
        report.say(run.bar, note)
      if "log" in due or (stopping and window.sums):  # with a stop: the steps since the last record
        last = _log(run, step, window)
        window = Window.after(step)
      if "eval" in due:
        last |= _evaluate(run, step, state, window)
      if "checkpoint" in due or stopping:
        _save(run, step, state, data_state, last)
      if stopping:
        _stop(run, step, stop.received)
        break
  return last


def _resume(ckpts: checkpoint.Checkpoints, state: TrainState, run_identity: dict, train_iter: BatchIterator,
            t: TrainConfig) -> TrainState:
  """The newest intact checkpoint's state; the iterator goes back to its data position."""
  saved, data_state, restored = ckpts.restore(state.saved(), run_identity)
  state = TrainState.from_saved(saved)
  ckpts.quarantine([f["step"] for f in ckpts.fallbacks])  # training will save those steps again
  train_iter.restore(data_state)
  if jax.process_index() == 0:
    for f in ckpts.fallbacks:
      print(f"warning: checkpoint {f['step']} is damaged and was skipped: {f['problem']}", flush=True)
    for change in ckpts.data_changes:
      print(f"warning: resuming with changed data (config.train.allow_data_change): {change}", flush=True)
    print(f"resumed from {ckpts.directory / str(restored)}", flush=True)
    if int(state.step) >= t.steps:
      print(f"this run is finished: it trained {int(state.step)} of config.train.steps={t.steps} steps. To train "
            f"longer, run the same command with --config.train.steps=N (N > {int(state.step)}); it goes on from "
            "here.", flush=True)
  return state


def _peak(model_cfg: ModelConfig, t: TrainConfig) -> tuple[float, str]:
  """MFU's denominator: the configured peak, else the device's nominal peak for the compute
  dtype, else (a CPU) an f32 matmul measured now and again at each evaluation (training
  paused). Load from other processes only slows a matmul down, so the fastest measurement so
  far is the best estimate; every metrics row records the one it used and its source."""
  device = jax.devices()[0]
  return flops.peak_flops(device.device_kind, device.platform, model_cfg.dtype, jax.device_count(), t.peak_flops)


def _due(step: int, t: TrainConfig) -> set[str]:
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


def _stopping(stop: checkpoint.StopSignal, due: set[str]) -> bool:
  """Whether to stop now: one host on its own signal; several agree at the steps they
  synchronise anyway (log, evaluation, checkpoint), so a stop waits at most log_every steps."""
  if jax.process_count() == 1:
    return stop.received is not None
  return bool(due) and _agree(stop.received is not None)


def _check(guard: DivergenceGuard | None, window: Window) -> tuple[str | None, int]:
  """(reason, step) of the first step since the last check that diverged, or (None, 0).
  Reads the window's per-step loss and gradient norm (0 where `train.grad_norm` is off: the
  loss alone is checked) back from the devices in one transfer."""
  unchecked, first = window.unchecked()
  if guard is None or not unchecked:
    return None, 0
  return guard.first_divergence(
      jax.device_get([(m["loss_sum"], m["tokens"], m.get("grad_norm", 0.0)) for m in unchecked]), first)


def _log(run: Run, step: int, window: Window) -> dict:
  values = window.summary(jax.device_get(window.sums), run.peak, time.perf_counter() - run.start_time)
  run.writer.write(step, values)
  report.log_line(run.bar, step, values)
  return values | {"step": step}


def _evaluate(run: Run, step: int, state: TrainState, window: Window) -> dict:
  """Validation loss (and BLEU when asked) at `step`, logged; their time is left out of the
  window's throughput."""
  start = time.perf_counter()
  val = {f"val_{k}": v for k, v in run.validation(state.params, bleu=not run.skip_bleu).items()}
  if run.peak[1] == flops.MEASURED:
    run.peak = (max(run.peak[0], flops.measure_matmul_peak(repeats=3) * jax.device_count()), run.peak[1])
  window.exclude(time.perf_counter() - start)
  run.writer.write(step, val)
  report.say(run.bar, f"step {step}: " + " ".join(f"{k}={v:.4g}" for k, v in val.items()))
  return val | {"val_step": step}


def _save(run: Run, step: int, state: TrainState, data_state: dict, last: dict) -> None:
  """An asynchronous checkpoint of `step`, ranked by its validation loss when it has one."""
  val_loss = last.get("val_loss") if last.get("val_step") == step else None
  run.ckpts.save(step, state.saved(), data_state, run.run_identity, val_loss=val_loss)
  report.say(run.bar, f"step {step}: checkpoint saving to {run.ckpts.directory / str(step)}")


def _stop(run: Run, step: int, signum: int) -> None:
  run.ckpts.wait()
  if jax.process_index() == 0:
    run.bar.write(f"signal {signum}: saved a checkpoint at step {step} in {run.ckpts.directory}; rerun the same "
                  "command to resume")


def _agree(flag: bool) -> bool:
  """True on every process if any process got a stop signal (multi-host preemption)."""
  from jax.experimental import multihost_utils

  return bool(np.max(multihost_utils.process_allgather(np.int32(flag))))


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
