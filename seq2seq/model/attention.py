"""Multi-head scaled dot-product attention: masks, the attention kernels and the choice
between them. The layer around them (projections to heads, output projection) is
`seq2seq.model.multihead.MultiHeadAttention`.

Shapes: b=batch, t=query length, s=key length, n=heads, h=head dim, d=d_model.

What runs: `implementation`, at trace time, from `config.model.attention_impl` ("auto" by
default) and the platform of the step's devices (the activation mesh's, which an ahead-of-time
compile may target without having them; else `jax.default_backend()`):
  attention dropout, or weights recorded   `explicit_attention`, the softmax written out
  GPU, unpacked rows (one segment a row)   cuDNN flash attention, given sequence lengths
  GPU, packed rows                         the Pallas flash kernel of seq2seq/model/flash.py
  TPU                                      Pallas splash attention with segment ids
  CPU, or what no kernel takes             XLA, with a dense [b, 1, t, s] mask
  an additive bias (relative positions)    XLA (or explicit): no kernel here takes one
Each kernel's conditions (dtypes, head dims, length multiples, meshes) and the notes on
JAX's kernels are in docs/scaling.md ("Attention kernels"). On every path but a bare dense
mask, outputs of padding queries (segment 0) are zeroed.

An additive bias [1 or b, n, t, s] (`config.model.positions=relative`: T5's relative
position bias) is added to the scaled logits before the mask. XLA and the explicit softmax
take it; the flash and splash kernels have no bias input, and cuDNN's bias, beside the
sequence lengths our masks take, is neither run nor tested here: all three are refused
with a bias ("auto" takes XLA).
"""

from __future__ import annotations

import dataclasses
import functools
import logging

import jax
import jax.numpy as jnp

from seq2seq.errors import ConfigError
from seq2seq.model import flash
from seq2seq.model.dropout import dropout
from seq2seq.sharding import activation_spec, current_mesh, kernel_device

try:  # experimental API; absent or moved in other JAX versions: TPU then takes XLA
  from jax.experimental.pallas.ops.tpu import splash_attention as _splash
except ImportError:  # pragma: no cover
  _splash = None

IMPLEMENTATIONS = ("auto", "xla", "explicit", "cudnn", "flash", "splash")
_CUDNN_DTYPES = (jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float16))
_SPLASH_BLOCK = 128  # splash's blocks are multiples of the 128 TPU lanes
_warn_once = functools.cache(logging.getLogger(__name__).warning)
HEADS = ("batch", "length", "heads", "kv")  # logical axes of q, k, v [b, t, n, h]
FUSED_HEADS = ("batch", "length", "heads", None, "kv")  # of a fused projection [b, t, n, p, h] (p: q, k, v or k, v)


def attention_mask(q_segments_bt: jax.Array, k_segments_bs: jax.Array, *, causal: bool = False) -> jax.Array:
  """Boolean mask [b, 1, t, s]: True where query t may attend to key s.

  Segment ids mark which sentence a token belongs to (0 = padding). Without packing
  they are simply `tokens != pad`. A query attends to non-pad keys of its own segment
  and, when `causal`, only to keys at or before its own index.
  """
  mask_bts = (q_segments_bt[:, :, None] == k_segments_bs[:, None, :]) & (k_segments_bs[:, None, :] != 0)
  if causal:
    t, s = q_segments_bt.shape[1], k_segments_bs.shape[1]
    mask_bts = mask_bts & (jnp.arange(t)[:, None] >= jnp.arange(s)[None, :])
  return mask_bts[:, None, :, :]


@functools.partial(jax.tree_util.register_dataclass, data_fields=["q_segments_bt", "k_segments_bs"],
                   meta_fields=["causal", "packed"])
@dataclasses.dataclass(frozen=True)
class SegmentMask:
  """Who attends to whom, kept as segment ids so that each kernel can take its own form:
  the dense mask (`attention_mask`), sequence lengths, or the segment ids themselves.

  `causal` and `packed` are static. `packed=False` promises that every row is one segment
  (id 1) followed by padding (0), so the mask is exactly the sequence lengths; packed rows
  (several segments a row) need the segment ids or the dense mask.
  """

  q_segments_bt: jax.Array
  k_segments_bs: jax.Array
  causal: bool = False
  packed: bool = True

  def dense_b1ts(self) -> jax.Array:
    return attention_mask(self.q_segments_bt, self.k_segments_bs, causal=self.causal)

  def lengths(self) -> tuple[jax.Array, jax.Array]:
    """Non-padding tokens per row, [b] int32, of queries and keys (meaningful when unpacked)."""
    count = lambda segments: jnp.sum(segments != 0, axis=1, dtype=jnp.int32)
    return count(self.q_segments_bt), count(self.k_segments_bs)


def explicit_attention(q_btnh: jax.Array, k_bsnh: jax.Array, v_bsnh: jax.Array, mask_b1ts: jax.Array,
                       *, dropout_rate: float = 0.0, rng: jax.Array | None = None, return_weights: bool = False,
                       bias_bnts: jax.Array | None = None):
  """softmax(q k^T / sqrt(h) + bias + mask) v written out, with dropout on the attention
  weights (and the weights [b, n, t, s] themselves with `return_weights`). A fully masked
  query row gets uniform weights (finite), since masked logits are the dtype's minimum, not
  -inf. `bias_bnts`: an additive bias [1 or b, n, t, s], or None."""
  scale = q_btnh.shape[-1] ** -0.5
  softmax_dtype = jnp.promote_types(q_btnh.dtype, jnp.float32)  # f32 for bf16 inputs
  logits_bnts = jnp.einsum("btnh,bsnh->bnts", q_btnh, k_bsnh, preferred_element_type=softmax_dtype) * scale
  if bias_bnts is not None:
    logits_bnts = logits_bnts + bias_bnts.astype(softmax_dtype)
  logits_bnts = jnp.where(mask_b1ts, logits_bnts, jnp.finfo(logits_bnts.dtype).min)
  weights_bnts = jax.nn.softmax(logits_bnts, axis=-1).astype(v_bsnh.dtype)
  dropped_bnts = dropout(weights_bnts, dropout_rate, rng)
  out_btnh = jnp.einsum("bnts,bsnh->btnh", dropped_bnts, v_bsnh)
  return (out_btnh, weights_bnts) if return_weights else out_btnh


def dot_product_attention(q_btnh: jax.Array, k_bsnh: jax.Array, v_bsnh: jax.Array, mask_b1ts: jax.Array,
                          *, dropout_rate: float = 0.0, rng: jax.Array | None = None,
                          bias_bnts: jax.Array | None = None) -> jax.Array:
  """softmax(q k^T / sqrt(h) + bias + mask) v, per head, [b, t, n, h], from a dense boolean
  mask and an optional additive bias [1 or b, n, t, s].

  Without attention dropout this is XLA's `jax.nn.dot_product_attention(implementation=
  "xla")`: plain XLA ops on every platform (a dense mask rules the fused kernels out; see
  the module docstring). Dropout on the weights takes `explicit_attention`.
  """
  if rng is None or dropout_rate == 0.0:
    return jax.nn.dot_product_attention(q_btnh, k_bsnh, v_bsnh, bias=bias_bnts, mask=mask_b1ts, implementation="xla")
  return explicit_attention(q_btnh, k_bsnh, v_bsnh, mask_b1ts, dropout_rate=dropout_rate, rng=rng, bias_bnts=bias_bnts)


def lengths_attention(q_btnh, k_bsnh, v_bsnh, mask: SegmentMask, *, implementation: str = "cudnn") -> jax.Array:
  """`jax.nn.dot_product_attention` given sequence lengths and `is_causal` instead of a mask
  tensor: the form cuDNN takes. Right only for unpacked rows (`mask.packed` False).
  Padding queries come out as zeros; `implementation="xla"` runs the same call anywhere."""
  q_len_b, k_len_b = mask.lengths()
  return jax.nn.dot_product_attention(q_btnh, k_bsnh, v_bsnh, query_seq_lengths=q_len_b,
                                      key_value_seq_lengths=k_len_b, is_causal=mask.causal,
                                      implementation=implementation)


def _splash_block(length: int) -> int:
  return next(b for b in (512, 256, _SPLASH_BLOCK) if length % b == 0)


def _splash_kernel(num_heads: int, t: int, s: int, causal: bool, interpret: bool):
  """The splash kernel of one example, [n, t, h] -> [n, t, h], for a static full or causal
  mask; the segment ids are given per call. Built per trace: it holds the mask's block
  tables as arrays of that trace (caching it across traces would leak tracers)."""
  bq, bkv = _splash_block(t), _splash_block(s)
  blocks = _splash.BlockSizes(block_q=bq, block_kv=bkv, block_kv_compute=bkv, block_q_dkv=bq, block_kv_dkv=bkv,
                              block_kv_dkv_compute=bkv, block_q_dq=bq, block_kv_dq=bkv)
  head_mask = _splash.CausalMask((t, s)) if causal else _splash.FullMask((t, s))
  return _splash.make_splash_mha(_splash.MultiHeadMask([head_mask] * num_heads), block_sizes=blocks,
                                 head_shards=1, q_seq_shards=1, interpret=interpret)


def splash_attention(q_btnh, k_bsnh, v_bsnh, mask: SegmentMask, *, interpret: bool = False) -> jax.Array:
  """TPU splash attention with segment ids (packed or not): a query attends to keys of its
  own segment id, so padding queries (0) attend to padding keys, or get uniform weights
  where there are none. Needs t and s multiples of 128. `interpret=True` runs the Pallas
  kernel in its interpreter (any platform, slowly: for tests). Inside
  `seq2seq.sharding.activation_mesh` (the train step) it runs in `jax.shard_map`, each
  device on its rows and heads."""
  (_, t, _, h), s = q_btnh.shape, k_bsnh.shape[1]

  def local(q_btnh, k_bsnh, v_bsnh, q_segments_bt, k_segments_bs):
    kernel = _splash_kernel(q_btnh.shape[2], t, s, mask.causal, interpret)  # this device's heads

    def one(q_tnh, k_snh, v_snh, q_segments_t, k_segments_s):
      heads_first = lambda x: jnp.swapaxes(x, 0, 1)
      q_nth = heads_first(q_tnh * jnp.asarray(h**-0.5, q_tnh.dtype))  # splash takes no scale
      out_nth = kernel(q_nth, heads_first(k_snh), heads_first(v_snh),
                       segment_ids=_splash.SegmentIds(q_segments_t, k_segments_s))
      return heads_first(out_nth)
    return jax.vmap(one)(q_btnh, k_bsnh, v_bsnh, q_segments_bt, k_segments_bs)

  return _per_device(local, (q_btnh, k_bsnh, v_bsnh), (HEADS,) * 3, mask)


def flash_attention(q_btnh, k_bsnh, v_bsnh, mask: SegmentMask, *, interpret: bool = False,
                    blocks: flash.Blocks | None = None) -> jax.Array:
  """The GPU flash kernel of `seq2seq.model.flash` (packed or not, causal or not, self or
  cross), per device inside the train step's mesh. `blocks`: its tiles; None takes
  `flash.BLOCKS` (the defaults, unless a benchmark set others)."""
  def local(q_btnh, k_bsnh, v_bsnh, q_segments_bt, k_segments_bs):
    return flash.flash_attention(q_btnh, k_bsnh, v_bsnh, q_segments_bt, k_segments_bs, mask.causal, interpret,
                                 blocks)
  return _per_device(local, (q_btnh, k_bsnh, v_bsnh), (HEADS,) * 3, mask)


def fused_flash_attention(arrays, layout: flash.Layout, mask: SegmentMask, *, q_bias_nh=None, v_bias_nh=None,
                          interpret: bool = False, blocks: flash.Blocks | None = None) -> jax.Array:
  """The flash kernel reading q, k and v in place from fused projections (`flash.Layout`:
  `flash.SELF` [b, t, n, 3, h], `flash.CROSS` [b, t, n, 1, h] and [b, s, n, 2, h]), the query
  and value biases ([n, h] or None) added as it reads them; per device as `flash_attention`.
  [b, t, n, h], padding queries zeros."""
  arrays = tuple(arrays)
  biases = {k: x for k, x in (("q_bias_nh", q_bias_nh), ("v_bias_nh", v_bias_nh)) if x is not None}

  def local(*args):
    given = dict(zip(biases, args[len(arrays):-2]))
    return flash.fused_flash_attention(args[:len(arrays)], layout, *args[-2:], **given, causal=mask.causal,
                                       interpret=interpret, blocks=blocks)

  axes = (FUSED_HEADS,) * len(arrays) + (("heads", "kv"),) * len(biases)
  return _per_device(local, arrays + tuple(biases.values()), axes, mask)


def _per_device(local, arrays, axes, mask: SegmentMask) -> jax.Array:
  """local(*arrays, q_segments, k_segments) on the whole arrays, or inside the train step's
  mesh in `jax.shard_map`, each device on its rows (data x fsdp) and heads (tensor), each
  array laid out by its logical `axes` as `constrain` lays out activations: a Pallas call
  has no SPMD partitioning rule. Returns [b, t, n, h]."""
  args = (*arrays, mask.q_segments_bt, mask.k_segments_bs)
  mesh = current_mesh()
  if mesh is None or mesh.size == 1:
    return local(*args)
  specs = [activation_spec(a, x.shape, mesh) for a, x in zip(axes, arrays)]
  spec_bt = activation_spec(("batch", "length"), mask.q_segments_bt.shape, mesh)
  spec_bs = activation_spec(("batch", "length"), mask.k_segments_bs.shape, mesh)
  q = arrays[0]  # the queries' array: [b, t, n, h], or [b, t, n, slots, h]
  out_spec = activation_spec(HEADS, (*q.shape[:3], q.shape[-1]), mesh)
  return jax.shard_map(local, mesh=mesh, in_specs=(*specs, spec_bt, spec_bs), out_specs=out_spec,
                       check_vma=False)(*args)


def _cudnn_blockers(*, platform, dtype, head_dim, packed, segments) -> list[str]:
  why = []
  if platform != "gpu":
    why.append(f"cuDNN runs on GPU only (platform is {platform})")
  if jnp.dtype(dtype) not in _CUDNN_DTYPES:
    why.append(f"cuDNN needs bfloat16 or float16 inputs (config.model.dtype), got {jnp.dtype(dtype).name}")
  if head_dim % 8 or head_dim > 128:
    why.append(f"cuDNN needs a head dim that is a multiple of 8 and at most 128, got {head_dim}")
  if not segments:
    why.append("cuDNN needs segment ids, not a dense mask")
  elif packed:
    why.append("cuDNN needs unpacked rows (one segment then padding: data.fill_rows=False, "
               "data.packing=False, and the model called with packed=False)")
  return why


def _splash_blockers(*, platform, q_len, kv_len, segments, device_count, mesh_size) -> list[str]:
  why = []
  if _splash is None:
    why.append("this JAX has no jax.experimental.pallas.ops.tpu.splash_attention")
  if platform != "tpu":
    why.append(f"splash attention runs on TPU only (platform is {platform})")
  if not segments:
    why.append("splash attention needs segment ids, not a dense mask")
  if q_len % _SPLASH_BLOCK or kv_len % _SPLASH_BLOCK:
    why.append(f"splash attention needs lengths that are multiples of {_SPLASH_BLOCK}, got {q_len} and {kv_len}")
  if device_count > 1 and mesh_size < 1:
    why.append(f"splash attention on {device_count} devices needs the mesh (seq2seq.sharding.activation_mesh) to "
               "run in jax.shard_map; a Pallas call cannot be partitioned automatically")
  return why


def choose_implementation(requested: str, *, platform: str, dtype, head_dim: int, q_len: int, kv_len: int,
                          packed: bool, segments: bool = True, dropout: bool = False, record_weights: bool = False,
                          device_count: int = 1, mesh_size: int = 0, bias: bool = False) -> str:
  """Which attention runs: "explicit", "xla", "cudnn", "flash" or "splash" (a pure function of static facts).

  `requested` is `config.model.attention_impl`; "auto" takes the first kernel that can run
  on `platform` ("cpu" / "gpu" / "tpu", as `jax.default_backend()` names them), else XLA.
  A requested kernel that cannot run raises ValueError saying why. `segments` is False for
  a bare dense mask; `dropout` means attention dropout is applied in this call; `bias` that
  an additive bias is (relative positions), which no kernel takes.
  """
  if requested not in IMPLEMENTATIONS:
    raise ConfigError(f"config.model.attention_impl must be one of {IMPLEMENTATIONS}, got {requested!r}")
  if record_weights:
    return "explicit"
  if dropout:
    if requested in ("auto", "explicit"):
      return "explicit"
    raise ConfigError(f"config.model.attention_impl={requested!r} cannot apply attention dropout "
                     "(config.model.attention_dropout_rate > 0): use 'auto' or 'explicit'")
  if requested in ("xla", "explicit"):
    return requested
  on_mesh = [] if device_count == 1 or mesh_size >= 1 else [
      f"a Pallas kernel on {device_count} devices needs the mesh (seq2seq.sharding.activation_mesh) to run in "
      "jax.shard_map; it cannot be partitioned automatically"]
  no_bias = ["it takes no additive attention bias, which config.model.positions='relative' adds: use 'auto', "
             "'xla' or 'explicit'"] if bias else []
  blockers = {
      "cudnn": no_bias + _cudnn_blockers(platform=platform, dtype=dtype, head_dim=head_dim, packed=packed,
                                         segments=segments),
      "flash": no_bias + flash.blockers(platform=platform, dtype=dtype, head_dim=head_dim, q_len=q_len, kv_len=kv_len,
                                        segments=segments) + on_mesh,
      "splash": no_bias + _splash_blockers(platform=platform, q_len=q_len, kv_len=kv_len, segments=segments,
                                           device_count=device_count, mesh_size=mesh_size),
  }
  if requested != "auto":
    if blockers[requested]:
      raise ConfigError(f"config.model.attention_impl={requested!r} cannot run here: "
                       + "; ".join(blockers[requested]))
    return requested
  return next((kernel for kernel in ("cudnn", "flash", "splash") if not blockers[kernel]), "xla")


def _zero_padding_queries(out_btnh: jax.Array, mask) -> jax.Array:
  if not isinstance(mask, SegmentMask):
    return out_btnh
  return jnp.where((mask.q_segments_bt != 0)[:, :, None, None], out_btnh, jnp.zeros_like(out_btnh))


def implementation(impl: str, *, dtype, head_dim: int, q_len: int, kv_len: int, mask: SegmentMask | jax.Array,
                   dropout: bool = False, bias: bool = False, layout: flash.Layout = flash.SEPARATE) -> str:
  """What `attention` runs for these static facts, at trace time: `choose_implementation` on the
  platform of the step's devices (the activation mesh's, which an ahead-of-time compile may
  target without having them; else JAX's default backend), then, for "flash", whether the
  kernel compiles with its current tiles in `layout` there (if not: "xla" with a warning, or a
  ConfigError when "flash" was asked for)."""
  segments = isinstance(mask, SegmentMask)
  mesh = current_mesh()
  device = kernel_device(mesh)
  choice = choose_implementation(impl, platform=jax.default_backend() if device is None else device.platform,
                                 dtype=dtype, head_dim=head_dim, q_len=q_len, kv_len=kv_len,
                                 packed=not segments or mask.packed, segments=segments, dropout=dropout,
                                 device_count=jax.device_count(), mesh_size=0 if mesh is None else mesh.size,
                                 bias=bias)
  if choice == "flash":
    problem = flash.compiles(jnp.dtype(dtype).name, head_dim, flash.BLOCKS, device, layout)
    if problem and impl == "flash":
      raise ConfigError(f"config.model.attention_impl='flash' does not compile on this GPU: {problem}")
    if problem:
      _warn_once(f"the flash attention kernel does not compile on this GPU ({problem}); using XLA")
      return "xla"
  return choice


def attention(q_btnh: jax.Array, k_bsnh: jax.Array, v_bsnh: jax.Array, mask: SegmentMask | jax.Array, *,
              impl: str = "auto", dropout_rate: float = 0.0, rng: jax.Array | None = None,
              bias_bnts: jax.Array | None = None) -> jax.Array:
  """softmax(q k^T / sqrt(h) + bias + mask) v per head, [b, t, n, h], by the implementation
  `choose_implementation` picks (see the module docstring). `mask` is a `SegmentMask`, or a
  dense boolean [b, 1, t, s] mask (then only "xla" / "explicit" can run); `bias_bnts` an
  additive bias [1 or b, n, t, s] (then too)."""
  (_, t, _, h), s = q_btnh.shape, k_bsnh.shape[1]
  dense_b1ts = mask.dense_b1ts if isinstance(mask, SegmentMask) else lambda: mask
  choice = implementation(impl, dtype=q_btnh.dtype, head_dim=h, q_len=t, kv_len=s, mask=mask,
                          dropout=rng is not None and dropout_rate > 0.0, bias=bias_bnts is not None)
  if choice == "explicit":
    out_btnh = explicit_attention(q_btnh, k_bsnh, v_bsnh, dense_b1ts(), dropout_rate=dropout_rate, rng=rng,
                                  bias_bnts=bias_bnts)
  elif choice == "cudnn":
    try:
      out_btnh = lengths_attention(q_btnh, k_bsnh, v_bsnh, mask, implementation="cudnn")
    except (NotImplementedError, RuntimeError) as err:  # raised while tracing: no cuDNN, unsupported GPU
      if impl == "cudnn":
        raise
      _warn_once(f"cuDNN attention unavailable ({err}); using XLA")
      out_btnh = dot_product_attention(q_btnh, k_bsnh, v_bsnh, dense_b1ts())
  elif choice == "flash":
    return flash_attention(q_btnh, k_bsnh, v_bsnh, mask)  # padding queries already zeros
  elif choice == "splash":
    out_btnh = splash_attention(q_btnh, k_bsnh, v_bsnh, mask)
  else:
    out_btnh = dot_product_attention(q_btnh, k_bsnh, v_bsnh, dense_b1ts(), bias_bnts=bias_bnts)
  return _zero_padding_queries(out_btnh, mask)


def single_query_attention(q_bnh: jax.Array, k_cnsh: jax.Array, v_cnsh: jax.Array, mask_cns: jax.Array,
                           bias_ns: jax.Array | None = None) -> jax.Array:
  """Attention of one query per row over cached keys/values stored heads-first ([c, n, s, h]):
  the layout a batched product reads without transposing the cache. The b = c * g query
  rows may share keys in groups of g consecutive rows (the beams of one sentence share its
  cross-attention keys), so shared keys are read once per group. `bias_ns`: an additive
  bias [n, s] of every row (the rows of a decoding step share their query position), or
  None. Returns [b, n, h]."""
  (b, n, h), c = q_bnh.shape, k_cnsh.shape[0]
  q_cgnh = q_bnh.reshape(c, b // c, n, h)
  softmax_dtype = jnp.promote_types(q_bnh.dtype, jnp.float32)
  logits_cgns = jnp.einsum("cgnh,cnsh->cgns", q_cgnh, k_cnsh, preferred_element_type=softmax_dtype) * h ** -0.5
  if bias_ns is not None:
    logits_cgns = logits_cgns + bias_ns.astype(softmax_dtype)
  logits_cgns = jnp.where(mask_cns[:, None], logits_cgns, jnp.finfo(softmax_dtype).min)
  weights_cgns = jax.nn.softmax(logits_cgns, axis=-1).astype(v_cnsh.dtype)
  return jnp.einsum("cgns,cnsh->cgnh", weights_cgns, v_cnsh).reshape(b, n, h)
