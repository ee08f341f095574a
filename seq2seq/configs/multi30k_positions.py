# Multi30k en->de for the length-extrapolation study of positions: trained on pairs of at most 16 tokens a side.
#   SEQ2SEQ_DATA_DIR=../shared/data python -m seq2seq.research.positions --config=configs/multi30k_positions.py --workdir=workdirs/positions
#   (one run alone: python train.py --config=configs/multi30k_positions.py --workdir=/tmp/positions1)
# Expected: sinusoidal positions 32.7 +- 0.1 BLEU on sources of 1-16 tokens, 13.2 +- 0.2 on 17-32 and 0.6 on
#   >64 (val and both test sets, pairs joined up to 4 at a time; beam 4, alpha 1.2), 3 seeds; learned, rotary
#   and relative within 2.6 BLEU of each other in every bucket (docs/positions.md); about 5.6 min a run on
#   2 cores, 75 min for the study's 12 runs.
"""multi30k_sweep.py with the training pairs cut to short ones: data.max_len = 16 subword tokens
a side, eos included (the pipeline drops a pair longer than that on either side, so both
sides are limited, not only the source). The learned position table keeps 256 rows
(model.max_len), enough for the study's longest evaluated source, reference and output (the
validation and test sets and their pairs joined four at a time), so nothing is cut, and
rows 16 and up are never trained. The study (`python -m seq2seq.research.positions`) sets
the norm and positions per run; everything else, the schedule included, is the sweep's.
"""

from seq2seq.configs import multi30k_sweep

TRAIN_LEN = 16  # tokens a side, eos included: the study's L (buckets at L, 2L, 3L, 4L)


def get_config():
  config = multi30k_sweep.get_config()
  config.data.update(max_len=TRAIN_LEN)
  config.model.update(max_len=256)
  return config
