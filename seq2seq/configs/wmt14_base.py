# Vaswani et al. (2017) Transformer base on WMT14 en->de, training pairs from the Hugging Face Hub.
#   SEQ2SEQ_DATA_DIR=../shared/data python train.py --config=configs/wmt14_base.py --workdir=/tmp/wmt14_base
#   (configs/wmt14_files.py is the same run from the WMT14 files on local disk)
# Expected: not trained here (no accelerator; docs/scaling.md has its dry run). The paper reports 27.3 BLEU
#   on newstest2014 after 100k steps of ~25k target tokens (8 GPUs, 12 hours).
"""default.py as Transformer base: d=512, 8 heads, 6+6 layers, ffn 2048, dropout 0.1, post-norm
(65M parameters); rsqrt schedule with 4000 warmup steps, label smoothing 0.1, 100k steps.

Data, as in the paper:
- train: the Hub dataset `wmt/wmt14`, config `de-en`, split `train`: 4,508,785 pairs, the
  WMT14 shared task's en-de training corpora Europarl v7 (1.9M pairs), Common Crawl (2.4M)
  and News Commentary v9 (0.2M). `datasets` downloads it on first use into its cache
  (~1.4 GB; HF_DATASETS_CACHE); `--config.data.streaming=true` reads it without keeping a
  copy (twice: once for the sentencepiece sample, once to tokenize).
- validation: newstest2013 (3000 pairs); test: newstest2014 (3003 pairs, the full set that
  fairseq and tensor2tensor report), read from $SEQ2SEQ_DATA_DIR/wmt14/ (../shared/data has
  them). Without local copies: --config.data.validation_split=hf:wmt/wmt14:de-en:validation
  and --config.data.test_splits=hf:wmt/wmt14:de-en:test (the same two sets).
- sentencepiece: one joint 37000-piece unigram model from 1M sentences sampled from train
  (2M would take 5.5 GB to train; 1M takes 2.8 GB, ~40 s).
- cleaning: pairs with a side over 256 pieces, or one side over 3x the other, are dropped.
- batches: ~25000 tokens per side; rows of up to 8 lengths from 8 to 256 (8 batch shapes at
  most), filled best-fit: about 3% padding (benchmarks/results/data_pipeline_wmt_cpu2.json).
"""

from seq2seq.configs import default

HUB_TRAIN = "hf:wmt/wmt14:de-en:train"


def get_config():
  config = default.get_config()
  config.model.update(d_model=512, num_heads=8, num_encoder_layers=6, num_decoder_layers=6, d_ff=2048,
                      dropout_rate=0.1, norm_position="post")
  config.data.update(src_lang="en", tgt_lang="de", vocab_size=37000, spm_sample_size=1_000_000, max_tokens=25000,
                     max_len=256, train_split=HUB_TRAIN, validation_split="files:wmt14/newstest2013.{lang}",
                     test_splits=("files:wmt14/newstest2014.{lang}",))
  config.train.update(steps=100_000, warmup_steps=4000, schedule="rsqrt", label_smoothing=0.1)
  return config
