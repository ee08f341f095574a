"""LayerNorm and RMSNorm as Pallas kernels (Triton on a GPU): one pass forward, one pass back.

What XLA makes of `Norm` on a GPU (benchmarks/gpu_compile.py, the wmt14_base step for an H200):
per norm about 340 MB moved in 8 kernels, where reading and writing the activations once each
way needs 125 MB. Forward, a second kernel reads the input again for the statistics the backward
keeps; backward, the scale's gradient (a sum over tokens of dy * x_hat) and the input's gradient
(sums over features) are reductions along different axes, so XLA writes dy * x_hat in float32
(50 MB at 96 x 256 x 512) and reads it back, and the bias gradient is a third pass over dy.

Here each program takes a block of rows whole (the feature axis, d, in one tile):
- forward: y = (x - mean) * rstd * scale + bias, writing y and the rows' mean and rstd (f32);
- backward: from x, dy and those statistics, dx = rstd (g - mean(g) - x_hat mean(g x_hat)),
  g = dy * scale, and each block's partial sums of dy * x_hat and dy (f32, rows of one array),
  which one small XLA reduction adds up. RMSNorm: no mean, no bias, dx = rstd (g - x_hat mean(g x_hat)).
- `copies`: the output returned that many times, as a post-norm's is (transformer.Fork: the
  residual path and the next sublayer's input). Their gradients come in apart and the backward
  kernel adds them as it reads them: JAX would add them first in an XLA kernel of its own, which
  reads two [tokens, d] arrays and writes one (per norm of the wmt14_base step for an H200,
  about 75 MB and a launch, 28 a step).
- `with_input`: x returned beside the output, for a pre-norm's residual path: the backward
  kernel adds that copy's gradient to dx as it writes it, where JAX would add the two after it.
- `branch_btd` (`Add`; `layers.Norm.add`): a residual add made by the kernels,
  x = residual + dropout(branch + bias), the mask `dropout.hash_keep`'s. XLA wrote that sum (75 MB
  a block) for the norm to read, and took the branch's gradient through the dropout and summed it
  for the bias in passes of their own. A post-norm's: forward, the kernel computes the sum and never
  writes it; backward, it computes it again and writes the residual's and the branch's gradients
  and the bias's partial sums. A pre-norm's (with `with_input`: the add that ends one block, made by
  the next block's norm, or by the stack's final norm without it): the sum is the residual stream,
  so the forward kernel writes it beside the output, and the backward kernel reads it back (one
  array where recomputing it would read two), adds the residual path's gradient and writes the
  same gradients and sums.

Rows are [tokens, d] of the activations ([b, t, d] flattened); inside a train step's mesh the
call runs per device in `jax.shard_map` over the batch (the residual stream's features are
never split: seq2seq.sharding.ACTIVATION_RULES). d must be a power of two (a Triton tile);
`interpret=True` runs the kernels in Pallas' interpreter on any platform (tests).
"""

from __future__ import annotations

import functools
import math
import warnings
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import pallas as pl

from seq2seq.compilation import KERNEL_IMPLEMENTATIONS, compile_problem, kernel_chosen
from seq2seq.model import dropout
from seq2seq.sharding import activation_spec, current_mesh

try:  # the Triton backend's helpers; absent in JAX builds without Pallas GPU support
  from jax.experimental.pallas import triton as plgpu
except ImportError:  # pragma: no cover
  plgpu = None

TILE = 16384  # elements of a [rows, d] tile: 32 rows of 512 features
IMPLEMENTATIONS = KERNEL_IMPLEMENTATIONS  # config.model.norm_impl
KINDS = ("layernorm", "rmsnorm")
WIDTHS = (64, 128, 256, 512, 1024, 2048, 4096, 8192)  # d: a power of two, a tile whole in registers
# Module switches, read when a step is traced. ADD_IN_KERNEL False leaves a post-norm's residual add,
# dropout and output bias to XLA, kernels of their own around the norm's, and the backward kernel's
# partial sums in an array each, each added up by a kernel (the `residual_apart` variant of
# benchmarks/device_check.py); PRE_ADD_IN_KERNEL False, a pre-norm's (`pre_add_apart`).
ADD_IN_KERNEL = True
PRE_ADD_IN_KERNEL = True


def rows_block(rows: int, d: int) -> int:
  """Rows of a program: the largest power of two that divides `rows`, at most TILE // d."""
  block = max(TILE // d, 1)
  while rows % block:
    block //= 2
  return block


def _params():
  return plgpu.CompilerParams(num_warps=8, num_stages=1) if plgpu is not None else None


class Add(NamedTuple):
  """A residual add, made in the kernels: x = residual + dropout(branch + bias, rate) (`bias`:
  whether the branch's output bias is an operand; `summed`: x itself is the operand, written by
  the forward kernel, and the kernel computes the dropout's mask alone: a pre-norm's backward).
  The dropout's words operand (uint32) holds the key's two words at `word0` and `word1`, and the
  first row of this device's rows of the batch at `first` (None: row 0)."""
  rate: float
  bias: bool = False
  word0: int = 0
  word1: int = 1
  first: int | None = None
  summed: bool = False


def _kept(rate: float, dtype) -> float:
  """1 - rate as `dropout.dropout` divides by it: in the array's dtype (a weakly typed constant)."""
  return float(np.asarray(1.0 - rate, dtype=dtype))


def _keep(words_ref, add: Add, block: int, shape: tuple[int, int]):
  """The dropout's keep mask of this program's [block, d] tile: `dropout.hash_keep`'s over the
  element's global row-major index."""
  first = pl.program_id(0).astype(jnp.uint32) * jnp.uint32(block)
  if add.first is not None:
    first = first + words_ref[add.first]
  rows = first + jax.lax.broadcasted_iota(jnp.uint32, shape, 0)
  index = rows * jnp.uint32(shape[1]) + jax.lax.broadcasted_iota(jnp.uint32, shape, 1)
  return dropout.hash_keep(index, words_ref[add.word0], words_ref[add.word1], add.rate)


def _summed(refs, add: Add | None, block: int):
  """The rows the norm takes, in f32, and the dropout's keep mask (None without one): x itself
  (`add` None, or `add.summed`), or x = residual + dropout(branch) as `transformer.residual`
  computes it, each operation rounded to their dtype as JAX's are (the scaled branch, then the sum)."""
  if add is None:
    return refs[0][...].astype(jnp.float32), None, refs[1:]
  if add.summed:
    x_ref, *refs = refs
    keep = None
    if add.rate:
      words_ref, *refs = refs
      keep = _keep(words_ref, add, block, x_ref.shape)
    return x_ref[...].astype(jnp.float32), keep, refs
  residual_ref, branch_ref, *refs = refs
  branch, keep, rate = branch_ref[...], None, add.rate
  if add.bias:  # the branch's output bias, in its dtype as `MultiHeadAttention._out` adds it
    bias_ref, *refs = refs
    bias = bias_ref[...].astype(branch.dtype).astype(jnp.float32)
    branch = (branch.astype(jnp.float32) + bias[None, :]).astype(branch.dtype)
  if rate:
    words_ref, *refs = refs
    keep = _keep(words_ref, add, block, branch.shape)
    scaled = (branch.astype(jnp.float32) / _kept(rate, branch.dtype)).astype(branch.dtype)
    branch = jnp.where(keep, scaled, jnp.zeros_like(scaled))
  x = (residual_ref[...].astype(jnp.float32) + branch.astype(jnp.float32)).astype(residual_ref.dtype)
  return x.astype(jnp.float32), keep, refs


def _forward_kernel(*refs, eps: float, rms: bool, add: Add | None, block: int, write_sum: bool):
  x, _, refs = _summed(refs, add, block)
  scale_ref, *refs = refs
  bias_ref, y_ref, *refs = (None, *refs) if rms else refs
  if write_sum:  # a pre-norm's residual stream: the sum, in the residual's dtype (x holds it exactly)
    sum_ref, *refs = refs
    sum_ref[...] = x.astype(sum_ref.dtype)
  mean_ref, rstd_ref = (None, *refs) if rms else refs
  if not rms:
    mean = jnp.mean(x, axis=1)
    x = x - mean[:, None]
    mean_ref[...] = mean
  rstd = jax.lax.rsqrt(jnp.mean(x * x, axis=1) + eps)
  y = x * rstd[:, None] * scale_ref[...].astype(jnp.float32)[None, :]
  if not rms:
    y = y + bias_ref[...].astype(jnp.float32)[None, :]
  y_ref[...] = y.astype(y_ref.dtype)
  rstd_ref[...] = rstd


def _backward_kernel(*refs, rms: bool, cotangents: int, with_input: bool, add: Add | None, block: int):
  x, keep, refs = _summed(refs, add, block)
  dy_refs, refs = refs[:cotangents], refs[cotangents:]
  dx_in_ref, (scale_ref, *refs) = (refs[0], refs[1:]) if with_input else (None, refs)
  if rms:
    rstd_ref, dx_ref, *refs = refs
  else:
    mean_ref, rstd_ref, dx_ref, *refs = refs
  dbranch_ref, sums_refs = (refs[0], refs[1:]) if add is not None else (None, refs)
  sums = []  # the block's partial sums: the scale's, the bias's, the branch bias's gradient
  dy = dy_refs[0][...].astype(jnp.float32)
  for more_ref in dy_refs[1:]:  # the gradients of the output's other copies, added as they are read
    dy = dy + more_ref[...].astype(jnp.float32)
  rstd = rstd_ref[...][:, None]
  x_hat = (x if rms else x - mean_ref[...][:, None]) * rstd
  g = dy * scale_ref[...].astype(jnp.float32)[None, :]
  dx = g - x_hat * jnp.mean(g * x_hat, axis=1)[:, None]
  sums.append(jnp.sum(dy * x_hat, axis=0))
  if not rms:
    dx = dx - jnp.mean(g, axis=1)[:, None]
    sums.append(jnp.sum(dy, axis=0))
  dx = dx * rstd
  if with_input:  # the gradient of x's copy handed on beside the output (the residual path's)
    dx = dx + dx_in_ref[...].astype(jnp.float32)
  dx = dx.astype(dx_ref.dtype)
  dx_ref[...] = dx
  if dbranch_ref is not None:  # the residual's gradient is dx; the branch's, dx through the dropout
    if keep is not None:
      scaled = (dx.astype(jnp.float32) / _kept(add.rate, dx.dtype)).astype(dx.dtype)
      dx = jnp.where(keep, scaled, jnp.zeros_like(scaled))
    dbranch_ref[...] = dx
    if add.bias:
      sums.append(jnp.sum(dx.astype(jnp.float32), axis=0))
  if len(sums_refs) == 1:  # rows of one array (then zeros to a power of two): one XLA reduction adds them up
    for row in range(sums_refs[0].shape[0]):
      sums_refs[0][row:row + 1, :] = (sums[row] if row < len(sums) else jnp.zeros_like(sums[0]))[None, :]
  else:  # an array each (ADD_IN_KERNEL off, as before)
    for ref, value in zip(sums_refs, sums):
      ref[...] = value[None, :]


def _specs(d: int, block: int):
  tile = pl.BlockSpec((block, d), lambda i: (i, 0))
  stat = pl.BlockSpec((block,), lambda i: (i,))
  vector = pl.BlockSpec((d,), lambda i: (0,))
  return tile, stat, vector


def _inputs(xs: tuple, add: Add | None, tile, vector):
  """The kernels' first operands and their specs: x, or residual and branch (and the branch's
  bias; and the dropout's words, read whole by every program, with a rate), or the sum and the words."""
  specs = [tile] * (1 if add is None or add.summed else 2)
  if add is not None and add.bias and not add.summed:
    specs.append(vector)
  if add is not None and add.rate:
    specs.append(pl.BlockSpec(xs[len(specs)].shape, lambda i: (0,)))
  return list(xs[:len(specs)]), specs


def _forward(xs: tuple, scale, bias, eps: float, interpret: bool, add: Add | None, write_sum: bool = False):
  """[y, the sum if `write_sum`, mean (LayerNorm), rstd]."""
  rows, d = xs[0].shape
  block = rows_block(rows, d)
  tile, stat, vector = _specs(d, block)
  rms = bias is None
  stats = 1 if rms else 2
  operands, specs = _inputs(xs, add, tile, vector)
  return pl.pallas_call(
      functools.partial(_forward_kernel, eps=eps, rms=rms, add=add, block=block, write_sum=write_sum),
      grid=(rows // block,),
      in_specs=specs + [vector] + ([] if rms else [vector]),
      out_specs=[tile] * (1 + write_sum) + [stat] * stats,
      out_shape=[jax.ShapeDtypeStruct(xs[0].shape, xs[0].dtype)] * (1 + write_sum) +
      [jax.ShapeDtypeStruct((rows,), jnp.float32)] * stats,
      compiler_params=_params(), interpret=interpret, name="seq2seq_norm_fwd",
  )(*operands, scale, *(() if rms else (bias,)))


def _backward(xs: tuple, dys, dx_in, scale, stats, rms: bool, interpret: bool, add: Add | None):
  rows, d = xs[0].shape
  block = rows_block(rows, d)
  tile, stat, vector = _specs(d, block)
  sums = (1 if rms else 2) + (add is not None and add.bias)
  rows_of_sums = 1 << (sums - 1).bit_length()  # a power of two: a Triton block
  arrays = 1 if ADD_IN_KERNEL else sums  # the partial sums in one array, or an array each
  dx_in = () if dx_in is None else (dx_in,)
  operands, specs = _inputs(xs, add, tile, vector)
  grads = 1 if add is None else 2  # dx; or the residual's and the branch's
  out = pl.pallas_call(
      functools.partial(_backward_kernel, rms=rms, cotangents=len(dys), with_input=bool(dx_in), add=add,
                        block=block),
      grid=(rows // block,),
      in_specs=specs + [tile] * (len(dys) + len(dx_in)) + [vector] + [stat] * len(stats),
      out_specs=[tile] * grads + ([pl.BlockSpec((rows_of_sums, d), lambda i: (i, 0))] if arrays == 1 else
                                  [pl.BlockSpec((1, d), lambda i: (i, 0))] * sums),
      out_shape=[jax.ShapeDtypeStruct(xs[0].shape, xs[0].dtype)] * grads +
      [jax.ShapeDtypeStruct((rows // block * (rows_of_sums if arrays == 1 else 1), d), jnp.float32)] * arrays,
      compiler_params=_params(), interpret=interpret, name="seq2seq_norm_bwd",
  )(*operands, *dys, *dx_in, scale, *stats)
  if arrays > 1:
    return out[:grads], [jnp.sum(p, axis=0) for p in out[grads:]]
  total = jnp.sum(out[grads].reshape(rows // block, rows_of_sums, d), axis=0)
  return out[:grads], [total[row] for row in range(sums)]


@functools.partial(jax.custom_vjp, nondiff_argnums=(4, 5, 6, 7, 8))
def _norm(xs, words, scale, bias, eps: float, interpret: bool, copies: int, with_input: bool, add: Add | None):
  """xs: (x,), or (residual, branch) with `add` (and the branch's bias); `words`, the dropout's.
  `with_input`: x beside the outputs, or with `add` the sum (a pre-norm's residual stream)."""
  return _norm_fwd(xs, words, scale, bias, eps, interpret, copies, with_input, add)[0]


def _norm_fwd(xs, words, scale, bias, eps, interpret, copies, with_input, add):
  write_sum = add is not None and with_input
  y, *stats = _forward(xs + words, scale, bias, eps, interpret, add, write_sum)
  x = stats.pop(0) if write_sum else xs[0]
  # what the backward kernel reads: the sum written here (a pre-norm's), or what gives it again
  saved = (x,) if write_sum else xs
  branch_bias = xs[2] if add is not None and add.bias else None
  return (y,) * copies + ((x,) if with_input else ()), (saved, branch_bias, words, scale, bias, tuple(stats))


def _norm_bwd(eps, interpret, copies, with_input, add, residuals, cotangents):
  saved, branch_bias, words, scale, bias, stats = residuals
  dx_in = cotangents[copies] if with_input else None
  if add is not None and with_input:
    add = add._replace(summed=True)
  dxs, sums = _backward(saved + words, cotangents[:copies], dx_in, scale, stats, bias is None, interpret, add)
  if branch_bias is not None:  # the branch's bias: its gradient the last of the sums
    dxs, sums = (*dxs, sums[-1].astype(branch_bias.dtype)), sums[:-1]
  return (tuple(dxs), tuple(None for _ in words), sums[0].astype(scale.dtype),
          None if bias is None else sums[1].astype(bias.dtype))


_norm.defvjp(_norm_fwd, _norm_bwd)


def adds(shape: tuple[int, ...], rate: float, rng, *, pre: bool = False) -> bool:
  """Whether the kernels can take a residual add, x = residual + dropout(branch) of this shape
  (`pre`: a pre-norm's, whose sum they write): a dropout mask of the hash (`dropout.keep_mask`
  draws bits for arrays of 2^32 elements or more). ADD_IN_KERNEL off: never (the add in XLA, as
  before); PRE_ADD_IN_KERNEL off: a post-norm's only."""
  return (ADD_IN_KERNEL and (PRE_ADD_IN_KERNEL or not pre)
          and (rng is None or rate == 0.0 or math.prod(shape) < 2**32))


def fused_norm(x_btd: jax.Array, scale_d: jax.Array, bias_d: jax.Array | None = None, *, eps: float,
               interpret: bool = False, copies: int = 1, with_input: bool = False,
               branch_btd: jax.Array | None = None, branch_bias_d: jax.Array | None = None, rate: float = 0.0,
               rng=None):
  """LayerNorm (with `bias_d`) or RMSNorm (without) over the last axis, statistics in f32, the
  result in x's dtype: what `seq2seq.model.layers.Norm` computes, in the kernels above; a tuple
  of `copies` references to it if `copies` > 1, and x itself after them if `with_input`. With
  `branch_btd`, the norm of x + dropout(branch + branch_bias, rate, rng) (`adds` says where it
  applies), the sum made inside the kernels (a post-norm's residual add; with `with_input`, a
  pre-norm's, the sum handed on after the outputs). Inside the train step's mesh, per device on its rows."""
  bias, outputs = () if bias_d is None else (bias_d,), copies + with_input
  add, words = None, ()
  if branch_btd is not None:
    add = Add(rate if rng is not None else 0.0, bias=branch_bias_d is not None)
    if add.rate:
      table, word0, word1 = dropout.key_table(rng)
      add, words = add._replace(word0=word0, word1=word1), (table,)
  xs = (x_btd,) if branch_btd is None else (x_btd, branch_btd) + (() if branch_bias_d is None else (branch_bias_d,))
  mesh = current_mesh()
  sharded = mesh is not None and mesh.size > 1
  spec = activation_spec(("batch",) + ("length",) * (x_btd.ndim - 2) + ("embed",), x_btd.shape, mesh) \
      if sharded else None

  def local(xs, words, scale, *bias):
    rows, local_add = tuple(x.reshape(-1, x.shape[-1]) for x in xs[:2]) + xs[2:], add
    if words and sharded and spec[0] is not None:  # the first row of this device's rows of the batch
      first = (jax.lax.axis_index(spec[0]) * rows[0].shape[0]).astype(jnp.uint32)
      words, local_add = (jnp.concatenate([words[0], first[None]]),), add._replace(first=words[0].shape[0])
    out = tuple(y.reshape(xs[0].shape)
                for y in _norm(rows, words, scale, bias[0] if bias else None, eps, interpret, copies, with_input,
                               local_add))
    return out if outputs > 1 else out[0]

  if not sharded:
    return local(xs, words, scale_d, *bias)
  vector = jax.sharding.PartitionSpec(None)
  return jax.shard_map(local, mesh=mesh, in_specs=((spec,) * min(len(xs), 2) + (vector,) * (len(xs) > 2),
                                                   (vector,) * len(words), vector) +
                       (vector,) * len(bias),
                       out_specs=(spec,) * outputs if outputs > 1 else spec,
                       check_vma=False)(xs, words, scale_d, *bias)


def blockers(*, platform: str, kind: str, d_model: int) -> list[str]:
  """Why the kernels cannot run here (empty: they can)."""
  why = []
  if plgpu is None:
    why.append("this JAX has no Pallas Triton backend (jax.experimental.pallas.triton)")
  if platform != "gpu":
    why.append(f"the norm kernels run on GPU only (platform is {platform})")
  if kind not in KINDS:
    why.append(f"the norm kernels compute {KINDS}, not {kind}")
  if d_model not in WIDTHS:
    why.append(f"the norm kernels need d_model in {WIDTHS}, got {d_model}")
  return why


def chosen(impl: str, kind: str, d_model: int, dtype) -> bool:
  """Whether `Norm` runs the kernels (`impl`: config.model.norm_impl), decided at trace time on
  the platform of the step's devices (the activation mesh's, else JAX's default backend):
  "auto" where they can run and compile (else XLA, with a warning once if they do not compile);
  "pallas" there or a ConfigError saying why not; "xla" never (seq2seq.compilation.kernel_chosen)."""
  return kernel_chosen(impl, "model.norm_impl", lambda platform: blockers(platform=platform, kind=kind, d_model=d_model),
                       lambda device: _compiles(kind, d_model, jnp.dtype(dtype).name, device))


@functools.cache
def _compiles(kind: str, d_model: int, dtype_name: str, device=None) -> str | None:
  """None if the kernels and their gradient compile for `device` (None: the default one), else
  why not, said once in a warning: checked once per process and setting."""
  placed = {} if device is None else {"sharding": jax.sharding.make_single_device_sharding(device)}
  x = jax.ShapeDtypeStruct((2 * max(TILE // d_model, 1), d_model), jnp.dtype(dtype_name), **placed)
  vector = jax.ShapeDtypeStruct((d_model,), jnp.float32, **placed)

  def loss(x, scale, bias):
    return jnp.sum(fused_norm(x, scale, None if kind == "rmsnorm" else bias, eps=1e-6).astype(jnp.float32))

  problem = compile_problem(jax.grad(loss, argnums=(0, 1, 2)), x, vector, vector)
  if problem:
    warnings.warn(f"the norm kernels do not compile on this GPU ({problem}); config.model.norm_impl=auto "
                  "uses XLA", stacklevel=3)
  return problem
