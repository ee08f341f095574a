# Multi30k en->de: the hour model trained 2.5x as long with dropout 0.2 (multi30k_d128.py is better).
#   SEQ2SEQ_DATA_DIR=../shared/data python train.py --config=configs/multi30k_6k.py --workdir=/tmp/m30k_6k
#   python eval.py --workdir=/tmp/m30k_6k
# Expected: 39.1 sacreBLEU on test_2016_flickr and 31.1 on test_2017_flickr (beam 4, alpha 1.2) after
#   6000 steps, 162 min on a slow 2-core AMD EPYC (run m30k_6k_rope, docs/results.md#multi30k_6k).
"""multi30k.py with dropout 0.2 and 2.5x the steps: 6000, a checkpoint every 500, validation
every 1000."""

from seq2seq.configs import multi30k


def get_config():
  config = multi30k.get_config()
  config.model.update(dropout_rate=0.2)
  config.train.update(steps=6000, checkpoint_every=500, eval_every=1000)
  return config
