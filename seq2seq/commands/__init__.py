"""The command-line programs, each defining its absl flags and a `run()` entry point:

  seq2seq-train      (python train.py)       commands/train.py
  seq2seq-eval       (python eval.py)        commands/eval.py
  seq2seq-translate  (stdin to stdout)       commands/translate.py

The smaller tools keep a `main()` beside their code: `python -m seq2seq.data`,
`seq2seq.average`, `seq2seq.export`, and the research tools `seq2seq.research.sweep`,
`seq2seq.research.results`, `seq2seq.research.plot`. All share `seq2seq.cli`:
`--config=NAME` for a shipped config, quiet logs unless `--log_level`, and `error: ...`
lines for bad input.
"""
