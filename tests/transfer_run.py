"""Helper for test_train.py, run in a subprocess with 2 fake CPU devices: trains the tiny
config with `train.transfer_guard="disallow"` and reports which steps read from the devices.

The CPU backend does not enforce `jax.transfer_guard_device_to_host` (host memory is device
memory), so this emulates it: every read of an array's value goes through
`ArrayImpl._value` once the array spans two devices (a single-device CPU array can be read
through the buffer protocol instead, which no Python hook sees), and the patched property
raises where the guard is "disallow" on the reading thread, as the guard does on GPU/TPU.

  python tests/transfer_run.py DATA_DIR CACHE_DIR WORKDIR [read_every_step]
"""

import os

if __name__ == "__main__":
  os.environ["XLA_FLAGS"] = os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=2"

import json  # noqa: E402
import sys  # noqa: E402

sys.path[:0] = [os.path.dirname(os.path.dirname(os.path.abspath(__file__))), os.path.dirname(__file__)]

import jax  # noqa: E402
from conftest import make_config  # noqa: E402
from jax._src import array  # noqa: E402
from jax._src import config as jax_config

from seq2seq.training import train  # noqa: E402
from seq2seq.training.window import Window  # noqa: E402

_read = array.ArrayImpl._value


def _guarded_value(self):
  if jax_config.transfer_guard_device_to_host.value == "disallow":
    raise RuntimeError("device-to-host transfer on a step that neither logs, evaluates nor checkpoints")
  return _read.fget(self)


array.ArrayImpl._value = property(_guarded_value)

if __name__ == "__main__":
  data_dir, cache_dir, workdir = sys.argv[1:4]
  assert jax.device_count() == 2
  # The emulation bites: a read of a two-device array under "disallow" raises.
  x = jax.device_put(jax.numpy.ones(2), jax.sharding.NamedSharding(jax.make_mesh((2,), ("d",)),
                                                                   jax.sharding.PartitionSpec()))
  with jax.transfer_guard_device_to_host("disallow"):
    try:
      float(x[0])
      raise SystemExit("the emulated transfer guard did not raise")
    except RuntimeError:
      pass
  if sys.argv[4:] == ["read_every_step"]:  # the old loop: the guard read the loss after every step
    add = Window.add
    Window.add = lambda window, m, counts, wait: (float(m["loss_sum"]), add(window, m, counts, wait))
  config = make_config("tiny", data_dir, cache_dir)
  config.mesh.update(data=2)
  config.train.update(steps=14, log_every=5, checkpoint_every=10, eval_every=7, transfer_guard="disallow",
                      peak_flops=1e12)
  try:
    last = train.train_and_evaluate(config, workdir)
    print(json.dumps({"ok": True, "step": last["step"], "loss": last["loss"]}))
  except RuntimeError as e:
    print(json.dumps({"ok": False, "error": str(e)}))
