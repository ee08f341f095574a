"""Data: parallel text sources -> sentencepiece tokenizer -> tokenized corpus -> length-
bucketed (or packed) batches, deterministic and resumable. The stages are the modules
`sources`, `tokenizer`/`subword`, `corpus`, `batching`; `pipeline` joins them for a config,
and its functions are re-exported here (`data.load_tokenizer(config, workdir)`, ...).
"""

from seq2seq.data.pipeline import (
                                   RESUME_KEYS,
                                   SPM_FILE,
                                   SPM_SETTINGS_FILE,
                                   batching_config,
                                   cache_dir,
                                   cleaning,
                                   describe,
                                   eval_pairs,
                                   load_corpus,
                                   load_tokenizer,
                                   resume_settings,
                                   save_tokenizer,
                                   source,
                                   statistics,
                                   tokenizer_settings,
                                   train_iterator,
)

__all__ = ["RESUME_KEYS", "SPM_FILE", "SPM_SETTINGS_FILE", "batching_config", "cache_dir", "cleaning", "describe",
           "eval_pairs", "load_corpus", "load_tokenizer", "resume_settings", "save_tokenizer", "source", "statistics",
           "tokenizer_settings", "train_iterator"]
