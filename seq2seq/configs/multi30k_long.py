# Multi30k en->de, an ablation: the hour config trained twice as long with dropout 0.3.
#   SEQ2SEQ_DATA_DIR=../shared/data python train.py --config=configs/multi30k_long.py --workdir=/tmp/m30k_long
#   python eval.py --workdir=/tmp/m30k_long
# Expected: 37.9 sacreBLEU on test_2016_flickr and 30.0 on test_2017_flickr (beam 4, alpha 1.2) after
#   4800 steps, 121 min on a slow 2-core AMD EPYC (run m30k_long_rope, docs/results.md#multi30k_long):
#   level with multi30k.py in twice the time, kept as a record.
"""multi30k.py with dropout 0.3 and 2x the steps: 4800, a checkpoint every 400, validation
every 800."""

from seq2seq.configs import multi30k


def get_config():
  config = multi30k.get_config()
  config.model.update(dropout_rate=0.3)
  config.train.update(steps=4800, checkpoint_every=400, keep_checkpoints=5, eval_every=800)
  return config
