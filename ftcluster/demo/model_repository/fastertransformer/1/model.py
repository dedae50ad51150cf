"""TEST MODEL -- not FasterTransformer. A python-backend stand-in that behaves like FT across ranks.

What it imitates, from the FT backend's src/libfastertransformer.cc
(triton-inference-server/fastertransformer_backend, c6936c3):
- every rank's tritonserver joins ONE MPI world when the model loads (FT calls MPI_Init_thread
  in TRITONBACKEND_Initialize), here through `ctmpi` (ctypes on the launcher's libmpi, beside
  this file) -- world size = node count, one rank per node;
- the refusals of ModelState, in FT's words: more than one instance group, a kind other than
  KIND_CPU, tensor_para_size x pipeline_para_size != visible GPUs x nodes (or an instance count
  other than 1) on several nodes, sequence batching with max_batch_size != 1, sequence and
  dynamic batching together; the checkpoint folder defaults to <version>/<tp>-gpu and must hold
  config.ini;
- after loading, each rank logs FT's line `TRITONBACKEND_ModelInstanceInitialize: NAME (count N)
  (instance_id M)`; then rank 0 returns and serves, while every rank != 0 NEVER returns from
  initialize: it serves rank 0's broadcasts forever, so its server never opens its HTTP port;
- rank 0 broadcasts each request; every rank computes its share of the generated tokens
  (position i is computed by rank i % world size) and rank 0 gathers them, so a missing or
  wrong rank shows in the output.

The outputs (GPT: output_ids = prompt + (last + i + 1) % vocab_size, padded with end_id;
T5: only the generated tokens; sequence_length to match) are what ftcluster's client checks.
The encoder-only types return hidden states instead, with FT's tensors
(fastertransformer_backend c6936c3 all_models/{t5-encoder,bert}, FasterTransformer
triton_backend/{t5-encoder,bert}/*TritonModelInstance.cc):
- T5-Encoder: input_ids [batch, seq] + sequence_length [batch] -> output_hidden_state
  [batch, seq, d_model] (and output_attentions [batch, layers, heads, seq, seq] when
  is_return_attentions is set);
- bert: input_hidden_state [batch, seq, hidden] + sequence_lengths [batch] (INT32) ->
  output_hidden_state [batch, seq, hidden].
Hidden dimension j is computed by rank j % world size (positions past the sequence length are
0). FT's ModelState::AutoCompleteConfig gives those hidden-state tensors the model's data_type
(fp16 -> TYPE_FP16, whatever config.pbtxt declared), and so does auto_complete_config here
(FT forces it for these types; the python backend runs it unless tritonserver was started
with --disable-auto-complete-config).
"Visible GPUs" on CPU: FTCLUSTER_TEST_GPUS, else the entries of CUDA_VISIBLE_DEVICES, else 1.

With torch and CUDA importable (and FTCLUSTER_TEST_DEVICE not `cpu`) the model computes for
real instead: gpt_cuda.py beside this file, a small GPT-like decoder with the checkpoint's
config.ini dimensions and seeded weights (FTCLUSTER_TEST_SEED, default 0), tensor parallelism
over the node's GPUs and pipeline parallelism across ranks over NCCL; the visible GPUs are then
what CUDA sees. Greedy tokens replace the CPU formula; everything else (the world, the
refusals, the broadcast of each request, the outputs' layout) is the same.

Fault hooks for ftcluster's tests; each names a host (its hostname) or a rank (`rank<R>`),
several separated by commas:
- FTCLUSTER_TEST_HANG_NODE: the rank hangs before joining the world (the others wait in it);
- FTCLUSTER_TEST_BREAK_NODE: initialize raises after joining, so that server exits; with
  `@<N>` (rank1@1) in the N-th restart of the world only (FTC_INCARNATION N);
- FTCLUSTER_TEST_LOAD_DELAY=<seconds>: a slow weight load that shows no progress (it sleeps), on
  every rank;
- FTCLUSTER_TEST_LOAD_PROGRESS=<seconds>: a slow weight load that moves, on every rank: every
  0.5 s it reads a file and logs a line, as FT reading its shards does;
- FTCLUSTER_TEST_DIE_NODE: the rank's tritonserver is killed (SIGKILL) when it serves its first
  request; with `@<seconds>` (rank1@2) that long after loading instead;
- FTCLUSTER_TEST_FREEZE_NODE: the rank freezes while serving, alive and silent (it stops adding
  its share, so rank 0 and every request wait forever: the hang FT users report), at its first
  request, or `@N` at its N-th;
- FTCLUSTER_TEST_STOP_NODE: the rank's whole server process stops (SIGSTOP of its tritonserver
  and of this stub), at its first request or `@N` at its N-th: what a SIGSTOP of a real FT rank
  does, whose backend lives in the tritonserver process -- its HTTP frontend and metrics stop
  answering too, where FREEZE leaves them up;
- FTCLUSTER_TEST_SLOW_NODE=<target>@<seconds>: each request takes that much longer on the rank.
DIE, FREEZE and STOP fire in the server's first incarnation only (FTC_INCARNATION unset or 0, as the
job sets it for each restart of the world), or in every one with FTCLUSTER_TEST_FAULTS_ALWAYS=1.
"""

import configparser
import ctypes
import io
import json
import os
import signal
import socket
import sys
import threading
import time

import numpy as np
import triton_python_backend_utils as pb_utils

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import ctmpi  # noqa: E402  (what FT's linked libmpi is to the real backend)

_FT_MULTI_INSTANCE = ("1. Number of visible GPUs must be evenly divisble by TP * PP \n"
                      "2. Number of visible GPUs must be <= instance count * TP * PP \n"
                      "3. Multi-Node Inference only support one model instance \n")


def _param(cfg, key, default=None):
    value = cfg.get("parameters", {}).get(key, {}).get("string_value")
    return default if value in (None, "") else value


def _launcher_rank():
    """The rank the launcher gave this process, before MPI is initialised."""
    for key in ("OMPI_COMM_WORLD_RANK", "PMIX_RANK", "SLURM_PROCID", "PMI_RANK", "FTC_RANK"):
        if os.environ.get(key, "").isdigit():
            return int(os.environ[key])
    return 0


def _fault(var, rank):
    """None, or the seconds part (0.0 when absent) of the first entry naming this host or rank."""
    for item in os.environ.get(var, "").split(","):
        target, _, when = item.strip().partition("@")
        if target and target in (socket.gethostname(), f"rank{rank}"):
            return float(when) if when else 0.0
    return None


def _first_incarnation():
    return os.environ.get("FTCLUSTER_TEST_FAULTS_ALWAYS") == "1" or os.environ.get("FTC_INCARNATION", "0") == "0"


def _die():
    """Like a crashing FT rank: the whole tritonserver goes, not just this stub."""
    os.kill(_server_pid(), signal.SIGKILL)
    os._exit(137)


def _server_pid():
    """The tritonserver this stub serves: its nearest ancestor of that name (the stub is started
    through a shell that execs it, so normally its parent), else its parent."""
    pid = os.getpid()
    for _ in range(8):
        try:
            with open(f"/proc/{pid}/stat") as f:
                pid = int(f.read().rsplit(")", 1)[1].split()[1])
            with open(f"/proc/{pid}/comm") as f:
                if f.read().strip().startswith("tritonserver"):
                    return pid
        except (OSError, ValueError, IndexError):
            break
    return os.getppid()


def _stop_whole_server(rank):
    """Like a SIGSTOPped FT rank: the whole server stops, frontend and backend, then this stub."""
    print(f"FTCLUSTER_TEST_STOP_NODE: rank {rank} stopped at {time.time():.6f}", file=sys.stderr, flush=True)
    os.kill(_server_pid(), signal.SIGSTOP)
    os.kill(os.getpid(), signal.SIGSTOP)


def _visible_gpus():
    forced = os.environ.get("FTCLUSTER_TEST_GPUS")
    if forced:
        return int(forced)
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible:
        return len([d for d in visible.split(",") if d.strip()])
    return 1


def _cuda_module():
    """gpt_cuda when torch with CUDA is importable here, else None (the CPU test model)."""
    if os.environ.get("FTCLUSTER_TEST_DEVICE", "").lower() == "cpu":
        return None
    try:
        # only with a GPU: torch is in the serving image, not in the CPU test bed
        import torch
    except ImportError:
        return None
    if not torch.cuda.is_available():
        return None
    # needs torch (above): the GPU decoder beside this file
    import gpt_cuda
    return gpt_cuda


# Tensors cross the python backend through DLPack under numpy >= 2: a stub built against
# numpy 1 reads a numpy 2 array's item size as 0 (the dtype struct changed), so every input
# element reads as the first one and every output goes out empty ("output tensor shape does
# not match size of output"). DLPack carries dtype, shape and strides itself. Seen with the
# pytriton 0.7.0 stub for Python 3.12 beside torch's numpy 2.
def _output(name, array):
    array = np.ascontiguousarray(array)
    if _NUMPY_2:
        return _from_dlpack(name, array)
    return pb_utils.Tensor(name, array)


# Private prototypes: ctypes.pythonapi's own function objects are shared with the process.
_CAPSULE_NAME = ctypes.PYFUNCTYPE(ctypes.c_char_p, ctypes.py_object)(("PyCapsule_GetName", ctypes.pythonapi))
_SET_CAPSULE_NAME = ctypes.PYFUNCTYPE(ctypes.c_int, ctypes.py_object, ctypes.c_char_p)(
    ("PyCapsule_SetName", ctypes.pythonapi))
_CONSUMED = b"used_dltensor"   # module-level: a capsule keeps a pointer to its name


def _from_dlpack(name, array):
    """pb_utils.Tensor.from_dlpack without the stub's own name for a consumed capsule.

    The stub (python_backend pb_tensor.cc, FromDLPackCapsule) takes the DLPack tensor over (its
    deleter frees it) and renames the capsule "used_dlpack"; the DLPack protocol's name is
    "used_dltensor", the only one numpy's capsule destructor skips. Under any other it looks the
    tensor up as "dltensor", fails and reports "ValueError: PyCapsule_GetPointer called with
    incorrect name" (numpy 2.5.2 on the GPU machine: a traceback per output tensor in the rank
    log, whose last lines a restart's cause quotes). So the capsule is handed over here and,
    once the stub has taken it, given the protocol's name."""
    capsule = array.__dlpack__()
    tensor = pb_utils.Tensor.from_dlpack(name, capsule)
    if _CAPSULE_NAME(capsule) == b"used_dlpack":
        _SET_CAPSULE_NAME(capsule, _CONSUMED)
    return tensor


_NUMPY_2 = int(np.__version__.split(".")[0]) >= 2


# FT's ModelState::AutoCompleteConfig: which tensors take the model's data_type.
_AUTO_TYPED = {"T5-Encoder": {"output": ("output_hidden_state", "output_attentions")},
               "bert": {"input": ("input_hidden_state",), "output": ("output_hidden_state",)}}
_HIDDEN_TYPES = {"fp16": "TYPE_FP16", "fp32": "TYPE_FP32", "bf16": "TYPE_BF16"}


def _hidden_size(ini, model_type):
    """d_model of [encoder] (T5-Encoder), hidden_size of [bert] (else head_num x size_per_head)."""
    if model_type == "T5-Encoder":
        return ini.getint("encoder", "d_model")
    fallback = ini.getint("bert", "head_num") * ini.getint("bert", "size_per_head")
    return ini.getint("bert", "hidden_size", fallback=fallback)


def _hidden_share(values, lens, rank, world):
    """This rank's hidden dimensions (j % world == rank) of f(values), 0 past each length."""
    hidden = values.shape[2]
    mine = (np.arange(hidden) % world) == rank
    valid = np.arange(values.shape[1])[None, :] < lens[:, None]
    return np.where(mine[None, None, :] & valid[:, :, None], values, 0.0)


def _pack(arrays):
    buf = io.BytesIO()
    np.savez(buf, **arrays)
    return buf.getvalue()


def _unpack(data):
    with np.load(io.BytesIO(data)) as z:
        return {k: z[k] for k in z.files}


class TritonPythonModel:
    def initialize(self, args):
        rank_hint = _launcher_rank()
        if _fault("FTCLUSTER_TEST_HANG_NODE", rank_hint) is not None:
            while True:          # never joins the world: every other rank waits for it
                time.sleep(3600)
        self.world = ctmpi.World()
        rank, nodes = self.world.rank, self.world.size
        breaks = _fault("FTCLUSTER_TEST_BREAK_NODE", rank)
        if breaks is not None and (not breaks or float(os.environ.get("FTC_INCARNATION", "0")) == breaks):
            raise RuntimeError(f"FTCLUSTER_TEST_BREAK_NODE: test model refuses to load on rank {rank} "
                               f"({socket.gethostname()})")
        delay = os.environ.get("FTCLUSTER_TEST_LOAD_DELAY")
        if delay:
            time.sleep(float(delay))
        progress = os.environ.get("FTCLUSTER_TEST_LOAD_PROGRESS")
        if progress:
            steps = max(1, int(float(progress) / 0.5))
            for k in range(steps):
                time.sleep(0.5)
                with open(__file__, "rb") as f:
                    f.read()
                print(f"test model: loading weights {k + 1}/{steps} on rank {rank}", file=sys.stderr, flush=True)

        cfg = json.loads(args["model_config"])
        self.cuda = _cuda_module()
        self._refuse_like_ft(cfg, nodes)
        self.model_type = _param(cfg, "model_type", "GPT")
        # Interactive GPT (sequence batching, max_batch_size 1): every tensor carries a pseudo
        # batch dimension of 1 in front of the real [batch, ...].
        self.pseudo_batch = "sequence_batching" in cfg
        tp = int(_param(cfg, "tensor_para_size", "1"))
        ckpt = _param(cfg, "model_checkpoint_path")
        if ckpt is None:   # FT: <repository>/<version>/<default_model_filename or tp-gpu>
            ckpt = os.path.join(args["model_repository"], args["model_version"],
                                cfg.get("default_model_filename") or f"{tp}-gpu")
        elif not os.path.isabs(ckpt):
            # The real backend resolves against its cwd; the shipped demo must work in place.
            ckpt = os.path.join(args["model_repository"], ckpt)
        ini_path = os.path.join(ckpt, "config.ini")
        ini = configparser.ConfigParser(inline_comment_prefixes=(";", "#"))
        if not ini.read(ini_path):
            raise RuntimeError(f"[FT][ERROR] Can't load '{ini_path}'")
        section = "decoder" if self.model_type == "T5" and ini.has_section("decoder") else ini.sections()[0]
        self.vocab_size = ini.getint(section, "vocab_size", fallback=50257)
        self.end_id = ini.getint(section, "end_id", fallback=self.vocab_size - 1)
        declared = {o["name"]: o["data_type"] for o in cfg["output"]}
        self.encoder = self.model_type in _AUTO_TYPED
        self.engine = None
        if self.encoder:
            self.hidden = _hidden_size(ini, self.model_type)
            self.layers = ini.getint("encoder", "num_layers", fallback=1)
            self.heads = ini.getint("encoder", "num_heads", fallback=1)
            if declared.get("output_hidden_state") == "TYPE_BF16":
                raise RuntimeError("test model: bf16 hidden states cannot leave numpy; use fp16 or fp32")
            self.hidden_dtype = pb_utils.triton_string_to_numpy(declared["output_hidden_state"])
        else:
            # FT returns its own types, whatever config.pbtxt declares (and Triton passes them
            # through): output_ids UINT32 (T5: INT32), sequence_length and response_input_lengths
            # INT32 (ParallelGptTritonModelInstance.cc, T5TritonModelInstance.cc) -- where the
            # shipped GPT config declares them all UINT32 (T5's declares INT32, as it returns).
            self.ids_dtype = np.int32 if self.model_type == "T5" else np.uint32
            self.len_dtype = np.int32
        if self.cuda is not None and not self.encoder:  # the CUDA decoder generates tokens only
            self.engine = self.cuda.Engine(self.world, self.cuda.Dims(ini, section), tp,
                                           int(_param(cfg, "pipeline_para_size", "1")),
                                           _param(cfg, "data_type", "fp32"),
                                           int(os.environ.get("FTCLUSTER_TEST_SEED", "0")))
            pb_utils.Logger.log_info(self.engine.describe())

        self.die_at_request = False
        self.served = 0
        self.freeze_at = _fault("FTCLUSTER_TEST_FREEZE_NODE", rank) if _first_incarnation() else None
        self.stop_at = _fault("FTCLUSTER_TEST_STOP_NODE", rank) if _first_incarnation() else None
        self.slow = _fault("FTCLUSTER_TEST_SLOW_NODE", rank) or 0.0
        die = _fault("FTCLUSTER_TEST_DIE_NODE", rank) if _first_incarnation() else None
        if die:
            threading.Timer(die, _die).start()
        elif die is not None:
            self.die_at_request = True
        count = cfg.get("instance_group", [{}])[0].get("count", 1)
        pb_utils.Logger.log_info(f"TRITONBACKEND_ModelInstanceInitialize: {args['model_instance_name']} "
                                 f"(count {count}) (instance_id 0)")
        if rank != 0:
            while True:          # FT: `if (node_id) { while (true) { instance_state->Execute(...); } }`
                self._serve_broadcast(None)

    @staticmethod
    def auto_complete_config(config):
        """FT's AutoCompleteConfig: hidden-state tensors take data_type's type (unknown: none)."""
        cfg = config.as_dict()
        wanted = _HIDDEN_TYPES.get(_param(cfg, "data_type", ""), "")
        for direction, names in _AUTO_TYPED.get(_param(cfg, "model_type", "GPT"), {}).items():
            for tensor in cfg.get(direction, []):
                if tensor["name"] in names:
                    tensor["data_type"] = wanted
        return config

    def _refuse_like_ft(self, cfg, nodes):
        groups = cfg.get("instance_group", [])
        if len(groups) != 1:
            raise RuntimeError("Only supports one instance group !")
        if groups[0].get("kind", "KIND_CPU") != "KIND_CPU":
            raise RuntimeError("Instance Group: only KIND_CPU supports!")
        count = int(groups[0].get("count", 1))
        tp_pp = int(_param(cfg, "tensor_para_size", "0")) * int(_param(cfg, "pipeline_para_size", "0"))
        gpus = self.cuda.visible_gpus() if self.cuda is not None else _visible_gpus()
        if nodes > 1:
            valid = tp_pp == gpus * nodes and count == 1
        else:
            valid = tp_pp > 0 and gpus % tp_pp == 0 and tp_pp * count >= gpus
        if not valid:
            raise RuntimeError(_FT_MULTI_INSTANCE)
        mbs = int(cfg.get("max_batch_size", 0))
        if "sequence_batching" in cfg and mbs != 1:
            raise RuntimeError("Sequence Batching for interactive text generation: only supports max batch "
                               "size = 1 currently !")
        if "sequence_batching" in cfg and "dynamic_batching" in cfg:
            raise RuntimeError("Sequence Batching cannot work with dynamic batching at the same time !")

    def _serve_broadcast(self, request):
        """One step of the world: rank 0 broadcasts a request, every rank adds its share."""
        req = _unpack(self.world.bcast_bytes(_pack(request) if request is not None else None))
        if self.die_at_request:
            _die()
        self.served += 1
        if self.freeze_at is not None and self.served >= max(1, self.freeze_at):
            # When it froze, for the benches (an epoch: Triton's own log lines carry no date).
            print(f"FTCLUSTER_TEST_FREEZE_NODE: rank {self.world.rank} froze at {time.time():.6f}",
                  file=sys.stderr, flush=True)
            while True:          # alive, silent: rank 0 waits in the gather below for good
                time.sleep(3600)
        if self.stop_at is not None and self.served >= max(1, self.stop_at):
            _stop_whole_server(self.world.rank)
        if self.slow:
            time.sleep(self.slow)
        if self.encoder:
            return self._encode_share(req)
        if self.engine is not None:
            generated = self.engine.generate(req)
            return generated if self.world.rank == 0 else None
        last, out_lens = req["last"], req["out_lens"]
        positions = np.arange(int(out_lens.max()) if out_lens.size else 0)
        mine = (positions % self.world.size == self.world.rank) & (positions < out_lens[:, None])
        part = np.where(mine, (last[:, None] + positions + 1) % self.vocab_size, 0).astype(np.int64)
        parts = self.world.gather_bytes(part.tobytes())
        if parts is None:
            return None
        return sum(np.frombuffer(p, np.int64).reshape(part.shape) for p in parts)

    def _encode_share(self, req):
        """Every rank its hidden dimensions; rank 0 gets their sum (float64, exact)."""
        if self.model_type == "T5-Encoder":
            ids = req["ids"].astype(np.float64)
            values = np.cos(ids[:, :, None] * 0.01 + np.arange(self.hidden)[None, None, :] * 0.1)
        else:
            values = np.tanh(req["x"].astype(np.float64) + np.arange(self.hidden)[None, None, :] * 0.01)
        part = _hidden_share(values, req["lens"], self.world.rank, self.world.size)
        parts = self.world.gather_bytes(part.tobytes())
        if parts is None:
            return None
        return sum(np.frombuffer(p, np.float64).reshape(part.shape) for p in parts)

    def _encode(self, request):
        if self.model_type == "T5-Encoder":
            x = self._input(request, "input_ids")
            lens = self._input(request, "sequence_length")
        else:
            x = self._input(request, "input_hidden_state")
            lens = self._input(request, "sequence_lengths")
            if x.ndim != 3 or x.shape[2] != self.hidden:
                # FT reads hidden_units from the tensor and would compute garbage: say it instead.
                raise ValueError(f"input_hidden_state is {list(x.shape)}, the checkpoint's hidden size is "
                                 f"{self.hidden}: send [batch, seq, {self.hidden}]")
        batch = x.shape[0]
        lens = lens.reshape(batch).astype(np.int64)
        if np.any(lens > x.shape[1]) or np.any(lens < 1):
            raise ValueError(f"sequence lengths {lens.tolist()} do not fit inputs of length {x.shape[1]}")
        key = "ids" if self.model_type == "T5-Encoder" else "x"
        hidden = self._serve_broadcast({key: x.astype(np.float64 if key == "x" else np.int64), "lens": lens})
        arrays = [("output_hidden_state", hidden.astype(self.hidden_dtype))]
        flag = self._input(request, "is_return_attentions") if self.model_type == "T5-Encoder" else None
        if flag is not None and bool(np.any(flag)):
            seq = x.shape[1]
            valid = (np.arange(seq)[None, :] < lens[:, None]).astype(np.float64)
            attn = valid[:, None, None, None, :] / lens[:, None, None, None, None]
            attn = np.broadcast_to(attn, (batch, self.layers, self.heads, seq, seq))
            arrays.append(("output_attentions", attn.astype(self.hidden_dtype)))
        return [_output(name, array) for name, array in arrays]

    def _input(self, request, name):
        tensor = pb_utils.get_input_tensor_by_name(request, name)
        if tensor is None:
            return None
        array = np.from_dlpack(tensor).copy() if _NUMPY_2 else tensor.as_numpy()
        return array[0] if self.pseudo_batch else array

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

        if self.engine is not None:
            self.engine.check(in_lens, out_lens)
            generated = self._serve_broadcast({"ids": ids.astype(np.int64), "in_lens": in_lens.astype(np.int64),
                                               "out_lens": out_lens.astype(np.int64)})
        else:
            last = ids[np.arange(batch), in_lens - 1].astype(np.int64)
            generated = self._serve_broadcast({"last": last, "out_lens": out_lens.astype(np.int64)})
        seq_lens = (in_lens + out_lens) if keep_prompt else out_lens.copy()
        width = int(seq_lens.max())
        out = np.full((batch, beam_width, width), self.end_id, dtype=np.int64)
        for b in range(batch):
            n_in, n_out = int(in_lens[b]), int(out_lens[b])
            row = generated[b, :n_out]
            if keep_prompt:
                row = np.concatenate([ids[b, :n_in].astype(np.int64), row])
            out[b, :, : row.size] = row
        seq = np.repeat(seq_lens.reshape(batch, 1), beam_width, axis=1)
        arrays = [
            ("output_ids", out.astype(self.ids_dtype)),
            ("sequence_length", seq.astype(self.len_dtype)),
            ("response_input_lengths", np.repeat(in_lens.reshape(batch, 1), beam_width, axis=1).astype(np.int32)),
            ("cum_log_probs", np.zeros((batch, beam_width), np.float32)),
            ("output_log_probs", np.zeros((batch, beam_width, width), np.float32)),
        ]
        return [_output(name, array[None] if self.pseudo_batch else array) for name, array in arrays]

    def execute(self, requests):
        responses = []
        for request in requests:
            try:
                tensors = self._encode(request) if self.encoder else self._generate(request)
                names = set(request.requested_output_names() or [t.name() for t in tensors])
                responses.append(pb_utils.InferenceResponse([t for t in tensors if t.name() in names]))
            except Exception as exc:  # one bad request must not fail the others in the batch
                responses.append(pb_utils.InferenceResponse(error=pb_utils.TritonError(str(exc))))
        return responses
