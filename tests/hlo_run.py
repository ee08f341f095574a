"""Helper for test_sharding.py, run in a subprocess with 8 fake CPU devices: compiles the
train step ahead of time for the meshes named on the command line and prints, per mesh, the
collectives of the compiled HLO with their result shapes, plus the model's sizes, as JSON.
XLA's warnings (e.g. "Involuntary full rematerialization") go to this process's stderr.

  python tests/hlo_run.py 8,1,1 1,8,1 2,2,2 1,2,4
"""

import os

if __name__ == "__main__":
  os.environ["XLA_FLAGS"] = os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"

import json  # noqa: E402
import re  # noqa: E402
import sys  # noqa: E402

sys.path[:0] = [os.path.dirname(os.path.dirname(os.path.abspath(__file__)))]

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
from seq2seq.configs import default  # noqa: E402
from flax import nnx  # noqa: E402

from seq2seq import sharding  # noqa: E402
from seq2seq.model import transformer  # noqa: E402
from seq2seq.model.config import ModelConfig  # noqa: E402
from seq2seq.training import optimizer  # noqa: E402
from seq2seq.training.state import abstract_state  # noqa: E402
from seq2seq.training.train import BATCH_KEYS, Steps  # noqa: E402

# Sizes chosen so that shapes tell tensors apart: tokens per batch (16 x 20 = 320) and per
# device (160, 80, 40) differ from every parameter dimension, also as a device holds it (a
# fused q/k/v weight of 4 of 8 heads has 4 x 3 x 8 = 96 outputs); every sharded dimension
# divides by 8.
MODEL = dict(vocab_size=1024, d_model=64, num_heads=8, num_encoder_layers=2, num_decoder_layers=3, d_ff=256,
             dropout_rate=0.1)
ROWS, LENGTH = 16, 20
COLLECTIVE = re.compile(r"= (\(.*?\)|\S+) (all-reduce|all-gather|reduce-scatter|all-to-all|collective-permute)"
                        r"(?:-start)?\(")
SHAPE = re.compile(r"(f32|bf16|s32|u32|pred)\[([\d,]*)\]")


def collectives(hlo: str) -> list[dict]:
  """Each collective of the compiled program: its kind and the shapes it produces."""
  out = []
  for line in hlo.splitlines():
    m = COLLECTIVE.search(line)
    if m:
      shapes = [[int(d) for d in dims.split(",") if d] for _, dims in SHAPE.findall(m.group(1))]
      out.append({"kind": m.group(2), "shapes": shapes})
  return out


def compile_step(mesh_shape):
  mesh = sharding.make_mesh(dict(zip(sharding.MESH_AXES, mesh_shape)))
  config = default.get_config()
  config.train.update(label_smoothing=0.1, schedule="rsqrt", learning_rate=1.0, warmup_steps=4, steps=5, adam_b1=0.9,
                      adam_b2=0.98, adam_eps=1e-9, weight_decay=0.0, grad_clip_norm=0.0, accum_steps=1,
                      rng_impl="threefry2x32")
  model_cfg = ModelConfig(**MODEL)
  tx, schedule = optimizer.make(config.train, d_model=model_cfg.d_model)
  state, shardings = abstract_state(model_cfg, tx, mesh, config.seed)
  steps = Steps(config, transformer.graphdef(model_cfg), shardings, mesh, tx, schedule)
  batch_sh = sharding.batch_sharding(mesh)
  batch = {k: jax.ShapeDtypeStruct((ROWS, LENGTH), jnp.int32, sharding=batch_sh) for k in BATCH_KEYS}
  return steps.train.lower(state, batch, False).compile().as_text()


if __name__ == "__main__":
  model = transformer.abstract(ModelConfig(**MODEL))
  shapes = [list(x.shape) for x in jax.tree.leaves(nnx.state(model, nnx.Param))]
  result = {"model": MODEL, "rows": ROWS, "length": LENGTH, "param_shapes": shapes, "meshes": {}}
  for arg in sys.argv[1:]:
    mesh_shape = tuple(int(x) for x in arg.split(","))
    result["meshes"][arg] = collectives(compile_step(mesh_shape))
    print(f"compiled {arg}", file=sys.stderr, flush=True)
  print(json.dumps(result))
