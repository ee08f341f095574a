"""Trains a model: python train.py --config=configs/NAME.py --workdir=DIR [--config.a.b=value ...]

Many hosts: run the same command on every host, adding --coordinator_address=auto (Cloud
TPU, SLURM, Open MPI) or --coordinator_address=HOST:PORT --num_processes=N --process_id=I.
"""

import shlex
import sys

from absl import app, flags
from ml_collections import config_flags

from seq2seq.sharding import define_distributed_flags
from seq2seq.train import train_and_evaluate

_CONFIG = config_flags.DEFINE_config_file("config", None, "Path to a config file (configs/*.py).", lock_config=True)
_WORKDIR = flags.DEFINE_string("workdir", None, "Directory for checkpoints, metrics and the tokenizer.")
_JOIN_HOSTS = define_distributed_flags()
flags.mark_flags_as_required(["config", "workdir"])


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  _JOIN_HOSTS()
  train_and_evaluate(_CONFIG.value, _WORKDIR.value, command=shlex.join(["python", *sys.argv]))


if __name__ == "__main__":
  app.run(main)
