"""TEST MODEL -- not FasterTransformer. A python-backend stand-in with FT's inputs and outputs.

Behaves like FT for the client's checks, without weights or a GPU:
- GPT (decoder-only): output_ids[b, 0] = the first input_lengths[b] prompt tokens, then
  request_output_len[b] tokens (last + i + 1) % vocab_size, padded with end_id;
  sequence_length[b] = input length + output length.
- T5 (encoder-decoder; inputs input_ids, sequence_length, max_output_len): output_ids hold only
  the generated tokens, sequence_length[b] = max_output_len[b].

Fault injection for ftcluster's tests:
- FTCLUSTER_TEST_BREAK_NODE == this host's name: initialize raises, so the server fails to
  load the model and exits (as FT does on a broken node);
- FTCLUSTER_TEST_LOAD_DELAY=<seconds>: initialize sleeps that long (a slow weight load).
Like the real backend, initialize fails when model_checkpoint_path has no config.ini.
"""

import configparser
import json
import os
import socket
import time

import numpy as np
import triton_python_backend_utils as pb_utils


def _param(cfg, key, default=None):
    value = cfg.get("parameters", {}).get(key, {}).get("string_value")
    return default if value in (None, "") else value


class TritonPythonModel:
    def initialize(self, args):
        broken = os.environ.get("FTCLUSTER_TEST_BREAK_NODE")
        if broken and broken == socket.gethostname():
            raise RuntimeError(f"FTCLUSTER_TEST_BREAK_NODE={broken}: test model refuses to load here")
        delay = os.environ.get("FTCLUSTER_TEST_LOAD_DELAY")
        if delay:
            time.sleep(float(delay))

        cfg = json.loads(args["model_config"])
        self.model_type = _param(cfg, "model_type", "GPT")
        ckpt = _param(cfg, "model_checkpoint_path")
        if ckpt is None:
            raise RuntimeError("parameter model_checkpoint_path is not set")
        if not os.path.isabs(ckpt):
            # The real backend resolves against its cwd; the shipped demo must work in place.
            ckpt = os.path.join(args["model_repository"], ckpt)
        ini_path = os.path.join(ckpt, "config.ini")
        if not os.path.isfile(ini_path):
            raise RuntimeError(f"model_checkpoint_path {ckpt}: no config.ini there")
        ini = configparser.ConfigParser(inline_comment_prefixes=(";", "#"))
        ini.read(ini_path)
        section = "decoder" if self.model_type == "T5" and ini.has_section("decoder") else ini.sections()[0]
        self.vocab_size = ini.getint(section, "vocab_size", fallback=50257)
        self.end_id = ini.getint(section, "end_id", fallback=self.vocab_size - 1)
        declared = {o["name"]: o["data_type"] for o in cfg["output"]}
        self.ids_dtype = pb_utils.triton_string_to_numpy(declared["output_ids"])
        self.len_dtype = pb_utils.triton_string_to_numpy(declared["sequence_length"])

    def _input(self, request, name):
        tensor = pb_utils.get_input_tensor_by_name(request, name)
        return None if tensor is None else tensor.as_numpy()

    def _generate(self, request):
        ids = self._input(request, "input_ids")
        batch = ids.shape[0]
        if self.model_type == "T5":
            in_lens = self._input(request, "sequence_length").reshape(batch)
            out_lens = self._input(request, "max_output_len").reshape(batch)
            keep_prompt = False
        else:
            in_lens = self._input(request, "input_lengths").reshape(batch)
            out_lens = self._input(request, "request_output_len").reshape(batch, -1)[:, 0]
            keep_prompt = True
        beam = self._input(request, "beam_width")
        beam_width = int(beam.reshape(-1)[0]) if beam is not None else 1
        if np.any(in_lens > ids.shape[1]) or np.any(in_lens < 1):
            raise ValueError(f"input lengths {in_lens.tolist()} do not fit input_ids of width {ids.shape[1]}")

        seq_lens = (in_lens + out_lens) if keep_prompt else out_lens.copy()
        width = int(seq_lens.max())
        out = np.full((batch, beam_width, width), self.end_id, dtype=np.int64)
        for b in range(batch):
            n_in, n_out = int(in_lens[b]), int(out_lens[b])
            prompt = ids[b, :n_in].astype(np.int64)
            generated = (prompt[-1] + np.arange(1, n_out + 1)) % self.vocab_size
            row = np.concatenate([prompt, generated]) if keep_prompt else generated
            out[b, :, : row.size] = row
        seq = np.repeat(seq_lens.reshape(batch, 1), beam_width, axis=1)
        return [
            pb_utils.Tensor("output_ids", out.astype(self.ids_dtype)),
            pb_utils.Tensor("sequence_length", seq.astype(self.len_dtype)),
            pb_utils.Tensor("response_input_lengths", in_lens.reshape(batch, 1).astype(np.int32)),
            pb_utils.Tensor("cum_log_probs", np.zeros((batch, beam_width), np.float32)),
            pb_utils.Tensor("output_log_probs", np.zeros((batch, beam_width, width), np.float32)),
        ]

    def execute(self, requests):
        responses = []
        for request in requests:
            try:
                tensors = self._generate(request)
                names = set(request.requested_output_names() or [t.name() for t in tensors])
                responses.append(pb_utils.InferenceResponse([t for t in tensors if t.name() in names]))
            except Exception as exc:  # one bad request must not fail the others in the batch
                responses.append(pb_utils.InferenceResponse(error=pb_utils.TritonError(str(exc))))
        return responses
