"""Trains a model: python train.py --config=configs/NAME.py --workdir=DIR [--config.a.b=value ...]

The same as the `seq2seq-train` command; see seq2seq/commands/train.py and `--help`.
"""

from seq2seq.commands.train import run

if __name__ == "__main__":
  run()
