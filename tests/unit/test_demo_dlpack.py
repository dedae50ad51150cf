"""The test model's outputs through DLPack (numpy >= 2): the python backend stub renames a capsule
it took over "used_dlpack", where the DLPack protocol says "used_dltensor", and numpy's capsule
destructor then reports "PyCapsule_GetPointer called with incorrect name" for every output
tensor (a traceback each in the rank log under numpy 2.5.2 on the GPU machine).

The stub is stood in for by its FromDLPackCapsule and DeleteDLPack as python_backend's
src/pb_tensor.cc has them (take the DLManagedTensor by the capsule's own name, rename the capsule
"used_dlpack", call the tensor's deleter when the Tensor goes). Each case runs in a child
interpreter: numpy reports through sys.unraisablehook with the dying capsule, which a hook in
this process cannot safely touch, and the default hook writes to stderr, as in the stub.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

MODEL = Path(__file__).resolve().parents[2] / "ftcluster/demo/model_repository/fastertransformer/1/model.py"

STUB = textwrap.dedent('''
    import ctypes, gc, importlib.util, sys, types
    import numpy as np

    class DLTensor(ctypes.Structure):
        _fields_ = [("data", ctypes.c_void_p), ("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32),
                    ("ndim", ctypes.c_int32), ("code", ctypes.c_uint8), ("bits", ctypes.c_uint8),
                    ("lanes", ctypes.c_uint16), ("shape", ctypes.POINTER(ctypes.c_int64)),
                    ("strides", ctypes.c_void_p), ("byte_offset", ctypes.c_uint64)]

    class DLManagedTensor(ctypes.Structure):
        pass

    DELETER = ctypes.CFUNCTYPE(None, ctypes.POINTER(DLManagedTensor))
    DLManagedTensor._fields_ = [("dl_tensor", DLTensor), ("manager_ctx", ctypes.c_void_p), ("deleter", DELETER)]
    name_of = ctypes.PYFUNCTYPE(ctypes.c_char_p, ctypes.py_object)(("PyCapsule_GetName", ctypes.pythonapi))
    pointer_of = ctypes.PYFUNCTYPE(ctypes.c_void_p, ctypes.py_object, ctypes.c_char_p)(
        ("PyCapsule_GetPointer", ctypes.pythonapi))
    set_name = ctypes.PYFUNCTYPE(ctypes.c_int, ctypes.py_object, ctypes.c_char_p)(("PyCapsule_SetName", ctypes.pythonapi))
    USED = b"used_dlpack"

    class Tensor:
        def __init__(self, name, managed):
            self.name, self.managed = name, managed
            t = managed.contents.dl_tensor
            self.values = [t.shape[i] for i in range(t.ndim)]

        def __del__(self):   # PbTensor::DeleteDLPack
            self.managed.contents.deleter(self.managed)

        @staticmethod
        def from_dlpack(name, tensor):   # PbTensor::FromDLPack (a CPU tensor), FromDLPackCapsule
            capsule = tensor if type(tensor).__name__ == "PyCapsule" else tensor.__dlpack__(stream=None)
            managed = ctypes.cast(pointer_of(capsule, name_of(capsule)), ctypes.POINTER(DLManagedTensor))
            set_name(capsule, USED)
            return Tensor(name, managed)

    pb_utils = types.ModuleType("triton_python_backend_utils")
    pb_utils.Tensor = Tensor
    sys.modules["triton_python_backend_utils"] = pb_utils
    spec = importlib.util.spec_from_file_location("ft_test_model", sys.argv[1])
    model = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(model)
''')


def _run(case: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", STUB + textwrap.dedent(case), str(MODEL)],
                          capture_output=True, text=True, timeout=60, check=False)


def test_outputs_through_dlpack_leave_no_capsule_error() -> None:
    p = _run('''
        for i in range(20):
            t = model._from_dlpack("output_ids", np.arange(6, dtype=np.int32).reshape(2, 3) + i)
            assert t.values == [2, 3], t.values
            del t
        gc.collect()
        print("ok")
    ''')
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip() == "ok"
    assert "PyCapsule" not in p.stderr and "Exception ignored" not in p.stderr, p.stderr


def test_the_stubs_own_name_is_what_numpy_reports() -> None:
    """The case above can fail: handed over as the stub takes it, the capsule is reported. (numpy 1
    names the dying capsule in its report, which recurses and may end the child with SIGSEGV, so
    only the report is asserted.)"""
    p = _run('''
        capsule = np.arange(6, dtype=np.int32).__dlpack__()
        t = Tensor.from_dlpack("output_ids", capsule)
        del capsule
        gc.collect()
        print("ok")
    ''')
    assert "PyCapsule_GetPointer called with incorrect name" in p.stderr, p.stderr


def test_the_ensembles_test_model_has_every_file_of_the_test_model() -> None:
    """The ensemble's fastertransformer step is the same test model: where torch sees a GPU its
    model.py imports gpt_cuda.py from its own folder (it failed to load there without it)."""
    own = MODEL.parent
    ensemble = MODEL.parents[3] / "ensemble_repository" / "fastertransformer" / "1"
    names = sorted(p.name for p in own.glob("*.py"))
    assert "gpt_cuda.py" in names
    for name in names:
        assert (ensemble / name).read_bytes() == (own / name).read_bytes(), name
