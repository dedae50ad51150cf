"""TEST CONVERTER (ftcluster tests), not FasterTransformer's: the command line of FT's
examples/pytorch/t5/utils/huggingface_t5_ckpt_convert.py; writes what ../../../../layout_convert.py says."""

import argparse
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), *[os.pardir] * 4))
from layout_convert import convert  # noqa: E402

ap = argparse.ArgumentParser()
ap.add_argument("-saved_dir", "-o", required=True)
ap.add_argument("-in_file", "-i", required=True)
ap.add_argument("-inference_tensor_para_size", "-i_g", type=int, required=True)
ap.add_argument("-weight_data_type", default="fp32", choices=["fp32", "fp16"])
ap.add_argument("--encoder_only", "-e", action="store_true")
a = ap.parse_args()
sys.exit(convert(a.in_file, a.saved_dir, a.inference_tensor_para_size))
