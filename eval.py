"""Evaluates a training run with sacreBLEU; see `seq2seq/evaluate.py` for the options.

  python eval.py --workdir=DIR [--step=N | --best | --average_last=K] [--split=NAME ...]
  python eval.py --workdir=DIR --source=FILE --reference=FILE [--beam_size=4 --alpha=0.6]
  python eval.py --workdir=DIR --source=- < input.txt > output.txt
"""

from seq2seq import evaluate

if __name__ == "__main__":
  evaluate.main()
