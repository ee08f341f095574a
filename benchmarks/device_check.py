"""One-call device check: what issue 45 measures on a GPU, in one command of at most 8
minutes, written to one JSON (benchmarks/results/device_check_<device>.json):

- flash: the Pallas kernels against XLA on this GPU, in values and gradients (the flash
  kernel, also reading fused projections in place; the LayerNorm/RMSNorm kernels), and the
  time of each against XLA's at the step's shape;
- steps_bfloat16, steps_float32: the wmt14_base train step at 96x256x256 on random tokens,
  packed rows (`data.fill_rows`, the default) and one pair per row: target tokens/s and MFU
  against the nominal peak of the compute dtype (seq2seq.model.flops.PEAK_TFLOPS), with the
  attention implementation chosen for it (benchmarks/accelerator.py's build and timing);
- train: `seq2seq-train` for 100 steps in bf16 on WMT-length text, newstest2013+2014 tiled
  to 150k pairs in a temporary folder (no network; 20000 pieces, TRAIN_FULL): target
  tokens/s and data_wait_fraction read from its metrics.jsonl (the median of the rows after
  the first, which includes compiling);
- peers: ../shared/bench/anchors_gpu.py on the same shape and model size, one process per
  peer (torch.compile, torch eager, the Flax WMT example, a bf16 matmul); a peer is skipped,
  with the reason, when torch or the Flax example's models.py (`--flax_models`) is missing;
- profile: the train step traced and tabled by benchmarks/profile_table.py (where the time goes);
- variants (not in the default run, `--sections=variants`): the packed step with each of
  VARIANTS, the changes issue 62's profile points to, one at a time against the baseline,
  then the winners together (`combined`);
- variants_big (not in the default run): wmt14_big's packed step (`--big_config`) at the
  baseline and with the variants section's winners (or `--big_variants`);
- profile_after (not in the default run; after `variants`): the profile section of the step
  with the variants section's winners, the "after" table in the same call.

  python benchmarks/device_check.py --flax_models=PATH/models.py   # one GPU, ~7 minutes
  python benchmarks/device_check.py --sections=profile,variants --profile_dir=DIR  # ~6 minutes
  python benchmarks/device_check.py --sections=flash,variants,variants_big,profile_after --budget_s=570 \
    --variants=flash_backward_64,loss_in_xla,residual_apart,logits_bfloat16,no_bias,ffn_bias_apart,flash_sums_apart,xla_norms
  python benchmarks/device_check.py --smoke --out=/tmp/check.json  # CPU: tiny config, ~1.5 minutes

Sections run in this order (the most wanted figures first), each in its own process (none
holds accelerator memory another needs) under what is left of `--budget_s`: a failure or a
timeout records an error string and the next section still runs. The JSON records the
versions (jax, jaxlib, flax, torch), the device kind and every command.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import datetime
import importlib
import importlib.metadata
import importlib.util
import json
import math
import os
import pathlib
import re
import shlex
import signal
import statistics
import subprocess
import sys
import tempfile
import time

REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

import accelerator  # noqa: E402  (build, time_steps, random_batch, load_config)
import wmt_like  # noqa: E402  (newstest pairs)

FULL = dict(config="configs/wmt14_base.py", shape="96x256x256", timed_steps=20, train_steps=100, train_pairs=150_000,
            train_dtype="bfloat16", peers="torch-compile,torch,flax-wmt,peak", peer_steps=10, budget_s=470.0,
            peak_repeats=10)
SMOKE = dict(config="configs/tiny.py", shape="8x32x32", timed_steps=2, train_steps=10, train_pairs=3000,
             train_dtype="float32", peers="torch,flax-wmt", peer_steps=2, budget_s=480.0, peak_repeats=3)
CAPS_S = {"flash": 90, "steps_bfloat16": 150, "profile": 150, "variants": 420, "variants_big": 150,
          "profile_after": 150, "decode": 240, "peers": 200, "train": 180, "steps_float32": 150}  # each one's limit
SECTIONS = "flash,steps_bfloat16,profile,decode,peers,train,steps_float32"  # the default order
MIN_SECTION_S = 15.0  # a section that would start with less left is skipped
# seq2seq-train settings of the train section besides the corpus: two row lengths (two
# compilations instead of eight, ~30 s each on an H200); 20000 pieces, since newstest's
# 12k distinct sentences support at most ~24k (wmt14_base has 37000).
TRAIN_FULL = ["--config.data.num_buckets=2", "--config.data.bucket_min=128", "--config.data.spm_sample_size=24000",
              "--config.data.vocab_size=20000", "--config.train.log_every=10"]
TRAIN_SMOKE = ["--config.train.log_every=5"]


# -- the child processes ---------------------------------------------------------------
def use_this_checkout() -> None:
  """`seq2seq`, its configs included, from this checkout (first on sys.path), whatever else is
  installed."""
  import seq2seq

  assert pathlib.Path(seq2seq.__file__).resolve().parent == REPO / "seq2seq", seq2seq.__file__


def _attention(model_cfg, t: int, packed: bool, devices: int, platform: str = "") -> str:
  """The self-attention implementation the model picks for this step on `platform` (default
  JAX's backend), or why it is unknown."""
  try:
    import jax

    from seq2seq.model import attention

    return attention.choose_implementation(model_cfg.attention_impl, platform=platform or jax.default_backend(),
                                           dtype=model_cfg.compute_dtype, head_dim=model_cfg.head_size, q_len=t,
                                           kv_len=t, packed=packed, device_count=devices, mesh_size=devices)
  except Exception as err:  # noqa: BLE001  (a record, not a failure)
    return f"unknown ({type(err).__name__}: {err})"


def step_rows(config_path: str, dtype: str, shape: tuple[int, int, int], count: int, repeats: int,
              layouts: str = "packed,unpacked", variant: Variant | None = None) -> None:
  """Prints one JSON line per row layout (packed, then unpacked): the train step at `shape`
  with `variant`'s settings (its config overrides, `section.key=value` as on the command line;
  its flash tiles and its UNDO switches, `Variant.apply`); its rows' factor and
  XLA flags are the caller's."""
  import jax
  import numpy as np

  from seq2seq import sharding
  from seq2seq.model import flash, flops

  variant = variant or Variant()
  variant.apply()

  device, (rows, s, t) = jax.devices()[0], shape
  peak = None
  for packed in [layout == "packed" for layout in layouts.split(",")]:
    applied = {}
    try:
      config, applied = _configured(config_path, dtype, packed, variant.overrides)
      model_cfg, mesh, state, steps = accelerator.build(config)
      peak = peak or flops.peak_flops(device.device_kind, device.platform, dtype, mesh.size, repeats=repeats)
      batch = accelerator.random_batch(rows, s, t, model_cfg.vocab_size, np.random.default_rng(0))
      state, seconds, compile_s = accelerator.time_steps(steps, state, sharding.put_batch(batch, mesh), count)
      step_flops = flops.train_step_flops(model_cfg, rows, s, t)
      row = {"packed": packed, "dtype": dtype, "shape": list(shape), "step_ms": seconds * 1e3,
             "target_tokens_per_s": rows * t / seconds, "mfu": step_flops / seconds / peak[0],
             "peak_tflops": peak[0] / 1e12, "peak_source": peak[1], "compile_s": compile_s,
             "attention": _attention(model_cfg, t, packed, mesh.size), "device_kind": device.device_kind,
             "platform": device.platform, "devices": mesh.size}
      del state, steps
    except Exception as err:  # noqa: BLE001  (the other layout still runs)
      row = {"packed": packed, "error": f"{type(err).__name__}: {err}"[:2000]}
    if applied:  # as the child's config holds them
      row["config"] = applied
    if variant.flash_blocks:  # as the child's kernel setting holds them, a failed row too
      row["flash_blocks"] = flash.BLOCKS.spec()
    if variant.undo:  # as the child's modules hold them
      row["switches"] = variant.switch_values()
    print(json.dumps(row), flush=True)


def _configured(config_path: str, dtype: str, packed: bool, overrides: tuple = ()):
  """The config at `config_path` in `dtype` and row layout, with `overrides` (`section.key=value`,
  as on the command line) applied; and those settings as the config now holds them."""
  config = accelerator.load_config(config_path)
  config.model.dtype = dtype
  config.data.update(fill_rows=packed, packing=False)
  applied = {}
  for override in overrides:
    key, value = override.split("=", 1)
    section, name = key.rsplit(".", 1)
    current = config[section][name]
    config[section][name] = value.lower() in ("1", "true") if isinstance(current, bool) else type(current)(value)
    applied[key] = config[section][name]
  return config, applied


def profile_capture(config_path: str, dtype: str, shape: tuple[int, int, int], count: int, out: pathlib.Path,
                    variant: Variant | None = None) -> None:
  """Traces `count` train steps of each row layout (packed, then unpacked) with jax.profiler
  into out/LAYOUT/ (TensorBoard's xplane.pb and a Perfetto trace.json.gz) beside the step's
  optimized HLO (out/LAYOUT/train_step.hlo.txt, whose fusion names the trace's kernels
  carry), and prints one JSON line per layout with the untraced step time. `variant` as
  `step_rows` takes it."""
  import jax
  import numpy as np

  from seq2seq import sharding

  variant = variant or Variant()
  variant.apply()
  rows, s, t = shape
  for packed in (True, False):
    folder = out / ("packed" if packed else "unpacked")
    folder.mkdir(parents=True, exist_ok=True)
    try:
      config, applied = _configured(config_path, dtype, packed, variant.overrides)
      model_cfg, mesh, state, steps = accelerator.build(config)
      batch = sharding.put_batch(accelerator.random_batch(rows, s, t, model_cfg.vocab_size, np.random.default_rng(0)),
                                 mesh)
      (folder / "train_step.hlo.txt").write_text(steps.train.lower(state, batch, False).compile().as_text())
      state, seconds, compile_s = accelerator.time_steps(steps, state, batch, count)
      with jax.profiler.trace(str(folder / "trace"), create_perfetto_trace=True):
        for _ in range(count):
          state, metrics = steps.update(state, [batch])
        jax.block_until_ready((state, metrics))
      row = {"packed": packed, "dtype": dtype, "shape": list(shape), "step_ms": seconds * 1e3, "traced_steps": count,
             "compile_s": compile_s, "attention": _attention(model_cfg, t, packed, mesh.size),
             "files": sorted(str(p.relative_to(out)) for p in folder.rglob("*") if p.is_file()),
             **({"config": applied} if applied else {})}
      del state, steps
    except Exception as err:  # noqa: BLE001  (the other layout still runs)
      row = {"packed": packed, "error": f"{type(err).__name__}: {err}"[:2000]}
    print(json.dumps(row), flush=True)


def _print_timing(name: str, shape: list, key: str, fn, *args, repeats: int) -> None:
  """Prints a JSON line: `fn(*args)`'s milliseconds a call as `key` (called once to compile,
  then `repeats` times), or the error that stopped it."""
  import jax

  try:
    jax.block_until_ready(fn(*args))
    start = time.perf_counter()
    for _ in range(repeats):
      out = fn(*args)
    jax.block_until_ready(out)
    row = {"shape": shape, key: (time.perf_counter() - start) / repeats * 1e3}
  except Exception as err:  # noqa: BLE001  (a record, not a failure)
    row = {"error": f"{type(err).__name__}: {err}"[:2000]}
  print(json.dumps({"timing": name, **row}), flush=True)


def _packed_segments(rng, rows: int, length: int, counts=None):
  """Segment ids of rows packed with sentences of 5 to length/2 tokens, then padding; with
  `counts`, row r holds counts[r] sentences (the sources of a packed row's targets)."""
  import numpy as np

  out = np.zeros((rows, length), np.int32)
  for r in range(rows):
    start, i = 0, 1
    while (start < length - 8) if counts is None else (i <= counts[r]):
      n = int(rng.integers(5, length // 2)) if counts is None else (length - 8) // counts[r]
      out[r, start:start + n] = i
      start, i = start + n, i + 1
  return out


def flash_rows(rows: int = 96, length: int = 256, repeats: int = 20) -> None:
  """Prints JSON lines: the Pallas flash kernel against explicit attention on this GPU
  (outputs and gradients on real queries, packed rows, self/causal/cross, and as the layers
  call it, reading fused projections in place with their biases: causal_in_place,
  cross_in_place), then the time of its forward+backward against XLA attention at the train
  step's shape (`rows` x `length`, wmt14_base's 8 heads of 64; the section passes --shape's
  rows and target length)."""
  import jax
  import jax.numpy as jnp
  import numpy as np

  from seq2seq.model import attention as att
  from seq2seq.model import flash

  def in_place(layout, mask, bq, bv):
    """The kernel on q, k, v stacked as the fused projections hold them, with their biases."""
    if layout is flash.SELF:
      return lambda q, k, v: att.fused_flash_attention((jnp.stack([q, k, v], axis=3),), layout, mask, q_bias_nh=bq,
                                                       v_bias_nh=bv)
    return lambda q, k, v: att.fused_flash_attention((q[:, :, :, None, :], jnp.stack([k, v], axis=3)), layout, mask,
                                                     q_bias_nh=bq, v_bias_nh=bv)

  rng = np.random.default_rng(0)
  for dtype in (jnp.bfloat16, jnp.float16):
    for case, (t, s, causal, layout) in {"self": (256, 256, False, None), "causal": (256, 256, True, None),
                                         "cross": (256, 384, False, None),
                                         "causal_in_place": (256, 256, True, flash.SELF),
                                         "cross_in_place": (256, 384, False, flash.CROSS)}.items():
      try:
        q_seg = _packed_segments(rng, 4, t)
        k_seg = q_seg if s == t else _packed_segments(rng, 4, s, counts=q_seg.max(axis=1))  # every query has keys
        mask = att.SegmentMask(jnp.asarray(q_seg), jnp.asarray(k_seg), causal=causal)
        q, k, v = (jnp.asarray(rng.standard_normal(shape), dtype) for shape in [(4, t, 8, 64), (4, s, 8, 64), (4, s, 8, 64)])
        bq, bv = ((jnp.asarray(rng.standard_normal((8, 64)), dtype) for _ in range(2)) if layout else
                  (jnp.zeros((8, 64), dtype),) * 2)
        real = jnp.asarray(q_seg != 0)[:, :, None, None]
        dz = jnp.asarray(rng.standard_normal(q.shape), dtype) * real
        kernel = in_place(layout, mask, bq, bv) if layout else (lambda q, k, v, mask=mask: att.flash_attention(q, k, v,
                                                                                                             mask))

        def both(q, k, v, mask=mask, dz=dz, kernel=kernel, bq=bq, bv=bv):
          outs = {}
          for name, fn in (("flash", kernel),
                           ("explicit", lambda q, k, v: att.explicit_attention(q + bq, k, v + bv, mask.dense_b1ts()))):
            out, vjp = jax.vjp(fn, q, k, v)
            outs[name] = (out, *vjp(dz))
          return outs

        outs = jax.jit(both)(q, k, v)
        real_np = np.asarray(q_seg != 0)
        row = {"dtype": jnp.dtype(dtype).name, "case": case}
        for i, name in enumerate(("out", "dq", "dk", "dv")):
          got, want = (np.asarray(outs[n][i], np.float32) for n in ("flash", "explicit"))
          if name == "out":
            got, want = got[real_np], want[real_np]
          row[f"{name}_max_abs_err"] = float(np.max(np.abs(got - want)))
          row[f"{name}_max_abs"] = float(np.max(np.abs(want)))
        # ulps at the largest output's magnitude (biased values reach 4 to 8, where a bf16 ulp is 2^-5)
        row["out_within_2_bf16_ulps"] = row["out_max_abs_err"] <= 2 * 2.0 ** (math.floor(math.log2(row["out_max_abs"]))
                                                                              - 7)
      except Exception as err:  # noqa: BLE001  (a record, not a failure)
        row = {"dtype": jnp.dtype(dtype).name, "case": case, "error": f"{type(err).__name__}: {err}"[:2000]}
      print(json.dumps(row), flush=True)
  b, t = rows, length  # the train step's shape: forward + backward of one self-attention, flash vs XLA
  q_seg = jnp.asarray(_packed_segments(rng, b, t))
  mask = att.SegmentMask(q_seg, q_seg, causal=True)
  q, k, v = (jnp.asarray(rng.standard_normal((b, t, 8, 64)), jnp.bfloat16) for _ in range(3))
  for impl in ("flash", "xla"):
    def loss(q, k, v, impl=impl):
      return jnp.sum(att.attention(q, k, v, mask, impl=impl).astype(jnp.float32))

    _print_timing(impl, [b, t, 8, 64], "causal_packed_fwd_bwd_ms", jax.jit(jax.grad(loss, argnums=(0, 1, 2))), q, k, v,
                  repeats=repeats)
  norm_rows(rows, length, repeats)
  loss_rows(rows, length, repeats)


def norm_rows(rows: int, length: int, repeats: int) -> None:
  """Prints JSON lines: `Norm` with the Pallas kernels (norm_impl="pallas",
  seq2seq/model/norm_kernels.py) against `Norm` as XLA computes it (norm_impl="xla") on this
  GPU, LayerNorm and RMSNorm of width 512 at the train step's rows x `length` in bf16: the
  output and the gradients of x and of each parameter; then each one's forward+backward time
  (LayerNorm) at that shape."""
  import jax
  import jax.numpy as jnp
  import numpy as np
  from flax import nnx

  from seq2seq.model.layers import Norm

  rng = np.random.default_rng(0)
  x = jnp.asarray(2.0 * rng.standard_normal((rows, length, 512)) + 0.5, jnp.bfloat16)
  dy = jnp.asarray(rng.standard_normal(x.shape), jnp.bfloat16)
  steps = {}
  for kind in ("layernorm", "rmsnorm"):
    try:
      graphdefs = {impl: nnx.split(Norm(kind, 512, impl=impl, rngs=nnx.Rngs(0))) for impl in ("pallas", "xla")}
      state = jax.tree.map(lambda v: v + jnp.asarray(0.3 * rng.standard_normal(v.shape), v.dtype),
                           graphdefs["xla"][1])  # the same scale (and bias) for both, not ones and zeros
      for impl, (graphdef, _) in graphdefs.items():
        steps[kind, impl] = jax.jit(lambda x, state, g=graphdef: jax.vjp(lambda x, s: nnx.merge(g, s)(x), x, state))
      row = {"dtype": "bfloat16", "case": f"norm_{kind}"}
      (y1, vjp1), (y0, vjp0) = (steps[kind, impl](x, state) for impl in ("pallas", "xla"))
      pairs = [("out", y1, y0), *zip(("dx", "dparams"), vjp1(dy), vjp0(dy))]
      for name, got, want in pairs:
        for path, a, b in zip(jax.tree_util.tree_flatten_with_path(want)[0], jax.tree.leaves(got), jax.tree.leaves(want)):
          key = name + "".join(f"[{k.key}]" for k in path[0] if isinstance(k, jax.tree_util.DictKey))
          a, b = np.asarray(a, np.float32), np.asarray(b, np.float32)
          row[f"{key}_max_abs_err"], row[f"{key}_max_abs"] = float(np.max(np.abs(a - b))), float(np.max(np.abs(b)))
      row["out_within_1_bf16_ulp"] = row["out_max_abs_err"] <= 2.0 ** (math.floor(math.log2(row["out_max_abs"])) - 7)
    except Exception as err:  # noqa: BLE001  (a record, not a failure)
      row = {"dtype": "bfloat16", "case": f"norm_{kind}", "error": f"{type(err).__name__}: {err}"[:2000]}
    print(json.dumps(row), flush=True)
  for impl in ("pallas", "xla"):  # LayerNorm's forward + backward at the step's shape
    graphdef, state = nnx.split(Norm("layernorm", 512, impl=impl, rngs=nnx.Rngs(0)))
    step = jax.jit(lambda x, state, g=graphdef: jax.vjp(lambda x, s: nnx.merge(g, s)(x), x, state)[1](dy))
    _print_timing(f"norm_{impl}", list(x.shape), "layernorm_fwd_bwd_ms", step, x, state, repeats=repeats)
  residual_add_rows(x, dy, repeats)


def residual_add_rows(residual, dy, repeats: int, rate: float = 0.1) -> None:
  """Prints JSON lines: a post-norm's residual add, the branch's bias and dropout made in the norm
  kernels (`Norm.add`, norm_kernels.ADD_IN_KERNEL) against the same in XLA before the kernels, on
  this GPU in bf16: the gradients of residual, branch, its bias and the norm's parameters, and
  whether the same elements were dropped (the kernel's hash in Triton against XLA's); then each
  one's forward+backward time."""
  import jax
  import jax.numpy as jnp
  import numpy as np
  from flax import nnx

  from seq2seq.model import norm_kernels
  from seq2seq.model.layers import Norm

  rng = np.random.default_rng(1)
  branch = jnp.asarray(rng.standard_normal(residual.shape), residual.dtype)
  bias = jnp.asarray(0.3 * rng.standard_normal(residual.shape[-1]), jnp.float32)
  graphdef, state = nnx.split(Norm("layernorm", residual.shape[-1], impl="pallas", rngs=nnx.Rngs(0)))
  key = jax.random.key(2)
  steps, outs = {}, {}

  def add(r, b, bias, s):
    return nnx.merge(graphdef, s).add(r, b, bias_d=bias, rate=rate, rng=key)
  for fused in (True, False):  # the switch is read when the step is traced: each traced under its own
    norm_kernels.ADD_IN_KERNEL = fused
    try:
      step = jax.jit(lambda *args: jax.vjp(add, *args)[1](dy))
      steps[fused], outs[fused] = step, jax.block_until_ready(step(residual, branch, bias, state))
    except Exception as err:  # noqa: BLE001  (a record, not a failure)
      outs[fused] = f"{type(err).__name__}: {err}"[:2000]
    finally:
      norm_kernels.ADD_IN_KERNEL = True
  if all(not isinstance(o, str) for o in outs.values()):
    row = {"dtype": "bfloat16", "case": "norm_residual_add", "rate": rate}
    got, want = outs[True], outs[False]
    row["dropped_equal"] = bool(jnp.all((got[1] == 0) == (want[1] == 0)))
    row["dropped_fraction"] = float(jnp.mean(want[1] == 0))
    for name, a, b in zip(("d_residual", "d_branch", "d_branch_bias", "dparams"), got, want):
      for a, b in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
        a, b = np.asarray(a, np.float32), np.asarray(b, np.float32)
        row[f"{name}_max_abs_err"] = max(row.get(f"{name}_max_abs_err", 0.0), float(np.max(np.abs(a - b))))
        row[f"{name}_max_abs"] = max(row.get(f"{name}_max_abs", 0.0), float(np.max(np.abs(b))))
  else:
    row = {"dtype": "bfloat16", "case": "norm_residual_add", "error": " / ".join(o for o in outs.values()
                                                                              if isinstance(o, str))}
  print(json.dumps(row), flush=True)
  for fused, step in steps.items():
    _print_timing(f"residual_add_{'kernel' if fused else 'xla'}", list(residual.shape), "fwd_bwd_ms", step,
                  residual, branch, bias, state, repeats=repeats)


def loss_rows(rows: int, length: int, repeats: int, vocab: int = 37000, d: int = 512) -> None:
  """Prints JSON lines: the train step's loss on a GPU (the tied projection onto `vocab` entries
  and the label-smoothed loss: seq2seq.training.loss.chunked_cross_entropy_sums, one chunk of
  all positions) with the Pallas kernel (seq2seq/training/loss_kernel.py) against it in XLA on
  this GPU, at rows x `length` bf16 states of width `d`: the sums and the gradients of the states
  and the weight; then each one's forward+backward time. The kernel's time says whether its second
  walk over a row finds it in the L2 cache."""
  import jax
  import jax.numpy as jnp
  import numpy as np

  from seq2seq.training.loss import chunked_cross_entropy_sums

  rng = np.random.default_rng(0)
  y = jnp.asarray(rng.standard_normal((rows, length, d)), jnp.bfloat16)
  w = jnp.asarray(rng.standard_normal((vocab, d)) * d**-0.5 * 4, jnp.float32)  # the embedding, [v, d]
  labels = jnp.asarray(rng.integers(0, vocab, (rows, length)), jnp.int32)
  weights = jnp.asarray(rng.random((rows, length)) < 0.9)

  def step(kernel: bool):
    def loss(y, w):
      sums = chunked_cross_entropy_sums(y, w, labels, weights, tied=True, chunk=length, label_smoothing=0.1,
                                        kernel=kernel)
      return sums["loss_sum"], sums
    return jax.jit(jax.grad(loss, (0, 1), has_aux=True))

  steps = {"pallas": step(True), "xla": step(False)}
  try:
    ((dy1, dw1), sums1), ((dy0, dw0), sums0) = (steps[impl](y, w) for impl in ("pallas", "xla"))
    row = {"dtype": "bfloat16", "case": "loss_kernel", "shape": [rows, length, vocab],
           **{f"{k}_rel_err": abs(float(sums1[k]) - float(sums0[k])) / max(abs(float(sums0[k])), 1.0) for k in sums0}}
    for name, got, want in (("dy", dy1, dy0), ("dw", dw1, dw0)):
      got, want = np.asarray(got, np.float32), np.asarray(want, np.float32)
      row[f"{name}_max_abs_err"], row[f"{name}_max_abs"] = float(np.max(np.abs(got - want))), float(np.max(np.abs(want)))
  except Exception as err:  # noqa: BLE001  (a record, not a failure)
    row = {"dtype": "bfloat16", "case": "loss_kernel", "error": f"{type(err).__name__}: {err}"[:2000]}
  print(json.dumps(row), flush=True)
  for impl, fn in steps.items():
    _print_timing(f"loss_{impl}", [rows, length, vocab], "loss_fwd_bwd_ms", fn, y, w, repeats=repeats)


# -- in the parent -------------------------------------------------------------------------
def run_child(command: list[str], timeout: float, cwd: pathlib.Path | None = None, env: dict | None = None) -> dict:
  """Runs `command` in its own process group (with `env` added to the environment), killed
  after `timeout` s: its return code, the JSON objects it printed one per line, its output's
  tails, and whether it timed out."""
  env = os.environ | (env or {}) | {
      "PYTHONPATH": os.pathsep.join([str(REPO), *filter(None, [os.environ.get("PYTHONPATH")])])}
  proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=cwd,
                          start_new_session=True)
  try:
    out, err = proc.communicate(timeout=max(timeout, 1.0))
    timed_out = False
  except subprocess.TimeoutExpired:
    os.killpg(proc.pid, signal.SIGKILL)
    out, err = proc.communicate()
    timed_out = True
  return {"returncode": proc.returncode, "objects": json_lines(out), "timed_out": timed_out,
          "stdout_tail": out[-1500:], "stderr_tail": err[-3000:]}


def json_lines(text: str) -> list[dict]:
  """The JSON objects of `text`, one a line; other lines (and a torn last one) are skipped."""
  objects = []
  for line in text.splitlines():
    if not line.startswith("{"):
      continue
    try:
      objects.append(json.loads(line))
    except json.JSONDecodeError:
      pass
  return objects


def _failure(child: dict, timeout: float) -> str:
  if child["timed_out"]:
    return f"timed out after {timeout:.0f} s"
  return f"exit status {child['returncode']}: {child['stderr_tail'][-1500:]}"


def steps_section(args, dtype: str, timeout: float) -> dict:
  command = [sys.executable, str(pathlib.Path(__file__).resolve()), "--section=steps", f"--config={args.config}",
             f"--dtype={dtype}", f"--shape={args.shape}", f"--timed_steps={args.timed_steps}",
             f"--peak_repeats={args.peak_repeats}"]
  child = run_child(command, timeout)
  result = {"command": shlex.join(command)}
  for row in child["objects"]:
    result["packed" if row.pop("packed") else "unpacked"] = row
  for layout in ("packed", "unpacked"):
    result.setdefault(layout, {"error": _failure(child, timeout)})
  return result


def flash_section(args, timeout: float) -> dict:
  """The child's checks and timings, and the matrix instructions of the Pallas kernels as XLA
  compiled them on this GPU (`ptx`: from the PTX XLA dumps; benchmarks/triton_kernels.py
  predicts them without a GPU, from another build of Triton)."""
  command = [sys.executable, str(pathlib.Path(__file__).resolve()), "--section=flash", f"--shape={args.shape}",
             f"--timed_steps={args.timed_steps}"]
  with tempfile.TemporaryDirectory(prefix="flash_dump_") as dump:
    flags = " ".join(filter(None, [os.environ.get("XLA_FLAGS", ""), f"--xla_dump_to={dump}"]))
    child = run_child(command, timeout, env={"XLA_FLAGS": flags})
    ptx = pallas_instruction_kinds(p.read_text(errors="replace") for p in pathlib.Path(dump).glob("*.ptx"))
  rows = child["objects"]
  result = {"command": shlex.join(command), "checks": [r for r in rows if "case" in r],
            "timing": {r.pop("timing"): r for r in rows if "timing" in r}, "ptx": ptx}
  return result if rows else result | {"error": _failure(child, timeout)}


PTX_KINDS = {"wgmma": r"\bwgmma\.mma_async\b", "mma_sync": r"\bmma\.sync\b"}  # Hopper's and the warp-level


def pallas_instruction_kinds(texts) -> dict:
  """{kernel: {wgmma, mma_sync, entries}}: the matrix instructions in the PTX entries of the
  project's Pallas kernels (seq2seq_*; XLA may suffix a copy's name with _N), summed over the
  entries of each name in the PTX `texts`."""
  kinds = {}
  for text in texts:
    entries = re.split(r"^\s*(?:\.\w+\s+)*\.entry\s+", text, flags=re.M)[1:]  # .visible .entry NAME(
    for body in entries:
      name = re.sub(r"_\d+$", "", re.match(r"[\w$]+", body).group(0))
      if not name.startswith("seq2seq_"):
        continue
      row = kinds.setdefault(name, {kind: 0 for kind in PTX_KINDS} | {"entries": 0})
      row["entries"] += 1
      for kind, pattern in PTX_KINDS.items():
        row[kind] += len(re.findall(pattern, body))
  return dict(sorted(kinds.items()))


# Changes the profile points to (issue 62), each timed alone against the baseline in the same
# call, then those that won together (`combine`).
@dataclasses.dataclass(frozen=True)
class Variant:
  overrides: tuple[str, ...] = ()  # config overrides, section.key=value
  xla_flags: str = ""  # added to XLA_FLAGS in the child only
  rows: int = 1  # factor on the batch shape's rows
  flash_blocks: str = ""  # seq2seq.model.flash.Blocks.parse form; "" the kernel's defaults
  undo: tuple[str, ...] = ()  # UNDO names: changes undone, the step as it was before each
  group: str = ""  # variants of one group are alternatives: a combination takes the fastest
  combine: bool = True  # False: timed alone only; it changes the model, so the winners' step leaves it out

  def child_flags(self) -> list[str]:
    """The steps / profile_capture child's flags for this variant's settings."""
    return [*[f"--override={o}" for o in self.overrides],
            *([f"--flash_blocks={self.flash_blocks}"] if self.flash_blocks else []),
            *[f"--undo={name}" for name in self.undo]]

  def child_env(self) -> dict:
    """The environment the child adds: XLA_FLAGS with this variant's flags."""
    return ({"XLA_FLAGS": " ".join(filter(None, [os.environ.get("XLA_FLAGS", ""), self.xla_flags]))}
            if self.xla_flags else {})

  def switches(self) -> dict:
    """The flash tiles and the switches this variant sets, as a record's row names them."""
    return {**({"flash_blocks": self.flash_blocks} if self.flash_blocks else {}),
            **{name: True for name in self.undo}}

  def apply(self) -> None:
    """Sets this process's flash tiles and every UNDO switch (off where this variant undoes
    its change, on otherwise), read when a step is traced."""
    from seq2seq.model import flash

    if self.flash_blocks:
      flash.BLOCKS = flash.Blocks.parse(self.flash_blocks)
    for name, (module, switch) in UNDO.items():
      setattr(importlib.import_module(module), switch, name not in self.undo)

  def switch_values(self) -> dict:
    """The switches this variant turns off, `module.SWITCH: value` as this process holds them."""
    values = {}
    for name in self.undo:
      module, switch = UNDO[name]
      values[f"{module.rsplit('.', 1)[1]}.{switch}"] = getattr(importlib.import_module(module), switch)
    return values


# The changes a variant can undo, each a module switch read when a step is traced, in the order
# they came; its name is what the step does with the switch off (a record's row says `name: true`).
UNDO = {
    "flash_sliced": ("seq2seq.model.flash", "IN_PLACE"),  # q, k and v sliced out of the projections for the kernel
    "bias_apart": ("seq2seq.model.layers", "BIAS_IN_MATMUL"),  # the FFN's bias added after its matmul, not in it
    "sums_apart": ("seq2seq.model.flash", "SUMS_IN_KERNELS"),  # the flash backward's delta and bias sums in XLA
    "norm_per_leaf": ("seq2seq.training.optimizer", "GROUPED_NORM"),  # the gradient norm a reduction a parameter
    "dropout_keys_apart": ("seq2seq.model.transformer", "DROPOUT_KEYS_AT_ONCE"),  # a fold_in kernel a dropout key
    "loss_in_xla": ("seq2seq.training.loss_kernel", "AUTO"),  # the loss's statistics and gradient in XLA's two passes
    "residual_apart": ("seq2seq.model.norm_kernels", "ADD_IN_KERNEL"),  # a post-norm's residual add in XLA's kernel
    "pre_add_apart": ("seq2seq.model.norm_kernels", "PRE_ADD_IN_KERNEL"),  # a pre-norm's residual add in XLA's kernel
}


def since(name: str) -> tuple[str, ...]:
  """The UNDO names from `name` on: a variant that undoes them is the step as it was before
  that change, so that each "apart" variant differs from the next by one change."""
  names = list(UNDO)
  return tuple(names[names.index(name):])


def child_variant(args) -> Variant:
  """The variant a steps / profile_capture child was handed (`Variant.child_flags`)."""
  return Variant(tuple(args.override), flash_blocks=args.flash_blocks, undo=tuple(args.undo))


FLASH = ("model.attention_impl=flash",)  # tiles that do not compile fail the variant, not fall back to XLA
VARIANTS = {  # in the order they run: the likeliest gains first
    "baseline": Variant(),
    "logits_bfloat16": Variant(("model.logits_dtype=bfloat16",)),  # the [tokens, vocab] logits in bf16
    # no biases in attention and feed-forward (T5, MaxText, LLaMA): ablations.md's `nobias`, inconclusive at ±0.02 NLL
    "no_bias": Variant(("model.use_bias=False",), combine=False),
    # the layers' q, k and v sliced out of their fused projections for the kernel, as before it read them in place
    "flash_sliced": Variant(FLASH, undo=("flash_sliced",)),
    # LayerNorm as XLA fuses it, as before the Pallas norm kernels (seq2seq/model/norm_kernels.py); the
    # step as it was then, so the later changes undone too (the FFN's bias, the flash backward's sums, the
    # gradient norm, the dropout keys, the loss, the residual adds)
    "xla_norms": Variant(("model.norm_impl=xla",), undo=since("bias_apart")),
    # the FFN's first bias added to its rounded matmul in a pass of its own, as before layers.dense_bias
    # (and, as then, the flash backward's sums in XLA, the gradient norm a reduction a parameter, the
    # dropout keys a fold each, the loss and the residual adds in XLA)
    "ffn_bias_apart": Variant(undo=since("bias_apart")),
    # the flash backward's delta = rowsum(dO * O) and its biases' gradients summed by XLA from the arrays
    # (and, as then, the gradient norm a reduction a parameter, the dropout keys a fold each, the loss and
    # the residual adds in XLA)
    "flash_sums_apart": Variant(FLASH, undo=since("sums_apart")),
    # the gradient's global norm summed a parameter at a time (optax.tree.norm), as before
    # optimizer.global_norm summed it by groups of one shape (and, as then, the dropout keys a fold each,
    # the loss and the residual adds in XLA)
    "norm_per_leaf": Variant(undo=since("norm_per_leaf")),
    # each dropout key derived by its own fold_in, as before dropout.DropoutKeys derived them at once
    # (the same keys: only the kernels differ; and, as then, the loss and the residual adds in XLA)
    "dropout_keys_apart": Variant(undo=since("dropout_keys_apart")),
    # the loss's statistics and its gradient in XLA, the logits read in the forward and again in the
    # backward pass, as before seq2seq/training/loss_kernel.py read them once (and the residual adds in XLA)
    "loss_in_xla": Variant(undo=since("loss_in_xla")),
    # a post-norm's residual add, dropout and output bias in XLA's kernels around the norm kernels, as
    # before seq2seq/model/norm_kernels.py made them (the norm's input written and read again, the
    # branch's gradient through the dropout a pass over the norm's, the bias's gradient summed apart),
    # and the norm backward's partial sums an array each
    "residual_apart": Variant(undo=since("residual_apart")),
    # the model made pre-norm (as the main job is; a model change), and the same step with its residual
    # add, dropout and output bias in XLA's kernels between the norm kernels, as before the next norm's
    # kernels made them (the sum written, then read by the norm; the branch's gradient through the
    # dropout and the bias's sum in passes of their own): the pair times that change
    "pre_norm": Variant(("model.norm_position=pre",), combine=False),
    "pre_add_apart": Variant(("model.norm_position=pre",), undo=since("pre_add_apart"), combine=False),
    # the backward kernels at tiles of 64 with 8 warps: the tiling where Triton gives all three
    # kernels Hopper's HGMMA without spilling (benchmarks/triton_kernels.py; the default's are HMMA)
    "flash_backward_64": Variant(FLASH, flash_blocks="dkdv=64x64,dq=64x64,backward_warps=8", group="flash"),
    # the Triton tutorial's Hopper tiles: large outer blocks, small inner ones, more stages
    "flash_tiles_128": Variant(FLASH, flash_blocks="forward=128x64,dkdv=128x32,dq=128x32,stages=3", group="flash"),
    "flash_tiles_64": Variant(FLASH, flash_blocks="forward=128x128,dkdv=64x64,dq=64x64,warps=8,backward_warps=8",
                              group="flash"),
    "cublaslt": Variant(xla_flags="--xla_gpu_enable_cublaslt=true"),  # bias and ReLU in the GEMM's epilogue
    "adam_mu_bfloat16": Variant(("train.adam_mu_dtype=bfloat16",)),
    # no global gradient norm each step (its per-parameter reductions; the guard checks the loss alone)
    "no_grad_norm": Variant(("train.grad_norm=False",)),
    "loss_chunk_32": Variant(("train.loss_chunk=32",)),  # no [tokens, vocab] logits held: 8 chunks of 256 positions
    "rows_x2": Variant(rows=2),
    "no_command_buffers": Variant(xla_flags="--xla_gpu_enable_command_buffer=", group="command_buffers"),
    "no_triton_gemm": Variant(xla_flags="--xla_gpu_enable_triton_gemm=false", group="triton_gemm"),
}
MIN_GAIN = 1.02  # a variant joins the combination when at least this much faster than the baseline
COMBINED_RESERVE_S = 75.0  # single variants stop when less is left, so that the combination runs


def union(names: list[str], variants: dict = VARIANTS) -> Variant:
  """The variants `names` together: overrides in order, XLA flags joined, row factors
  multiplied, the first flash tiles (a group's alternatives are not combined)."""
  parts = [variants[name] for name in names]
  blocks = [v.flash_blocks for v in parts if v.flash_blocks]
  return Variant(overrides=tuple(dict.fromkeys(o for v in parts for o in v.overrides)),
                 xla_flags=" ".join(v.xla_flags for v in parts if v.xla_flags),
                 rows=math.prod(v.rows for v in parts), flash_blocks=blocks[0] if blocks else "",
                 undo=tuple(dict.fromkeys(name for v in parts for name in v.undo)))


def combine(results: dict, variants: dict = VARIANTS) -> tuple[list[str], Variant]:
  """The variants at least MIN_GAIN faster than the baseline (the fastest of each group; none
  that changes the model), in the table's order, and their `union`."""
  best = {}
  for name, row in results.items():
    speed = (row.get("speed_vs_baseline") if isinstance(row, dict) else None) or 0.0  # ("seconds": a number)
    if name != "baseline" and name in variants and variants[name].combine and speed >= MIN_GAIN:
      group = variants[name].group or name
      if group not in best or speed > results[best[group]]["speed_vs_baseline"]:
        best[group] = name
  members = [name for name in variants if name in best.values()]
  return members, union(members, variants)


def _variant_row(args, config: str, variant: Variant, timeout: float, layout: str = "packed") -> dict:
  """The train step of `config` with `variant` in row `layout`, in a child (so that XLA_FLAGS apply)."""
  rows, s, t = (int(x) for x in args.shape.split("x"))
  command = [sys.executable, str(pathlib.Path(__file__).resolve()), "--section=steps", f"--config={config}",
             f"--dtype={args.train_dtype}", f"--shape={rows * variant.rows}x{s}x{t}",
             f"--timed_steps={args.timed_steps}", f"--peak_repeats={args.peak_repeats}", f"--layouts={layout}",
             *variant.child_flags()]
  child = run_child(command, timeout, env=variant.child_env())
  row = next(iter(child["objects"]), {"error": _failure(child, timeout)})
  row.pop("packed", None)
  return {"overrides": list(variant.overrides), "xla_flags": variant.xla_flags, **variant.switches(), **row}


def _speeds(result: dict) -> dict:
  base = result.get("baseline", {}).get("target_tokens_per_s")
  for row in result.values():
    if base and row.get("target_tokens_per_s"):
      row["speed_vs_baseline"] = row["target_tokens_per_s"] / base
  return result


def variants_section(args, timeout: float) -> dict:
  """The packed train step with each of `--variants` (one child each) against the baseline:
  step time, tokens/s, MFU and the speed relative to `baseline`; `unpacked`, the baseline
  with unpacked rows (packed rows' target: at least as fast); then `combined`, the variants
  that won (`combine`), together."""
  deadline, result = time.monotonic() + timeout, {}
  names = ["baseline", "unpacked", *[v for v in args.variants.split(",") if v and v != "baseline"]]
  for name in names:
    left = deadline - time.monotonic() - (COMBINED_RESERVE_S if name != "baseline" else 0.0)
    if left < MIN_SECTION_S:
      result[name] = {"skipped": f"{max(left, 0):.0f} s left"}
    elif name == "unpacked":
      result[name] = _variant_row(args, args.config, VARIANTS["baseline"], left, layout="unpacked")
    else:
      result[name] = _variant_row(args, args.config, VARIANTS[name], left)
  members, together = combine(_speeds(result))
  left = deadline - time.monotonic()
  if len(members) < 2:
    result["combined"] = {"members": members, "skipped": "fewer than two variants won"}
  elif left < MIN_SECTION_S:
    result["combined"] = {"members": members, "skipped": f"{max(left, 0):.0f} s left"}
  else:
    result["combined"] = {"members": members, **_variant_row(args, args.config, together, left)}
  return _speeds(result)


def variants_big_section(args, timeout: float) -> dict:
  """wmt14_big's packed step (issue 62's 45% MFU target), at the baseline and with the
  winners of this call's variants section (or the variants `--big_variants` names)."""
  members = list(filter(None, args.big_variants.split(","))) if args.big_variants else args.variant_winners
  together = union(members)
  deadline, result = time.monotonic() + timeout, {}
  for name, variant in (("baseline", Variant()), ("combined", together)):
    left = deadline - time.monotonic()
    if name == "combined" and not members:
      result[name] = {"members": [], "skipped": "no variant won"}
    elif left < MIN_SECTION_S:
      result[name] = {"skipped": f"{max(left, 0):.0f} s left"}
    else:
      result[name] = ({"members": members} if name == "combined" else {}) | _variant_row(args, args.big_config,
                                                                                         variant, left)
  return _speeds(result)


def profile_after_section(args, timeout: float) -> dict:
  """The profile section of the step with the winners of this call's variants section (the
  "after" table beside the baseline's; run after `variants`, in the same call). Its step is
  the one the winner's child (or `combined`'s) compiled, which the shared compilation cache
  may hold."""
  if not args.variants_ran:
    return {"skipped": "the variants section has not run before it in --sections"}
  if not args.variant_winners:
    return {"variants": [], "skipped": "no variant won"}
  return profile_section(args, timeout, args.variant_winners)


def profile_section(args, timeout: float, members: list[str] | None = None) -> dict:
  """The train step traced (profile_capture, in a child) and tabled by benchmarks/profile_table.py
  for each row layout, with `members` (default --profile_variants) together; --profile_dir
  keeps the traces and the HLO (in DIR/after for profile_after)."""
  import profile_table

  after = members is not None
  members = members if after else list(filter(None, args.profile_variants.split(",")))  # checked by `parse`
  variant = union(members)
  rows, s, t = (int(x) for x in args.shape.split("x"))
  with tempfile.TemporaryDirectory(prefix="device_check_profile_") as tmp:
    out = pathlib.Path(args.profile_dir or tmp) / ("after" if after else "")
    command = [sys.executable, str(pathlib.Path(__file__).resolve()), "--section=profile_capture",
               f"--config={args.config}", f"--dtype={args.train_dtype}", f"--shape={rows * variant.rows}x{s}x{t}",
               f"--timed_steps={args.profile_steps}", f"--out={out}", *variant.child_flags()]
    child = run_child(command, timeout, env=variant.child_env())
    result = {"command": shlex.join(command), "variants": members, "xla_flags": variant.xla_flags}
    for row in child["objects"]:
      layout = "packed" if row.pop("packed") else "unpacked"
      if "error" not in row:
        try:
          row["table"] = profile_table.from_folder(out / layout, row["traced_steps"])
        except (OSError, ValueError) as err:
          row["error"] = f"{type(err).__name__}: {err}"
      result[layout] = row
    for layout in ("packed", "unpacked"):
      result.setdefault(layout, {"error": _failure(child, timeout)})
  return result


def decode_section(args, timeout: float) -> dict:
  """benchmarks/decode_programs.py: newstest2014's compiled programs and sentences/s."""
  with tempfile.TemporaryDirectory(prefix="device_check_") as tmp:
    out = pathlib.Path(tmp) / "decode.json"
    command = [sys.executable, str(pathlib.Path(__file__).resolve()), "--section=decode", f"--out={out}",
               *(["--sentences=64", "--config=configs/tiny.py"] if args.smoke else [])]
    child = run_child(command, timeout)
    if out.is_file():
      return json.loads(out.read_text()) | {"command": shlex.join(command)}
  return {"command": shlex.join(command), "error": _failure(child, timeout), "stdout_tail": child["stdout_tail"]}


def tiled_newstest(data_dir: pathlib.Path, pairs: int, out: pathlib.Path) -> str:
  """Writes newstest2013+2014 repeated to `pairs` lines per side as OUT/wmt_tiled.{en,de}; its files: split."""
  real = wmt_like.newstest(str(data_dir))
  out.mkdir(parents=True, exist_ok=True)
  for side, lang in enumerate(("en", "de")):
    lines = [real[i % len(real)][side] for i in range(pairs)]
    (out / f"wmt_tiled.{lang}").write_text("\n".join(lines) + "\n", encoding="utf-8")
  return f"files:{out}/wmt_tiled.{{lang}}"


def train_section(args, timeout: float) -> dict:
  with tempfile.TemporaryDirectory(prefix="device_check_") as tmp:
    tmp = pathlib.Path(tmp)
    split = tiled_newstest(args.shared / "data", args.train_pairs, tmp / "text")
    flags = [f"--config={REPO / args.config}", f"--workdir={tmp / 'run'}", f"--config.model.dtype={args.train_dtype}",
             f"--config.data.dir={args.shared / 'data'}", f"--config.data.train_split={split}",
             f"--config.data.cache_dir={tmp / 'cache'}", f"--config.train.steps={args.train_steps}",
             "--config.train.eval_every=0", "--config.train.checkpoint_every=1000000", *args.train_flags,
             f"--compilation_cache={tmp / 'xla'}"]
    command = [sys.executable, str(pathlib.Path(__file__).resolve()), "--section=seq2seq-train", *flags]
    start = time.perf_counter()
    child = run_child(command, timeout)
    wall_s = time.perf_counter() - start
    metrics_path = tmp / "run" / "metrics.jsonl"
    records = json_lines(metrics_path.read_text()) if metrics_path.is_file() else []
    rows = [{k: r[k] for k in ("step", "target_tokens_per_s", "data_wait_fraction", "padding_fraction", "mfu",
                                "peak_source") if k in r} for r in records if "loss" in r]
    result = {"command": "seq2seq-train " + shlex.join(flags), "run_as": shlex.join(command),
              "corpus": f"newstest2013+2014 tiled to {args.train_pairs} pairs", "wall_s": wall_s, "rows": rows,
              "vocab_size": _pieces(tmp / "run" / "spm.model")}
  if child["returncode"] != 0 or not rows:
    return result | {"error": _failure(child, timeout) if child["returncode"] != 0 else "no metrics rows"}
  steady = rows[1:] or rows  # the first window includes compiling
  for key in ("target_tokens_per_s", "data_wait_fraction", "mfu"):
    result[key] = statistics.median(r[key] for r in steady)
  return result | {"peak_source": rows[-1].get("peak_source")}


def _pieces(model: pathlib.Path) -> int | None:
  try:
    import sentencepiece

    return sentencepiece.SentencePieceProcessor(model_file=str(model)).get_piece_size()
  except Exception:  # noqa: BLE001  (no run, no tokenizer)
    return None


def peers_section(args, timeout: float) -> dict:
  script = args.shared / "bench" / "anchors_gpu.py"
  if not script.is_file():
    return {"skipped": f"{script} is missing"}
  config = accelerator.load_config(str(REPO / args.config))
  m, vocab = config.model, config.data.vocab_size
  if m.num_encoder_layers != m.num_decoder_layers:
    return {"skipped": "anchors_gpu.py takes one layer count for both stacks"}
  deadline = time.monotonic() + timeout
  result = {}
  for impl in args.peers.split(","):
    reason = _peer_missing(impl, args.flax_models)
    left = deadline - time.monotonic()
    if reason or left < MIN_SECTION_S:
      result[impl] = {"skipped": reason or f"time budget: {max(left, 0):.0f} s left"}
      continue
    command = [sys.executable, str(script), f"--shapes={args.shape}", f"--impls={impl}", f"--steps={args.peer_steps}",
               "--dtype=bfloat16", f"--d={m.d_model}", f"--heads={m.num_heads}", f"--layers={m.num_encoder_layers}",
               f"--ff={m.d_ff}", f"--vocab={vocab}", f"--flax_models={args.flax_models}"]
    child = run_child(command, left, cwd=script.parent)
    found = child["objects"][-1] if child["objects"] else {"error": _failure(child, left)}
    if impl == "peak" and not child["objects"] and child["returncode"] == 0:
      found = {"skipped": "no CUDA device"}
    result[impl] = found | {"command": shlex.join(command)}
  return result


def _peer_missing(impl: str, flax_models: pathlib.Path) -> str:
  if impl.startswith("torch") or impl == "peak":
    return "" if importlib.util.find_spec("torch") else "torch is not installed"
  if impl == "flax-wmt" and not flax_models.is_file():
    return (f"no Flax WMT example at {flax_models} (--flax_models; from a google/flax clone: "
            "git show HEAD:examples/wmt/models.py > models.py)")
  return ""


def versions() -> dict:
  found = {"python": sys.version.split()[0]}
  for name in ("jax", "jaxlib", "flax", "optax", "torch"):
    try:
      found[name] = importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
      found[name] = None
  return found


def guarded(name: str, section, deadline: float) -> dict:
  """`section(timeout)` within its cap and what is left of the budget; an error or a lack
  of time is recorded instead of raised."""
  left = deadline - time.monotonic()
  if left < MIN_SECTION_S:
    return {"skipped": f"time budget: {max(left, 0):.0f} s left"}
  start = time.monotonic()
  try:
    result = section(min(CAPS_S[name], left))
  except Exception as err:  # noqa: BLE001  (the next section still runs)
    result = {"error": f"{type(err).__name__}: {err}"[:2000]}
  print(f"{name}: {time.monotonic() - start:.0f} s", flush=True)
  return result | {"seconds": time.monotonic() - start}


def summary(sections: dict) -> dict:
  """The figures issue 45's targets compare, measured in this run."""
  out = {}
  for dtype in ("bfloat16", "float32"):
    for layout in ("packed", "unpacked"):
      row = sections.get(f"steps_{dtype}", {}).get(layout, {})
      if "target_tokens_per_s" in row:
        out[f"{dtype}_{layout}_tokens_per_s"], out[f"{dtype}_{layout}_mfu"] = row["target_tokens_per_s"], row["mfu"]
  if "bfloat16_packed_tokens_per_s" in out and "bfloat16_unpacked_tokens_per_s" in out:
    out["bfloat16_packed_over_unpacked"] = out["bfloat16_packed_tokens_per_s"] / out["bfloat16_unpacked_tokens_per_s"]
  for peer, row in sections.get("peers", {}).items():
    for layout in ("packed", "unpacked"):
      ours = out.get(f"bfloat16_{layout}_tokens_per_s")
      if ours and isinstance(row, dict) and "target_tokens_per_s" in row:
        out[f"bfloat16_{layout}_over_{peer}"] = ours / row["target_tokens_per_s"]
  for section, prefix in (("variants", "variants"), ("variants_big", "big")):  # issue 62
    rows = {k: v for k, v in sections.get(section, {}).items() if isinstance(v, dict)}
    if any("speed_vs_baseline" in row for row in rows.values()):
      out[f"{prefix}_speed_vs_baseline"] = {k: v["speed_vs_baseline"] for k, v in rows.items() if "speed_vs_baseline" in v}
      out[f"{prefix}_mfu"] = {k: v["mfu"] for k, v in rows.items() if "mfu" in v}
  variants = sections.get("variants", {})
  if "target_tokens_per_s" in variants.get("unpacked", {}):
    unpacked = variants["unpacked"]["target_tokens_per_s"]
    out["variants_packed_over_unpacked"] = {k: variants[k]["target_tokens_per_s"] / unpacked
                                            for k in ("baseline", "combined")
                                            if "target_tokens_per_s" in variants.get(k, {})}
  for key in ("target_tokens_per_s", "data_wait_fraction"):
    if key in sections.get("train", {}):
      out[f"train_{key}"] = sections["train"][key]
  return out


def device_of(sections: dict) -> dict:
  """The device the step rows ran on (those of a steps or variants section)."""
  for name in ("steps_bfloat16", "steps_float32", "variants", "variants_big"):
    for row in sections.get(name, {}).values():
      if isinstance(row, dict) and "device_kind" in row:
        return {k: row[k] for k in ("device_kind", "platform", "devices")}
  return {"device_kind": "unknown", "platform": "unknown", "devices": 0}


@contextlib.contextmanager
def shared_compilation_cache():
  """JAX's persistent compilation cache for this call's children: JAX_COMPILATION_CACHE_DIR
  if set, else a fresh folder removed at the end. A child then loads what another compiled
  (every variant's initializer; variants_big's baseline when it is the variants' config)
  instead of compiling it again; XLA flags, tiles and shapes are in the programs' keys, so
  each variant's step still compiles its own. Yields what the JSON records."""
  if os.environ.get("JAX_COMPILATION_CACHE_DIR"):
    yield os.environ["JAX_COMPILATION_CACHE_DIR"]
    return
  with tempfile.TemporaryDirectory(prefix="device_check_xla_") as folder:
    os.environ["JAX_COMPILATION_CACHE_DIR"] = folder
    try:
      yield "a fresh folder for this call's children"
    finally:
      del os.environ["JAX_COMPILATION_CACHE_DIR"]


def check(args) -> dict:
  with shared_compilation_cache() as cache:
    return _check(args) | {"compilation_cache": cache}


def _check(args) -> dict:
  start = time.monotonic()
  deadline = start + args.budget_s
  run = {"flash": lambda s: flash_section(args, s), "steps_bfloat16": lambda s: steps_section(args, "bfloat16", s),
         "profile": lambda s: profile_section(args, s), "variants": lambda s: variants_section(args, s),
         "variants_big": lambda s: variants_big_section(args, s),
         "profile_after": lambda s: profile_after_section(args, s),
         "decode": lambda s: decode_section(args, s),
         "peers": lambda s: peers_section(args, s),
         "train": lambda s: train_section(args, s), "steps_float32": lambda s: steps_section(args, "float32", s)}
  sections = {}
  for name in args.sections.split(","):
    if name not in run:
      raise SystemExit(f"error: unknown section {name!r}; known: {', '.join(run)}")
    sections[name] = guarded(name, run[name], deadline)
    if name == "variants":  # what variants_big combines and profile_after traces
      args.variant_winners, args.variants_ran = combine(sections[name])[0], True
  return {"check": "benchmarks/device_check.py", "date": datetime.datetime.now(datetime.timezone.utc).isoformat(),
          "smoke": args.smoke, "command": shlex.join([sys.executable, *sys.argv]), "config": args.config,
          "shape": [int(x) for x in args.shape.split("x")], **device_of(sections), "versions": versions(),
          "budget_s": args.budget_s, "elapsed_s": time.monotonic() - start, "summary": summary(sections),
          "sections": sections}


def parse(argv: list[str]):
  parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--smoke", action="store_true", help="tiny config, small shapes, few steps (a CPU check)")
  for name, value in FULL.items():
    parser.add_argument(f"--{name}", type=type(value), default=None, help=f"default {value} ({SMOKE[name]} with --smoke)")
  parser.add_argument("--shared", type=pathlib.Path, default=REPO.parent / "shared",
                      help="the shared folder: data/wmt14 and bench/anchors_gpu.py")
  parser.add_argument("--flax_models", type=pathlib.Path, default=None,
                      help="the Flax WMT example's models.py (default SHARED/bench/flax_wmt_models.py)")
  parser.add_argument("--out", default="", help="default benchmarks/results/device_check_<device>[_smoke].json")
  parser.add_argument("--variants", default=",".join(VARIANTS), help="the variants section's variants (baseline always)")
  parser.add_argument("--big_config", default=None, help="variants_big's config (default configs/wmt14_big.py; "
                      "configs/tiny.py with --smoke)")
  parser.add_argument("--big_variants", default="", help="variants_big combines these (default: the variants "
                      "section's winners in this call)")
  parser.add_argument("--profile_dir", default="", help="keep the profile section's traces and HLO here")
  parser.add_argument("--profile_steps", type=int, default=5, help="train steps the profile section traces")
  parser.add_argument("--profile_variants", default="", help="the profile section traces the step with these "
                      "variants together (default: the baseline)")
  parser.add_argument("--sections", default=SECTIONS, help=f"sections to run, in order (default {SECTIONS})")
  parser.add_argument("--section", default="", help=argparse.SUPPRESS)  # a child: steps or flash
  parser.add_argument("--dtype", default="bfloat16", help=argparse.SUPPRESS)
  parser.add_argument("--override", action="append", default=[], help=argparse.SUPPRESS)  # steps: config overrides
  parser.add_argument("--layouts", default="packed,unpacked", help=argparse.SUPPRESS)  # steps: which layouts
  parser.add_argument("--flash_blocks", default="", help=argparse.SUPPRESS)  # steps: the flash kernel's tiles
  parser.add_argument("--undo", action="append", default=[], choices=sorted(UNDO),
                      help=argparse.SUPPRESS)  # steps: an UNDO switch off
  args = parser.parse_args(argv)
  for flag in ("variants", "big_variants", "profile_variants"):
    unknown = [n for n in getattr(args, flag).split(",") if n and n not in VARIANTS]
    if unknown:
      parser.error(f"--{flag}: unknown variant(s) {', '.join(unknown)}; known: {', '.join(VARIANTS)}")
  for name, value in (SMOKE if args.smoke else FULL).items():
    if getattr(args, name) is None:
      setattr(args, name, value)
  args.flax_models = args.flax_models or args.shared / "bench" / "flax_wmt_models.py"
  args.train_flags = TRAIN_SMOKE if args.smoke else TRAIN_FULL
  args.big_config = args.big_config or ("configs/tiny.py" if args.smoke else "configs/wmt14_big.py")
  args.variant_winners, args.variants_ran = [], False
  return args


def main() -> None:
  use_this_checkout()
  if sys.argv[1:2] == ["--section=seq2seq-train"]:  # a child: the seq2seq-train command itself
    from seq2seq.commands import train

    sys.argv = ["seq2seq-train", *sys.argv[2:]]
    return train.run()
  if sys.argv[1:2] == ["--section=decode"]:  # a child: benchmarks/decode_programs.py
    import decode_programs

    sys.argv = ["decode_programs.py", *sys.argv[2:]]
    return decode_programs.main()
  args = parse(sys.argv[1:])
  if args.section == "flash":
    rows, _, t = (int(x) for x in args.shape.split("x"))
    return flash_rows(rows, t, args.timed_steps)
  if args.section == "profile_capture":
    return profile_capture(str(REPO / args.config), args.dtype, tuple(int(x) for x in args.shape.split("x")),
                           args.timed_steps, pathlib.Path(args.out), child_variant(args))
  if args.section == "steps":
    return step_rows(str(REPO / args.config), args.dtype, tuple(int(x) for x in args.shape.split("x")),
                     args.timed_steps, args.peak_repeats, args.layouts, child_variant(args))
  result = check(args)
  slug = re.sub(r"[^a-z0-9]+", "_", result["device_kind"].lower()).strip("_") + ("_smoke" if args.smoke else "")
  out = pathlib.Path(args.out or REPO / "benchmarks" / "results" / f"device_check_{slug}.json")
  out.parent.mkdir(parents=True, exist_ok=True)
  out.write_text(json.dumps(result, indent=1) + "\n")
  print(json.dumps(result["summary"], indent=1))
  print(f"wrote {out}")


if __name__ == "__main__":
  main()
