"""Helper for test_train.py: one process of a multi-host run on this machine (gloo CPU
collectives over 127.0.0.1). Each process feeds only its own rows of every batch.

  python tests/multihost_run.py PROCESS_ID NUM_PROCESSES PORT
"""

import json
import sys

import jax

process_id, num_processes, port = (int(a) for a in sys.argv[1:4])
jax.config.update("jax_cpu_collectives_implementation", "gloo")
if num_processes > 1:
  jax.distributed.initialize(f"127.0.0.1:{port}", num_processes=num_processes, process_id=process_id)

from sharded_run import batches, run_steps  # noqa: E402

from seq2seq import sharding  # noqa: E402

rows = 16
local = [{k: v[process_id * rows // num_processes:(process_id + 1) * rows // num_processes] for k, v in b.items()}
         for b in batches(5, rows=rows)]
mesh = sharding.make_mesh({"data": -1, "fsdp": 1, "tensor": 1})
losses = run_steps(mesh, local)
if process_id == 0:
  print(json.dumps({"devices": jax.device_count(), "processes": jax.process_count(), "losses": losses}))
