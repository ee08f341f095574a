"""The loss's statistics and its gradient with respect to the logits in one Pallas kernel (Triton on
a GPU): the [tokens, vocab] logits read once, where XLA reads them twice.

What XLA makes of the loss on a GPU (benchmarks/gpu_compile.py, the wmt14_base step for an
H200): the forward pass reads the f32 logits [24576, 37000] once for the per-token statistics
(3.7 GB), and the backward pass reads them again for the gradient p - target, which it writes in
bf16 (5.5 GB): two passes over 3.6 GB because the gradient needs each row's log-sum-exp, a
reduction over the whole row, before its first entry can be written.

Here each program takes one row (a target position) and walks its vocabulary twice in blocks of
`block` entries: first the online softmax (Milakov & Gimelshein 2018: the running max and the
sum of exp(logit - max)), the label's logit and the sum of the logits; then, in the reverse
order, so that the blocks it read last (still in the L2 cache) come first, the gradient
weight * (p - (1 - eps) onehot - eps / V), written in the states' dtype. Only the first walk reads
HBM, as long as the row (148 KB in f32) stays in the L2 cache between the two walks; a GPU says
whether it does (benchmarks/device_check.py: the flash section's `loss_pallas` and `loss_xla`
timings, the `loss_in_xla` variant). Liger-Kernel's cross entropy
(Hsu et al. 2024) computes its gradient in the forward pass the same way.

The gradient is that of the weighted loss sum, so it is known in the forward pass: the kernel's
caller (seq2seq.training.loss, `_chunk_loop`) owns the vocabulary projection and multiplies the
matmuls' results by the loss's cotangent, one number, in the backward pass.

Rows are the [b, t] positions flattened; inside a train step's mesh the call runs per device in
`jax.shard_map` over the batch (the vocabulary must not be split over devices: `blockers`).
`interpret=True` runs the kernel in Pallas' interpreter on any platform (tests).
"""

from __future__ import annotations

import functools
import warnings

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import pallas as pl

from seq2seq.compilation import compile_problem, kernel_chosen
from seq2seq.sharding import activation_spec, current_mesh

try:  # the Triton backend's helpers; absent in JAX builds without Pallas GPU support
  from jax.experimental.pallas import triton as plgpu
except ImportError:  # pragma: no cover
  plgpu = None

# Vocabulary entries a program reads at a time (a power of two: a Triton tile) and its warps.
# Compiled for sm_90a by Triton 3.9 (benchmarks/results/triton_kernels_h100.json): 119 registers a
# thread, no spills, 2 programs an SM; their rows, 2 x 132 x 148 KB = 39 MB at 37000 entries in
# f32, fit the 50 MB L2 cache between the two walks. 4096 x 8 warps: 3 programs an SM, 59 MB.
BLOCK = 8192
WARPS = 8
# The L2 cache policy of each walk's loads: keep the row for the second walk, then let it go.
EVICTION = ("evict_last", "evict_first")
# "auto" picks the kernel where it runs (benchmarks/device_check.py's `loss_in_xla` turns this off
# to time the step as it was before it).
AUTO = True


def _block(vocab: int) -> int:
  return min(BLOCK, int(pl.next_power_of_2(vocab)))


def _kernel(z_ref, labels_ref, weights_ref, d_ref, max_ref, lse_ref, label_ref, total_ref, *, eps: float,
            block: int):
  vocab = z_ref.shape[-1]
  blocks = pl.cdiv(vocab, block)
  lowest = float(np.finfo(np.float32).min)  # past the vocabulary: no weight in the max or the sums
  label = labels_ref[...]  # [1]

  def read(j, policy: str | None):
    cols = j * block + jnp.arange(block, dtype=jnp.int32)
    inside = (cols < vocab)[None, :]
    x = plgpu.load(z_ref.at[:, pl.ds(j * block, block)], mask=inside, other=lowest, eviction_policy=policy)
    return cols[None, :], inside, x.astype(jnp.float32)

  def first(j, carry):  # the statistics: online softmax, the label's logit, the sum
    high, sumexp, at_label, total = carry
    cols, inside, x = read(j, EVICTION[0])
    new_high = jnp.maximum(high, jnp.max(x, axis=1))
    sumexp = sumexp * jnp.exp(high - new_high) + jnp.sum(jnp.exp(x - new_high[:, None]), axis=1)
    at_label = at_label + jnp.sum(jnp.where(cols == label[:, None], x, 0.0), axis=1)
    return new_high, sumexp, at_label, total + jnp.sum(jnp.where(inside, x, 0.0), axis=1)

  zero = jnp.zeros((1,), jnp.float32)
  high, sumexp, at_label, total = jax.lax.fori_loop(0, blocks, first, (zero + lowest, zero, zero, zero))
  lse = high + jnp.log(sumexp)
  g = weights_ref[...][:, None]

  def second(i, carry):  # the gradient, the blocks read last first
    j = blocks - 1 - i
    cols, inside, x = read(j, EVICTION[1])
    d = g * jnp.exp(x - lse[:, None]) - jnp.where(cols == label[:, None], (1.0 - eps) * g, 0.0) - (eps / vocab) * g
    plgpu.store(d_ref.at[:, pl.ds(j * block, block)], d.astype(z_ref.dtype).astype(d_ref.dtype), mask=inside)
    return carry

  jax.lax.fori_loop(0, blocks, second, 0)
  max_ref[...], lse_ref[...], label_ref[...], total_ref[...] = high, lse, at_label, total


def _rows(z_nv, labels_n, weights_n, eps: float, out_dtype, interpret: bool):
  rows, vocab = z_nv.shape
  row = pl.BlockSpec((1, vocab), lambda i: (i, 0))
  one = pl.BlockSpec((1,), lambda i: (i,))
  stat = jax.ShapeDtypeStruct((rows,), jnp.float32)
  params = plgpu.CompilerParams(num_warps=WARPS, num_stages=1) if plgpu is not None else None
  return pl.pallas_call(
      functools.partial(_kernel, eps=eps, block=_block(vocab)), grid=(rows,),
      in_specs=[row, one, one], out_specs=[row] + [one] * 4,
      out_shape=[jax.ShapeDtypeStruct(z_nv.shape, out_dtype)] + [stat] * 4,
      compiler_params=params, interpret=interpret, name="seq2seq_loss_fwd_bwd",
  )(z_nv, labels_n.astype(jnp.int32), weights_n.astype(jnp.float32))


def stats_and_grad(z_btv: jax.Array, labels_bt: jax.Array, weights_bt: jax.Array, *, eps: float, out_dtype,
                   interpret: bool = False):
  """((max, log-sum-exp, label logit, sum) over the vocabulary, each [b, t] f32, and
  d (sum over tokens of weight * smoothed loss) / d logits [b, t, v] in `out_dtype`), from the
  logits read once: what seq2seq.training.loss computes in XLA (`_token_stats`, and the gradient
  of `_chunk_loop`), rounded to z's dtype and then `out_dtype` as there."""
  out_dtype = jnp.dtype(out_dtype)

  def local(z, labels, weights):
    b, t, v = z.shape
    d, *stats = _rows(z.reshape(b * t, v), labels.reshape(-1), weights.reshape(-1), eps, out_dtype, interpret)
    return tuple(s.reshape(b, t) for s in stats), d.reshape(b, t, v)

  mesh = current_mesh()
  if mesh is None or mesh.size == 1:
    return local(z_btv, labels_bt, weights_bt)
  spec = activation_spec(("batch", "length", "vocab"), z_btv.shape, mesh)
  if spec[2] is not None:
    raise ValueError(f"the loss kernel reads rows whole, but the vocabulary is split over mesh axis {spec[2]!r}")
  tokens = jax.sharding.PartitionSpec(*spec[:2])
  return jax.shard_map(local, mesh=mesh, in_specs=(spec, tokens, tokens), out_specs=((tokens,) * 4, spec),
                       check_vma=False)(z_btv, labels_bt, weights_bt)


def blockers(*, platform: str, vocab_shards: int) -> list[str]:
  """Why the kernel cannot run here (empty: it can)."""
  why = []
  if plgpu is None:
    why.append("this JAX has no Pallas Triton backend (jax.experimental.pallas.triton)")
  if platform != "gpu":
    why.append(f"the loss kernel runs on GPU only (platform is {platform})")
  if vocab_shards > 1:
    why.append(f"the vocabulary is split over {vocab_shards} devices (mesh.tensor); the kernel reads rows whole")
  return why


def chosen(impl: str, vocab_shards: int, dtype) -> bool:
  """Whether the train step's loss runs the kernel (`impl`: config.train.loss_impl), decided at
  trace time on the platform of the step's devices (the activation mesh's, else JAX's default
  backend): "auto" where it can run and compile (else XLA, with a warning once if it does not
  compile); "pallas" there or a ConfigError saying why not; "xla" never
  (seq2seq.compilation.kernel_chosen)."""
  return kernel_chosen("xla" if impl == "auto" and not AUTO else impl, "train.loss_impl",
                       lambda platform: blockers(platform=platform, vocab_shards=vocab_shards),
                       lambda device: _compiles(jnp.dtype(dtype).name, device))


@functools.cache
def _compiles(dtype_name: str, device=None) -> str | None:
  """None if the kernel compiles for `device` (None: the default one), else why not, said once
  in a warning: checked once per process and logits dtype."""
  placed = {} if device is None else {"sharding": jax.sharding.make_single_device_sharding(device)}
  z = jax.ShapeDtypeStruct((1, 2, 3 * BLOCK // 2), jnp.dtype(dtype_name), **placed)
  tokens = jax.ShapeDtypeStruct((1, 2), jnp.int32, **placed)
  problem = compile_problem(lambda z, labels: stats_and_grad(z, labels, labels, eps=0.1, out_dtype=jnp.bfloat16),
                            z, tokens)
  if problem:
    warnings.warn(f"the loss kernel does not compile on this GPU ({problem}); config.train.loss_impl=auto "
                  "uses XLA", stacklevel=3)
  return problem
