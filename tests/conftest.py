"""Test-wide settings: faster XLA compiles on the CPU (results stay exact per program)."""

import os

# Tests compile many small programs; LLVM's expensive passes cost more than they save here.
_FAST_COMPILE = "--xla_backend_optimization_level=0 --xla_llvm_disable_expensive_passes=true"
os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " " + _FAST_COMPILE).strip()
