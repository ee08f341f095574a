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
key block). A padding query (segment 0), and a query with no key of its segment, attends to
nothing: its output is zeros and it takes and gives no gradient (the masked softmax would
give it uniform weights over masked keys; a real query always has keys of its own pair), so
callers need not zero padding queries' outputs themselves. The ops are those the shipped
Triton kernel uses (`plgpu.load`/`dot`/`store`, `exp2`, `lax.fori_loop`). `interpret=True`
runs the kernels in Pallas' interpreter on any platform (tests).

The kernels read q, k and v where a `Layout` says: slots of the fused projections' outputs,
[b, t, n, 3, h] for self-attention (`SELF`), [b, t, n, 1, h] and [b, s, n, 2, h] for
cross-attention (`CROSS`), read in place, with the query and value biases added as a block
is read; their gradients are written in place the same way (dk and dv into their slots of
one array, dq into its slot of the same array when q shares it). Around the kernels there is
then no slice of the projections, no bias pass and no concatenation of gradients, which were
most of the "attention elementwise" time of the H200 profile (docs/scaling.md).
`flash_attention` takes q, k and v as three arrays (`SEPARATE`).

Tiles, warps and pipeline stages are a `Blocks`; the defaults (forward 64x64, backward 32s,
4 or 8 warps forward, 2 stages) are what the kernel has always run. A benchmark times other
tiles by setting `flash.BLOCKS = Blocks.parse("forward=128x64,dkdv=128x32,stages=3")` in its
process before tracing (a function already traced keeps its tiles), or by passing `blocks=`.
"""

from __future__ import annotations

import collections
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
# The attention layers hand the kernels their fused projections to read in place (SELF, CROSS);
# False: q, k and v are sliced out first and their biases added by XLA, as before (a benchmark
# times the difference: device_check's variant `flash_sliced`). Read when a step is traced.
IN_PLACE = True


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


@dataclasses.dataclass(frozen=True)
class Layout:
  """Where the kernels read q, k and v (static): each is (array, slot), an index into the
  arrays the call takes, all [b, length, n, slots, h], and a slot of that array. A fused
  projection's output is read in place, [b, t, n, 3, h] for self-attention's q, k, v and
  [b, s, n, 2, h] for cross-attention's k, v, with no slice taken of it; and its gradient
  is written in place, each kernel into its own slots, with no concatenation after. The
  slots of every array are those of q, k and v, each once."""

  q: tuple[int, int]
  k: tuple[int, int]
  v: tuple[int, int]

  def __post_init__(self):
    if self.q[0] == self.v[0] != self.k[0]:
      raise ValueError(f"q shares its array with v but not k: {self}")
    if len({self.q, self.k, self.v}) != 3:
      raise ValueError(f"q, k and v read the same slot: {self}")

  def check(self, shapes) -> None:
    for n, shape in enumerate(shapes):
      used = sorted(slot for array, slot in (self.q, self.k, self.v) if array == n)
      if len(shape) != 5 or used != list(range(shape[3])):
        raise ValueError(f"array {n} of shape {shape}: its slots {list(range(shape[3]))} are not those of q, k and "
                         f"v ({used}) in {self}")


SEPARATE = Layout(q=(0, 0), k=(1, 0), v=(2, 0))  # three [b, length, n, 1, h] arrays
SELF = Layout(q=(0, 0), k=(0, 1), v=(0, 2))  # one [b, t, n, 3, h] array
CROSS = Layout(q=(0, 0), k=(1, 0), v=(1, 1))  # [b, t, n, 1, h] and [b, s, n, 2, h]


def _with_bias(x, bias_ref):
  return x if bias_ref is None else x + bias_ref[...][None, :].astype(x.dtype)


def _take_biases(refs, biases: tuple[bool, bool]):
  """(q bias ref or None, v bias ref or None, the other refs): the bias refs come first where present."""
  refs = list(refs)
  q_bias = refs.pop(0) if biases[0] else None
  v_bias = refs.pop(0) if biases[1] else None
  return q_bias, v_bias, refs


def _store(ref, slot, value):
  """A gradient block into its slot of a fused gradient's block, or into its own block."""
  if slot is None:
    ref[...] = value.astype(ref.dtype)
  else:
    ref[:, slot, :] = value.astype(ref.dtype)


def _forward_kernel(q_ref, k_ref, v_ref, *refs, scale, causal, block_k, biases):
  qb_ref, vb_ref, (q_seg_ref, k_seg_ref, o_ref, lse_ref) = _take_biases(refs, biases)
  block_q, kv_len = q_ref.shape[0], k_ref.shape[0]
  i = pl.program_id(0)
  q, q_seg = _with_bias(q_ref[...], qb_ref), q_seg_ref[...]

  def body(j, carry):
    o, m, l = carry
    keys = pl.ds(j * block_k, block_k)
    s = _logits2(q, k_ref[keys, :], q_seg, k_seg_ref[keys], i * block_q, j * block_k, scale, causal)
    m_next = jnp.maximum(m, jnp.max(s, axis=-1))
    correction = jnp.exp2(m - m_next)
    p = jnp.exp2(s - m_next[:, None])
    v = _with_bias(v_ref[keys, :], vb_ref)
    o = correction[:, None] * o + jnp.dot(p.astype(v.dtype), v, preferred_element_type=jnp.float32)
    return o, m_next, correction * l + jnp.sum(p, axis=-1)

  init = (jnp.zeros((block_q, q_ref.shape[1]), jnp.float32), jnp.full((block_q,), -jnp.inf, jnp.float32),
          jnp.zeros((block_q,), jnp.float32))
  o, m, l = lax.fori_loop(0, _causal_upper(i, block_q, block_k, kv_len) if causal else kv_len // block_k, body, init)
  # A padding query (segment 0), or one with no key of its segment (every logit masked: m is
  # MASK), attends to nothing: zeros, and an infinite log-sum-exp, so that the backward pass's
  # weights for it are zeros too.
  live = (m > MASK) & (q_seg != 0)
  o_ref[...] = jnp.where(live[:, None], o / l[:, None], 0.0).astype(o_ref.dtype)
  lse_ref[...] = jnp.where(live, m + jnp.log2(l), jnp.inf)


def _dkdv_kernel(q_ref, k_ref, v_ref, *refs, scale, causal, block_q, biases, slots):
  qb_ref, vb_ref, (q_seg_ref, k_seg_ref, do_ref, lse_ref, delta_ref, *out_refs) = _take_biases(refs, biases)
  block_k, q_len = k_ref.shape[0], q_ref.shape[0]
  j = pl.program_id(0)
  k, v, k_seg = k_ref[...], _with_bias(v_ref[...], vb_ref), k_seg_ref[...]

  def body(i, carry):
    dk, dv = carry
    queries = pl.ds(i * block_q, block_q)
    q, do, lse = _with_bias(q_ref[queries, :], qb_ref), do_ref[queries, :], lse_ref[queries]
    p = jnp.exp2(_logits2(q, k, q_seg_ref[queries], k_seg, i * block_q, j * block_k, scale, causal) - lse[:, None])
    dv = dv + jnp.dot(p.astype(do.dtype).T, do, preferred_element_type=jnp.float32)
    dp = jnp.dot(do, v.T, preferred_element_type=jnp.float32) - delta_ref[queries][:, None]
    ds = (p * dp * scale).astype(q.dtype)
    return dk + jnp.dot(ds.T, q, preferred_element_type=jnp.float32), dv

  zeros = jnp.zeros((block_k, k_ref.shape[1]), jnp.float32)
  lower = lax.div(j * block_k, block_q) if causal else 0
  dk, dv = lax.fori_loop(lower, q_len // block_q, body, (zeros, zeros))
  dk_ref, dv_ref = (out_refs[0], out_refs[0]) if len(out_refs) == 1 else out_refs  # one fused gradient, or two
  _store(dk_ref, slots[0], dk)
  _store(dv_ref, slots[1], dv)


def _dq_kernel(q_ref, k_ref, v_ref, *refs, scale, causal, block_k, biases):
  qb_ref, vb_ref, (q_seg_ref, k_seg_ref, do_ref, lse_ref, delta_ref, *rest) = _take_biases(refs, biases)
  dq_ref = rest[-1]  # before it, where dq joins dk and dv's array: that array, aliased to it
  block_q, kv_len = q_ref.shape[0], k_ref.shape[0]
  i = pl.program_id(0)
  q, q_seg, do = _with_bias(q_ref[...], qb_ref), q_seg_ref[...], do_ref[...]
  lse, delta = lse_ref[...], delta_ref[...]

  def body(j, dq):
    keys = pl.ds(j * block_k, block_k)
    k = k_ref[keys, :]
    p = jnp.exp2(_logits2(q, k, q_seg, k_seg_ref[keys], i * block_q, j * block_k, scale, causal) - lse[:, None])
    dp = jnp.dot(do, _with_bias(v_ref[keys, :], vb_ref).T, preferred_element_type=jnp.float32) - delta[:, None]
    return dq + jnp.dot((p * dp * scale).astype(k.dtype), k, preferred_element_type=jnp.float32)

  upper = _causal_upper(i, block_q, block_k, kv_len) if causal else kv_len // block_k
  dq_ref[...] = lax.fori_loop(0, upper, body, jnp.zeros((block_q, q_ref.shape[1]), jnp.float32)).astype(dq_ref.dtype)


def _slot_spec(array_shape, length: int, where, index):
  """A [length, h] block of one slot of a [b, L, n, slots, h] array; `index(x, j, k)` gives the
  block's (row, length block, head) from the program ids."""
  h = array_shape[-1]
  return pl.BlockSpec((None, length, None, None, h), lambda x, j, k: (*index(x, j, k), where[1], 0))


def _bias_specs(q_bias, v_bias):
  """Specs of the present biases ([n, h]: this head's [h])."""
  return [pl.BlockSpec((None, b.shape[-1]), lambda x, j, k: (k, 0)) for b in (q_bias, v_bias) if b is not None]


def _forward(arrays, q_bias, v_bias, q_seg, k_seg, layout: Layout, causal: bool, interpret: bool, blocks: Blocks):
  qa, ka, va = (arrays[w[0]] for w in (layout.q, layout.k, layout.v))
  (b, t, n, _, h), s = qa.shape, ka.shape[1]
  block_q, block_k = blocks.fitted(t, s).forward
  per_q = lambda i, j, k: (j, i, k)
  whole = lambda i, j, k: (j, 0, k)
  biases = (q_bias is not None, v_bias is not None)
  out, lse = pl.pallas_call(
      functools.partial(_forward_kernel, scale=h**-0.5, causal=causal, block_k=block_k, biases=biases),
      grid=(t // block_q, b, n),
      in_specs=[_slot_spec(qa.shape, block_q, layout.q, per_q), _slot_spec(ka.shape, s, layout.k, whole),
                _slot_spec(va.shape, s, layout.v, whole), *_bias_specs(q_bias, v_bias),
                pl.BlockSpec((None, block_q), lambda i, j, k: (j, i)), pl.BlockSpec((None, s), lambda i, j, k: (j, 0))],
      out_specs=[pl.BlockSpec((None, block_q, None, h), lambda i, j, k: (j, i, k, 0)),
                 pl.BlockSpec((None, None, block_q), lambda i, j, k: (j, k, i))],
      out_shape=[jax.ShapeDtypeStruct((b, t, n, h), qa.dtype), jax.ShapeDtypeStruct((b, n, t), jnp.float32)],
      compiler_params=_params(blocks.forward_warps(h), blocks.stages), interpret=interpret,
      name="seq2seq_flash_forward",
  )(qa, ka, va, *(x for x in (q_bias, v_bias) if x is not None), q_seg, k_seg)
  return out, lse


def _backward(layout: Layout, causal: bool, interpret: bool, blocks: Blocks, residuals, d_out):
  arrays, q_bias, v_bias, q_seg, k_seg, out, lse = residuals
  qa, ka, va = (arrays[w[0]] for w in (layout.q, layout.k, layout.v))
  (b, t, n, _, h), s = qa.shape, ka.shape[1]
  fitted = blocks.fitted(t, s)
  params = _params(blocks.backward_warps, blocks.stages)
  biases = (q_bias is not None, v_bias is not None)
  bias_args = [x for x in (q_bias, v_bias) if x is not None]
  delta = jnp.einsum("btnh,btnh->bnt", out.astype(jnp.float32), d_out.astype(jnp.float32))
  whole = lambda x, j, k: (j, 0, k)
  block = lambda x, j, k: (j, x, k)
  seg_whole = lambda length: pl.BlockSpec((None, length), lambda x, j, k: (j, 0))
  stat_whole = pl.BlockSpec((None, None, t), lambda x, j, k: (j, k, 0))
  do_whole = pl.BlockSpec((None, t, None, h), lambda x, j, k: (j, 0, k, 0))
  args = (qa, ka, va, *bias_args, q_seg, k_seg, d_out, lse, delta)

  block_k, block_q = fitted.dkdv  # one program per key block, a loop over query blocks
  kv_fused = layout.k[0] == layout.v[0]
  if kv_fused:  # dk and dv into their slots of one array's gradient, each block of it whole
    kva = arrays[layout.k[0]]
    out_specs = [pl.BlockSpec((None, block_k, None, kva.shape[3], h), lambda x, j, k: (j, x, k, 0, 0))]
    out_shape = [jax.ShapeDtypeStruct(kva.shape, kva.dtype)]
    slots = (layout.k[1], layout.v[1])
  else:
    out_specs = [pl.BlockSpec((None, block_k, None, None, h), lambda x, j, k, w=w: (j, x, k, w[1], 0))
                 for w in (layout.k, layout.v)]
    out_shape = [jax.ShapeDtypeStruct(ka.shape, ka.dtype), jax.ShapeDtypeStruct(va.shape, va.dtype)]
    slots = (None, None)
  kv_grads = pl.pallas_call(
      functools.partial(_dkdv_kernel, scale=h**-0.5, causal=causal, block_q=block_q, biases=biases, slots=slots),
      grid=(s // block_k, b, n),
      in_specs=[_slot_spec(qa.shape, t, layout.q, whole), _slot_spec(ka.shape, block_k, layout.k, block),
                _slot_spec(va.shape, block_k, layout.v, block), *_bias_specs(q_bias, v_bias), seg_whole(t),
                pl.BlockSpec((None, block_k), lambda x, j, k: (j, x)), do_whole, stat_whole, stat_whole],
      out_specs=out_specs, out_shape=out_shape, compiler_params=params, interpret=interpret,
      name="seq2seq_flash_dkdv",
  )(*args)

  block_q, block_k = fitted.dq  # one program per query block, a loop over key blocks
  stat_block = pl.BlockSpec((None, None, block_q), lambda x, j, k: (j, k, x))
  in_specs = [_slot_spec(qa.shape, block_q, layout.q, block), _slot_spec(ka.shape, s, layout.k, whole),
              _slot_spec(va.shape, s, layout.v, whole), *_bias_specs(q_bias, v_bias),
              pl.BlockSpec((None, block_q), lambda x, j, k: (j, x)), seg_whole(s),
              pl.BlockSpec((None, block_q, None, h), lambda x, j, k: (j, x, k, 0)), stat_block, stat_block]
  dq_spec = _slot_spec(qa.shape, block_q, layout.q, block)
  joins = layout.q[0] == layout.k[0]  # self-attention's fused array: dq into its slot of dk and dv's gradient
  dq = pl.pallas_call(
      functools.partial(_dq_kernel, scale=h**-0.5, causal=causal, block_k=block_k, biases=biases),
      grid=(t // block_q, b, n),
      in_specs=in_specs + ([dq_spec] if joins else []), out_specs=dq_spec,
      out_shape=jax.ShapeDtypeStruct(qa.shape, qa.dtype),
      input_output_aliases={len(in_specs): 0} if joins else {}, compiler_params=params, interpret=interpret,
      name="seq2seq_flash_dq",
  )(*args, *([kv_grads[0]] if joins else []))

  grads = [None] * len(arrays)
  grads[layout.q[0]] = dq
  if kv_fused:
    grads[layout.k[0]] = dq if joins else kv_grads[0]
  else:
    grads[layout.k[0]], grads[layout.v[0]] = kv_grads
  d_q_bias = None if q_bias is None else jnp.sum(dq[:, :, :, layout.q[1]], axis=(0, 1), dtype=jnp.float32).astype(
      q_bias.dtype)
  dv = grads[layout.v[0]][:, :, :, layout.v[1]]
  d_v_bias = None if v_bias is None else jnp.sum(dv, axis=(0, 1), dtype=jnp.float32).astype(v_bias.dtype)
  return tuple(grads), d_q_bias, d_v_bias, None, None


@functools.partial(jax.custom_vjp, nondiff_argnums=(5, 6, 7, 8))
def _flash(arrays, q_bias, v_bias, q_seg, k_seg, layout: Layout, causal: bool, interpret: bool, blocks: Blocks):
  return _forward(arrays, q_bias, v_bias, q_seg, k_seg, layout, causal, interpret, blocks)[0]


def _flash_fwd(arrays, q_bias, v_bias, q_seg, k_seg, layout, causal, interpret, blocks):
  out, lse = _forward(arrays, q_bias, v_bias, q_seg, k_seg, layout, causal, interpret, blocks)
  return out, (arrays, q_bias, v_bias, q_seg, k_seg, out, lse)


_flash.defvjp(_flash_fwd, _backward)


def flash_attention(q_btnh, k_bsnh, v_bsnh, q_segments_bt, k_segments_bs, causal: bool = False,
                    interpret: bool = False, blocks: Blocks | None = None):
  """softmax(q k^T / sqrt(h), masked to equal segment ids [and causal]) v: [b, t, n, h];
  padding queries (segment 0) give zeros. t and s must be multiples of 16; the head dim one
  of HEAD_DIMS on a GPU. `blocks`: the tiles (static); None takes the module's BLOCKS as it is
  at this call."""
  arrays = tuple(x[:, :, :, None, :] for x in (q_btnh, k_bsnh, v_bsnh))
  return fused_flash_attention(arrays, SEPARATE, q_segments_bt, k_segments_bs, causal=causal, interpret=interpret,
                               blocks=blocks)


def fused_flash_attention(arrays, layout: Layout, q_segments_bt, k_segments_bs, *, q_bias_nh=None, v_bias_nh=None,
                          causal: bool = False, interpret: bool = False, blocks: Blocks | None = None):
  """`flash_attention` of softmax((q + q_bias) k^T / sqrt(h)) (v + v_bias), reading q, k and v
  where `layout` says in `arrays` ([b, length, n, slots, h] each: SELF, one fused projection;
  CROSS, queries and fused keys and values), the gradient written the same way. The biases
  ([n, h] or None) are added where q and v are read. [b, t, n, h]."""
  layout.check([x.shape for x in arrays])
  return _flash(tuple(arrays), q_bias_nh, v_bias_nh, q_segments_bt, k_segments_bs, layout, causal, interpret,
                BLOCKS if blocks is None else blocks)


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


def compiles(dtype_name: str, head_dim: int, blocks: Blocks | None = None, device=None,
             layout: Layout = SEPARATE) -> str | None:
  """None if the kernel and its gradient compile on this GPU with these tiles (None: BLOCKS)
  and q, k and v read as `layout` says (with biases), else why not (a Triton or driver version,
  or tiles, it does not work with). Checked once per process and setting, so a kernel that
  cannot build here costs a warning and XLA attention, not the run. `device`: the GPU to
  compile for (None: the default device); an ahead-of-time compile names its target's
  (benchmarks/gpu_compile.py)."""
  return _compiles(dtype_name, head_dim, BLOCKS if blocks is None else blocks, device, layout)


@functools.cache
def _compiles(dtype_name: str, head_dim: int, blocks: Blocks, device=None, layout: Layout = SEPARATE) -> str | None:
  length = blocks.largest()  # every block divides it, so each kernel runs its configured tiles
  placed = {} if device is None else {"sharding": jax.sharding.SingleDeviceSharding(device)}
  slots = collections.Counter(array for array, _ in (layout.q, layout.k, layout.v))  # of each array
  arrays = [jax.ShapeDtypeStruct((1, length, 1, slots[n], head_dim), jnp.dtype(dtype_name), **placed)
            for n in sorted(slots)]
  bias = jax.ShapeDtypeStruct((1, head_dim), jnp.dtype(dtype_name), **placed)
  segments = jax.ShapeDtypeStruct((1, length), jnp.int32, **placed)

  def loss(arrays, q_bias, v_bias, q_seg, k_seg):
    out = fused_flash_attention(arrays, layout, q_seg, k_seg, q_bias_nh=q_bias, v_bias_nh=v_bias, causal=True,
                                blocks=blocks)
    return jnp.sum(out.astype(jnp.float32))

  try:
    jax.jit(jax.grad(loss, argnums=(0, 1, 2))).lower(arrays, bias, bias, segments, segments).compile()
  except Exception as err:  # noqa: BLE001 - Triton/driver failures come in many kinds
    return f"{type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}"
  return None
