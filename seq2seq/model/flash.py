"""Flash attention for packed rows on GPU: a Pallas (Triton) kernel, forward and backward,
that takes the query's and the key's segment ids separately.

Packed rows hold several sentence pairs; a token attends only to tokens of its own pair
(its segment id; 0 is padding). Cross-attention needs the query's (target) segment ids and
the key's (source) ones, of different lengths. The alternatives fall short there: JAX's
shipped GPU kernel (`jax.experimental.pallas.ops.gpu.attention.mha`) takes one segment
array for both, so it serves self-attention only; the public cuDNN API takes a packed mask
only as an additive bias whose gradient it always computes; cuDNN's packed layout
(`q_offsets`/`kv_offsets` of the private `jax._src.cudnn.fused_attention_stablehlo`) needs
Hopper and a static bound on segments per row. This kernel is the FlashAttention-2
algorithm (Dao, 2023) with a segment mask built from two arrays:

  forward   one program per (query block, row, head): a loop over key blocks keeps the
            running max and sum of exp2 logits and the output, never the [t, s] matrix;
            it saves the log-sum-exp per query for the backward pass.
  backward  delta = rowsum(dO * O) in XLA; one kernel per key block accumulates dK and dV
            over the query blocks, one per query block accumulates dQ over the key blocks.

Causal attention skips the key blocks after the query block (and query blocks before the
key block). A query with no key of its segment (a padding query of a row without padding
keys) attends to nothing: its output is zeros and it takes and gives no gradient (the masked
softmax would give it uniform weights over masked keys; callers zero padding queries' outputs,
and a real query always has keys of its own pair). The ops are those
the shipped Triton kernel uses (`plgpu.load`/`dot`/`store`, `exp2`, `lax.fori_loop`).
`interpret=True` runs the kernels in Pallas' interpreter on any platform (tests).

Tiles, warps and pipeline stages are a `Blocks`; the defaults (forward 64x64, backward 32s,
4 or 8 warps forward, 2 stages) are what the kernel has always run. A benchmark times other
tiles by setting `flash.BLOCKS = Blocks.parse("forward=128x64,dkdv=128x32,stages=3")` in its
process before tracing (a function already traced keeps its tiles), or by passing `blocks=`.
"""

from __future__ import annotations

import dataclasses
import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.experimental import pallas as pl

try:  # the Triton backend's helpers; absent in JAX builds without Pallas GPU support
  from jax.experimental.pallas import triton as plgpu
except ImportError:  # pragma: no cover
  plgpu = None

MASK = -0.7 * float(np.finfo(np.float32).max)  # a masked logit: finite, so fully masked rows stay finite
LOG2E = math.log2(math.e)
HEAD_DIMS = (16, 32, 64, 128)  # Triton's dot needs power-of-two tiles of at least 16
BLOCK = 16  # lengths must be multiples of this (the smallest tile)


def _block(length: int, largest: int) -> int:
  """The largest power of two <= `largest` (one itself) that divides `length`, at least BLOCK."""
  block = largest
  while length % block:
    if block <= BLOCK:
      raise ValueError(f"the flash kernel needs lengths that are multiples of {BLOCK}, got {length}")
    block //= 2
  return block


def _power_of_two(x) -> bool:
  return isinstance(x, int) and x > 0 and x & (x - 1) == 0


@dataclasses.dataclass(frozen=True)
class Blocks:
  """The kernels' tiles and Triton settings: a static argument, so each setting traces its own
  kernels. A block is the most a kernel takes; at a length it does not divide, the kernel
  takes the largest power of two below it that does (`fitted`). The defaults are the tiles
  the kernel shipped with; `parse` / `spec` are the command-line form a benchmark sweeps."""

  forward: tuple[int, int] = (64, 64)  # (query block, key block) of the forward kernel
  dkdv: tuple[int, int] = (32, 32)  # (outer key block, inner query block) of the dK/dV kernel
  dq: tuple[int, int] = (32, 32)  # (outer query block, inner key block) of the dQ kernel
  warps: int | None = None  # forward warps; None: 4 if the head dim is <= 64, else 8
  backward_warps: int = 4  # warps of both backward kernels
  stages: int = 2  # Triton pipeline stages of all three kernels

  TILES = ("forward", "dkdv", "dq")

  def __post_init__(self):
    for name in self.TILES:
      pair = tuple(getattr(self, name))
      if len(pair) != 2 or not all(_power_of_two(x) and x >= BLOCK for x in pair):
        raise ValueError(f"Blocks.{name} must be two powers of two >= {BLOCK}, got {getattr(self, name)!r}")
      object.__setattr__(self, name, pair)
    if not (self.warps is None or _power_of_two(self.warps)) or not _power_of_two(self.backward_warps):
      raise ValueError(f"warps must be powers of two, got warps={self.warps!r}, backward_warps={self.backward_warps!r}")
    if not (isinstance(self.stages, int) and self.stages >= 1):
      raise ValueError(f"stages must be a positive integer, got {self.stages!r}")

  @classmethod
  def parse(cls, text: str) -> Blocks:
    """From "forward=128x64,dkdv=128x32,dq=128x32,warps=8,backward_warps=4,stages=3"; fields
    not named keep their defaults ("" is the defaults; warps=auto is None)."""
    fields = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
      name, _, value = (s.strip() for s in part.partition("="))
      if name not in cls.TILES + ("warps", "backward_warps", "stages"):
        raise ValueError(f"{part!r} in blocks {text!r}: no such field (forward, dkdv, dq, warps, backward_warps, "
                         "stages)")
      if name in fields:
        raise ValueError(f"{part!r} in blocks {text!r}: {name} given twice")
      try:
        if name in cls.TILES:
          outer, inner = value.split("x")
          fields[name] = (int(outer), int(inner))
        else:
          fields[name] = None if name == "warps" and value == "auto" else int(value)
      except ValueError:
        form = "two sizes AxB (forward=128x64)" if name in cls.TILES else "an integer"
        raise ValueError(f"{part!r} in blocks {text!r}: {name} takes {form}") from None
    try:
      return cls(**fields)
    except ValueError as err:
      raise ValueError(f"blocks {text!r}: {err}") from None

  def spec(self) -> str:
    """The `parse` form of every field: Blocks.parse(b.spec()) == b."""
    tiles = [f"{name}={getattr(self, name)[0]}x{getattr(self, name)[1]}" for name in self.TILES]
    warps = "auto" if self.warps is None else self.warps
    return ",".join(tiles + [f"warps={warps}", f"backward_warps={self.backward_warps}", f"stages={self.stages}"])

  __str__ = spec

  def fitted(self, q_len: int, kv_len: int) -> Blocks:
    """The tiles a call at these lengths runs: each block, or the largest power of two below it
    that divides its length (at least BLOCK)."""
    (fq, fk), (dk, dkq), (dq, dqk) = self.forward, self.dkdv, self.dq
    return dataclasses.replace(self, forward=(_block(q_len, fq), _block(kv_len, fk)),
                               dkdv=(_block(kv_len, dk), _block(q_len, dkq)), dq=(_block(q_len, dq), _block(kv_len, dqk)))

  def forward_warps(self, head_dim: int) -> int:
    return self.warps if self.warps is not None else (4 if head_dim <= 64 else 8)

  def largest(self) -> int:
    return max(max(getattr(self, name)) for name in self.TILES)


BLOCKS = Blocks()  # what `flash_attention` runs when given no blocks; read at each call, so a benchmark may set it


def _params(num_warps: int, num_stages: int):
  return plgpu.CompilerParams(num_warps=num_warps, num_stages=num_stages) if plgpu is not None else None


def _causal_upper(i, block_q: int, block_k: int, kv_len: int):
  """Key blocks that query block i sees under the causal mask: those starting at or before
  its last query, ceil(block_q (i + 1) / block_k), any block sizes; at most the key blocks
  there are (queries past the last key, t > s, see them all)."""
  return jnp.minimum(lax.div(block_q * (i + 1) + block_k - 1, block_k), kv_len // block_k)


def _logits2(q, k, q_seg, k_seg, q_start, k_start, scale: float, causal: bool):
  """Masked base-2 logits [bq, bk] of a query block against a key block (f32)."""
  s = jnp.dot(q, k.T, preferred_element_type=jnp.float32) * (scale * LOG2E)
  mask = q_seg[:, None] == k_seg[None, :]
  if causal:
    span_q = q_start + jnp.arange(q.shape[0])
    span_k = k_start + jnp.arange(k.shape[0])
    mask = mask & (span_q[:, None] >= span_k[None, :])
  return jnp.where(mask, s, MASK)


def _forward_kernel(q_ref, k_ref, v_ref, q_seg_ref, k_seg_ref, o_ref, lse_ref, *, scale, causal, block_k):
  block_q, kv_len = q_ref.shape[0], k_ref.shape[0]
  i = pl.program_id(0)
  q, q_seg = q_ref[...], q_seg_ref[...]

  def body(j, carry):
    o, m, l = carry
    keys = pl.ds(j * block_k, block_k)
    s = _logits2(q, k_ref[keys, :], q_seg, k_seg_ref[keys], i * block_q, j * block_k, scale, causal)
    m_next = jnp.maximum(m, jnp.max(s, axis=-1))
    correction = jnp.exp2(m - m_next)
    p = jnp.exp2(s - m_next[:, None])
    v = v_ref[keys, :]
    o = correction[:, None] * o + jnp.dot(p.astype(v.dtype), v, preferred_element_type=jnp.float32)
    return o, m_next, correction * l + jnp.sum(p, axis=-1)

  init = (jnp.zeros((block_q, q_ref.shape[1]), jnp.float32), jnp.full((block_q,), -jnp.inf, jnp.float32),
          jnp.zeros((block_q,), jnp.float32))
  o, m, l = lax.fori_loop(0, _causal_upper(i, block_q, block_k, kv_len) if causal else kv_len // block_k, body, init)
  # A query with no key of its segment (every logit masked: m is MASK) attends to nothing: zeros,
  # and an infinite log-sum-exp, so that the backward pass's weights for it are zeros too.
  live = m > MASK
  o_ref[...] = jnp.where(live[:, None], o / l[:, None], 0.0).astype(o_ref.dtype)
  lse_ref[...] = jnp.where(live, m + jnp.log2(l), jnp.inf)


def _forward(q, k, v, q_seg, k_seg, causal: bool, interpret: bool, blocks: Blocks):
  (b, t, n, h), s = q.shape, k.shape[1]
  block_q, block_k = blocks.fitted(t, s).forward
  per_q = pl.BlockSpec((None, block_q, None, h), lambda i, j, k: (j, i, k, 0))
  whole_kv = pl.BlockSpec((None, s, None, h), lambda i, j, k: (j, 0, k, 0))
  out, lse = pl.pallas_call(
      functools.partial(_forward_kernel, scale=h**-0.5, causal=causal, block_k=block_k),
      grid=(t // block_q, b, n),
      in_specs=[per_q, whole_kv, whole_kv, pl.BlockSpec((None, block_q), lambda i, j, k: (j, i)),
                pl.BlockSpec((None, s), lambda i, j, k: (j, 0))],
      out_specs=[per_q, pl.BlockSpec((None, None, block_q), lambda i, j, k: (j, k, i))],
      out_shape=[jax.ShapeDtypeStruct(q.shape, q.dtype), jax.ShapeDtypeStruct((b, n, t), jnp.float32)],
      compiler_params=_params(blocks.forward_warps(h), blocks.stages), interpret=interpret,
      name="seq2seq_flash_forward",
  )(q, k, v, q_seg, k_seg)
  return out, lse


def _dkdv_kernel(q_ref, k_ref, v_ref, q_seg_ref, k_seg_ref, do_ref, lse_ref, delta_ref, dk_ref, dv_ref, *, scale,
                 causal, block_q):
  block_k, q_len = k_ref.shape[0], q_ref.shape[0]
  j = pl.program_id(0)
  k, v, k_seg = k_ref[...], v_ref[...], k_seg_ref[...]

  def body(i, carry):
    dk, dv = carry
    queries = pl.ds(i * block_q, block_q)
    q, do, lse = q_ref[queries, :], do_ref[queries, :], lse_ref[queries]
    p = jnp.exp2(_logits2(q, k, q_seg_ref[queries], k_seg, i * block_q, j * block_k, scale, causal) - lse[:, None])
    dv = dv + jnp.dot(p.astype(do.dtype).T, do, preferred_element_type=jnp.float32)
    dp = jnp.dot(do, v.T, preferred_element_type=jnp.float32) - delta_ref[queries][:, None]
    ds = (p * dp * scale).astype(q.dtype)
    return dk + jnp.dot(ds.T, q, preferred_element_type=jnp.float32), dv

  zeros = jnp.zeros((block_k, k_ref.shape[1]), jnp.float32)
  lower = lax.div(j * block_k, block_q) if causal else 0
  dk, dv = lax.fori_loop(lower, q_len // block_q, body, (zeros, zeros))
  dk_ref[...] = dk.astype(dk_ref.dtype)
  dv_ref[...] = dv.astype(dv_ref.dtype)


def _dq_kernel(q_ref, k_ref, v_ref, q_seg_ref, k_seg_ref, do_ref, lse_ref, delta_ref, dq_ref, *, scale, causal,
               block_k):
  block_q, kv_len = q_ref.shape[0], k_ref.shape[0]
  i = pl.program_id(0)
  q, q_seg, do = q_ref[...], q_seg_ref[...], do_ref[...]
  lse, delta = lse_ref[...], delta_ref[...]

  def body(j, dq):
    keys = pl.ds(j * block_k, block_k)
    k = k_ref[keys, :]
    p = jnp.exp2(_logits2(q, k, q_seg, k_seg_ref[keys], i * block_q, j * block_k, scale, causal) - lse[:, None])
    dp = jnp.dot(do, v_ref[keys, :].T, preferred_element_type=jnp.float32) - delta[:, None]
    return dq + jnp.dot((p * dp * scale).astype(k.dtype), k, preferred_element_type=jnp.float32)

  upper = _causal_upper(i, block_q, block_k, kv_len) if causal else kv_len // block_k
  dq_ref[...] = lax.fori_loop(0, upper, body, jnp.zeros((block_q, q_ref.shape[1]), jnp.float32)).astype(dq_ref.dtype)


def _backward(causal: bool, interpret: bool, blocks: Blocks, residuals, d_out):
  q, k, v, q_seg, k_seg, out, lse = residuals
  (b, t, n, h), s = q.shape, k.shape[1]
  fitted = blocks.fitted(t, s)
  params = _params(blocks.backward_warps, blocks.stages)
  delta = jnp.einsum("btnh,btnh->bnt", out.astype(jnp.float32), d_out.astype(jnp.float32))
  whole = lambda length: pl.BlockSpec((None, length, None, h), lambda x, j, k: (j, 0, k, 0))
  block = lambda length: pl.BlockSpec((None, length, None, h), lambda x, j, k: (j, x, k, 0))
  seg_whole = lambda length: pl.BlockSpec((None, length), lambda x, j, k: (j, 0))
  stat_whole = pl.BlockSpec((None, None, t), lambda x, j, k: (j, k, 0))
  args = (q, k, v, q_seg, k_seg, d_out, lse, delta)
  block_k, block_q = fitted.dkdv  # one program per key block, a loop over query blocks
  dk, dv = pl.pallas_call(
      functools.partial(_dkdv_kernel, scale=h**-0.5, causal=causal, block_q=block_q),
      grid=(s // block_k, b, n),
      in_specs=[whole(t), block(block_k), block(block_k), seg_whole(t),
                pl.BlockSpec((None, block_k), lambda x, j, k: (j, x)), whole(t), stat_whole, stat_whole],
      out_specs=[block(block_k), block(block_k)],
      out_shape=[jax.ShapeDtypeStruct(k.shape, k.dtype), jax.ShapeDtypeStruct(v.shape, v.dtype)],
      compiler_params=params, interpret=interpret, name="seq2seq_flash_dkdv",
  )(*args)
  block_q, block_k = fitted.dq  # one program per query block, a loop over key blocks
  stat_block = pl.BlockSpec((None, None, block_q), lambda x, j, k: (j, k, x))
  dq = pl.pallas_call(
      functools.partial(_dq_kernel, scale=h**-0.5, causal=causal, block_k=block_k),
      grid=(t // block_q, b, n),
      in_specs=[block(block_q), whole(s), whole(s), pl.BlockSpec((None, block_q), lambda x, j, k: (j, x)),
                seg_whole(s), block(block_q), stat_block, stat_block],
      out_specs=block(block_q),
      out_shape=jax.ShapeDtypeStruct(q.shape, q.dtype),
      compiler_params=params, interpret=interpret, name="seq2seq_flash_dq",
  )(*args)
  return dq, dk, dv, None, None


def flash_attention(q_btnh, k_bsnh, v_bsnh, q_segments_bt, k_segments_bs, causal: bool = False,
                    interpret: bool = False, blocks: Blocks | None = None):
  """softmax(q k^T / sqrt(h), masked to equal segment ids [and causal]) v: [b, t, n, h].
  t and s must be multiples of 16; the head dim one of HEAD_DIMS on a GPU. `blocks`: the
  tiles (static); None takes the module's BLOCKS as it is at this call."""
  return _flash(q_btnh, k_bsnh, v_bsnh, q_segments_bt, k_segments_bs, causal, interpret,
                BLOCKS if blocks is None else blocks)


@functools.partial(jax.custom_vjp, nondiff_argnums=(5, 6, 7))
def _flash(q, k, v, q_seg, k_seg, causal: bool, interpret: bool, blocks: Blocks):
  return _forward(q, k, v, q_seg, k_seg, causal, interpret, blocks)[0]


def _flash_fwd(q, k, v, q_seg, k_seg, causal, interpret, blocks):
  out, lse = _forward(q, k, v, q_seg, k_seg, causal, interpret, blocks)
  return out, (q, k, v, q_seg, k_seg, out, lse)


_flash.defvjp(_flash_fwd, _backward)


def blockers(*, platform: str, dtype, head_dim: int, q_len: int, kv_len: int, segments: bool) -> list[str]:
  """Why the kernel cannot run here (empty: it can)."""
  why = []
  if plgpu is None:
    why.append("this JAX has no Pallas Triton backend (jax.experimental.pallas.triton)")
  if platform != "gpu":
    why.append(f"the flash kernel runs on GPU only (platform is {platform})")
  if jnp.dtype(dtype) not in (jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float16)):
    why.append(f"the flash kernel takes bfloat16 or float16 inputs (config.model.dtype), got {jnp.dtype(dtype).name}")
  if head_dim not in HEAD_DIMS:
    why.append(f"the flash kernel needs a head dim in {HEAD_DIMS}, got {head_dim}")
  if q_len % BLOCK or kv_len % BLOCK:
    why.append(f"the flash kernel needs lengths that are multiples of {BLOCK}, got {q_len} and {kv_len}")
  if not segments:
    why.append("the flash kernel needs segment ids, not a dense mask")
  return why


def compiles(dtype_name: str, head_dim: int, blocks: Blocks | None = None, device=None) -> str | None:
  """None if the kernel and its gradient compile on this GPU with these tiles (None: BLOCKS),
  else why not (a Triton or driver version, or tiles, it does not work with). Checked once
  per process and setting, so a kernel that cannot build here costs a warning and XLA
  attention, not the run. `device`: the GPU to compile for (None: the default device); an
  ahead-of-time compile names its target's (benchmarks/gpu_compile.py)."""
  return _compiles(dtype_name, head_dim, BLOCKS if blocks is None else blocks, device)


@functools.cache
def _compiles(dtype_name: str, head_dim: int, blocks: Blocks, device=None) -> str | None:
  length = blocks.largest()  # every block divides it, so each kernel runs its configured tiles
  placed = {} if device is None else {"sharding": jax.sharding.SingleDeviceSharding(device)}
  shape = jax.ShapeDtypeStruct((1, length, 1, head_dim), jnp.dtype(dtype_name), **placed)
  segments = jax.ShapeDtypeStruct((1, length), jnp.int32, **placed)

  def loss(q, k, v, q_seg, k_seg):
    return jnp.sum(flash_attention(q, k, v, q_seg, k_seg, True, blocks=blocks).astype(jnp.float32))

  try:
    jax.jit(jax.grad(loss, argnums=(0, 1, 2))).lower(shape, shape, shape, segments, segments).compile()
  except Exception as err:  # noqa: BLE001 - Triton/driver failures come in many kinds
    return f"{type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}"
  return None
