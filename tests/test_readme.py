"""The README's Python examples run as written."""

import pathlib
import re

README = pathlib.Path(__file__).resolve().parents[1] / "README.md"


def test_readme_python_blocks_run():
  blocks = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)
  assert blocks
  for block in blocks:
    namespace = {}
    exec(compile(block, str(README), "exec"), namespace)
    assert namespace["logits_bv"].shape == (1, 8000)
