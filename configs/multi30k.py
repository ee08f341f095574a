# The CPU default: Multi30k en->de on a 2-core machine.
#   SEQ2SEQ_DATA_DIR=../shared/data python train.py --config=configs/multi30k.py --workdir=/tmp/m30k
# Expected: 33.1 sacreBLEU (cased, 13a, beam 4) on test_2016_flickr and 24.9 on
# test_2017_flickr after 60 minutes of training (step 1938; stop there with
# --config.train.steps=1938), then `python eval.py --workdir=/tmp/m30k`. Target: >= 36.
"""Multi30k en->de: a small pre-norm Transformer sized for a CPU."""

from configs import default


def get_config():
  config = default.get_config()
  config.model.update(d_model=256, num_heads=4, num_encoder_layers=3, num_decoder_layers=3, d_ff=1024,
                      dropout_rate=0.2, norm_position="pre")
  # Packing: one batch shape, so training compiles one program (length buckets would compile ~34).
  config.data.update(source="multi30k", src_lang="en", tgt_lang="de", vocab_size=8000, max_tokens=2048,
                     packing=True, pack_length=128, test_splits=("test_2016_flickr", "test_2017_flickr"))
  config.train.update(steps=20_000, checkpoint_every=500, keep_checkpoints=5, log_every=50, eval_every=500,
                      warmup_steps=800, learning_rate=2.0)
  config.eval.update(val_bleu_sentences=500, val_beam_size=1)
  return config
