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
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import gzip
import json
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
                "Embed.attend": "vocabulary projection", "Transformer._logits": "vocabulary projection"}
ATTENTION = ("attention", "flash_attention", "explicit_attention", "single_query_attention", "dot_product_attention",
             "splash_attention", "_per_device", "_flash_fwd", "_flash_bwd", "cudnn_attention")
# Python functions -> category: the first function of the stack (innermost first) that contains a name.
CATEGORIES = (
    (("keep_mask", "dropout", "_fmix32", "fold"), "dropout"),
    (("cross_entropy", "_xent", "_token_stats", "_stats_in_one_pass", "label_smooth", "Embed.attend", "_logits"),
     "loss and logits (softmax, casts)"),
    (("scale_by_", "apply_gradients", "apply_updates", "tree_", "clip", "safe_increment", "schedule"), "optimizer"),
    (("Norm.__call__", "layer_norm", "rms_norm", "adanorm"), "norm"),
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


def categorize(inst: Instruction | None, kernel: str) -> tuple[str, str]:
  """(category, matmul site or "") of a kernel and the instruction that launched it."""
  if inst is None:
    if kernel.startswith(("nvjet", "sm90_xmma", "sm80_xmma", "cutlass", "ampere_", "gemm")):
      return "matmul", "unattributed"
    return ("copy/layout", "") if "memcpy" in kernel or "copy" in kernel else ("unattributed", "")
  op = inst.op_name.rsplit("/", 1)[-1]
  matmul = op in ("dot_general", "dot") or kernel.startswith(("nvjet", "gemm_fusion", "sm90_xmma", "cutlass")) or \
      inst.name.startswith("gemm_fusion")
  for function in inst.functions:  # innermost first
    if function in ATTENTION or function.startswith(("flash_attention.", "_flash")):
      return "attention", ""
    if matmul and function in MATMUL_SITES:
      return "matmul", MATMUL_SITES[function] + (" (backward)" if "transpose(" in inst.op_name else "")
    for names, category in CATEGORIES:
      if any(name in function for name in names):
        return category, ""
  if matmul:
    return "matmul", "other"
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
