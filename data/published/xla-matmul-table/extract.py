"""Rebuild ``matmul.jsonl`` from OpenXLA's GEMM performance table.

    git -C XLA show 71feeddf7cc3c9c7878eee18ea43c983631e6e84:xla/service/gpu/model/matmul_interpolator_data.h \
        > table.h && python extract.py table.h > matmul.jsonl

The file embeds a text protobuf: per device key (``sm_90``, ``sm_100``) entries of
``b, m, n, k`` and ``flops {key: "<lhs>x<rhs>-><out>" value: FLOP/s}``. Rows are written sorted
(GPU, dtype, b, m, n, k); ``time_s`` is 2 b m n k over the FLOP rate.
"""

import json
import re
import sys

GPUS = {"sm_90": "H100-SXM-80GB", "sm_100": "B200"}
DTYPES = {"bf16xbf16->bf16": "bf16", "f8e4m3fnxf8e4m3fn->bf16": "fp8"}


def entries(text: str, key: str) -> list[dict]:
    m = re.search(r'key: "' + key + r'"\s*value \{', text)
    i, depth = m.end(), 1
    while depth:
        depth += {"{": 1, "}": -1}.get(text[i], 0)
        i += 1
    body = text[m.end():i - 1]
    out = []
    for e in re.finditer(r"entries \{\s*b: (\d+)\s*m: (\d+)\s*n: (\d+)\s*k: (\d+)(.*?)\n      \}",
                         body, re.S):
        b, mm, n, k = map(int, e.groups()[:4])
        for name, v in re.findall(r'key: "([^"]+)"\s*value: (\d+)', e.group(5)):
            if name in DTYPES:
                out.append({"b": b, "m": mm, "n": n, "k": k, "dtype": DTYPES[name],
                            "flops_per_s": int(v)})
    return out


def main(path: str) -> None:
    text = open(path).read()
    rows = []
    for key, gpu in GPUS.items():
        for r in entries(text, key):
            fl = 2 * r["b"] * r["m"] * r["n"] * r["k"]
            rows.append({"gpu": gpu, "xla_key": key, "dtype": r["dtype"], "b": r["b"],
                         "m": r["m"], "n": r["n"], "k": r["k"],
                         "tflops": round(r["flops_per_s"] / 1e12, 3),
                         "time_s": float(f"{fl / r['flops_per_s']:.6g}")})
    rows.sort(key=lambda r: (r["gpu"], r["dtype"], r["b"], r["m"], r["n"], r["k"]))
    for r in rows:
        print(json.dumps(r))


if __name__ == "__main__":
    main(sys.argv[1])
