"""seq2seq: encoder-decoder Transformers for machine translation in JAX / Flax NNX.

The package follows the data's one-way flow:

  configs/ -> data/ -> model/ -> training/ -> inference/
  (settings)  (text to batches)  (Transformer)  (loop, checkpoints)  (search, BLEU)

with small tools beside it (sharding, metrics, average, export, cli), the command-line
programs in commands/, and the research tools (sweeps, variants, results table, plots) in
research/, which nothing else imports.
The names most users need are importable from here:

  from seq2seq import Translator
  translator = Translator.from_workdir("/tmp/m30k")          # or Translator.from_pretrained(MODEL_DIR)
  translator.translate(["A man rides a bike."])

Imports are lazy, so `import seq2seq` is cheap and pulls in JAX only when a name is used.
"""

import importlib

__version__ = "0.2.0"  # the one version source: pyproject.toml reads it, --version prints it
DISTRIBUTION = "seq2seq-jax"  # the name on PyPI (`seq2seq` there is another project); the import name is seq2seq

_EXPORTS = {
    "Translator": "seq2seq.inference.translate",
    "Sampling": "seq2seq.inference.settings",  # Translator.translate(..., sampling=Sampling(top_p=0.9))
    "ModelConfig": "seq2seq.model.config",
    "Transformer": "seq2seq.model.transformer",
    "Tokenizer": "seq2seq.data.tokenizer",
    "train_and_evaluate": "seq2seq.training.train",
    "get_config": ("seq2seq.configs", "get"),
    "score": "seq2seq.inference.score",
    "export": "seq2seq.export",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name):
  if name in _EXPORTS:
    module, attribute = _EXPORTS[name] if isinstance(_EXPORTS[name], tuple) else (_EXPORTS[name], name)
    return getattr(importlib.import_module(module), attribute)
  raise AttributeError(f"module 'seq2seq' has no attribute {name!r}")


def __dir__():
  return sorted(set(globals()) | set(__all__))
