"""The special token ids, in one place: padding, the decoder's start token and end of sentence.

The tokenizer trains and checks its sentencepiece models with them and hands them out as
`Tokenizer.special`; the data pads with `pad` and starts decoder inputs with `bos`; the model
takes `pad` as padding where no segment ids are given; the search starts hypotheses with
`bos`, ends them with `eos` and fills after them with `pad`.
"""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class SpecialTokens:
  """Ids of the special tokens. The decoder input starts with eos (bos = eos, as in fairseq)."""

  pad: int = 0
  bos: int = 1
  eos: int = 1


SPECIAL = SpecialTokens()  # the ids every tokenizer of this package has
