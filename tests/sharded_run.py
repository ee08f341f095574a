"""Helper for test_train.py, run in a subprocess with 8 fake CPU devices: trains a small
model for 5 steps on several meshes and prints losses and parameter specs as JSON."""

import os

if __name__ == "__main__":
  os.environ["XLA_FLAGS"] = os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"

import json  # noqa: E402
import sys  # noqa: E402

import jax  # noqa: E402
from seq2seq.configs import default  # noqa: E402
import numpy as np  # noqa: E402

from seq2seq import sharding  # noqa: E402
from seq2seq.model.config import ModelConfig  # noqa: E402
from seq2seq.training import optimizer  # noqa: E402
from seq2seq.training.train import Steps, init_state  # noqa: E402


def batches(n, rows=16, s=12, t=10, vocab=64):
  rng = np.random.default_rng(0)
  out = []
  for _ in range(n):
    src = rng.integers(3, vocab, (rows, s)).astype(np.int32)
    tgt = rng.integers(3, vocab, (rows, t)).astype(np.int32)
    src[::3, -4:] = 0  # some padding
    tgt[::4, -3:] = 0
    seg_s, seg_t = (src > 0).astype(np.int32), (tgt > 0).astype(np.int32)
    tgt_in = np.concatenate([np.ones((rows, 1), np.int32), tgt[:, :-1]], 1) * seg_t
    pos = lambda x: np.broadcast_to(np.arange(x.shape[1], dtype=np.int32), x.shape).copy()
    out.append({"src_bs": src, "src_segments_bs": seg_s, "src_positions_bs": pos(src), "tgt_in_bt": tgt_in,
                "tgt_out_bt": tgt, "tgt_segments_bt": seg_t, "tgt_positions_bt": pos(tgt)})
  return out


def setup(mesh):
  config = default.get_config()
  config.train.update(label_smoothing=0.1, schedule="warmup_linear", learning_rate=1e-2, warmup_steps=2, steps=5,
                      adam_b1=0.9, adam_b2=0.98, adam_eps=1e-9, weight_decay=0.01, grad_clip_norm=1.0,
                      end_lr_fraction=0.0, accum_steps=1, rng_impl="threefry2x32")
  model_cfg = ModelConfig(vocab_size=64, d_model=32, num_heads=4, num_encoder_layers=2, num_decoder_layers=2,
                          d_ff=64, dropout_rate=0.1, share_embeddings=False, tie_output=False)
  tx, lr = optimizer.make(config.train, d_model=model_cfg.d_model)
  graphdef, state, shardings = init_state(model_cfg, tx, mesh, config.seed)
  return Steps(config, graphdef, shardings, mesh, tx, lr), state


def run_steps(mesh, local_batches):
  """Losses of 5 steps; each batch holds this process's rows only."""
  steps, state = setup(mesh)
  losses = []
  for b in local_batches:
    state, m = steps.update(state, [sharding.put_batch(b, mesh)])
    losses.append(float(m["loss_sum"] / m["tokens"]))
  return losses


def run(mesh_shape):
  devices = jax.devices()[:int(np.prod(mesh_shape))]
  mesh = sharding.make_mesh(dict(zip(sharding.MESH_AXES, mesh_shape)), devices)
  steps, state = setup(mesh)
  losses = []
  for b in batches(5):
    state, m = steps.update(state, [sharding.put_batch(b, mesh)])
    losses.append(float(m["loss_sum"] / m["tokens"]))
  specs = {jax.tree_util.keystr(path).removesuffix(".value"): str(tuple(leaf.sharding.spec))
           for path, leaf in jax.tree_util.tree_leaves_with_path(state.params)}
  expected = {jax.tree_util.keystr(path): str(tuple(sharding.spec_for(v.get_metadata()["axes"], v.shape, mesh)))
              for path, v in jax.tree_util.tree_leaves_with_path(
                  state.params, is_leaf=lambda x: hasattr(x, "get_metadata"))}
  wi = state.params["encoder_layers"][0]["ffn"]["wi_df"][...]
  return {"losses": losses, "specs": specs, "expected_specs": expected,
          "wi_df_shard_shape": list(wi.addressable_shards[0].data.shape)}


if __name__ == "__main__":
  shapes = [tuple(int(x) for x in arg.split(",")) for arg in sys.argv[1:]]
  print(json.dumps({",".join(map(str, s)): run(s) for s in shapes}))
