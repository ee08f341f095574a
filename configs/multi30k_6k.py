# Multi30k en->de: the hour model trained 2.5x as long with dropout 0.2 (multi30k_d128.py is better).
#   SEQ2SEQ_DATA_DIR=../shared/data python train.py --config=configs/multi30k_6k.py --workdir=/tmp/m30k_6k
#   python eval.py --workdir=/tmp/m30k_6k
# Expected: 37.7 sacreBLEU on test_2016_flickr and 28.3 on test_2017_flickr (beam 4, alpha 1.2) after
# 6000 steps, 156 minutes on the 2-core CPU (about 1250 target tokens/s).
"""Multi30k en->de: multi30k.py with 2.5x the steps (6000) and dropout 0.2.

The `m30k_d02` rows of docs/results.md were trained with the same settings written as
overrides of multi30k_long.py (tests/test_configs.py checks that the two are the same
config). Validation NLL 1.727 at the end against 1.78 for the hour run; training NLL
(dropout on) 1.12, so the model still overfits and is short of the >= 40 BLEU published
text-only models reach.
"""

from seq2seq.configs import multi30k


def get_config():
  config = multi30k.get_config()
  # Sinusoidal positions, as multi30k.py had when this config's reported run was trained
  # (multi30k.py has used RoPE since); rerun its rows before dropping this line.
  config.model.positions = "sinusoidal"
  config.model.update(dropout_rate=0.2)
  config.train.update(steps=6000, checkpoint_every=500, eval_every=1000)
  return config
