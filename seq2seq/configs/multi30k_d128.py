# Multi30k en->de, the best en->de result: a narrower, deeper model (d_model 128, 4+4 layers) with dropout 0.3.
#   SEQ2SEQ_DATA_DIR=../shared/data python train.py --config=configs/multi30k_d128.py --workdir=/tmp/m30k_d128
#   python eval.py --workdir=/tmp/m30k_d128
# Expected: 39.9 sacreBLEU on test_2016_flickr and 32.4 on test_2017_flickr (beam 4, alpha 1.2) after
#   7000 steps, 34 min on a fast 2-core AMD EPYC (run m30k_d128_rope, docs/results.md#multi30k_d128).
"""multi30k.py with a third of the FLOPs per token and 2.3x the epochs: d_model 128, d_ff 256,
4+4 layers, dropout 0.3; peak rate 0.005 after 800 warmup steps, 7000 steps (about 30
epochs; a checkpoint every 500, 10 kept, validation every 1000)."""

from seq2seq.configs import multi30k


def get_config():
  config = multi30k.get_config()
  config.model.update(dropout_rate=0.3)
  return config
