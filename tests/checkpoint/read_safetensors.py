#!/usr/bin/env python3
"""Independent check of dpml's safetensors files and checkpoint manifest (see write_reference.cpp).

Reads <dir>/reference.safetensors with the `safetensors` + `numpy` packages when both import,
otherwise with the plain-Python parser below, which follows the published format
(https://github.com/huggingface/safetensors): u64 little-endian header length N, N bytes of JSON
(space padded), then the raw little-endian data; offsets relative to the data, contiguous.
Then checks <dir>/ckpt: `latest`, the manifest and its own CRC-32 ("manifest_crc32": over its
compact JSON without that member, keys in file order), each piece's header entry, values and
zlib CRC-32.
Exits non-zero on any mismatch; there is no silent pass.

    read_safetensors.py <dir>
"""
import json
import os
import struct
import sys
import zlib

FORMATS = {"F64": ("d", 8), "F32": ("f", 4), "BF16": ("H", 2), "I64": ("q", 8),
           "U64": ("Q", 8), "I32": ("i", 4), "U16": ("H", 2), "U8": ("B", 1)}


def expected():
    """name -> (dtype, shape, values) as write_reference.cpp writes them."""
    def values(n, scale, shift, conv):
        return [conv(i * scale + shift) for i in range(n)]
    def bf16_bits(x):
        return struct.unpack("<I", struct.pack("<f", x))[0] >> 16  # exact values: truncation is exact
    return {
        "f64": ("F64", [2, 3], values(6, 0.5, -3, float)),
        "f32": ("F32", [2, 3, 4], values(24, 0.25, -1, float)),
        "bf16": ("BF16", [8], values(8, 1.5, -4, bf16_bits)),
        "i64": ("I64", [3], values(3, 1000000000007, -2000000000000, int)),
        "u64": ("U64", [2, 2], values(4, 1, 9007199254740000, int)),
        "i32": ("I32", [5], values(5, -7, 100, int)),
        "u16": ("U16", [4], values(4, -1, 65535, int)),
        "u8": ("U8", [3, 3], values(9, -1, 255, int)),
        "scalar": ("F32", [], [42.5]),
    }


def numel(shape):
    n = 1
    for d in shape:
        n *= d
    return n


def plain_read(path):
    """Header (dict) and {name: (dtype, shape, flat values, raw bytes)} by the published format."""
    with open(path, "rb") as f:
        blob = f.read()
    if len(blob) < 8:
        raise ValueError(f"{path}: shorter than the header length")
    (n,) = struct.unpack("<Q", blob[:8])
    if n % 8 != 0:
        raise ValueError(f"{path}: header length {n} is not a multiple of 8")
    text = blob[8:8 + n].decode("utf-8")
    if not text.rstrip(" ").endswith("}"):
        raise ValueError(f"{path}: the header is not one JSON object padded with spaces")
    header = json.loads(text)  # strict JSON: also checks dpml's JSON writer
    data = blob[8 + n:]
    tensors, spans = {}, []
    for name, e in header.items():
        if name == "__metadata__":
            if not all(isinstance(v, str) for v in e.values()):
                raise ValueError(f"{path}: __metadata__ values must be strings")
            continue
        code, size = FORMATS[e["dtype"]]
        begin, end = e["data_offsets"]
        if end - begin != numel(e["shape"]) * size:
            raise ValueError(f"{path}: {name}: offsets do not match shape and dtype")
        raw = data[begin:end]
        tensors[name] = (e["dtype"], e["shape"], list(struct.unpack(f"<{numel(e['shape'])}{code}", raw)), raw)
        spans.append((begin, end))
    at = 0
    for begin, end in sorted(spans):
        if begin != at:
            raise ValueError(f"{path}: data offsets not contiguous at {begin}")
        at = end
    if at != len(data):
        raise ValueError(f"{path}: {len(data) - at} bytes after the last tensor")
    return header, tensors


def library_read(path):
    """{name: (dtype, shape, flat values)} with the safetensors package (numpy framework)."""
    import numpy as np  # noqa: F401
    from safetensors import safe_open
    out = {}
    with safe_open(path, framework="np") as f:
        for name in f.keys():
            if name == "bf16":  # numpy has no bfloat16: safetensors cannot hand it over
                continue
            a = f.get_tensor(name)
            out[name] = (None, list(a.shape), [x.item() for x in a.reshape(-1)])
    return out


def check_reference(path):
    want = expected()
    header, plain = plain_read(path)
    if header.get("__metadata__") != {"written_by": "dpml write_reference"}:
        raise ValueError(f"{path}: __metadata__ is {header.get('__metadata__')}")
    try:
        got = library_read(path)
        reader = "safetensors+numpy"
        for name in ("bf16",):  # not representable in numpy: the plain parser's values
            got[name] = plain[name][:3]
    except ImportError:
        got = {k: v[:3] for k, v in plain.items()}
        reader = "plain-Python parser"
    if set(got) != set(want):
        raise ValueError(f"{path}: tensors {sorted(got)}, expected {sorted(want)}")
    for name, (dtype, shape, values) in want.items():
        g_dtype, g_shape, g_values = got[name]
        if plain[name][0] != dtype or list(g_shape) != shape or g_values != values:
            raise ValueError(f"{path}: tensor {name}: got {plain[name][0]} {g_shape} {g_values[:8]}, "
                             f"expected {dtype} {shape} {values[:8]}")
    print(f"{path}: {len(want)} tensors equal ({reader})")


def check_checkpoint(root):
    with open(os.path.join(root, "latest")) as f:
        step_dir = os.path.join(root, f.read().strip())
    with open(os.path.join(step_dir, "manifest.json")) as f:
        manifest = json.load(f)
    if manifest["format"] != "dpml-checkpoint" or manifest["version"] != 1 or manifest["step"] != 3:
        raise ValueError(f"{step_dir}: unexpected manifest head {manifest}")
    recorded = manifest.pop("manifest_crc32")
    body = json.dumps(manifest, separators=(",", ":"), ensure_ascii=False).encode()
    if zlib.crc32(body) != recorded:
        raise ValueError(f"{step_dir}: manifest crc32 {zlib.crc32(body)}, it records {recorded}")
    if manifest["layout"] != {"tp": 2, "pp": 1, "dp": 1, "zero": 0} or manifest["config"] != {"note": "reference"}:
        raise ValueError(f"{step_dir}: layout/config {manifest['layout']} {manifest['config']}")
    tensors = {t["name"]: t for t in manifest["tensors"]}
    want = {"w": ("F32", [4, 6], [float(i) for i in range(24)], 2),
            "b": ("F64", [3], [1.0, 1.5, 2.0], 1)}
    if set(tensors) != set(want):
        raise ValueError(f"{step_dir}: tensors {sorted(tensors)}")
    for name, (dtype, shape, values, npieces) in want.items():
        t = tensors[name]
        if t["dtype"] != dtype or t["shape"] != shape or len(t["pieces"]) != npieces:
            raise ValueError(f"{step_dir}: {name}: {t}")
        full = [None] * numel(shape)
        for p in t["pieces"]:
            _, entries = plain_read(os.path.join(step_dir, p["file"]))
            e_dtype, e_shape, e_values, raw = entries[name]
            extents = [e - b for b, e in p["slice"]]
            if e_dtype != dtype or e_shape != extents:
                raise ValueError(f"{p['file']}: {name}: entry {e_dtype} {e_shape}, slice {p['slice']}")
            if zlib.crc32(raw) != p["crc32"]:
                raise ValueError(f"{p['file']}: {name}: crc32 {zlib.crc32(raw)}, manifest {p['crc32']}")
            # Scatter the piece (row-major over its extents) into the full tensor.
            for k, v in enumerate(e_values):
                idx, rest = [], k
                for d in reversed(range(len(extents))):
                    idx.append(rest % extents[d] + p["slice"][d][0])
                    rest //= extents[d]
                flat = 0
                for d, i in enumerate(reversed(idx)):
                    flat = flat * shape[d] + i
                full[flat] = v
        if full != values:
            raise ValueError(f"{step_dir}: {name}: assembled {full}, expected {values}")
    print(f"{step_dir}: manifest (its own crc32 too), pieces, values and crc32 agree")


def main():
    if len(sys.argv) != 2:
        sys.exit("usage: read_safetensors.py <dir>")
    try:
        check_reference(os.path.join(sys.argv[1], "reference.safetensors"))
        check_checkpoint(os.path.join(sys.argv[1], "ckpt"))
    except (OSError, ValueError, KeyError, struct.error, json.JSONDecodeError) as e:
        sys.exit(f"FAIL: {e}")


if __name__ == "__main__":
    main()
