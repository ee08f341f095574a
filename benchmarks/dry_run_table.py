"""The tables of docs/scaling.md: `train.py --dry_run` for wmt14_base and wmt14_big on
8-device meshes, in f32 and bf16, with the fit in 16, 32 and 80 GiB per device.

  python benchmarks/dry_run_table.py --out=benchmarks/results/dry_run_wmt14.json   # ~10 min on 2 CPU cores
  python benchmarks/dry_run_table.py --dtypes=bfloat16 --meshes="8,1,1;1,8,1" --loss_chunks=0,32 \
      --out=benchmarks/results/dry_run_loss_chunk.json                            # train.loss_chunk's memory

Each case is a fresh `python train.py --config=... --dry_run` process (fake CPU devices),
so the figures are exactly what a user gets from that command.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import subprocess
import sys

REPO = pathlib.Path(__file__).resolve().parents[1]
MESHES = ((8, 1, 1), (1, 8, 1), (2, 4, 1), (2, 2, 2), (1, 4, 2))
MEMORY_GIB = (16, 32, 80)


def plan(config: str, mesh, dtype: str, peak_tflops: float, extra=()) -> dict:
  data, fsdp, tensor = mesh
  args = [sys.executable, "train.py", f"--config=configs/{config}.py", "--workdir=/nonexistent", "--dry_run",
          f"--config.mesh.data={data}", f"--config.mesh.fsdp={fsdp}", f"--config.mesh.tensor={tensor}",
          f"--config.model.dtype={dtype}", f"--peak_tflops={peak_tflops}", *extra]
  out = subprocess.run(args, cwd=REPO, capture_output=True, text=True, timeout=1800)
  lines = [line for line in out.stdout.splitlines() if line.startswith("{")]
  if out.returncode or not lines:
    raise SystemExit(f"{' '.join(args)} failed:\n{out.stderr[-3000:]}")
  return json.loads(lines[-1])


def markdown(rows: list[dict]) -> str:
  head = ("| config | tokens/batch | dtype | mesh (data, fsdp, tensor) | params + Adam GiB | temporaries GiB | total GiB | "
          + " | ".join(f"fits {m} GiB" for m in MEMORY_GIB) + " | TFLOP/step/device (XLA / formula) |")
  lines = [head, "|" + "---|" * (head.count("|") - 1)]
  for r in rows:
    mesh = ", ".join(str(r["mesh"][a]) for a in ("data", "fsdp", "tensor"))
    fits = " | ".join("yes" if r["total_gib"] <= m else "no" for m in MEMORY_GIB)
    lines.append(f"| {r['config']} | {r['max_tokens']} | {r['dtype']} | {mesh} | {(r['param_bytes'] + r['opt_state_bytes']) / 2**30:.2f} | "
                 f"{r['temp_bytes'] / 2**30:.2f} | {r['total_gib']:.2f} | {fits} | "
                 f"{r['flops_xla'] / 1e12:.2f} / {r['flops_model'] / 1e12:.2f} |")
  return "\n".join(lines)


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--configs", default="wmt14_base,wmt14_big")
  parser.add_argument("--dtypes", default="bfloat16,float32")
  parser.add_argument("--peak_tflops", type=float, default=989.0, help="per device (default: H100 SXM dense bf16)")
  parser.add_argument("--max_tokens", default="", help="comma-separated data.max_tokens values (default: the config's)")
  parser.add_argument("--loss_chunks", default="", help="comma-separated train.loss_chunk values (default: the config's)")
  parser.add_argument("--meshes", default=";".join(",".join(map(str, m)) for m in MESHES),
                      help="data,fsdp,tensor sizes, ';' between meshes (default: the docs' five)")
  parser.add_argument("--out", default="")
  args = parser.parse_args()
  meshes = [tuple(int(x) for x in m.split(",")) for m in args.meshes.split(";")]
  rows = []
  for config in args.configs.split(","):
    for dtype in args.dtypes.split(","):
      for max_tokens in (args.max_tokens.split(",") if args.max_tokens else [""]):
        for chunk in (args.loss_chunks.split(",") if args.loss_chunks else [""]):
          for mesh in meshes:
            extra = [f"--config.data.max_tokens={max_tokens}"] if max_tokens else []
            extra += [f"--config.train.loss_chunk={chunk}"] if chunk else []
            row = plan(config, mesh, dtype, args.peak_tflops, extra)
            rows.append({"config": config, "max_tokens": max_tokens or "config"}
                        | ({"loss_chunk": int(chunk)} if chunk else {}) | row)
            print(markdown(rows[-1:]).splitlines()[-1], flush=True)
  print(markdown(rows))
  if args.out:
    pathlib.Path(args.out).write_text(json.dumps(rows, indent=1) + "\n")


if __name__ == "__main__":
  main()
