"""Forwarding: `python -m seq2seq.results` runs `python -m seq2seq.research.results` (its name since
the research tools moved to seq2seq/research/), so old command lines and sweep manifests work."""

if __name__ == "__main__":
  import runpy

  runpy.run_module("seq2seq.research.results", run_name="__main__", alter_sys=True)
