"""Where a train step's time goes: a jax.profiler trace turned into a table by category.

  python benchmarks/profile_table.py --profile=DIR [--steps=5] [--out=table.json]

DIR is what `benchmarks/device_check.py --section=profile_capture` writes for one row layout:
DIR/trace/.../perfetto_trace.json.gz (the kernels) and DIR/train_step.hlo.txt (the step's
optimized HLO). Each kernel is matched to the HLO instruction that launched it, and the
instruction to the Python frames that made it (the HLO's stack frames), which give the
category and, for matmuls, the site:

- the kernel's own `hlo_op` when it names an instruction (CPU thunks; GPU kernels outside a
  command buffer);
- inside a command buffer (CUDA graph) every kernel says `command_buffer_N`: a kernel that XLA
  emitted is named after its fusion; a library kernel (cuBLAS, cuDNN, Pallas/Triton) belongs
  to the next library call in the schedule after the last matched instruction.

The table: milliseconds per step by category (matmul sites, attention, norms, residual and
other elementwise fusions, dropout, loss, optimizer, casts, copies/layout, host-to-device,
idle gaps on the device), the 15 slowest kernels with their share, kernel launches per step.

Without a trace, the same categories from the optimized HLO alone (`kernel_costs`,
`static_table`): each kernel's bytes read and written and each matmul's FLOPs, turned into
milliseconds by a `CostModel` fitted to a measured table (`fit`). benchmarks/gpu_compile.py
uses them on a GPU program compiled on a machine without one.
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import gzip
import json
import math
import pathlib
import re



def library_family(name: str) -> str:
  """cublas | cudnn | triton: the library behind a custom call target or a kernel's name ("" if none).
  A cuBLAS call launches one kernel; a cuDNN attention call one to three."""
  lower = name.lower()
  if "cublas" in lower or lower.startswith(("nvjet", "sm90_xmma", "sm80_xmma", "cutlass", "ampere_", "gemm_")):
    return "cublas"
  if "cudnn" in lower or "fmha" in lower or "sdpa" in lower:
    return "cudnn"
  if "triton" in lower or "pallas" in lower:
    return "triton"
  return ""
# Python functions (innermost first) -> where a matmul is: the first function of its stack found here.
MATMUL_SITES = {"MultiHeadAttention.query_key_value": "QKV projection", "MultiHeadAttention.query": "Q projection",
                "MultiHeadAttention.key_value": "KV projection", "MultiHeadAttention.attend": "attention output",
                "MultiHeadAttention.attend_cached": "attention output", "FeedForward.__call__": "FFN",
                "tied_logits": "vocabulary projection", "_tied_logits_fwd": "vocabulary projection",
                "MultiHeadAttention.project_qkv": "QKV projection", "MultiHeadAttention.project_q": "Q projection",
                "MultiHeadAttention.project_kv": "KV projection", "MultiHeadAttention._out": "attention output",
                "Embed.attend": "vocabulary projection", "Transformer._logits": "vocabulary projection",
                "_chunk_loop.<locals>.project": "vocabulary projection",  # train.loss_chunk: the logits
                "_chunk_loop.<locals>.body": "vocabulary projection"}  # and their gradients, in the forward pass
ATTENTION = ("attention", "flash_attention", "fused_flash_attention", "explicit_attention", "single_query_attention", "dot_product_attention",
             "splash_attention", "_per_device", "_flash_fwd", "_flash_bwd", "cudnn_attention")
# Python functions -> category: the first function of the stack (innermost first) that contains a name.
CATEGORIES = (
    (("keep_mask", "dropout", "_fmix32", "fold"), "dropout"),
    (("cross_entropy", "_xent", "_token_stats", "_stats_in_one_pass", "label_smooth", "Embed.attend", "_logits"),
     "loss and logits (softmax, casts)"),
    (("scale_by_", "apply_gradients", "apply_updates", "tree_", "clip", "safe_increment", "schedule"), "optimizer"),
    (("Norm.__call__", "layer_norm", "rms_norm", "adanorm", "fused_norm", "_norm_fwd", "_norm_bwd"), "norm"),
    (("Embed.__call__", "_embed", "sinusoidal", "_rope", "positions"), "embedding"),
    (("FeedForward.__call__",), "FFN elementwise (bias, activation)"),
    (("MultiHeadAttention.",), "attention elementwise (biases, layout)"),
    (("residual",), "residual adds"),
)


@dataclasses.dataclass
class Instruction:
  name: str
  opcode: str
  op_name: str  # jax's op name: "jit(train_step)/transpose(jvp())/dot_general"
  functions: list  # Python function names of its stack, innermost first
  library: str  # a library call whose kernels are not named after it: cublas | cudnn | triton; else ""
  fingerprint: str  # equal for instructions that can share one kernel (same shape and fused computation)


@dataclasses.dataclass
class Hlo:
  schedule: list  # the entry computation's instructions in execution order
  by_name: dict  # every instruction of every computation, by name


_INSTRUCTION = re.compile(r"^\s*(?:ROOT )?%(\S+) = .*? ([a-z][a-z0-9\-]*)\(")


def _table(text: str, header: str) -> dict:
  """A numbered section of the HLO text's stack-frame tables (`1 "name"` or `1 {k=v ...}`)."""
  start = text.find("\n" + header + "\n")
  if start < 0:
    return {}
  out = {}
  for line in text[start + len(header) + 2:].split("\n"):
    m = re.match(r"^(\d+) (.*)$", line)
    if not m:
      break
    value = m.group(2)
    out[int(m.group(1))] = (value.strip('"') if value.startswith('"') else
                            dict(re.findall(r"(\w+)=([^ }]+)", value)))
  return out


def parse_hlo(text: str) -> Hlo:
  """The optimized HLO's instructions with their stacks, and the entry schedule."""
  functions, locations, frames = _table(text, "FunctionNames"), _table(text, "FileLocations"), \
      _table(text, "StackFrames")

  def stack(frame_id: int) -> list:
    out, seen = [], set()
    while frame_id in frames and frame_id not in seen:
      seen.add(frame_id)
      location = locations.get(int(frames[frame_id].get("file_location_id", 0)), {})
      out.append(functions.get(int(location.get("function_name_id", 0)), "?"))
      parent = int(frames[frame_id].get("parent_frame_id", 0))
      frame_id = parent - 1 if parent - 1 in frames and parent - 1 != frame_id else parent
    return out

  bodies, current = {}, None  # computation -> its text without names and metadata
  for line in text.split("\n"):
    head = re.match(r"^%(\S+) \(", line)
    if head:
      current = bodies.setdefault(head.group(1), [])
    elif line.startswith("}"):
      current = None
    elif current is not None:
      current.append(re.sub(r"%[\w.\-]+", "%", re.sub(r", (metadata|backend_config)=.*$", "", line)))
  by_name, schedule, in_entry = {}, [], False
  for line in text.split("\n"):
    if line.startswith("ENTRY "):
      in_entry = True
      continue
    if in_entry and line.startswith("}"):
      in_entry = False
    m = _INSTRUCTION.match(line)
    if not m:
      continue
    name, opcode = m.groups()
    op_name = re.search(r'op_name="([^"]*)"', line)
    frame = re.search(r"stack_frame_id=(\d+)", line)
    target = re.search(r'custom_call_target="([^"]+)"', line)
    calls = re.search(r"calls=%([\w.\-]+)", line)
    shape = line.split(" = ", 1)[1].split(f" {opcode}(", 1)[0]
    fingerprint = "\n".join([opcode, shape, *bodies.get(calls.group(1) if calls else "", [])])
    inst = Instruction(name, opcode, op_name.group(1) if op_name else "", stack(int(frame.group(1))) if frame else [],
                       library_family(target.group(1)) if target else "", fingerprint)
    by_name[name] = inst
    if in_entry and opcode not in ("parameter", "get-tuple-element", "bitcast", "tuple", "constant"):
      schedule.append(inst)
  return Hlo(schedule, by_name)


def kernel_name(instruction: str) -> str:
  """The name XLA gives the kernel of an instruction: `input_reduce_fusion.142` ->
  `input_reduce_fusion_142`."""
  return re.sub(r"[.\-]", "_", instruction)


def categorize(inst: Instruction | None, kernel: str, matmul: bool = False) -> tuple[str, str]:
  """(category, matmul site or "") of a kernel and the instruction that launched it; `matmul`:
  known to multiply matrices (else judged by its op and kernel names)."""
  if inst is None:
    if kernel.startswith(("nvjet", "sm90_xmma", "sm80_xmma", "cutlass", "ampere_", "gemm")):
      return "matmul", "unattributed"
    return ("copy/layout", "") if "memcpy" in kernel or "copy" in kernel else ("unattributed", "")
  op = inst.op_name.rsplit("/", 1)[-1]
  matmul = matmul or op in ("dot_general", "dot") or inst.name.startswith("gemm_fusion") or \
      kernel.startswith(("nvjet", "gemm_fusion", "sm90_xmma", "cutlass"))
  backward = " (backward)" if "transpose(" in inst.op_name else ""
  for function in inst.functions if matmul else ():  # a matmul is one wherever it is, but in attention
    if function in ATTENTION or function.startswith(("flash_attention.", "_flash")):
      return "attention", ""
    if function in MATMUL_SITES:
      return "matmul", MATMUL_SITES[function] + backward
  if matmul:
    return "matmul", "other"
  for function in inst.functions:  # innermost first
    if function in ATTENTION or function.startswith(("flash_attention.", "_flash")):
      return "attention", ""
    for names, category in CATEGORIES:
      if any(name in function for name in names):
        return category, ""
  if inst.opcode in ("copy", "transpose") or op in ("transpose", "copy"):
    return "copy/layout", ""
  if op == "convert_element_type":
    return "casts", ""
  return "other elementwise", ""


def attribute(events: list, hlo: Hlo, module: str = "jit_train_step") -> tuple[list, float]:
  """([(event, instruction or None, category, site)] for the module's kernels in time order,
  host-to-device microseconds); see the module docstring for the matching."""
  names = {kernel_name(i.name): i for i in hlo.schedule}
  position = {id(i): n for n, i in enumerate(hlo.schedule)}
  library = [n for n, i in enumerate(hlo.schedule) if i.library]
  kernels, h2d, pointer = [], 0.0, -1
  for e in sorted(events, key=lambda e: e["ts"]):
    args = e.get("args", {})
    if "MemcpyH2D" in e.get("stream", ""):
      h2d += e["dur"]
      continue
    if args.get("hlo_module") != module:
      continue
    if e["name"].lower().startswith(("memset", "memcpy")):  # copies XLA inserts: they take no library call
      kernels.append((e, None, "memsets/copies", ""))
      continue
    inst = hlo.by_name.get(args.get("hlo_op", ""))
    named = names.get(e["name"]) if inst is None else None
    if named is not None:  # XLA names a kernel after the first fusion that uses it: the next one like it
      inst = named if position[id(named)] > pointer else next(
          (i for i in hlo.schedule[pointer + 1:] if i.fingerprint == named.fingerprint), named)
    elif inst is None:  # a library kernel inside a command buffer: the next call of its library
      family = library_family(e["name"]) or "triton"  # Pallas kernels carry the names their authors gave
      if 0 <= pointer and family == "cudnn" and hlo.schedule[pointer].library == "cudnn":
        inst = hlo.schedule[pointer]  # a cuDNN call's further kernels
      else:
        inst = next((hlo.schedule[n] for n in library if n > pointer and hlo.schedule[n].library == family), None)
    if inst is not None:
      pointer = position.get(id(inst), pointer)
    kernels.append((e, inst, *categorize(inst, e["name"])))
  return kernels, h2d


def table(events: list, hlo: Hlo, steps: int, module: str = "jit_train_step") -> dict:
  """The per-step table of a trace's device events (see the module docstring)."""
  kernels, h2d = attribute(events, hlo, module)
  if not kernels:
    raise ValueError(f"no device events of {module} in the trace")
  matched = sum(inst is not None for _, inst, *_ in kernels)
  busy = sum(e["dur"] for e, *_ in kernels)
  span = max(e["ts"] + e["dur"] for e, *_ in kernels) - min(e["ts"] for e, *_ in kernels)
  by_category, by_site, by_kernel = collections.Counter(), collections.Counter(), collections.Counter()
  launches = collections.Counter()
  for e, inst, category, site in kernels:
    by_category[category] += e["dur"]
    if site:
      by_site[site] += e["dur"]
    key = (e["name"], category + (f": {site}" if site else ""))
    by_kernel[key] += e["dur"]
    launches[key] += 1
  per_step = lambda us: round(us / steps / 1e3, 4)  # ms
  categories = {k: per_step(v) for k, v in by_category.most_common()}
  categories["host-to-device copies"] = per_step(h2d)
  categories["idle gaps (device)"] = per_step(max(span - busy, 0.0))
  return {"steps": steps, "step_ms": per_step(span), "busy_ms": per_step(busy),
          "kernel_launches_per_step": round(len(kernels) / steps, 1),
          "attributed_fraction": round(matched / len(kernels), 4),  # kernels matched to an HLO instruction
          "ms_per_step": categories, "matmul_sites_ms_per_step": {k: per_step(v) for k, v in by_site.most_common()},
          "slowest_kernels": [{"kernel": k[0], "category": k[1], "ms_per_step": per_step(v),
                               "share": round(v / busy, 4), "launches_per_step": round(launches[k] / steps, 1)}
                              for k, v in by_kernel.most_common(15)]}


# -- the same table from the optimized HLO alone --------------------------------------
DTYPE_BYTES = {"pred": 1, "s4": 0.5, "u4": 0.5, "s8": 1, "u8": 1, "f8e4m3fn": 1, "f8e5m2": 1, "s16": 2, "u16": 2,
               "f16": 2, "bf16": 2, "s32": 4, "u32": 4, "f32": 4, "s64": 8, "u64": 8, "f64": 8, "c64": 8, "c128": 16}
_ARRAY = re.compile(r"\b(" + "|".join(DTYPE_BYTES) + r")\[([\d,]*)\]")
_LINE = re.compile(r"^\s*(?:ROOT )?%(\S+) = (.*?) ([a-z][a-z0-9\-]*)\((.*)$")
# Instructions that launch nothing: views, tuples, and the containers whose bodies are walked.
NOT_KERNELS = ("parameter", "get-tuple-element", "bitcast", "tuple", "constant", "after-all", "opt-barrier",
               "partition-id", "replica-id", "while", "call", "conditional")
VIEWS = ("bitcast", "reshape")  # a fused parameter seen through these is still the parameter


def shape_bytes(shape: str) -> int:
  """Bytes of an HLO shape, a tuple's leaves summed: `(bf16[2,3]{1,0}, f32[])` -> 16."""
  return int(sum(DTYPE_BYTES[t] * math.prod(int(d) for d in dims.split(",") if d) for t, dims in _ARRAY.findall(shape)))


def _dims(shape: str) -> list[int]:
  return [int(d) for d in _ARRAY.findall(shape)[0][1].split(",") if d]


@dataclasses.dataclass
class _Op:
  name: str
  shape: str
  opcode: str
  operands: list  # names, in order
  line: str


def _computations(text: str) -> tuple[dict, str]:
  """{computation: [_Op]} in text order (a scheduled module: execution order) and the entry's name."""
  comps, current, entry = {}, None, ""
  for line in text.split("\n"):
    head = re.match(r"^(ENTRY )?%(\S+) \(", line)
    if head:
      current = comps.setdefault(head.group(2), [])
      entry = head.group(2) if head.group(1) else entry
    elif line.startswith("}"):
      current = None
    elif current is not None and (m := _LINE.match(line)):
      name, shape, opcode, rest = m.groups()
      depth, end = 1, len(rest)
      for n, ch in enumerate(rest):  # the operand list ends at the parenthesis that closes the opcode's
        depth += {"(": 1, ")": -1}.get(ch, 0)
        if depth == 0:
          end = n
          break
      current.append(_Op(name, shape, opcode, re.findall(r"%([\w.\-]+)", rest[:end]), line))
  return comps, entry


def _read_bytes(fused: list, index: int, full: int) -> int:
  """Bytes a fusion reads of its operand `index`: only what slices take of it when slices
  (seen through views) are its only uses, nothing when it is the buffer an in-place
  dynamic-update-slice writes into, else all of it."""
  param = next((op for op in fused if op.opcode == "parameter" and f"parameter({index})" in op.line), None)
  if param is None:
    return full
  users = {}
  for op in fused:
    for operand in op.operands:
      users.setdefault(operand, []).append(op)
  frontier, views, ends = [param.name], {param.name}, []
  while frontier:
    for user in users.get(frontier.pop(), []):
      if user.opcode in VIEWS:
        frontier.append(user.name)
        views.add(user.name)
      else:
        ends.append(user)
  if ends and all(u.opcode in ("slice", "dynamic-slice") for u in ends):
    return min(full, sum(shape_bytes(u.shape) for u in ends))
  if ends and all(u.opcode == "dynamic-update-slice" and u.operands[0] in views for u in ends):
    return 0
  return full


def _written_bytes(fused: list, output: int) -> int:
  """Bytes a fusion writes: its update only when its root updates a buffer in place."""
  root = next((op for op in fused if op.line.lstrip().startswith("ROOT ")), None)
  if root is not None and root.opcode == "dynamic-update-slice":
    by_name = {op.name: op for op in fused}
    return shape_bytes(by_name[root.operands[1]].shape) if root.operands[1] in by_name else output
  return output


def _dot_flops(ops: list, shapes: dict) -> float:
  """2 x (output elements) x (contracted size) of each dot among `ops`."""
  flops = 0.0
  for op in ops:
    if op.opcode != "dot" or op.operands[0] not in shapes:
      continue
    contracting = re.search(r"lhs_contracting_dims=\{([\d,]*)\}", op.line)
    lhs = _dims(shapes[op.operands[0]])
    k = math.prod(lhs[int(c)] for c in contracting.group(1).split(",") if c) if contracting else 1
    flops += 2.0 * k * math.prod(_dims(op.shape))
  return flops


def _library_flops(op: _Op, shapes: dict) -> float:
  """A cuBLAS call's FLOPs, from its backend config's contracting dimensions."""
  contracting = re.search(r'"lhs_contracting_dimensions":\[([^\]]*)\]', op.line)
  if not contracting or not op.operands or op.operands[0] not in shapes:
    return 0.0
  lhs = _dims(shapes[op.operands[0]])
  k = math.prod(lhs[int(c.strip('"'))] for c in contracting.group(1).split(",") if c.strip('"'))
  return 2.0 * k * math.prod(_dims(op.shape))  # the first leaf: the product (a workspace may follow)


@dataclasses.dataclass
class KernelCost:
  name: str
  category: str
  site: str
  bytes: float  # read and written, per launch
  flops: float  # of matmuls, per launch
  launches: int  # per step: the trip count of the loops around it
  library: bool = False  # a library or Pallas kernel that is not a matmul (attention's): its bytes say little


def kernel_costs(text: str) -> list[KernelCost]:
  """Every kernel an optimized, scheduled HLO module launches in one run (entry order; the
  bodies of loops with a known trip count that many times), with its category and matmul site
  (`categorize`), the bytes it reads and writes (`_read_bytes`, `_written_bytes`: a fusion's
  operands and outputs, not its insides) and its matmul FLOPs."""
  comps, entry = _computations(text)
  hlo = parse_hlo(text)
  out = []

  def walk(name: str, times: int):
    shapes = {op.name: op.shape for op in comps.get(name, [])}
    for op in comps.get(name, []):
      if op.opcode == "while":
        trip = re.search(r'"known_trip_count":\{"n":"(\d+)"', op.line)
        walk(re.search(r"body=%([\w.\-]+)", op.line).group(1), times * (int(trip.group(1)) if trip else 1))
        continue
      if op.opcode in ("call", "conditional"):
        for callee in re.findall(r"(?:to_apply|branch_computations=\{|, )%([\w.\-]+)", op.line):
          walk(callee, times)
        continue
      if op.opcode in NOT_KERNELS:
        continue
      operand_bytes = [shape_bytes(shapes.get(o, "")) for o in op.operands]
      called = re.search(r"calls=%([\w.\-]+)", op.line)
      if op.opcode == "fusion" and called:
        fused = comps.get(called.group(1), [])
        read = sum(_read_bytes(fused, n, b) for n, b in enumerate(operand_bytes))
        written = _written_bytes(fused, shape_bytes(op.shape))
        flops = _dot_flops(fused, {o.name: o.shape for o in fused})
      else:
        read, written = sum(operand_bytes), shape_bytes(op.shape)
        flops = _library_flops(op, shapes) if op.opcode == "custom-call" else _dot_flops([op], shapes)
      category, site = categorize(hlo.by_name.get(op.name), kernel_name(op.name), matmul=flops > 0)
      out.append(KernelCost(op.name, category, site, float(read + written), flops, times,
                            library=op.opcode == "custom-call" and not flops and category == "attention"))

  walk(entry, 1)
  return out


@dataclasses.dataclass(frozen=True)
class CostModel:
  """Milliseconds of a kernel from what it moves and computes: a memory-bound kernel takes
  bytes / `bandwidth` plus `launch_us` (its launch and tail, inside a CUDA graph); a matmul
  FLOPs / `matmul_flops`; the library kernels of a category (attention's Pallas kernels,
  compute-bound, whose operands say little of what they read) take that category's measured
  time `library_ms` in a step of `library_tflop` attention FLOPs (the model formula's,
  seq2seq.model.flops.attention_flops, forward and backward), in proportion to those FLOPs:
  twice the rows, or twice the heads, twice the time."""

  bandwidth: float  # bytes/s that memory-bound kernels reach
  launch_us: float
  matmul_flops: float  # FLOP/s that the step's matmuls reach
  library_ms: dict = dataclasses.field(default_factory=dict)  # {category: ms per step of its library kernels}
  library_tflop: float = 1.0  # the attention TFLOP of the step the model was fitted to

  def kernel_ms(self, k: KernelCost) -> float:
    """ms per step of one kernel (a library kernel's share is given by `static_table`)."""
    if k.category == "matmul":
      return k.launches * k.flops / self.matmul_flops * 1e3
    return k.launches * (k.bytes / self.bandwidth * 1e3 + self.launch_us / 1e3)

  def to_json(self) -> dict:
    return {"bandwidth_tb_s": round(self.bandwidth / 1e12, 4), "launch_us": round(self.launch_us, 4),
            "matmul_tflop_s": round(self.matmul_flops / 1e12, 2),
            "library_ms": {c: round(v, 4) for c, v in self.library_ms.items()},
            "library_tflop": round(self.library_tflop, 6)}

  @classmethod
  def from_json(cls, record: dict) -> CostModel:
    return cls(record["bandwidth_tb_s"] * 1e12, record["launch_us"], record["matmul_tflop_s"] * 1e12,
               dict(record["library_ms"]), record["library_tflop"])


FITTED_OUT = ("matmul", "attention", "memsets/copies", "idle gaps (device)", "host-to-device copies", "unattributed",
              "copy/layout", "other elementwise", "casts")  # not fitted: matmuls and attention kernels, what the HLO lacks


def _totals(costs: list, library: bool | None = None) -> dict:
  """{category: [launches, bytes, matmul FLOPs]} per step (of library kernels only, or of the others)."""
  out = collections.defaultdict(lambda: [0, 0.0, 0.0])
  for k in costs:
    if library is not None and k.library != library:
      continue
    row = out[k.category]
    row[0] += k.launches
    row[1] += k.launches * k.bytes
    row[2] += k.launches * k.flops
  return dict(out)


def fit(costs: list, measured_ms: dict, library_tflop: float) -> tuple[CostModel, dict]:
  """The CostModel whose predictions best match `measured_ms`, a profile table's ms per step
  of the same program (its attention kernels do `library_tflop` by the model formula): least
  squares of ms = bytes/bandwidth + launches x launch_us over the memory-bound categories; the
  matmul rate from the matmuls' FLOPs and measured time; the library kernels' time per
  category, what its measured time leaves after its other kernels. Also, per fitted category,
  the measured and predicted ms and the prediction of a fit without that category (how well the
  model predicts what it was not fitted to)."""
  import numpy as np

  totals = _totals(costs, library=False)
  names = [c for c in totals if c not in FITTED_OUT and measured_ms.get(c, 0.0) > 0.0]
  if len(names) < 3:
    raise ValueError(f"fitting needs at least 3 memory-bound categories measured and compiled; got {names}")
  design = np.array([[totals[c][1] / 1e9, totals[c][0] / 1e3] for c in names])  # GB, thousands of launches
  target = np.array([measured_ms[c] for c in names])

  def solve(rows):
    return np.linalg.lstsq(design[rows], target[rows], rcond=None)[0]

  ms_per_gb, launch_us = solve(slice(None))
  check = {}
  for n, c in enumerate(names):
    left_out = design[n] @ solve([m for m in range(len(names)) if m != n])
    check[c] = {"measured_ms": measured_ms[c], "predicted_ms": round(float(design[n] @ (ms_per_gb, launch_us)), 4),
                "predicted_ms_left_out": round(float(left_out), 4)}
  matmul_flops = totals.get("matmul", [0, 0, 0.0])[2] / (measured_ms["matmul"] / 1e3) if measured_ms.get("matmul") \
      else 0.0
  model = CostModel(bandwidth=1e12 / ms_per_gb, launch_us=float(launch_us), matmul_flops=matmul_flops,
                    library_tflop=library_tflop)
  others = collections.Counter()
  for k in costs:
    if not k.library and k.category != "matmul":
      others[k.category] += model.kernel_ms(k)
  library = {c for c in _totals(costs, library=True) if measured_ms.get(c)}
  return dataclasses.replace(model, library_ms={c: max(measured_ms[c] - others[c], 0.0) for c in library}), check


def static_table(costs: list, model: CostModel | None = None, library_tflop: float | None = None) -> dict:
  """Per step, by category: kernel launches, GB moved by XLA's kernels (what a library or
  Pallas kernel reads of its operands is unknown: not counted), matmul TFLOP and (with a model)
  predicted ms, the total and the matmul sites; the shape of `table`'s figures.
  `library_tflop`: the step's attention TFLOP by the model formula (the model's library kernels
  scale with them; default the fitted step's)."""
  totals, xla = _totals(costs), _totals(costs, library=False)
  out = {"kernel_launches_per_step": sum(v[0] for v in totals.values()),
         "gb_per_step": round(sum(v[1] for v in xla.values()) / 1e9, 4),
         "matmul_tflop_per_step": round(sum(v[2] for v in totals.values()) / 1e12, 4),
         "by_category": {c: {"launches": v[0], "gb": round(xla.get(c, [0, 0.0])[1] / 1e9, 4),
                             "tflop": round(v[2] / 1e12, 4)}
                         for c, v in sorted(totals.items(), key=lambda x: -xla.get(x[0], [0, 0.0])[1])}}
  if model is not None:
    ms, sites = collections.Counter(), collections.Counter()
    for k in costs:
      if not k.library:
        ms[k.category] += model.kernel_ms(k)
      if k.site:
        sites[k.site] += model.kernel_ms(k)
    for c in _totals(costs, library=True):  # a category's library kernels, as measured, per attention FLOP
      ms[c] += model.library_ms.get(c, 0.0) * (library_tflop or model.library_tflop) / model.library_tflop
    for c, row in out["by_category"].items():
      row["ms"] = round(ms[c], 4)
    out["ms_per_step"] = round(sum(ms.values()), 4)
    out["matmul_sites_ms_per_step"] = {s: round(v, 4) for s, v in sites.most_common()}
  out["largest_kernels"] = _largest(costs, model)
  return out


def _largest(costs: list, model: CostModel | None, count: int = 15) -> list:
  """XLA's kernels of one kind (a fusion's name without its number) and category, the largest
  by predicted ms (or by bytes, without a model): launches, GB and ms per step."""
  groups = collections.defaultdict(lambda: [0, 0.0, 0.0])
  for k in costs:
    if k.library:
      continue
    row = groups[(re.sub(r"\.\d+$", "", k.name), k.category + (f": {k.site}" if k.site else ""))]
    row[0] += k.launches
    row[1] += k.launches * k.bytes
    row[2] += model.kernel_ms(k) if model else 0.0
  ranked = sorted(groups.items(), key=lambda x: -(x[1][2] if model else x[1][1]))[:count]
  return [{"kernel": name, "category": category, "launches_per_step": n, "gb_per_step": round(b / 1e9, 4),
           **({"ms_per_step": round(ms, 4)} if model else {})} for (name, category), (n, b, ms) in ranked]


def device_events(trace: dict) -> list:
  """The trace's op events on the accelerator (a process named /device:...), or on a CPU the
  XLA thunks (events that carry an hlo_op), each with its stream's name."""
  meta = [e for e in trace["traceEvents"] if e.get("ph") == "M"]
  processes = {e["pid"]: e["args"]["name"] for e in meta if e["name"] == "process_name"}
  streams = {(e["pid"], e.get("tid")): e["args"]["name"] for e in meta if e["name"] == "thread_name"}
  device = {pid for pid, name in processes.items() if name.startswith("/device:")}
  out = []
  for e in trace["traceEvents"]:
    if e.get("ph") != "X" or (device and e["pid"] not in device) or (not device and "hlo_op" not in e.get("args", {})):
      continue
    out.append(e | {"stream": streams.get((e["pid"], e.get("tid")), "")})
  return out


def from_folder(folder: pathlib.Path, steps: int) -> dict:
  traces = sorted(folder.glob("trace/plugins/profile/*/perfetto_trace.json.gz"))
  if not traces:
    raise FileNotFoundError(f"no perfetto_trace.json.gz under {folder}/trace")
  with gzip.open(traces[-1]) as f:
    trace = json.load(f)
  return table(device_events(trace), parse_hlo((folder / "train_step.hlo.txt").read_text()), steps)


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--profile", type=pathlib.Path, required=True, help="one layout's folder of profile_capture")
  parser.add_argument("--steps", type=int, default=5, help="steps in the trace")
  parser.add_argument("--out", default="")
  args = parser.parse_args()
  result = from_folder(args.profile, args.steps)
  text = json.dumps(result, indent=1)
  if args.out:
    pathlib.Path(args.out).write_text(text + "\n")
  print(text)


if __name__ == "__main__":
  main()
