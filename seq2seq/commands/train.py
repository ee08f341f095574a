"""Trains a model: seq2seq-train --config=NAME --workdir=DIR [--config.a.b=value ...]
(or python train.py ...). Rerunning the same command on the same DIR resumes.

Many hosts: run the same command on every host, adding --coordinator_address=auto (Cloud
TPU, SLURM, Open MPI) or --coordinator_address=HOST:PORT --num_processes=N --process_id=I.
Before renting: --dry_run compiles the train step for the configured mesh (fake CPU devices
if this machine has too few) and prints memory per device, FLOPs and a predicted speed.
"""

from absl import app, flags
from ml_collections import config_flags

from seq2seq import cli

_CONFIG = config_flags.DEFINE_config_file("config", None, "A shipped config's name (tiny, multi30k, wmt14_base, ...) "
                                          "or a config file's path.", lock_config=True)
_WORKDIR = flags.DEFINE_string("workdir", None, "Directory for checkpoints, metrics and the tokenizer.")
_JOIN_HOSTS = cli.define_distributed_flags()
_DRY_RUN = flags.DEFINE_bool("dry_run", False, "Compile the train step for the configured mesh and report memory per "
                             "device, FLOPs and predicted speed; trains nothing and reads no data.")
_DRY_RUN_DEVICES = flags.DEFINE_integer("dry_run_devices", 0, "--dry_run: devices of the mesh (0: the product of "
                                        "config.mesh's sizes, or 8 when one is -1); fake CPU devices if too few.")
_PEAK_TFLOPS = flags.DEFINE_float("peak_tflops", 0.0, "--dry_run: peak TFLOP/s of one device, for a predicted speed.")
_MFU = flags.DEFINE_float("mfu", 0.4, "--dry_run: the model-FLOPs utilisation assumed for the predicted speed.")
_DEVICE_MEMORY_GIB = flags.DEFINE_float("device_memory_gib", 0.0, "--dry_run: memory of one device; exit non-zero "
                                        "when the run would not fit.")
flags.mark_flags_as_required(["config", "workdir"])


def dry_run(config) -> None:
  from seq2seq.training import plan

  count = _DRY_RUN_DEVICES.value or plan.mesh_devices(config.mesh)
  plan.use_fake_cpu_devices(count)
  result = plan.dry_run(config, plan.devices_for(count), peak_tflops=_PEAK_TFLOPS.value, mfu=_MFU.value)
  print(plan.report(result, _DEVICE_MEMORY_GIB.value))
  print(plan.to_json(result))
  if _DEVICE_MEMORY_GIB.value and not plan.fits(result, _DEVICE_MEMORY_GIB.value):
    raise SystemExit(plan.advice(result, _DEVICE_MEMORY_GIB.value))


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  if _DRY_RUN.value:
    return dry_run(_CONFIG.value)
  from seq2seq.training.train import train_and_evaluate

  _JOIN_HOSTS()
  train_and_evaluate(_CONFIG.value, _WORKDIR.value, command=cli.command_line("seq2seq-train"))


def run() -> None:
  cli.run(main, __name__)


if __name__ == "__main__":
  run()
