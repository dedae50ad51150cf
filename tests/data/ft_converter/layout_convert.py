"""TEST CONVERTER helper (ftcluster tests), not FasterTransformer's.

Writes <saved_dir>/<tp>-gpu/ as <input>/layout.json describes it: {"tensor_para_size": N,
"config_ini": TEXT, "files": {NAME: BYTES}}, the file names and sizes of a real converted
checkpoint (sparse: no bytes written), for the converters whose real ones need torch and real
weights (T5, GPT-J, Megatron GPT). Stdlib only: it runs on a node or inside the image.
"""

import json
import os


def convert(input_dir, saved_dir, tp):
    with open(os.path.join(input_dir, "layout.json")) as fh:
        layout = json.load(fh)
    if int(layout["tensor_para_size"]) != tp:
        raise SystemExit(f"TEST CONVERTER: {input_dir} describes a checkpoint for {layout['tensor_para_size']} "
                         f"GPU(s), not {tp}")
    out = os.path.join(saved_dir, f"{tp}-gpu")
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "config.ini"), "w") as fh:
        fh.write(layout["config_ini"])
    for name, nbytes in layout["files"].items():
        with open(os.path.join(out, name), "wb") as fh:
            fh.truncate(nbytes)
    print(f"TEST CONVERTER: wrote {out} for {tp} GPU(s)", flush=True)
    return 0


def here():
    """This folder, for the scripts under examples/ to import this module from."""
    return os.path.dirname(os.path.abspath(__file__))
