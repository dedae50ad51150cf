"""TEST DETOKENIZER -- not GPT-2's. Token ids below 256 are bytes; others (padding) are dropped."""

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        pass

    def execute(self, requests):
        responses = []
        for request in requests:
            tokens = pb_utils.get_input_tensor_by_name(request, "TOKENS_BATCH").as_numpy()
            texts = [
                [bytes(int(t) for t in beam if t < 256).decode("utf-8", errors="replace").encode("utf-8")
                 for beam in row]
                for row in tokens
            ]
            responses.append(pb_utils.InferenceResponse([
                pb_utils.Tensor("OUTPUT", np.array(texts, dtype=np.object_)),
            ]))
        return responses
