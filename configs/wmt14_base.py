# Vaswani et al. (2017) Transformer base on WMT14 en->de (37k shared subword vocabulary).
#   python train.py --config=configs/wmt14_base.py --workdir=/tmp/wmt14_base
# Expected: about 27.3 BLEU on newstest2014 after 100k steps of ~25k target tokens
# (8 GPUs x 12 hours in the paper); 65M parameters.
"""WMT14 en->de, Transformer base: d=512, 8 heads, 6+6 layers, ffn 2048, dropout 0.1."""

from configs import default


def get_config():
  config = default.get_config()
  config.model.update(d_model=512, num_heads=8, num_encoder_layers=6, num_decoder_layers=6, d_ff=2048,
                      dropout_rate=0.1, norm_position="post")
  config.data.update(src_lang="en", tgt_lang="de", vocab_size=37000, max_tokens=25000, max_len=256,
                     train_split="hf:wmt14/de-en:train", validation_split="files:wmt14/newstest2013.{lang}",
                     test_splits=("files:wmt14/newstest2014.{lang}",))
  config.train.update(steps=100_000, warmup_steps=4000, schedule="rsqrt", label_smoothing=0.1)
  return config
