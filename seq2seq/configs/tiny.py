# A model that trains in seconds on a CPU, for tests and smoke runs.
#   python train.py --config=configs/tiny.py --workdir=/tmp/tiny
# Expected: no measured BLEU (it is not meaningful at this size); the training loss falls within the
#   first 100 steps. The tests and the quick start train it.
"""default.py shrunk: 2+2 pre-norm layers of width 64 (d_ff 128, no dropout), a 1000-piece
vocabulary, packed rows of 64 tokens, 200 steps (rsqrt schedule, warmup 50), beam 2."""

from seq2seq.configs import default


def get_config():
  config = default.get_config()
  config.model.update(d_model=64, num_heads=4, num_encoder_layers=2, num_decoder_layers=2, d_ff=128,
                      dropout_rate=0.0, norm_position="pre", max_len=64)
  # Packing: one batch shape, so a test run compiles one train step.
  config.data.update(vocab_size=1000, max_len=48, max_tokens=1024, packing=True, pack_length=64,
                     spm_sample_size=20_000)
  config.train.update(steps=200, checkpoint_every=100, log_every=10, eval_every=100, warmup_steps=50,
                      schedule="rsqrt")
  config.eval.update(beam_size=2, max_len_b=10, batch_size=32)
  return config
