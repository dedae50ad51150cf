"""TEST CONVERTER (ftcluster tests), not FasterTransformer's: the command line of FT's
examples/pytorch/gpt/utils/megatron_ckpt_convert.py; writes what ../../../../layout_convert.py says."""

import argparse
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), *[os.pardir] * 4))
from layout_convert import convert  # noqa: E402

ap = argparse.ArgumentParser()
ap.add_argument("--saved-dir", "-o", required=True)
ap.add_argument("--in-file", "-i", required=True)
ap.add_argument("--infer-gpu-num", "-i_g", type=int, required=True)
ap.add_argument("--weight-data-type", default="fp32", choices=["fp32", "fp16"])
a = ap.parse_args()
sys.exit(convert(a.in_file, a.saved_dir, a.infer_gpu_num))
