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
  backward  one kernel per query block accumulates dQ over the key blocks, first computing
            delta = rowsum(dO * O) of its queries, which it writes for the next: one kernel
            per key block accumulates dK and dV over the query blocks. The first also writes
            its block's sums of dq and of dO over live queries (a live query's weights sum to
            1), which XLA adds up into the query's and the value's bias gradients.

Each program visits only the other side's blocks that hold one of its block's segments
(`flash_kernels._segment_span`: packed rows keep their pairs in order, so a block of queries
meets the few key blocks of its pairs, not the row; on WMT-like packed rows of 256 the kernels
do 40% of the work of visiting every block, benchmarks/flash_blocks.py), and causal attention
also skips the key blocks after the query block (and query blocks before the key block). A padding query (segment 0), and a query with no key of its segment, attends to
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

import jax
import jax.numpy as jnp

from seq2seq.compilation import compile_problem
from seq2seq.model import flash_kernels as kernels
from seq2seq.model.flash_kernels import plgpu

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
# The dQ kernel computes delta = rowsum(dO * O) and sums dq and dO over its blocks for the
# biases' gradients; False: XLA computes delta and the gradients from the arrays, in passes of
# their own, as before (device_check's variant `flash_sums_apart`). Read when a call is traced.
SUMS_IN_KERNELS = True


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


@functools.partial(jax.custom_vjp, nondiff_argnums=(5, 6, 7, 8, 9))
def _flash(arrays, q_bias, v_bias, q_seg, k_seg, layout: Layout, causal: bool, interpret: bool, blocks: Blocks,
           sums: bool):
  return kernels.forward(arrays, q_bias, v_bias, q_seg, k_seg, layout, causal, interpret, blocks)[0]


def _flash_fwd(arrays, q_bias, v_bias, q_seg, k_seg, layout, causal, interpret, blocks, sums):
  out, lse = kernels.forward(arrays, q_bias, v_bias, q_seg, k_seg, layout, causal, interpret, blocks)
  return out, (arrays, q_bias, v_bias, q_seg, k_seg, out, lse)


_flash.defvjp(_flash_fwd, kernels.backward)


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
                BLOCKS if blocks is None else blocks, SUMS_IN_KERNELS)


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
  placed = {} if device is None else {"sharding": jax.sharding.make_single_device_sharding(device)}
  slots = collections.Counter(array for array, _ in (layout.q, layout.k, layout.v))  # of each array
  arrays = [jax.ShapeDtypeStruct((1, length, 1, slots[n], head_dim), jnp.dtype(dtype_name), **placed)
            for n in sorted(slots)]
  bias = jax.ShapeDtypeStruct((1, head_dim), jnp.dtype(dtype_name), **placed)
  segments = jax.ShapeDtypeStruct((1, length), jnp.int32, **placed)

  def loss(arrays, q_bias, v_bias, q_seg, k_seg):
    out = fused_flash_attention(arrays, layout, q_seg, k_seg, q_bias_nh=q_bias, v_bias_nh=v_bias, causal=True,
                                blocks=blocks)
    return jnp.sum(out.astype(jnp.float32))

  return compile_problem(jax.grad(loss, argnums=(0, 1, 2)), arrays, bias, bias, segments, segments)
