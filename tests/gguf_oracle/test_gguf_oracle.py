#!/usr/bin/env python3
"""The GGUF reader (core/include/rotary/gguf.h) against gguf-py, llama.cpp's own Python package: files written by
gguf-py's GGUFWriter - metadata of every value type (each scalar type, strings, arrays of each, nested arrays),
tensors of F32, F16, BF16, Q8_0 and Q4_0 (quantized by gguf-py's quantizer), Q4_K and Q6_K (raw blocks), with the
default alignment and with general.alignment = 64 - are read by rotary (tests/gguf_oracle/gguf_dump.cpp prints what
it read as JSON) and compared with what was written and with what gguf-py's GGUFReader reads: every key, type and
value, every tensor's type, dims, row-major shape, offset, size and bytes. rotary's table of ggml types (block size,
bytes per block) is compared with gguf-py's GGML_QUANT_SIZES, and a gguf-py file cut short is refused.

    ROTARY_GGUF_PY=/path/to/llama.cpp/gguf-py /usr/bin/python3 tests/gguf_oracle/test_gguf_oracle.py build/tests/core_gguf_dump

gguf-py is not part of this repository: its path comes from ROTARY_GGUF_PY (a llama.cpp source tree's gguf-py
directory; docs/checkpoints.md says how to get the one llama.cpp release we compare with, from the node-llama-cpp
npm package), else the tree scripts/setup.sh unpacks (gguf_py_setup.py). Without it, or without numpy, the test
prints why and exits 77, which ctest reports as skipped - never as passed. A wrong path is a failure.
"""
import json
import os
import subprocess
import sys
import tempfile

from gguf_py_setup import start_oracle


def main():
    dump_tool, gguf, np, _ = start_oracle("test_gguf_oracle.py GGUF_DUMP")
    from gguf import GGMLQuantizationType as Q, GGUFValueType as V

    failures = []

    def expect(ok, what):
        if not ok:
            failures.append(what)

    def run_dump(arg):
        p = subprocess.run([dump_tool, arg], capture_output=True, text=True)
        return p.returncode, (json.loads(p.stdout) if p.returncode == 0 else None), p.stderr.strip()

    # ---- The type table ----
    rc, types, err = run_dump("--types")
    assert rc == 0, err
    for tid, (name, block, size) in types.items():
        qt = Q(int(tid))
        expect(qt.name == name, f"type {tid}: rotary {name}, gguf-py {qt.name}")
        expect(tuple(gguf.GGML_QUANT_SIZES[qt]) == (block, size),
               f"type {name}: rotary ({block}, {size}), gguf-py {gguf.GGML_QUANT_SIZES[qt]}")
    not_read = [q.name for q in Q if str(int(q)) not in types]
    print(f"types: {len(types)} read by rotary agree with gguf-py's GGML_QUANT_SIZES; not read: {', '.join(not_read)}")

    # ---- A file of every value type and tensor type ----
    rng = np.random.default_rng(46)
    f32 = np.float32
    metadata = [  # key, GGUF value type, value, array element type
        ("t.u8", V.UINT8, 255, None), ("t.i8", V.INT8, -128, None), ("t.u16", V.UINT16, 65535, None),
        ("t.i16", V.INT16, -32768, None), ("t.u32", V.UINT32, 2**32 - 1, None), ("t.i32", V.INT32, -2**31, None),
        ("t.u64", V.UINT64, 2**64 - 1, None), ("t.i64", V.INT64, -2**63, None),
        ("t.f32", V.FLOAT32, 0.1, None), ("t.f64", V.FLOAT64, 0.1, None), ("t.true", V.BOOL, True, None),
        ("t.false", V.BOOL, False, None), ("t.str", V.STRING, "Qwen2.5 \u2014 0.5B \u65e5\u672c", None),
        ("t.a.u8", V.ARRAY, [0, 7, 255], V.UINT8), ("t.a.i8", V.ARRAY, [-1, 127], V.INT8),
        ("t.a.u16", V.ARRAY, [1, 65535], V.UINT16), ("t.a.i16", V.ARRAY, [-2, 300], V.INT16),
        ("t.a.u32", V.ARRAY, [3, 4000000000], V.UINT32), ("t.a.i32", V.ARRAY, [-5, 0, 5], V.INT32),
        ("t.a.u64", V.ARRAY, [2**60], V.UINT64), ("t.a.i64", V.ARRAY, [-2**60, 9], V.INT64),
        ("t.a.f32", V.ARRAY, [0.5, -1.25, 3e38], V.FLOAT32), ("t.a.f64", V.ARRAY, [1e300, -0.0], V.FLOAT64),
        ("t.a.bool", V.ARRAY, [True, False, True], V.BOOL),
        ("tokenizer.ggml.tokens", V.ARRAY, ["<unk>", "<s>", "\u0120the", ""], V.STRING),
        ("tokenizer.ggml.scores", V.ARRAY, [0.0, -1.5, -2.25, -3.0], V.FLOAT32),
        ("tokenizer.ggml.token_type", V.ARRAY, [2, 3, 1, 1], V.INT32),
        ("t.nested", V.ARRAY, [[1, 2], [3]], V.ARRAY), ("t.nested.str", V.ARRAY, [["a"], ["b", "c"]], V.ARRAY),
    ]
    x = lambda *shape: rng.standard_normal(shape).astype(np.float32)  # noqa: E731
    tensors = [  # name, array as written (quantized: uint8 blocks), ggml type
        ("token_embd.weight", x(3, 64), Q.F32), ("blk.0.attn_norm.weight", x(5).astype(np.float16), Q.F16),
        ("blk.0.cube", x(2, 3, 32), Q.F32), ("blk.0.attn_q.weight", gguf.quants.quantize(x(4, 64), Q.Q8_0), Q.Q8_0),
        ("blk.0.attn_k.weight", gguf.quants.quantize(x(2, 128), Q.Q4_0), Q.Q4_0),
        ("blk.0.attn_v.weight", gguf.quants.quantize(x(2, 32), Q.BF16), Q.BF16),
        ("blk.0.ffn_up.weight", rng.integers(0, 256, (2, 144), dtype=np.uint8), Q.Q4_K),
        ("blk.0.ffn_down.weight", rng.integers(0, 256, (1, 420), dtype=np.uint8), Q.Q6_K),
    ]

    def logical_shape(arr, qtype):
        if arr.dtype == np.uint8:  # a quantized type's blocks, a row's bytes last (as gguf-py's quantizer gives them)
            block, size = gguf.GGML_QUANT_SIZES[qtype]
            return list(arr.shape[:-1]) + [arr.shape[-1] // size * block]
        return list(arr.shape)  # bf16 comes as uint16 bit patterns, one per value

    def expected_value(vtype, value, elem):
        if vtype == V.STRING:
            return {"type": "string", "hex": value.encode("utf-8").hex()}
        if vtype == V.ARRAY:  # gguf-py types a nested array's items by their first element
            items = [expected_value(elem, item, V.get_type(item[0]) if elem == V.ARRAY else None) for item in value]
            return {"type": "array", "elem": type_name(elem), "items": items}
        if vtype == V.FLOAT32:
            value = float(f32(value))
        return {"type": type_name(vtype), "value": value}

    def type_name(v):
        return {V.UINT8: "uint8", V.INT8: "int8", V.UINT16: "uint16", V.INT16: "int16", V.UINT32: "uint32",
                V.INT32: "int32", V.FLOAT32: "float32", V.BOOL: "bool", V.STRING: "string", V.ARRAY: "array",
                V.UINT64: "uint64", V.INT64: "int64", V.FLOAT64: "float64"}[v]

    with tempfile.TemporaryDirectory() as tmp:
        for alignment in (None, 64):
            path = os.path.join(tmp, f"oracle_{alignment or 32}.gguf")
            w = gguf.GGUFWriter(path, arch="llama")
            if alignment:
                w.add_custom_alignment(alignment)
            for key, vtype, value, elem in metadata:
                w.add_key_value(key, value, vtype, sub_type=elem)
            for name, arr, qtype in tensors:
                if qtype in (Q.F32, Q.F16):
                    w.add_tensor(name, arr)
                else:
                    w.add_tensor(name, arr, raw_dtype=qtype)
            w.write_header_to_file()
            w.write_kv_data_to_file()
            w.write_tensors_to_file()
            w.close()

            rc, got, err = run_dump(path)
            if rc != 0:
                failures.append(f"{path}: rotary refused gguf-py's file: {err}")
                continue
            label = f"alignment {alignment or 32}"
            expect(got["alignment"] == (alignment or 32), f"{label}: alignment {got['alignment']}")
            want_meta = [("general.architecture", {"type": "string", "hex": b"llama".hex()})]
            if alignment:
                want_meta.append(("general.alignment", {"type": "uint32", "value": alignment}))
            want_meta += [(k, expected_value(t, v, e)) for k, t, v, e in metadata]
            got_meta = [(m["key"], m["value"]) for m in got["metadata"]]
            expect([k for k, _ in got_meta] == [k for k, _ in want_meta],
                   f"{label}: keys {[k for k, _ in got_meta]} != {[k for k, _ in want_meta]}")
            for (k, gv), (_, wv) in zip(got_meta, want_meta):
                expect(gv == wv, f"{label}: {k}: rotary read {gv}, gguf-py wrote {wv}")
            expect(len(got["tensors"]) == len(tensors), f"{label}: {len(got['tensors'])} tensors")
            # gguf-py's own reader: tensor offsets, dims, sizes and field types.
            reader = gguf.GGUFReader(path)
            read_by_py = {t.name: t for t in reader.tensors}
            for t, (name, arr, qtype) in zip(got["tensors"], tensors):
                shape = logical_shape(arr, qtype)
                expect(t["name"] == name, f"{label}: tensor {t['name']} != {name}")
                expect(t["type"] == qtype.name, f"{label}: {name}: type {t['type']} != {qtype.name}")
                expect(t["shape"] == shape, f"{label}: {name}: shape {t['shape']} != {shape}")
                expect(t["dims"] == shape[::-1], f"{label}: {name}: dims {t['dims']} != {shape[::-1]}")
                expect(t["bytes"] == arr.nbytes, f"{label}: {name}: {t['bytes']} bytes != {arr.nbytes}")
                expect(t["hex"] == arr.tobytes().hex(), f"{label}: {name}: bytes differ from what gguf-py wrote")
                expect(t["offset"] % (alignment or 32) == 0, f"{label}: {name}: offset {t['offset']}")
                py = read_by_py[name]
                expect(got["data_offset"] + t["offset"] == py.data_offset,
                       f"{label}: {name}: at {got['data_offset'] + t['offset']}, GGUFReader at {py.data_offset}")
                expect([int(d) for d in py.shape] == t["dims"], f"{label}: {name}: GGUFReader dims {list(py.shape)}")
                expect(int(py.n_bytes) == t["bytes"], f"{label}: {name}: GGUFReader {py.n_bytes} bytes")
                expect(py.tensor_type == qtype, f"{label}: {name}: GGUFReader type {py.tensor_type}")
            for m in got["metadata"]:
                field = reader.fields.get(m["key"])
                if field is None:
                    failures.append(f"{label}: GGUFReader has no {m['key']}")
                    continue
                want_types = [type_name(V(t)) for t in field.types]
                v, ours = m["value"], []
                while True:
                    ours.append(v["type"])
                    if v["type"] != "array":
                        break
                    if v["elem"] != "array":
                        ours.append(v["elem"])
                        break
                    v = v["items"][0]
                expect(ours == want_types, f"{label}: {m['key']}: types {ours}, GGUFReader {want_types}")
            print(f"{label}: {len(got_meta)} keys and {len(got['tensors'])} tensors read as gguf-py wrote them "
                  f"and as GGUFReader reads them (data section at {got['data_offset']})")

            # Cut one byte into the last tensor (gguf-py pads after it): refused, naming that tensor.
            last = got["tensors"][-1]
            with open(path, "rb") as f:
                whole = f.read()
            cut = os.path.join(tmp, "cut.gguf")
            with open(cut, "wb") as f:
                f.write(whole[:got["data_offset"] + last["offset"] + last["bytes"] - 1])
            rc, _, err = run_dump(cut)
            expect(rc == 1 and "tensor blk.0.ffn_down.weight offset" in err and "data section" in err,
                   f"{label}: a file cut by one byte: exit {rc}, {err!r}")

    for f in failures:
        print("FAILED:", f)
    print("gguf oracle:", "FAILED" if failures else "passed", f"({len(failures)} differences)")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
