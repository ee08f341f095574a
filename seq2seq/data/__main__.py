"""python -m seq2seq.data --config=NAME: the data statistics of a config (see pipeline.main)."""

from seq2seq.data.pipeline import main

if __name__ == "__main__":
  main()
