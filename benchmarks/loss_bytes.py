"""Bytes accessed and FLOPs (XLA's `cost_analysis()`) of the train step and of the loss alone,
compiled on this machine's CPU for abstract inputs: nothing runs, no data is needed.

  python benchmarks/loss_bytes.py --out=benchmarks/results/loss_bytes_cpu.json   # wmt14_base, bf16, 96x256x256
  python benchmarks/loss_bytes.py --loss=legacy --what=loss                      # one loss, the loss alone

The step is `train.Steps(...).train` (forward, backward, optimizer) on one device, lowered
for (rows, S, T) int32 batches. The loss alone is logits [rows * T, vocab] f32 -> the metric
sums, forward and backward (the gradient of `loss_sum` with respect to the logits).
Losses: `legacy`, the label-smoothed cross entropy before issue 45 (kept below as the
baseline); `passes` and `one_pass`, seq2seq.training.loss with that `impl` (a CPU program
runs `passes`, a GPU or TPU one `one_pass`: `auto`). With every loss (`--loss=all`) also
`one_pass_bf16_logits`: `one_pass` on bf16 logits (`model.logits_dtype=bfloat16`, issue 62),
and `one_pass_chunked`: the step with the projection and loss in chunks (`train.loss_chunk`).
XLA:CPU counts every operand and result of every instruction once, so these figures are the
traffic of a machine without caches.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import pathlib
import sys
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402


# -- the loss before issue 45 (f32 logits; max, exp-sum, label and mean as separate passes) --
@functools.partial(jax.custom_vjp, nondiff_argnums=(2,))
def legacy_xent(logits_btv, labels_bt, eps):
  return _legacy_fwd(logits_btv, labels_bt, eps)[0]


def _legacy_label(logits_btv, labels_bt):
  onehot_btv = labels_bt[..., None] == jnp.arange(logits_btv.shape[-1], dtype=labels_bt.dtype)
  return jnp.sum(jnp.where(onehot_btv, logits_btv, 0.0), axis=-1)


def _legacy_fwd(logits_btv, labels_bt, eps):
  logits_btv = logits_btv.astype(jnp.promote_types(logits_btv.dtype, jnp.float32))
  max_bt = jnp.max(logits_btv, axis=-1)
  lse_bt = max_bt + jnp.log(jnp.sum(jnp.exp(logits_btv - max_bt[..., None]), axis=-1))
  nll_bt = lse_bt - _legacy_label(logits_btv, labels_bt)
  loss_bt = (1.0 - eps) * nll_bt + eps * (lse_bt - jnp.mean(logits_btv, axis=-1))
  return (loss_bt, nll_bt), (logits_btv, lse_bt, labels_bt)


def _legacy_bwd(eps, residuals, cotangents):
  logits_btv, lse_bt, labels_bt = residuals
  g_loss_bt, g_nll_bt = cotangents
  vocab = logits_btv.shape[-1]
  p_btv = jnp.exp(logits_btv - lse_bt[..., None])
  onehot_btv = labels_bt[..., None] == jnp.arange(vocab, dtype=labels_bt.dtype)
  g_all_bt = (g_loss_bt + g_nll_bt)[..., None]
  g_onehot_bt = ((1.0 - eps) * g_loss_bt + g_nll_bt)[..., None]
  d_btv = g_all_bt * p_btv - jnp.where(onehot_btv, g_onehot_bt, 0.0) - (eps / vocab) * g_loss_bt[..., None]
  return d_btv, None


legacy_xent.defvjp(_legacy_fwd, _legacy_bwd)


def legacy_cross_entropy_sums(logits_btv, labels_bt, weights_bt, label_smoothing=0.0) -> dict:
  """`loss.cross_entropy_sums` before issue 45."""
  loss_bt, nll_bt = legacy_xent(logits_btv, labels_bt, float(label_smoothing))
  w_bt = weights_bt.astype(jnp.float32)
  fixed_btv = jax.lax.stop_gradient(logits_btv)
  correct_bt = (_legacy_label(fixed_btv, labels_bt) >= jnp.max(fixed_btv, axis=-1)).astype(jnp.float32)
  return {"loss_sum": jnp.sum(loss_bt * w_bt), "nll_sum": jnp.sum(nll_bt * w_bt), "tokens": jnp.sum(w_bt),
          "correct": jnp.sum(correct_bt * w_bt)}


LOSSES = ("legacy", "passes", "one_pass")  # before issue 45; after, as on a CPU; after, as on a GPU or TPU


@contextlib.contextmanager
def using_loss(name: str):
  """Within this block the train step (`train._loss`) uses loss `name` (an `impl` name: also
for the loss in chunks)."""
  from seq2seq.training import loss, train

  saved = train.cross_entropy_sums, train.chunked_cross_entropy_sums
  train.cross_entropy_sums = sums_fn(name)
  if isinstance(name, str) and name != "legacy":
    train.chunked_cross_entropy_sums = functools.partial(loss.chunked_cross_entropy_sums, impl=name)
  try:
    yield
  finally:
    train.cross_entropy_sums, train.chunked_cross_entropy_sums = saved


def sums_fn(name):
  """The sums function of loss `name` ("legacy", or an `impl` of `loss.cross_entropy_sums`:
  "auto", "passes", "one_pass"), or `name` itself if it is a function."""
  from seq2seq.training import loss

  if callable(name):
    return name
  return legacy_cross_entropy_sums if name == "legacy" else functools.partial(loss.cross_entropy_sums, impl=name)


def cost(compiled) -> dict:
  """XLA's bytes accessed and FLOPs, and the temporary memory the program allocates."""
  c = compiled.cost_analysis()
  c = c[0] if isinstance(c, list) else c  # older JAX: one dict per program
  return {"bytes_accessed": float(c.get("bytes accessed", 0.0)), "flops": float(c.get("flops", 0.0)),
          "temp_bytes": float(compiled.memory_analysis().temp_size_in_bytes)}


def loss_cost(name, tokens: int, vocab: int, label_smoothing: float = 0.1, dtype: str = "float32") -> dict:
  """Cost of logits [1, tokens, vocab] in `dtype` -> sums, with the gradient of loss_sum;
  `name` is a loss name or a function with `cross_entropy_sums`' signature."""
  sums = sums_fn(name)

  def fwd_bwd(logits_btv, labels_bt, weights_bt):
    f = lambda lg: (lambda s: (s["loss_sum"], s))(sums(lg, labels_bt, weights_bt, label_smoothing))
    return jax.grad(f, has_aux=True)(logits_btv)

  args = (jax.ShapeDtypeStruct((1, tokens, vocab), jnp.dtype(dtype)), jax.ShapeDtypeStruct((1, tokens), jnp.int32),
          jax.ShapeDtypeStruct((1, tokens), jnp.bool_))
  start = time.perf_counter()
  out = cost(jax.jit(fwd_bwd).lower(*args).compile())
  return out | {"shape": [tokens, vocab], "dtype": jnp.dtype(dtype).name,
                "logits_bytes": tokens * vocab * jnp.dtype(dtype).itemsize, "compile_s": time.perf_counter() - start}


def step_cost(name: str, config, rows: int, s: int, t: int) -> dict:
  """Cost of the jitted train step of `config` on one CPU device for an abstract batch."""
  from seq2seq import sharding
  from seq2seq.model import transformer
  from seq2seq.model.config import ModelConfig
  from seq2seq.training import optimizer, train
  from seq2seq.training.state import abstract_state

  config.mesh.update(data=1, fsdp=1, tensor=1)
  mesh = sharding.make_mesh(config.mesh, jax.devices("cpu")[:1])
  model_cfg = ModelConfig.from_config(config.model, vocab_size=config.data.vocab_size)
  tx, schedule = optimizer.make(config.train, d_model=model_cfg.d_model)
  state, shardings = abstract_state(model_cfg, tx, mesh, config.seed)
  batch_sh = sharding.batch_sharding(mesh)
  batch = {k: jax.ShapeDtypeStruct((rows, s if k.startswith("src") else t), jnp.int32, sharding=batch_sh)
           for k in train.BATCH_KEYS}
  start = time.perf_counter()
  with using_loss(name):  # Steps traces `_loss` at lowering, inside this block
    steps = train.Steps(config, transformer.graphdef(model_cfg), shardings, mesh, tx, schedule)
    out = cost(steps.train.lower(state, batch, False).compile())
  return out | {"shape": [rows, s, t], "dtype": model_cfg.dtype, "logits_dtype": model_cfg.logits_dtype,
                "vocab": model_cfg.vocab_size, "compile_s": time.perf_counter() - start}


def main() -> None:
  root = pathlib.Path(__file__).resolve().parents[1]
  parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--config", default=str(root / "configs/wmt14_base.py"))
  parser.add_argument("--dtype", default="bfloat16")
  parser.add_argument("--shape", default="96,256,256", help="rows,S,T of the train step")
  parser.add_argument("--loss", default="all", choices=(*LOSSES, "auto", "all"))
  parser.add_argument("--what", default="both", choices=("step", "loss", "both"))
  parser.add_argument("--loss_chunk", type=int, default=32, help="train.loss_chunk of the chunked entry")
  parser.add_argument("--out", default="")
  args = parser.parse_args()

  sys.path.insert(0, str(root / "benchmarks"))
  from accelerator import load_config

  rows, s, t = (int(x) for x in args.shape.split(","))

  def costs(name: str, logits_dtype: str = "float32") -> dict:  # loss `name`'s entry: the loss alone, the step
    config = load_config(args.config)
    config.model.update(dtype=args.dtype, logits_dtype=logits_dtype)
    entry = {}
    if args.what in ("loss", "both"):
      entry["loss"] = loss_cost(name, rows * t, config.data.vocab_size, config.train.label_smoothing, logits_dtype)
    if args.what in ("step", "both"):
      entry["step"] = step_cost(name, config, rows, s, t)
    return entry

  ratios = lambda entry, to: {part: {k: v[k] / to[part][k] for k in ("bytes_accessed", "flops")}
                              for part, v in entry.items()}
  result = {"config": pathlib.Path(args.config).name, "jax": jax.__version__, "platform": "cpu", "losses": {}}
  for name in (LOSSES if args.loss == "all" else (args.loss,)):
    result["losses"][name] = costs(name)
    print(json.dumps({name: result["losses"][name]}), flush=True)
  if args.loss == "all":  # issue 62: the GPU's loss on bf16 logits (model.logits_dtype=bfloat16)
    result["one_pass_bf16_logits"] = entry = costs("one_pass", "bfloat16")
    print(json.dumps({"one_pass_bf16_logits": entry}), flush=True)
    result["bf16_logits_ratio_to_one_pass"] = ratios(entry, result["losses"]["one_pass"])
    # and the projection and loss in chunks (train.loss_chunk): the step's memory as compiled,
    # its bytes and FLOPs with the chunk loop unrolled (seq2seq.training.loss.unrolled_chunks)
    config = load_config(args.config)
    config.model.dtype, config.train.loss_chunk = args.dtype, args.loss_chunk
    entry = {"step": step_cost("one_pass", config, rows, s, t)}
    from seq2seq.training.loss import unrolled_chunks

    with unrolled_chunks():
      unrolled = step_cost("one_pass", config, rows, s, t)
    entry["step"].update(bytes_accessed=unrolled["bytes_accessed"], flops=unrolled["flops"],
                         loss_chunk=args.loss_chunk)
    result["one_pass_chunked"] = entry
    print(json.dumps({"one_pass_chunked": entry}), flush=True)
    result["chunked_ratio_to_one_pass"] = {
        "step": {k: entry["step"][k] / result["losses"]["one_pass"]["step"][k]
                 for k in ("bytes_accessed", "flops", "temp_bytes")}}
    result["ratio_to_legacy"] = {name: ratios(e, result["losses"]["legacy"]) for name, e in result["losses"].items()}
  print(json.dumps(result))
  if args.out:
    pathlib.Path(args.out).write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
  main()
