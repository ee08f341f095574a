# The CPU default: Multi30k en->de on a 2-core machine.
#   SEQ2SEQ_DATA_DIR=../shared/data python train.py --config=configs/multi30k.py --workdir=/tmp/m30k
# Expected: >= 36 sacreBLEU (cased, 13a) on test_2016_flickr after at most 60 minutes of
# training (the target of the results issue; not yet measured).
"""Multi30k en->de: a small pre-norm Transformer sized for a CPU."""

from configs import default


def get_config():
  config = default.get_config()
  config.model.update(d_model=256, num_heads=4, num_encoder_layers=3, num_decoder_layers=3, d_ff=1024,
                      dropout_rate=0.1, norm_position="pre")
  config.data.update(source="multi30k", src_lang="en", tgt_lang="de", vocab_size=8000, max_tokens=2048,
                     test_splits=("test_2016_flickr", "test_2017_flickr"))
  config.train.update(steps=20_000, checkpoint_every=1000, log_every=50, eval_every=1000, warmup_steps=1000,
                      learning_rate=2.0)
  return config
