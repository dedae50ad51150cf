"""TEST TOKENIZER -- not GPT-2's. One token per UTF-8 byte (ids 0-255), padded with end_id.

Keeps FT's preprocessing tensor names so the ensemble looks like FT's GPT ensemble.
BAD_WORDS_DICT/STOP_WORDS_DICT are accepted and ignored (the test model has no word lists);
where the config declares FT's other outputs (the backend's all_models/gpt and gptj do), they
are sent empty: no bad or stop words, task 0.
"""

import json

import numpy as np
import triton_python_backend_utils as pb_utils

PAD_ID = 50256  # GPT-2's end_id, as FT pads


def _text(value):
    return value.decode("utf-8") if isinstance(value, bytes) else str(value)


class TritonPythonModel:
    def initialize(self, args):
        self.outputs = {o["name"] for o in json.loads(args["model_config"])["output"]}

    def execute(self, requests):
        responses = []
        for request in requests:
            query = pb_utils.get_input_tensor_by_name(request, "QUERY").as_numpy()
            out_len = pb_utils.get_input_tensor_by_name(request, "REQUEST_OUTPUT_LEN").as_numpy()
            batch = query.shape[0]
            tokens = [list(_text(row[0]).encode("utf-8")) or [PAD_ID] for row in query.reshape(batch, -1)]
            width = max(len(t) for t in tokens)
            ids = np.full((batch, width), PAD_ID, dtype=np.uint32)
            for b, row in enumerate(tokens):
                ids[b, : len(row)] = row
            lens = np.array([[len(t)] for t in tokens], dtype=np.uint32)
            tensors = [
                pb_utils.Tensor("INPUT_ID", ids),
                pb_utils.Tensor("REQUEST_INPUT_LEN", lens),
                pb_utils.Tensor("REQUEST_OUTPUT_LEN", out_len.reshape(batch, -1).astype(np.uint32)),
            ]
            for name in ("BAD_WORDS_IDS", "STOP_WORDS_IDS"):
                if name in self.outputs:
                    # FT's word-list format: a row of ids and a row of end offsets; empty = [0], [-1]
                    words = np.zeros((batch, 2, 1), dtype=np.int32)
                    words[:, 1, :] = -1
                    tensors.append(pb_utils.Tensor(name, words))
            if "PROMPT_LEARNING_TASK_NAME_IDS" in self.outputs:
                tensors.append(pb_utils.Tensor("PROMPT_LEARNING_TASK_NAME_IDS", np.zeros((batch, 1), np.uint32)))
            responses.append(pb_utils.InferenceResponse(tensors))
        return responses
