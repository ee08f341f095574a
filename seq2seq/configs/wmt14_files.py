# Transformer base on WMT14 en->de from the shared task's files on local disk (wmt14_base.py reads the Hub instead).
#   SEQ2SEQ_DATA_DIR=~/data python train.py --config=configs/wmt14_files.py --workdir=/tmp/wmt14_files
#   (the big model: add --config.model.d_model=1024 --config.model.num_heads=16 --config.model.d_ff=4096 ...: see wmt14_big.py)
# Expected: as wmt14_base.py: not trained here; the paper reports 27.3 BLEU on newstest2014 after 100k steps.
"""wmt14_base.py with the training split read from the three WMT14 en-de corpora as local files.

Get them (about 1.4 GB unpacked) into the data folder, beside newstest2013/2014:
  cd $SEQ2SEQ_DATA_DIR/wmt14
  for f in wmt13/training-parallel-europarl-v7.tgz wmt13/training-parallel-commoncrawl.tgz \
           wmt14/training-parallel-nc-v9.tgz; do curl -L https://www.statmt.org/$f | tar xz; done
which gives (plain text, one sentence per line, line i of .en translating line i of .de):
  wmt14/training/europarl-v7.de-en.{en,de}          1,920,209 pairs
  wmt14/commoncrawl.de-en.{en,de}                   2,399,123 pairs
  wmt14/training/news-commentary-v9.de-en.{en,de}     201,288 pairs
The train split lists the three (files: takes comma-separated {lang} paths, or a glob);
each pair of files is checked to have equal line counts. Validation is newstest2013 and
test newstest2014, from the same folder, as in wmt14_base.py.
"""

from seq2seq.configs import wmt14_base

CORPORA = ("wmt14/training/europarl-v7.de-en", "wmt14/commoncrawl.de-en", "wmt14/training/news-commentary-v9.de-en")
LOCAL_TRAIN = "files:" + ",".join(f"{c}.{{lang}}" for c in CORPORA)


def get_config():
  config = wmt14_base.get_config()
  config.data.train_split = LOCAL_TRAIN
  return config
