"""Dry run: will this config fit, and how fast should it go, on a given mesh? No data, no
training: the real train step is compiled ahead of time (`jax.jit(...).lower(...).compile()`)
for the configured mesh on abstract arrays, and XLA's memory and cost analyses are read.

  python train.py --config=configs/wmt14_big.py --workdir=/tmp/plan --dry_run \
      --config.mesh.fsdp=8 --config.model.dtype=bfloat16 --device_memory_gib=80 --peak_tflops=989

On a machine without the mesh's devices (a laptop), the CPU stands in with as many fake
devices as the mesh needs (`--dry_run_devices`, default 8). The memory figures are then
XLA:CPU's buffer assignment for the same partitioned program: parameters and optimizer state
are exact, temporaries are an estimate of what a GPU/TPU compile would need (different
fusions and layouts).
"""

from __future__ import annotations

import dataclasses
import json
import math

import jax
import jax.numpy as jnp
import numpy as np

from seq2seq.errors import ConfigError

GIB = 2**30


@dataclasses.dataclass
class Plan:
  mesh: dict
  devices: int
  platform: str
  dtype: str
  params: int
  batch_shapes: list  # (rows, source length, target length) of each shape the run compiles
  compiled_shape: tuple  # the one compiled here: the longest rows (the most activation memory)
  param_bytes: int  # per device
  opt_state_bytes: int  # per device
  argument_bytes: int  # per device: state + batch (memory_analysis)
  temp_bytes: int  # per device: activations and other temporaries (memory_analysis)
  output_bytes: int
  alias_bytes: int  # outputs that reuse donated arguments
  flops_xla: float  # per device per step (cost_analysis of the partitioned program)
  flops_model: float  # per device per step (seq2seq.model.flops: matmuls only, 2 per multiply-add)
  target_tokens: int  # per step (all devices), the compiled shape's target slots
  peak_tflops: float = 0.0  # per device
  mfu: float = 0.0

  @property
  def total_bytes(self) -> int:
    """Per-device peak: arguments, temporaries and the outputs that do not reuse arguments."""
    return self.argument_bytes + self.temp_bytes + max(self.output_bytes - self.alias_bytes, 0)

  @property
  def step_seconds(self) -> float:
    return self.flops_model / (self.peak_tflops * 1e12 * self.mfu) if self.peak_tflops and self.mfu else 0.0

  def summary(self) -> dict:
    out = dataclasses.asdict(self) | {"total_bytes": self.total_bytes, "total_gib": self.total_bytes / GIB}
    if self.step_seconds:
      out |= {"step_seconds": self.step_seconds, "target_tokens_per_s": self.target_tokens / self.step_seconds}
    return out


def shard_bytes(tree) -> int:
  """Bytes one device holds of a tree of sharded ShapeDtypeStructs (the largest shard)."""
  total = 0
  for x in jax.tree.leaves(tree):
    shape = x.sharding.shard_shape(x.shape) if getattr(x, "sharding", None) is not None else x.shape
    total += math.prod(shape) * jnp.dtype(x.dtype).itemsize
  return total


def batch_shapes(config) -> list[tuple[int, int, int]]:
  """The (rows, S, T) the run will compile, from the config alone: equal source and target
  token counts are assumed (with a tokenized corpus the shorter side's rows are shorter)."""
  from seq2seq import data

  cfg = data.batching_config(config)
  longest = (cfg.max_len, cfg.max_len) if not cfg.packing else (cfg.lengths()[0],) * 2
  return cfg.shapes(np.ones(1), np.ones(1), longest=longest)


def devices_for(count: int) -> list:
  """`count` devices of the default platform, else as many fake CPU devices (which needs
  `use_fake_cpu_devices` before JAX starts its backends)."""
  if len(jax.devices()) >= count:
    return jax.devices()[:count]
  cpu = jax.devices("cpu")
  if len(cpu) < count:
    raise ConfigError(f"the dry run needs {count} devices; {jax.default_backend()} has {len(jax.devices())} and the "
                     f"CPU {len(cpu)} (set --dry_run_devices, or start the process with use_fake_cpu_devices)")
  return cpu[:count]


def use_fake_cpu_devices(count: int) -> None:
  """Gives the CPU backend `count` devices; call before anything touches a JAX device."""
  jax.config.update("jax_num_cpu_devices", count)


def mesh_devices(mesh_cfg, default: int = 8) -> int:
  """How many devices the configured mesh names: the product of its sizes, or `default` when
  one size is -1 (the rest of the devices)."""
  sizes = [int(mesh_cfg[a]) for a in ("data", "fsdp", "tensor")]
  return default if -1 in sizes else math.prod(sizes)


@dataclasses.dataclass
class CompiledStep:
  """The train step compiled ahead of time (`compile_step`)."""

  compiled: object  # jax.stages.Compiled
  model_cfg: object  # ModelConfig
  mesh: object  # Mesh
  state: object  # the abstract train state
  shardings: object  # the state's
  batch: dict  # abstract batch arrays, with their sharding
  shape: tuple  # (rows, source length, target length)
  shapes: list  # every batch shape the config's run compiles

  def recompile(self, config):
    """The same step compiled again (a new jit: trace-time settings such as
    `loss.unrolled_chunks` apply)."""
    from seq2seq.model import transformer
    from seq2seq.training import optimizer, train
    from seq2seq.training.config import TrainConfig

    tx, schedule = optimizer.make(TrainConfig.from_config(config.train), d_model=self.model_cfg.d_model)
    steps = train.Steps(config, transformer.graphdef(self.model_cfg), self.shardings, self.mesh, tx, schedule)
    return steps.train.lower(self.state, self.batch, False).compile()


def compile_step(config, devices=None, shape: tuple | None = None) -> CompiledStep:
  """The train step of `config` compiled for its mesh over `devices` (default: this host's),
  on abstract arrays, at `shape` (rows, source length, target length; default the longest
  batch shape the run compiles). Allocates nothing on the devices, which may be compile-only
  ones (`jax.experimental.topologies`: a GPU or TPU target on a machine without one)."""
  from seq2seq import sharding
  from seq2seq.model import transformer
  from seq2seq.model.config import ModelConfig
  from seq2seq.training import optimizer, train
  from seq2seq.training.config import TrainConfig
  from seq2seq.training.state import abstract_state

  mesh = sharding.make_mesh(config.mesh, devices)
  model_cfg = ModelConfig.from_config(config.model, vocab_size=config.data.vocab_size)
  tx, schedule = optimizer.make(TrainConfig.from_config(config.train), d_model=model_cfg.d_model)
  state, shardings = abstract_state(model_cfg, tx, mesh, config.seed)
  steps = train.Steps(config, transformer.graphdef(model_cfg), shardings, mesh, tx, schedule)
  shapes = batch_shapes(config)
  rows, s, t = shape or max(shapes, key=lambda x: (max(x[1], x[2]), x[0]))
  batch_sh = sharding.batch_sharding(mesh)
  batch = {k: jax.ShapeDtypeStruct((rows, s if k.startswith("src") else t), jnp.int32, sharding=batch_sh)
           for k in train.BATCH_KEYS}
  compiled = steps.train.lower(state, batch, False).compile()
  return CompiledStep(compiled, model_cfg, mesh, state, shardings, batch, (rows, s, t), shapes)


def dry_run(config, devices=None, *, peak_tflops: float = 0.0, mfu: float = 0.0) -> Plan:
  """Compiles the train step of `config` on its mesh for the longest batch shape and reads
  XLA's memory and cost analyses. Allocates nothing on the devices."""
  from seq2seq.model import flops, transformer
  from seq2seq.training import loss

  step = compile_step(config, devices)
  compiled, model_cfg, mesh, state, shapes, (rows, s, t) = (step.compiled, step.model_cfg, step.mesh, step.state,
                                                            step.shapes, step.shape)
  memory = compiled.memory_analysis()
  if config.train.loss_chunk:  # XLA counts a loop's body once: FLOPs from the chunk loop unrolled
    with loss.unrolled_chunks():
      cost = step.recompile(config).cost_analysis()
  else:
    cost = compiled.cost_analysis()
  cost = cost[0] if isinstance(cost, list) else cost  # older JAX: one dict per program
  return Plan(mesh=dict(mesh.shape), devices=mesh.size, platform=mesh.devices.flat[0].platform, dtype=model_cfg.dtype,
              params=transformer.count_params(model_cfg), batch_shapes=[tuple(x) for x in shapes],
              compiled_shape=(rows, s, t), param_bytes=shard_bytes(state.params),
              opt_state_bytes=shard_bytes(state.opt_state), argument_bytes=int(memory.argument_size_in_bytes),
              temp_bytes=int(memory.temp_size_in_bytes), output_bytes=int(memory.output_size_in_bytes),
              alias_bytes=int(memory.alias_size_in_bytes), flops_xla=float(cost.get("flops", 0.0)),
              flops_model=flops.train_step_flops(model_cfg, rows, s, t) / mesh.size, target_tokens=rows * t,
              peak_tflops=peak_tflops, mfu=mfu)


def report(plan: Plan, device_memory_gib: float = 0.0) -> str:
  """The plan as lines of text for a person."""
  gib = lambda n: f"{n / GIB:.2f} GiB"
  mesh = " x ".join(f"{k}={v}" for k, v in plan.mesh.items())
  lines = [
      f"dry run: {plan.params / 1e6:.1f}M parameters, {plan.dtype} compute, mesh {mesh} ({plan.devices} "
      f"{plan.platform} devices)",
      "batch shapes (rows, source, target): " + ", ".join(f"{r}x{s}x{t}" for r, s, t in plan.batch_shapes)
      + f"; compiled: {'x'.join(map(str, plan.compiled_shape))}",
      f"per device: parameters {gib(plan.param_bytes)}, optimizer state {gib(plan.opt_state_bytes)}, "
      f"arguments {gib(plan.argument_bytes)}, temporaries {gib(plan.temp_bytes)}, total {gib(plan.total_bytes)}",
      f"FLOPs per step per device: {plan.flops_xla:.3e} (XLA cost analysis), {plan.flops_model:.3e} (model formula, "
      "matmuls only)",
  ]
  if plan.step_seconds:
    lines.append(f"predicted at {plan.peak_tflops:g} TFLOP/s per device and {plan.mfu:.0%} MFU: "
                 f"{plan.step_seconds * 1e3:.0f} ms per step, {plan.target_tokens / plan.step_seconds:,.0f} target "
                 "tokens/s")
  if device_memory_gib:
    verdict = "fits" if fits(plan, device_memory_gib) else "DOES NOT FIT"
    lines.append(f"{verdict} in {device_memory_gib:g} GiB per device ({plan.total_bytes / GIB / device_memory_gib:.0%})")
  return "\n".join(lines)


def fits(plan: Plan, device_memory_gib: float) -> bool:
  return plan.total_bytes <= device_memory_gib * GIB


def advice(plan: Plan, device_memory_gib: float) -> str:
  return (f"config does not fit: {plan.total_bytes / GIB:.2f} GiB per device needed, {device_memory_gib:g} GiB "
          "available. Shard parameters and optimizer state (--config.mesh.fsdp=N), compute in bfloat16 "
          "(--config.model.dtype=bfloat16), or lower --config.data.max_tokens and raise --config.train.accum_steps "
          "to keep the tokens per update")


def to_json(plan: Plan) -> str:
  return json.dumps(plan.summary(), default=list)
