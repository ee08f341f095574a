"""Evaluates a training run with sacreBLEU; the same as the `seq2seq-eval` command.

  python eval.py --workdir=DIR [--step=N | --best | --average_last=K] [--split=NAME ...]
  python eval.py --workdir=DIR --source=FILE --reference=FILE [--beam_size=4 --alpha=0.6]
  python eval.py --workdir=DIR --source=- < input.txt > output.txt

See seq2seq/commands/eval.py and `--help`.
"""

from seq2seq.commands.eval import run

if __name__ == "__main__":
  run()
