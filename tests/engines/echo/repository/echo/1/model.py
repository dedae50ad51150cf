"""The echo engine's model (tests only): every rank logs the engine's load line; rank 0 answers
each prompt with its token ids shifted by the `shift` parameter the engine set; the other ranks
stay in their model load for good."""

import json
import os
import time

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        cfg = json.loads(args["model_config"])
        params = {k: v["string_value"] for k, v in cfg.get("parameters", {}).items()}
        self.shift = int(params["shift"])
        rank = int(os.environ.get("FTC_RANK", "0"))
        pb_utils.Logger.log_info(f"echo engine: rank {rank} of {params['world_size']} loaded")
        while rank != 0:
            time.sleep(3600)

    def execute(self, requests):
        responses = []
        for request in requests:
            ids = pb_utils.get_input_tensor_by_name(request, "input_ids").as_numpy()
            out = pb_utils.Tensor("output_ids", (ids + self.shift).astype(np.uint32))
            responses.append(pb_utils.InferenceResponse(output_tensors=[out]))
        return responses
