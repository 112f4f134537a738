"""Time and peak memory of reading compressed bombs as a prompt set (issue 30): each file read by
load_prompts in a fresh process whose address space is capped (--cap-gib), so that a reader
without bounds fails there instead of filling the machine. Prints one JSON line per file:
the outcome, seconds, and the peak resident memory above the process before the read.

    .venv/bin/python bench/data_bomb_bench.py [--cap-gib 4]
"""
from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

MIB = 1 << 20
CHILD = """
import json, re, sys, time
from pop_analysis.data.prompts import load_prompts
hwm = lambda: int(re.search(r"VmHWM:\\s+(\\d+)", open("/proc/self/status").read())[1]) << 10
base, t0 = hwm(), time.perf_counter()
try:
    line = f"loaded {len(load_prompts(sys.argv[1], limit=int(sys.argv[2])))} prompts"
except BaseException as e:
    line = f"{type(e).__name__}: {e}"
print(json.dumps({"outcome": line[:200], "seconds": round(time.perf_counter() - t0, 2),
                  "peak_mib_above": round((hwm() - base) / 2 ** 20)}))
"""


def files(folder: Path) -> dict[str, tuple[Path, int]]:
    """name -> (file, prompts asked for): the shapes of bomb the readers must bound."""
    one = pa.array(["a" * (64 * MIB)])  # one 64 MiB value that 64 rows reference: 4 GiB of text
    index = pa.DictionaryArray.from_arrays(pa.array([0] * 64, pa.int32()), one)
    pq.write_table(pa.table({"prompt": index}), folder / "dictionary.parquet", compression="zstd")
    schema = pa.schema([("prompt", pa.string())])  # 48 rows of 32 MiB in one row group: 1.5 GiB
    with pq.ParquetWriter(folder / "plain.parquet", schema, compression="zstd",
                          use_dictionary=False) as w:
        w.write_table(pa.concat_tables([pa.table({"prompt": ["b" * (32 * MIB)] * 4})] * 12),
                      row_group_size=48)
    lists = folder / "lists.jsonl"  # one record of 16 MB, the line bound: 5.6M empty lists
    lists.write_text('{"prompt": "x", "pad": [' + ",".join(["[]"] * (16 * MIB // 3 - 20)) + "]}\n")
    return {"parquet, dictionary page (4 GiB of text)": (folder / "dictionary.parquet", 16),
            "parquet, plain pages, one row group (1.5 GiB)": (folder / "plain.parquet", 16),
            "jsonl, one 16 MB record of empty lists": (lists, 1)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cap-gib", type=float, default=4.0, help="address space of each reader")
    args = ap.parse_args()
    cap = int(args.cap_gib * (1 << 30))
    rows = []
    with tempfile.TemporaryDirectory() as d:
        for name, (path, limit) in files(Path(d)).items():
            out = subprocess.run([sys.executable, "-c", CHILD, str(path), str(limit)],
                                 capture_output=True, text=True, preexec_fn=lambda: resource.setrlimit(
                                     resource.RLIMIT_AS, (cap, cap)))
            got = json.loads(out.stdout) if out.returncode == 0 else {"crashed": out.stderr[-300:]}
            rows.append({"file": name, "bytes": path.stat().st_size, **got})
            print(json.dumps(rows[-1]), flush=True)
    from bench_results import save

    save("data_bomb_bench", args, {"rows": rows}, show=False)


if __name__ == "__main__":
    main()
