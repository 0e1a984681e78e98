#!/usr/bin/env python3
"""llama.cpp's block formats in rotary (core/include/rotary/ggml_quants.h) against llama.cpp's own code:

1. quantizers: float32 rows (several seeds; normal values, outliers, all-zero blocks, values near and inside f16's
   subnormal range, one sign only, constant blocks, scales near f16's largest, mixed magnitudes) quantized by rotary
   (tests/gguf_oracle/ggml_quants_dump.cpp) and by gguf-py's gguf.quants.quantize (Q8_0, Q4_0, Q4_1, Q5_0, Q5_1,
   F16, BF16: the types gguf-py can quantize), byte for byte;
2. the float64 dequantization reference: random bytes of every type (f16 / bf16 / f32 fields with their infinity
   and NaN exponents masked out; some scales forced to f16 subnormals, the largest finite half and negatives), and
   the blocks rotary's quantizers wrote, decoded by rotary and by gguf-py's gguf.quants.dequantize (float32):
   rotary's value rounded once to float32 must equal gguf-py's bit for bit (every product in these formats is exact
   in float32, so gguf-py rounds at most once, in the min's addition or subtraction of Q4_1 / Q5_1 / Q4_K / Q5_K, and
   so does the reference's rounding);
3. llama.cpp's C: the unpacked tree's ggml/src/ggml-quants.c, compiled here with tests/gguf_oracle/llama_quants.c by
   the system C compiler ($CC or cc; -O2 -DNDEBUG -ffp-contract=off, as llama.cpp's release ggml-base builds on
   x86-64: no asserts, no FMA): quantize_row_{q4_0,q4_1,q5_0,q5_1,q8_0,q4_K,q5_K,q6_K}_ref against rotary's
   quantizers byte for byte on the rows of part 1, and dequantize_row_* against the reference rounded to float32 bit
   for bit on the blocks of part 2.

    ROTARY_GGUF_PY=/path/to/llama.cpp/gguf-py /usr/bin/python3 tests/gguf_oracle/test_ggml_quants_oracle.py \\
        build/tests/core_ggml_quants_dump

gguf-py comes from ROTARY_GGUF_PY or the llama.cpp source scripts/setup.sh unpacks into tests/gguf_oracle/llama.cpp
(gguf_py_setup.py, as for test_gguf_oracle.py); without it, or without numpy, the test prints why and exits 77
(skipped, never passed). Part 3 needs ggml/src/ggml-quants.c beside that gguf-py directory (a whole llama.cpp tree);
where there is none the test says so on its last line and part 3 is not run. A compiler error in part 3 is a
failure.
"""
import atexit
import os
import shutil
import subprocess
import sys
import tempfile

from gguf_py_setup import start_oracle

QUANT_TYPES = ["Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q4_K", "Q5_K", "Q6_K"]
ALL_TYPES = QUANT_TYPES + ["F32", "F16", "BF16"]
GGUF_PY_QUANTIZES = ["Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "F16", "BF16"]


def main():
    dump_tool, gguf, np, gguf_py = start_oracle("test_ggml_quants_oracle.py GGML_QUANTS_DUMP")
    from gguf import GGMLQuantizationType as Q

    failures = []
    tmp = tempfile.mkdtemp(prefix="ggml_quants_oracle_")
    atexit.register(shutil.rmtree, tmp, True)

    def expect(ok, what):
        if not ok:
            failures.append(what)

    def run(tool, mode, qtype, data, out_dtype):
        src, dst = os.path.join(tmp, "in.bin"), os.path.join(tmp, "out.bin")
        data.tofile(src)
        p = subprocess.run([tool, mode, qtype, src, dst], capture_output=True, text=True)
        if p.returncode != 0:
            raise RuntimeError(f"{os.path.basename(tool)} {mode} {qtype}: exit {p.returncode}: {p.stderr.strip()}")
        return np.fromfile(dst, dtype=out_dtype)

    def first_difference(a, b):
        diff = np.flatnonzero(a != b)
        return f"{diff.size} differ, first at {diff[0]}: {a[diff[0]]} vs {b[diff[0]]}" if diff.size else ""

    # ---- Float rows: one per kind, each 8 super-blocks (2048 values; a multiple of every block size) ----
    n = 2048

    def rows_for(seed):
        rng = np.random.default_rng(seed)
        normal = lambda: rng.standard_normal(n)  # noqa: E731
        rows = {"normal": normal()}
        outliers = normal()
        outliers[rng.choice(n, 24, replace=False)] *= 100  # a few per block
        rows["outliers"] = outliers
        zero_blocks = normal()
        for b in rng.choice(n // 32, 16, replace=False):  # whole 32-blocks and one whole super-block zero
            zero_blocks[32 * b:32 * b + 32] = 0
        zero_blocks[256:512] = 0
        rows["zero_blocks"] = zero_blocks
        rows["f16_subnormal"] = normal() * 2.0**-24 * 20      # scales (d = max / 127, / 63 ...) f16 subnormal
        rows["f16_min_normal"] = normal() * 2.0**-14          # around the smallest normal half
        rows["tiny_mixed"] = normal() * 10.0 ** rng.uniform(-9, -3, n)
        rows["mixed_magnitudes"] = normal() * np.repeat(10.0 ** rng.uniform(-4, 4, n // 32), 32)
        rows["positive"] = np.abs(normal()) + 0.5             # the k-quants' min clamped at 0
        rows["negative"] = -np.abs(normal()) - 0.5
        rows["constant"] = np.repeat(rng.standard_normal(n // 32), 32)  # max == min per sub-block
        rows["large"] = normal() * 3e5                        # k-quant scales past f16's largest half
        rows["huge"] = normal() * 1e7                         # Q8_0 / Q4_0 / Q5_0 ... scales past it too
        rows["integers"] = rng.integers(-8, 8, n).astype(np.float64)
        ties = np.zeros(n)
        ties[::32] = 3.0
        ties[1::32] = -3.0                                    # equal magnitudes of both signs: the first wins
        ties[2::32] = 1.5
        rows["ties"] = ties
        rows["one_per_block"] = np.where(np.arange(n) % 37 == 0, normal(), 0.0)
        return {k: v.astype(np.float32) for k, v in rows.items()}

    seeds = (46, 2024, 7)
    all_rows = [(f"seed {s} {kind}", row) for s in seeds for kind, row in rows_for(s).items()]

    # ---- 1. quantizers against gguf-py ----
    compared = 0
    for label, row in all_rows:
        for qtype in GGUF_PY_QUANTIZES:
            ours = run(dump_tool, "quantize", qtype, row, np.uint8)
            with np.errstate(over="ignore"):  # scales past f16's largest half: infinity, in gguf-py as in rotary
                theirs = np.ascontiguousarray(gguf.quants.quantize(row.reshape(1, -1), Q[qtype])).view(np.uint8)
            theirs = theirs.ravel()
            expect(ours.size == theirs.size and not first_difference(ours, theirs),
                   f"quantize {qtype} {label}: rotary's bytes differ from gguf-py's "
                   f"({first_difference(ours, theirs) if ours.size == theirs.size else 'sizes differ'})")
            compared += 1
    print(f"1. quantizers: {compared} rows ({len(all_rows)} kinds x {', '.join(GGUF_PY_QUANTIZES)}) byte for byte "
          f"as gguf-py's")

    # ---- Random blocks: every f16 / bf16 / f32 field finite ----
    rng = np.random.default_rng(4646)
    n_blocks = 512

    def f16_fields(qtype):  # byte offsets of the f16 fields in a block
        return {"Q4_0": [0], "Q4_1": [0, 2], "Q5_0": [0], "Q5_1": [0, 2], "Q8_0": [0], "Q4_K": [0, 2], "Q5_K": [0, 2],
                "Q6_K": [208], "F16": [0]}.get(qtype, [])

    def random_blocks(qtype):
        block, size = gguf.GGML_QUANT_SIZES[Q[qtype]]
        count = n_blocks if block > 1 else n_blocks * 32
        b = rng.integers(0, 256, (count, size), dtype=np.uint8)
        for off in f16_fields(qtype):
            h = b[:, off:off + 2].copy().view(np.uint16).ravel()
            h = np.where((h & 0x7C00) == 0x7C00, h & ~np.uint16(0x4000), h).astype(np.uint16)  # exponent 31 -> 15
            special = np.array([0x0001, 0x03FF, 0x8001, 0x0200, 0x7BFF, 0xFBFF, 0x0400, 0x0000, 0x8000], np.uint16)
            h[:special.size] = special  # subnormals, largest finite, smallest normal, signed zeros
            b[:, off:off + 2] = h.view(np.uint8).reshape(-1, 2)
        if qtype == "BF16":
            h = b.copy().view(np.uint16).ravel()
            b = np.where((h & 0x7F80) == 0x7F80, h & ~np.uint16(0x4000), h).astype(np.uint16).view(np.uint8)
        if qtype == "F32":
            w = b.copy().view(np.uint32).ravel()
            b = np.where((w & 0x7F800000) == 0x7F800000, w & ~np.uint32(0x40000000), w).astype(np.uint32)
            b = b.view(np.uint8)
        return np.ascontiguousarray(b).ravel()

    blocks_of = {qtype: random_blocks(qtype) for qtype in ALL_TYPES}
    # And the bytes rotary's quantizers wrote for the rows above (real blocks, all in range).
    quantized_rows = {qtype: [run(dump_tool, "quantize", qtype, row, np.uint8) for _, row in all_rows[:6]]
                      for qtype in QUANT_TYPES}

    # ---- 2. the reference against gguf-py's dequantize ----
    for qtype in ALL_TYPES:
        for label, data in [("random bytes", blocks_of[qtype])] + [
                (f"rotary's blocks of {all_rows[i][0]}", q) for i, q in enumerate(quantized_rows.get(qtype, []))]:
            ours64 = run(dump_tool, "dequantize", qtype, data, np.float64)
            ours = ours64.astype(np.float32)
            theirs = np.asarray(gguf.quants.dequantize(data, Q[qtype]), dtype=np.float32).ravel()
            expect(ours.size == theirs.size, f"dequantize {qtype} {label}: {ours.size} values, gguf-py {theirs.size}")
            if ours.size == theirs.size:
                d = first_difference(ours.view(np.uint32), theirs.view(np.uint32))
                expect(not d, f"dequantize {qtype} {label}: float32 bits differ from gguf-py's ({d})")
            expect(np.all(np.isfinite(ours64)), f"dequantize {qtype} {label}: a non-finite value from finite fields")
    print(f"2. reference: {', '.join(ALL_TYPES)} ({n_blocks} random blocks each, and rotary's own blocks) rounded "
          f"to float32 bit for bit as gguf-py's dequantize")

    # ---- 3. llama.cpp's C reference ----
    ggml_dir = os.path.join(os.path.dirname(os.path.abspath(gguf_py)), "ggml")
    quants_c = os.path.join(ggml_dir, "src", "ggml-quants.c")
    c_note = ""
    if not os.path.isfile(quants_c):
        c_note = (f"3. llama.cpp's C: NOT RUN - no {quants_c} beside gguf-py (a whole llama.cpp tree, as "
                  f"scripts/setup.sh unpacks, has it)")
    else:
        cc = os.environ.get("CC", "cc")
        driver = os.path.join(os.path.dirname(os.path.abspath(__file__)), "llama_quants.c")
        llama_tool = os.path.join(tmp, "llama_quants")
        inc = [f"-I{os.path.join(ggml_dir, 'include')}", f"-I{os.path.join(ggml_dir, 'src')}"]
        flags = ["-O2", "-DNDEBUG", "-std=gnu11", "-ffp-contract=off"]
        p = subprocess.run([cc, *flags, *inc, "-o", llama_tool, driver, quants_c, "-lm"],
                           capture_output=True, text=True)
        if p.returncode != 0:
            failures.append(f"compiling llama.cpp's ggml-quants.c with {cc}: {p.stderr.strip()[-2000:]}")
        else:
            for qtype in QUANT_TYPES:
                for label, row in all_rows:
                    ours = run(dump_tool, "quantize", qtype, row, np.uint8)
                    theirs = run(llama_tool, "quantize", qtype, row, np.uint8)
                    d = first_difference(ours, theirs) if ours.size == theirs.size else "sizes differ"
                    expect(not d, f"quantize {qtype} {label}: rotary's bytes differ from llama.cpp's ({d})")
                for label, data in [("random bytes", blocks_of[qtype])] + [
                        (f"rotary's blocks {i}", q) for i, q in enumerate(quantized_rows[qtype])]:
                    ours = run(dump_tool, "dequantize", qtype, data, np.float64).astype(np.float32)
                    theirs = run(llama_tool, "dequantize", qtype, data, np.float32)
                    d = first_difference(ours.view(np.uint32), theirs.view(np.uint32)) \
                        if ours.size == theirs.size else "sizes differ"
                    expect(not d, f"dequantize {qtype} {label}: float32 bits differ from llama.cpp's ({d})")
            c_note = (f"3. llama.cpp's C ({quants_c}, {cc}): quantize_row_*_ref byte for byte on {len(all_rows)} "
                      f"rows x {', '.join(QUANT_TYPES)}; dequantize_row_* bit for bit on every block set")

    for f in failures:
        print("FAILED:", f)
    print(c_note)
    print("ggml quants oracle:", "FAILED" if failures else "passed", f"({len(failures)} differences)")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
