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
  g = dy * scale, and each block's partial sums of dy * x_hat and dy (f32 [blocks, d]), which
  one small XLA reduction adds up. RMSNorm: no mean, no bias, dx = rstd (g - x_hat mean(g x_hat)).
- `copies`: the output returned that many times, as a post-norm's is (transformer.Fork: the
  residual path and the next sublayer's input). Their gradients come in apart and the backward
  kernel adds them as it reads them: JAX would add them first in an XLA kernel of its own, which
  reads two [tokens, d] arrays and writes one (per norm of the wmt14_base step for an H200,
  about 75 MB and a launch, 28 a step).
- `with_input`: x returned beside the output, for a pre-norm's residual path: the backward
  kernel adds that copy's gradient to dx as it writes it, where JAX would add the two after it.

Rows are [tokens, d] of the activations ([b, t, d] flattened); inside a train step's mesh the
call runs per device in `jax.shard_map` over the batch (the residual stream's features are
never split: seq2seq.sharding.ACTIVATION_RULES). d must be a power of two (a Triton tile);
`interpret=True` runs the kernels in Pallas' interpreter on any platform (tests).
"""

from __future__ import annotations

import functools
import warnings

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

from seq2seq.compilation import KERNEL_IMPLEMENTATIONS, compile_problem, kernel_chosen
from seq2seq.sharding import activation_spec, current_mesh

try:  # the Triton backend's helpers; absent in JAX builds without Pallas GPU support
  from jax.experimental.pallas import triton as plgpu
except ImportError:  # pragma: no cover
  plgpu = None

TILE = 16384  # elements of a [rows, d] tile: 32 rows of 512 features
IMPLEMENTATIONS = KERNEL_IMPLEMENTATIONS  # config.model.norm_impl
KINDS = ("layernorm", "rmsnorm")
WIDTHS = (64, 128, 256, 512, 1024, 2048, 4096, 8192)  # d: a power of two, a tile whole in registers


def rows_block(rows: int, d: int) -> int:
  """Rows of a program: the largest power of two that divides `rows`, at most TILE // d."""
  block = max(TILE // d, 1)
  while rows % block:
    block //= 2
  return block


def _params():
  return plgpu.CompilerParams(num_warps=8, num_stages=1) if plgpu is not None else None


def _forward_kernel(x_ref, scale_ref, *refs, eps: float, rms: bool):
  if rms:
    y_ref, rstd_ref = refs
  else:
    bias_ref, y_ref, mean_ref, rstd_ref = refs
  x = x_ref[...].astype(jnp.float32)
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


def _backward_kernel(x_ref, *refs, rms: bool, cotangents: int, with_input: bool):
  dy_refs, refs = refs[:cotangents], refs[cotangents:]
  dx_in_ref, (scale_ref, *refs) = (refs[0], refs[1:]) if with_input else (None, refs)
  if rms:
    rstd_ref, dx_ref, dscale_ref = refs
  else:
    mean_ref, rstd_ref, dx_ref, dscale_ref, dbias_ref = refs
  x, dy = x_ref[...].astype(jnp.float32), dy_refs[0][...].astype(jnp.float32)
  for more_ref in dy_refs[1:]:  # the gradients of the output's other copies, added as they are read
    dy = dy + more_ref[...].astype(jnp.float32)
  rstd = rstd_ref[...][:, None]
  x_hat = (x if rms else x - mean_ref[...][:, None]) * rstd
  g = dy * scale_ref[...].astype(jnp.float32)[None, :]
  dx = g - x_hat * jnp.mean(g * x_hat, axis=1)[:, None]
  if not rms:
    dx = dx - jnp.mean(g, axis=1)[:, None]
    dbias_ref[...] = jnp.sum(dy, axis=0)[None, :]
  dx = dx * rstd
  if with_input:  # the gradient of x's copy handed on beside the output (the residual path's)
    dx = dx + dx_in_ref[...].astype(jnp.float32)
  dx_ref[...] = dx.astype(dx_ref.dtype)
  dscale_ref[...] = jnp.sum(dy * x_hat, axis=0)[None, :]


def _specs(d: int, block: int):
  tile = pl.BlockSpec((block, d), lambda i: (i, 0))
  stat = pl.BlockSpec((block,), lambda i: (i,))
  vector = pl.BlockSpec((d,), lambda i: (0,))
  partial = pl.BlockSpec((1, d), lambda i: (i, 0))
  return tile, stat, vector, partial


def _forward(x, scale, bias, eps: float, interpret: bool):
  rows, d = x.shape
  block = rows_block(rows, d)
  tile, stat, vector, _ = _specs(d, block)
  rms = bias is None
  stats = 1 if rms else 2
  return pl.pallas_call(
      functools.partial(_forward_kernel, eps=eps, rms=rms), grid=(rows // block,),
      in_specs=[tile, vector] + ([] if rms else [vector]),
      out_specs=[tile] + [stat] * stats,
      out_shape=[jax.ShapeDtypeStruct(x.shape, x.dtype)] + [jax.ShapeDtypeStruct((rows,), jnp.float32)] * stats,
      compiler_params=_params(), interpret=interpret, name="seq2seq_norm_fwd",
  )(x, scale, *(() if rms else (bias,)))


def _backward(x, dys, dx_in, scale, stats, rms: bool, interpret: bool):
  rows, d = x.shape
  block = rows_block(rows, d)
  tile, stat, vector, partial = _specs(d, block)
  sums = 1 if rms else 2
  dx_in = () if dx_in is None else (dx_in,)
  out = pl.pallas_call(
      functools.partial(_backward_kernel, rms=rms, cotangents=len(dys), with_input=bool(dx_in)),
      grid=(rows // block,),
      in_specs=[tile] * (1 + len(dys) + len(dx_in)) + [vector] + [stat] * len(stats),
      out_specs=[tile] + [partial] * sums,
      out_shape=[jax.ShapeDtypeStruct(x.shape, x.dtype)] +
      [jax.ShapeDtypeStruct((rows // block, d), jnp.float32)] * sums,
      compiler_params=_params(), interpret=interpret, name="seq2seq_norm_bwd",
  )(x, *dys, *dx_in, scale, *stats)
  return out[0], [jnp.sum(p, axis=0) for p in out[1:]]


@functools.partial(jax.custom_vjp, nondiff_argnums=(3, 4, 5, 6))
def _norm(x, scale, bias, eps: float, interpret: bool, copies: int, with_input: bool):
  return (_forward(x, scale, bias, eps, interpret)[0],) * copies + ((x,) if with_input else ())


def _norm_fwd(x, scale, bias, eps, interpret, copies, with_input):
  y, *stats = _forward(x, scale, bias, eps, interpret)
  return (y,) * copies + ((x,) if with_input else ()), (x, scale, bias, tuple(stats))


def _norm_bwd(eps, interpret, copies, with_input, residuals, cotangents):
  x, scale, bias, stats = residuals
  dx_in = cotangents[copies] if with_input else None
  dx, sums = _backward(x, cotangents[:copies], dx_in, scale, stats, bias is None, interpret)
  return dx, sums[0].astype(scale.dtype), None if bias is None else sums[1].astype(bias.dtype)


_norm.defvjp(_norm_fwd, _norm_bwd)


def fused_norm(x_btd: jax.Array, scale_d: jax.Array, bias_d: jax.Array | None = None, *, eps: float,
               interpret: bool = False, copies: int = 1, with_input: bool = False):
  """LayerNorm (with `bias_d`) or RMSNorm (without) over the last axis, statistics in f32, the
  result in x's dtype: what `seq2seq.model.layers.Norm` computes, in the kernels above; a tuple
  of `copies` references to it if `copies` > 1, and x itself after them if `with_input`. Inside
  the train step's mesh, per device on its rows."""
  bias, outputs = () if bias_d is None else (bias_d,), copies + with_input

  def local(x, scale, *bias):
    rows = x.reshape(-1, x.shape[-1])
    out = tuple(y.reshape(x.shape)
                for y in _norm(rows, scale, bias[0] if bias else None, eps, interpret, copies, with_input))
    return out if outputs > 1 else out[0]

  mesh = current_mesh()
  if mesh is None or mesh.size == 1:
    return local(x_btd, scale_d, *bias)
  spec = activation_spec(("batch",) + ("length",) * (x_btd.ndim - 2) + ("embed",), x_btd.shape, mesh)
  vector = jax.sharding.PartitionSpec(None)
  return jax.shard_map(local, mesh=mesh, in_specs=(spec, vector) + (vector,) * len(bias),
                       out_specs=(spec,) * outputs if outputs > 1 else spec,
                       check_vma=False)(x_btd, scale_d, *bias)


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
