"""The device mesh and how arrays are laid out on it.

Model code names parameter axes (`vocab`, `embed`, `heads`, `kv`, `mlp`); the rules below
map those names onto mesh axes `data`, `fsdp`, `tensor`. Batches are split over
`data` x `fsdp` along their first axis. A dimension a mesh axis does not divide is left
unsharded, so any mesh works with any model (the same program on 1 CPU, 8 fake CPU
devices, a GPU box or a TPU slice).
"""

from __future__ import annotations

import contextlib
import hashlib
import contextvars
import functools
import math

import jax
import numpy as np
from flax import nnx
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from seq2seq.errors import ConfigError, DataError

MESH_AXES = ("data", "fsdp", "tensor")
BATCH_AXES = ("data", "fsdp")
# logical parameter axis -> mesh axis (None: replicated)
RULES = {
    "vocab": "tensor",
    "embed": "fsdp",
    "heads": "tensor",
    "mlp": "tensor",
    "kv": None,
    None: None,
}
# logical activation axis -> mesh axes. Activations are split over the batch on data x fsdp
# (fsdp gathers parameters, not activations) and over heads / mlp / vocab on tensor
# (Megatron: the embed dimension of the residual stream stays whole on every device).
ACTIVATION_RULES = {
    "batch": BATCH_AXES,
    "length": None,
    "embed": None,
    "heads": "tensor",
    "kv": None,
    "mlp": "tensor",
    "vocab": "tensor",
    None: None,
}
_ACTIVATION_MESH: contextvars.ContextVar[Mesh | None] = contextvars.ContextVar("activation_mesh", default=None)


def mesh_shape(mesh_cfg, device_count: int) -> tuple[int, int, int]:
  """Sizes of (data, fsdp, tensor); one of them may be -1, meaning the remaining devices."""
  sizes = [int(mesh_cfg[a]) for a in MESH_AXES]
  if sizes.count(-1) > 1:
    raise ConfigError(f"at most one of config.mesh.{{data,fsdp,tensor}} may be -1, got {dict(zip(MESH_AXES, sizes))}")
  known = math.prod(s for s in sizes if s != -1)
  if -1 in sizes:
    if known <= 0 or device_count % known:
      raise ConfigError(f"config.mesh {dict(zip(MESH_AXES, sizes))} does not divide {device_count} devices")
    sizes[sizes.index(-1)] = device_count // known
  if math.prod(sizes) != device_count:
    raise ConfigError(f"config.mesh {dict(zip(MESH_AXES, sizes))} needs {math.prod(sizes)} devices, "
                     f"but {device_count} are available")
  return tuple(sizes)


def initialize_distributed(coordinator_address: str, num_processes: int = 0, process_id: int = -1) -> None:
  """Joins a multi-host run before any device is used; one process per host (or per GPU).

  `coordinator_address` is "" (a single process: nothing to do), "auto" (let JAX detect the
  cluster: Cloud TPU, SLURM, Open MPI, Kubernetes) or "HOST:PORT" of process 0, with
  `num_processes` and `process_id`. CPU processes exchange data over gloo.
  """
  if not coordinator_address:
    return
  explicit = coordinator_address != "auto"
  if explicit and (num_processes < 1 or not 0 <= process_id < num_processes):
    raise ConfigError(f"--coordinator_address={coordinator_address} needs --num_processes >= 1 and "
                     f"0 <= --process_id < num_processes, got {num_processes} and {process_id}")
  jax.config.update("jax_cpu_collectives_implementation", "gloo")  # CPU only; other platforms ignore it
  if explicit:
    jax.distributed.initialize(coordinator_address, num_processes=num_processes, process_id=process_id)
  else:
    jax.distributed.initialize()


def check_same_on_every_process(values: dict[str, bytes], fix: str) -> None:
  """Raises DataError naming the first of `values` (what it is -> its bytes) that is not the
  same on every process. Hosts that each train a sentencepiece model and tokenize the corpus
  (no shared cache) would otherwise train one model on different token ids, silently."""
  if jax.process_count() == 1:
    return
  from jax.experimental import multihost_utils

  words = [np.frombuffer(hashlib.sha256(v).digest(), np.int32) for v in values.values()]
  every = np.asarray(multihost_utils.process_allgather(np.stack(words)))  # [processes, values, 8]
  for i, what in enumerate(values):
    if other := next((p for p in range(len(every)) if not np.array_equal(every[p, i], every[0, i])), None):
      digest = lambda p: every[p, i].tobytes().hex()[:12]  # noqa: E731
      raise DataError(f"the processes have different {what}: sha256 {digest(0)}... on process 0, {digest(other)}... "
                      f"on process {other}; {fix}")


def make_mesh(mesh_cfg, devices=None) -> Mesh:
  devices = jax.devices() if devices is None else devices
  shape = mesh_shape(mesh_cfg, len(devices))
  auto = (jax.sharding.AxisType.Auto,) * len(MESH_AXES)  # shardings propagate; model code names no devices
  return jax.make_mesh(shape, MESH_AXES, axis_types=auto, devices=devices)


def spec_for(axes, shape, mesh: Mesh) -> PartitionSpec:
  """PartitionSpec of one parameter from its logical axes, skipping axes that do not divide."""
  used, out = set(), []
  for name, dim in zip(axes, shape):
    mesh_axis = RULES.get(name, None)
    if mesh_axis is None or mesh_axis in used or dim % mesh.shape[mesh_axis]:
      out.append(None)
    else:
      used.add(mesh_axis)
      out.append(mesh_axis)
  return PartitionSpec(*out)


@contextlib.contextmanager
def activation_mesh(mesh: Mesh | None):
  """Within this block (at trace time) `constrain` lays activations out on `mesh`."""
  token = _ACTIVATION_MESH.set(mesh)
  try:
    yield
  finally:
    _ACTIVATION_MESH.reset(token)


def current_mesh() -> Mesh | None:
  """The mesh of the enclosing `activation_mesh`, or None."""
  return _ACTIVATION_MESH.get()


def kernel_device(mesh: Mesh | None):
  """The device a kernel is checked for at trace time (None: JAX's default): the first of the
  activation mesh's devices that this process holds (on many hosts the mesh's first device is
  another process's), else its first."""
  if mesh is None:
    return None
  return next((d for d in mesh.devices.flat if d.process_index == jax.process_index()), mesh.devices.flat[0])


def with_activation_mesh(fn, mesh: Mesh):
  """`fn` traced with `activation_mesh(mesh)`: what `jax.jit` of a model function takes."""
  @functools.wraps(fn)
  def traced(*args, **kwargs):
    with activation_mesh(mesh):
      return fn(*args, **kwargs)
  inner = fn.func if isinstance(fn, functools.partial) else fn
  traced.__name__ = traced.__qualname__ = getattr(inner, "__name__", "traced")  # jit names the program after it
  return traced


def activation_spec(axes, shape, mesh: Mesh) -> PartitionSpec:
  """PartitionSpec of an activation from its logical axes; a mesh axis that does not divide
  its dimension (or is already used, or has size 1) is left out."""
  used, out = set(), []
  for name, dim in zip(axes, shape):
    wanted = ACTIVATION_RULES[name]
    wanted = (wanted,) if isinstance(wanted, str) else (wanted or ())
    kept = tuple(a for a in wanted if a not in used and mesh.shape[a] > 1)
    if kept and dim % math.prod(mesh.shape[a] for a in kept) == 0:
      used.update(kept)
      out.append(kept[0] if len(kept) == 1 else kept)
    else:
      out.append(None)
  return PartitionSpec(*out)


def constrain(x: jax.Array, axes) -> jax.Array:
  """`x` laid out by its logical `axes` (one name per dimension, see ACTIVATION_RULES) on the
  mesh of the enclosing `activation_mesh`; unchanged outside one or on a single device."""
  mesh = _ACTIVATION_MESH.get()
  if mesh is None or mesh.size == 1:
    return x
  if len(axes) != x.ndim:
    raise ValueError(f"logical axes {axes} do not match an activation of shape {x.shape}")
  return jax.lax.with_sharding_constraint(x, NamedSharding(mesh, activation_spec(axes, x.shape, mesh)))


def state_shardings(state, mesh: Mesh):
  """A tree of NamedShardings for an (abstract) nnx.State: params by their `axes`, the rest replicated."""
  def one(x):
    if isinstance(x, nnx.Variable):
      axes = x.get_metadata().get("axes")
      shape = x.shape if hasattr(x, "shape") else np.shape(x[...])
      spec = spec_for(axes, shape, mesh) if axes is not None else PartitionSpec()
      return NamedSharding(mesh, spec)
    return NamedSharding(mesh, PartitionSpec())
  return jax.tree.map(one, state, is_leaf=lambda x: isinstance(x, nnx.Variable))


def init_on_mesh(init, mesh: Mesh):
  """(values, shardings) of `init()`: its outputs are created directly in their shardings on
  `mesh` (no full copy on one device first); `init` takes no arguments and returns nnx state."""
  shardings = state_shardings(jax.eval_shape(init), mesh)
  return jax.jit(init, out_shardings=shardings)(), shardings


def batch_sharding(mesh: Mesh) -> NamedSharding:
  return NamedSharding(mesh, PartitionSpec(BATCH_AXES))


def data_parallel_size(mesh: Mesh) -> int:
  return mesh.shape["data"] * mesh.shape["fsdp"]


def put_batch(local_batch: dict[str, np.ndarray], mesh: Mesh) -> dict[str, jax.Array]:
  """Global arrays from this process's rows (multi-host: every process passes its own share)."""
  sharding = batch_sharding(mesh)
  return {k: jax.make_array_from_process_local_data(sharding, v) for k, v in local_batch.items()}
