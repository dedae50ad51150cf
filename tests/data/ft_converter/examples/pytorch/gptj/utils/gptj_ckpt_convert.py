"""TEST CONVERTER (ftcluster tests), not FasterTransformer's: the command line of FT's
examples/pytorch/gptj/utils/gptj_ckpt_convert.py; writes what ../../../../layout_convert.py says."""

import argparse
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), *[os.pardir] * 4))
from layout_convert import convert  # noqa: E402

ap = argparse.ArgumentParser()
ap.add_argument("--output-dir", required=True)
ap.add_argument("--ckpt-dir", required=True)
ap.add_argument("--n-inference-gpus", type=int, required=True)
a = ap.parse_args()
sys.exit(convert(a.ckpt_dir, a.output_dir, a.n_inference_gpus))
