"""The flash attention kernels of `seq2seq.model.flash` (Pallas, Triton on a GPU): the
forward kernel, the dK/dV and dQ kernels of the backward pass, and the calls that lay them
out over (query or key block, row, head) grids, reading q, k and v where a `flash.Layout`
says. `seq2seq.model.flash` holds the settings (tiles, layouts), the custom gradient and the
entry points; the algorithm is described there.

Shapes: b=batch, t=query length, s=key length, n=heads, h=head dim; the arrays the calls take
are [b, length, n, slots, h].
"""

from __future__ import annotations

import functools
import math
from typing import TYPE_CHECKING

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.experimental import pallas as pl

try:  # the Triton backend's helpers; absent in JAX builds without Pallas GPU support
  from jax.experimental.pallas import triton as plgpu
except ImportError:  # pragma: no cover
  plgpu = None

if TYPE_CHECKING:  # the settings' types, defined where they are set (seq2seq.model.flash imports this module)
  from seq2seq.model.flash import Blocks, Layout

MASK = -0.7 * float(np.finfo(np.float32).max)  # a masked logit: finite, so fully masked rows stay finite
BIG_SEGMENT = 2**30  # above any segment id
LOG2E = math.log2(math.e)


def _params(num_warps: int, num_stages: int):
  return plgpu.CompilerParams(num_warps=num_warps, num_stages=num_stages) if plgpu is not None else None


def _causal_upper(i, block_q: int, block_k: int, kv_len: int):
  """Key blocks that query block i sees under the causal mask: those starting at or before
  its last query, ceil(block_q (i + 1) / block_k), any block sizes; at most the key blocks
  there are (queries past the last key, t > s, see them all)."""
  return jnp.minimum(lax.div(block_q * (i + 1) + block_k - 1, block_k), kv_len // block_k)


def _segment_span(own_seg, other_ref, block: int):
  """[start, stop) of the blocks of `block` positions of the other side's row (the ref of its
  segment ids, whole) that hold a position of a segment in this block's range of segments
  (`own_seg`, padding 0 left out): the only blocks that can share a segment with it. Packed
  rows hold their pairs in order, so a block's pairs meet a few blocks of the other side
  rather than the row. Empty where none does (a block of padding). Any layout of segment ids
  gives a superset of the blocks needed, so skipping the rest changes nothing. Read a block
  at a time (Triton's arrays are powers of two; a row need not be)."""
  live = own_seg != 0
  low, high = jnp.min(jnp.where(live, own_seg, BIG_SEGMENT)), jnp.max(jnp.where(live, own_seg, 0))
  count = other_ref.shape[0] // block

  def scan(j, span):
    seg = other_ref[pl.ds(j * block, block)]
    hit = jnp.max(((seg >= low) & (seg <= high)).astype(jnp.int32)) > 0
    return jnp.where(hit, jnp.minimum(span[0], j), span[0]), jnp.where(hit, j + 1, span[1])

  start, stop = lax.fori_loop(0, count, scan, (jnp.int32(count), jnp.int32(0)))
  return start, jnp.maximum(stop, start)


def _logits2(q, k, q_seg, k_seg, q_start, k_start, scale: float, causal: bool):
  """Masked base-2 logits [bq, bk] of a query block against a key block (f32)."""
  s = jnp.dot(q, k.T, preferred_element_type=jnp.float32) * (scale * LOG2E)
  mask = q_seg[:, None] == k_seg[None, :]
  if causal:
    span_q = q_start + jnp.arange(q.shape[0])
    span_k = k_start + jnp.arange(k.shape[0])
    mask = mask & (span_q[:, None] >= span_k[None, :])
  return jnp.where(mask, s, MASK)


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
  start, stop = _segment_span(q_seg, k_seg_ref, block_k)
  if causal:
    stop = jnp.minimum(stop, _causal_upper(i, block_q, block_k, kv_len))
  o, m, l = lax.fori_loop(start, stop, body, init)
  # A padding query (segment 0), or one with no key of its segment (every logit masked: m is
  # MASK), attends to nothing: zeros, and an infinite log-sum-exp, so that the backward pass's
  # weights for it are zeros too.
  live = (m > MASK) & (q_seg != 0)
  o_ref[...] = jnp.where(live[:, None], o / l[:, None], 0.0).astype(o_ref.dtype)
  lse_ref[...] = jnp.where(live, m + jnp.log2(l), jnp.inf)


def _dkdv_kernel(q_ref, k_ref, v_ref, *refs, scale, causal, block_q, biases, slots, aliased):
  qb_ref, vb_ref, (q_seg_ref, k_seg_ref, do_ref, lse_ref, delta_ref, *out_refs) = _take_biases(refs, biases)
  out_refs = out_refs[aliased:]  # first, where dk and dv join dq's array: that array, aliased to it (not read)
  block_k = k_ref.shape[0]
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
  start, stop = _segment_span(k_seg, q_seg_ref, block_q)
  if causal:
    start = jnp.maximum(start, lax.div(j * block_k, block_q))
  dk, dv = lax.fori_loop(start, stop, body, (zeros, zeros))
  dk_ref, dv_ref = (out_refs[0], out_refs[0]) if len(out_refs) == 1 else out_refs  # one fused gradient, or two
  _store(dk_ref, slots[0], dk)
  _store(dv_ref, slots[1], dv)


def _dq_kernel(q_ref, k_ref, v_ref, *refs, scale, causal, block_k, biases, sums):
  qb_ref, vb_ref, (q_seg_ref, k_seg_ref, do_ref, lse_ref, o_ref, dq_ref, *outs) = _take_biases(refs, biases)
  block_q, kv_len = q_ref.shape[0], k_ref.shape[0]
  i = pl.program_id(0)
  do, lse = do_ref[...], lse_ref[...]
  if sums:  # delta = rowsum(dO * O) of this block's queries, for its dq and for the dK/dV kernel after it
    delta = jnp.sum(do.astype(jnp.float32) * o_ref[...].astype(jnp.float32), axis=1)
    outs[0][...] = delta
    if vb_ref is not None:  # this block's share of the value bias's gradient: o = P (v + bv) and a live
      # query's weights sum to 1, so the bias's gradient is the sum of dO over live queries
      outs[-1][...] = jnp.sum(jnp.where((lse < jnp.inf)[:, None], do.astype(jnp.float32), 0.0), axis=0)
  else:  # o_ref holds delta, computed by XLA
    delta = o_ref[...]
  q, q_seg = _with_bias(q_ref[...], qb_ref), q_seg_ref[...]

  def body(j, dq):
    keys = pl.ds(j * block_k, block_k)
    k = k_ref[keys, :]
    p = jnp.exp2(_logits2(q, k, q_seg, k_seg_ref[keys], i * block_q, j * block_k, scale, causal) - lse[:, None])
    dp = jnp.dot(do, _with_bias(v_ref[keys, :], vb_ref).T, preferred_element_type=jnp.float32) - delta[:, None]
    return dq + jnp.dot((p * dp * scale).astype(k.dtype), k, preferred_element_type=jnp.float32)

  start, stop = _segment_span(q_seg, k_seg_ref, block_k)
  if causal:
    stop = jnp.minimum(stop, _causal_upper(i, block_q, block_k, kv_len))
  dq = lax.fori_loop(start, stop, body, jnp.zeros((block_q, q_ref.shape[1]), jnp.float32))
  dq_ref[...] = dq.astype(dq_ref.dtype)
  if sums and qb_ref is not None:  # this block's share of the query bias's gradient: dq summed over its queries
    outs[1][...] = jnp.sum(dq, axis=0)


def _slot_spec(array_shape, length: int, where, index):
  """A [length, h] block of one slot of a [b, L, n, slots, h] array; `index(x, j, k)` gives the
  block's (row, length block, head) from the program ids."""
  h = array_shape[-1]
  return pl.BlockSpec((None, length, None, None, h), lambda x, j, k: (*index(x, j, k), where[1], 0))


def _bias_specs(bias_args):
  """Specs of the present biases ([n, h]: this head's [h])."""
  return [pl.BlockSpec((None, b.shape[-1]), lambda x, j, k: (k, 0)) for b in bias_args]


def forward(arrays, q_bias, v_bias, q_seg, k_seg, layout: Layout, causal: bool, interpret: bool, blocks: Blocks):
  qa, ka, va = (arrays[w[0]] for w in (layout.q, layout.k, layout.v))
  (b, t, n, _, h), s = qa.shape, ka.shape[1]
  block_q, block_k = blocks.fitted(t, s).forward
  per_q = lambda i, j, k: (j, i, k)
  whole = lambda i, j, k: (j, 0, k)
  biases = (q_bias is not None, v_bias is not None)
  bias_args = [x for x in (q_bias, v_bias) if x is not None]
  out, lse = pl.pallas_call(
      functools.partial(_forward_kernel, scale=h**-0.5, causal=causal, block_k=block_k, biases=biases),
      grid=(t // block_q, b, n),
      in_specs=[_slot_spec(qa.shape, block_q, layout.q, per_q), _slot_spec(ka.shape, s, layout.k, whole),
                _slot_spec(va.shape, s, layout.v, whole), *_bias_specs(bias_args),
                pl.BlockSpec((None, block_q), lambda i, j, k: (j, i)), pl.BlockSpec((None, s), lambda i, j, k: (j, 0))],
      out_specs=[pl.BlockSpec((None, block_q, None, h), lambda i, j, k: (j, i, k, 0)),
                 pl.BlockSpec((None, None, block_q), lambda i, j, k: (j, k, i))],
      out_shape=[jax.ShapeDtypeStruct((b, t, n, h), qa.dtype), jax.ShapeDtypeStruct((b, n, t), jnp.float32)],
      compiler_params=_params(blocks.forward_warps(h), blocks.stages), interpret=interpret,
      name="seq2seq_flash_forward",
  )(qa, ka, va, *bias_args, q_seg, k_seg)
  return out, lse


def backward(layout: Layout, causal: bool, interpret: bool, blocks: Blocks, sums: bool, residuals, d_out):
  """The dQ kernel, then the dK/dV kernel. With `sums` (flash.SUMS_IN_KERNELS) the dQ kernel
  also writes delta = rowsum(dO * O), which both use, and its blocks' sums of dq and of dO
  over live queries, which XLA adds up into the query's and the value's bias gradients: no XLA
  pass over [b, t, n, h] for any of them. Without, XLA computes delta and the biases'
  gradients from the arrays, as before."""
  arrays, q_bias, v_bias, q_seg, k_seg, out, lse = residuals
  qa, ka, va = (arrays[w[0]] for w in (layout.q, layout.k, layout.v))
  (b, t, n, _, h), s = qa.shape, ka.shape[1]
  fitted = blocks.fitted(t, s)
  params = _params(blocks.backward_warps, blocks.stages)
  biases = (q_bias is not None, v_bias is not None)
  bias_args = [x for x in (q_bias, v_bias) if x is not None]
  whole = lambda x, j, k: (j, 0, k)
  block = lambda x, j, k: (j, x, k)
  seg_whole = lambda length: pl.BlockSpec((None, length), lambda x, j, k: (j, 0))
  stat_whole = pl.BlockSpec((None, None, t), lambda x, j, k: (j, k, 0))
  do_whole = pl.BlockSpec((None, t, None, h), lambda x, j, k: (j, 0, k, 0))
  partial_sums = lambda count: (pl.BlockSpec((None, None, None, h), lambda x, j, k: (x, j, k, 0)),
                                jax.ShapeDtypeStruct((count, b, n, h), jnp.float32))  # a block's sum over positions

  block_q, block_k = fitted.dq  # one program per query block, a loop over key blocks
  stat_block = pl.BlockSpec((None, None, block_q), lambda x, j, k: (j, k, x))
  rows_block = pl.BlockSpec((None, block_q, None, h), lambda x, j, k: (j, x, k, 0))
  dq_spec = _slot_spec(qa.shape, block_q, layout.q, block)
  out_specs, out_shape = [dq_spec], [jax.ShapeDtypeStruct(qa.shape, qa.dtype)]
  if sums:
    out_specs, out_shape = out_specs + [stat_block], out_shape + [jax.ShapeDtypeStruct((b, n, t), jnp.float32)]
    for bias in (q_bias, v_bias):
      if bias is not None:
        spec, shape = partial_sums(t // block_q)
        out_specs, out_shape = out_specs + [spec], out_shape + [shape]
  else:
    delta = jnp.einsum("btnh,btnh->bnt", out.astype(jnp.float32), d_out.astype(jnp.float32))
  dq_outs = pl.pallas_call(
      functools.partial(_dq_kernel, scale=h**-0.5, causal=causal, block_k=block_k, biases=biases, sums=sums),
      grid=(t // block_q, b, n),
      in_specs=[dq_spec, _slot_spec(ka.shape, s, layout.k, whole), _slot_spec(va.shape, s, layout.v, whole),
                *_bias_specs(bias_args), pl.BlockSpec((None, block_q), lambda x, j, k: (j, x)), seg_whole(s),
                rows_block, stat_block, rows_block if sums else stat_block],
      out_specs=out_specs, out_shape=out_shape, compiler_params=params, interpret=interpret,
      name="seq2seq_flash_dq",
  )(qa, ka, va, *bias_args, q_seg, k_seg, d_out, lse, out if sums else delta)
  dq = dq_outs[0]
  if sums:
    delta = dq_outs[1]

  block_k, block_q = fitted.dkdv  # one program per key block, a loop over query blocks
  kv_fused = layout.k[0] == layout.v[0]
  joins = layout.q[0] == layout.k[0]  # self-attention's fused array: dk and dv into their slots of dq's
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
  in_specs = [_slot_spec(qa.shape, t, layout.q, whole), _slot_spec(ka.shape, block_k, layout.k, block),
              _slot_spec(va.shape, block_k, layout.v, block), *_bias_specs(bias_args), seg_whole(t),
              pl.BlockSpec((None, block_k), lambda x, j, k: (j, x)), do_whole, stat_whole, stat_whole]
  kv_grads = pl.pallas_call(
      functools.partial(_dkdv_kernel, scale=h**-0.5, causal=causal, block_q=block_q, biases=biases, slots=slots,
                        aliased=int(joins)),
      grid=(s // block_k, b, n),
      in_specs=in_specs + ([out_specs[0]] if joins else []), out_specs=out_specs, out_shape=out_shape,
      input_output_aliases={len(in_specs): 0} if joins else {}, compiler_params=params, interpret=interpret,
      name="seq2seq_flash_dkdv",
  )(qa, ka, va, *bias_args, q_seg, k_seg, d_out, lse, delta, *([dq] if joins else []))

  grads = [None] * len(arrays)
  grads[layout.q[0]] = dq
  if kv_fused:  # where it joins dq's array (self-attention), the whole array: dq's slot, dk's and dv's
    grads[layout.k[0]] = kv_grads[0]
  else:
    grads[layout.k[0]], grads[layout.v[0]] = kv_grads
  if sums:
    d_q_bias = None if q_bias is None else jnp.sum(dq_outs[2], axis=(0, 1)).astype(q_bias.dtype)
    d_v_bias = None if v_bias is None else jnp.sum(dq_outs[-1], axis=(0, 1)).astype(v_bias.dtype)
  else:
    d_q_bias = None if q_bias is None else jnp.sum(grads[layout.q[0]][:, :, :, layout.q[1]], axis=(0, 1),
                                                   dtype=jnp.float32).astype(q_bias.dtype)
    dv = grads[layout.v[0]][:, :, :, layout.v[1]]
    d_v_bias = None if v_bias is None else jnp.sum(dv, axis=(0, 1), dtype=jnp.float32).astype(v_bias.dtype)
  return tuple(grads), d_q_bias, d_v_bias, None, None
