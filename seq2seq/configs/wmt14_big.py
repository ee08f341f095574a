# Vaswani et al. (2017) Transformer big on WMT14 en->de (the data of wmt14_base.py: the Hub's wmt/wmt14).
#   SEQ2SEQ_DATA_DIR=../shared/data python train.py --config=configs/wmt14_big.py --workdir=/tmp/wmt14_big
#   (from local files: add --config.data.train_split=<configs/wmt14_files.py's LOCAL_TRAIN>)
# Expected: not trained here (no accelerator; docs/scaling.md has its dry run). The paper reports 28.4 BLEU
#   on newstest2014 after 300k steps (8 GPUs, 3.5 days).
"""wmt14_base.py as Transformer big: d=1024, 16 heads, 6+6 layers, ffn 4096, dropout 0.3
(213M parameters), 300k steps. Data, sentencepiece, cleaning and batching as wmt14_base.py.
"""

from seq2seq.configs import wmt14_base


def get_config():
  config = wmt14_base.get_config()
  config.model.update(d_model=1024, num_heads=16, d_ff=4096, dropout_rate=0.3)
  config.train.update(steps=300_000)
  return config
