"""Forwarding: `python -m seq2seq.sweep` runs `python -m seq2seq.research.sweep` (its name since
the research tools moved to seq2seq/research/), so old command lines and sweep manifests work."""

if __name__ == "__main__":
  import runpy

  runpy.run_module("seq2seq.research.sweep", run_name="__main__", alter_sys=True)
