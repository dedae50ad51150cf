"""TEST CONVERTER (ftcluster tests), not FasterTransformer's.

Same command line as FT's examples/pytorch/gpt/utils/huggingface_gpt_convert.py and the same
output: <-o>/<-i_g>-gpu/config.ini and model.*.bin with FT's names and tensor-parallel splits.
Weights are a deterministic byte pattern sized from <-i>/config.json; stdlib only.
"""

import argparse
import configparser
import json
import os
import sys


def write(path, nbytes):
    with open(path, "wb") as fh:
        fh.write((bytes(range(256)) * (nbytes // 256 + 1))[:nbytes])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("-saved_dir", "-o", required=True)
    ap.add_argument("-in_file", "-i", required=True)
    ap.add_argument("-trained_gpu_num", "-t_g", type=int, default=1)
    ap.add_argument("-infer_gpu_num", "-i_g", type=int, required=True)
    ap.add_argument("-processes", "-p", type=int, default=4)
    ap.add_argument("-weight_data_type", default="fp32", choices=["fp32", "fp16"])
    a = ap.parse_args()
    with open(os.path.join(a.in_file, "config.json")) as fh:
        hf = json.load(fh)
    tp, b = a.infer_gpu_num, 2 if a.weight_data_type == "fp16" else 4
    hidden, inter = hf["n_embd"], 4 * hf["n_embd"]
    out = os.path.join(a.saved_dir, f"{tp}-gpu")
    os.makedirs(out, exist_ok=True)
    cfg = configparser.ConfigParser()
    cfg["gpt"] = {"model_name": hf["_name_or_path"], "head_num": hf["n_head"],
                  "size_per_head": hidden // hf["n_head"], "inter_size": inter,
                  "max_pos_seq_len": hf["n_positions"], "num_layer": hf["n_layer"],
                  "vocab_size": hf["vocab_size"], "start_id": hf["bos_token_id"],
                  "end_id": hf["eos_token_id"], "weight_data_type": a.weight_data_type,
                  "tensor_para_size": tp}
    with open(os.path.join(out, "config.ini"), "w") as fh:
        cfg.write(fh)
    write(os.path.join(out, "model.wte.bin"), hf["vocab_size"] * hidden * b)
    write(os.path.join(out, "model.wpe.bin"), hf["n_positions"] * hidden * b)
    for n in ("final_layernorm.weight", "final_layernorm.bias"):
        write(os.path.join(out, f"model.{n}.bin"), hidden * b)
    for layer in range(hf["n_layer"]):
        p = os.path.join(out, f"model.layers.{layer}.")
        for n in ("input_layernorm.weight", "input_layernorm.bias", "attention.dense.bias",
                  "post_attention_layernorm.weight", "post_attention_layernorm.bias",
                  "mlp.dense_4h_to_h.bias"):
            write(f"{p}{n}.bin", hidden * b)
        split = {"attention.query_key_value.weight": hidden * 3 * hidden // tp,
                 "attention.query_key_value.bias": 3 * hidden // tp,
                 "attention.dense.weight": hidden // tp * hidden,
                 "mlp.dense_h_to_4h.weight": hidden * inter // tp,
                 "mlp.dense_h_to_4h.bias": inter // tp,
                 "mlp.dense_4h_to_h.weight": inter // tp * hidden}
        for rank in range(tp):
            for n, size in split.items():
                write(f"{p}{n}.{rank}.bin", size * b)
    print(f"TEST CONVERTER: wrote {out} for {tp} GPU(s)", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
