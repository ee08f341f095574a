"""Helper for test_train.py: process PROCESS_ID of 2 (gloo collectives on 127.0.0.1) checks
that two values are the same on every process; the second is not, on process 1.

  python tests/agreement_run.py PROCESS_ID PORT
"""

import sys

process_id, port = int(sys.argv[1]), int(sys.argv[2])

from seq2seq import sharding  # noqa: E402

sharding.initialize_distributed(f"127.0.0.1:{port}", 2, process_id)
sharding.check_same_on_every_process({"configs": b"same", "models": b"model-%d" % process_id}, "make them one")
print("the same")
