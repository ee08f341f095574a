"""Forwarding: `python -m seq2seq.plot` runs `python -m seq2seq.research.plot` (its name since
the research tools moved to seq2seq/research/), so old command lines and sweep manifests work."""

if __name__ == "__main__":
  import runpy

  runpy.run_module("seq2seq.research.plot", run_name="__main__", alter_sys=True)
