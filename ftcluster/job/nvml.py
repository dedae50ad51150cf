"""NVML's XID and ECC events, through ctypes on the driver's libnvidia-ml.so.1.

The node sampler (gpu_sampler.py) waits on them in a thread of its own. ctypes and the driver's
own library, not nvidia-ml-py: this runs in the user's image with its python3 (stdlib only), and
where the library is missing (a CPU node, an image without the driver's user-space mounted)
`Nvml()` raises OSError and nothing is watched.

The layouts are NVIDIA's nvml.h: nvmlEventSetWait_v2 fills the nvmlEventData_t that carries the
MIG instance ids (the v1 call's struct stops after eventData); nvmlDevice_t and nvmlEventSet_t
are opaque pointers.
"""

from __future__ import annotations

import ctypes
from typing import Any, Dict, List, NamedTuple, Optional, Tuple

# nvmlReturn_t values the watcher acts on.
SUCCESS = 0
ERROR_NOT_SUPPORTED = 3
ERROR_TIMEOUT = 10
# nvmlEventType* bits (nvml.h).
SINGLE_BIT_ECC = 0x1
DOUBLE_BIT_ECC = 0x2
XID_CRITICAL = 0x8
WATCHED = XID_CRITICAL | DOUBLE_BIT_ECC | SINGLE_BIT_ECC
KINDS = {XID_CRITICAL: "xid", DOUBLE_BIT_ECC: "ecc_dbe", SINGLE_BIT_ECC: "ecc_sbe"}
# gpuInstanceId / computeInstanceId when the event is not a MIG instance's.
NO_INSTANCE = 0xFFFFFFFF
UUID_BUFFER = 96   # NVML_DEVICE_UUID_V2_BUFFER_SIZE


class EventData(ctypes.Structure):
    """nvmlEventData_t (nvml.h), as nvmlEventSetWait_v2 fills it."""

    _fields_ = [("device", ctypes.c_void_p),            # nvmlDevice_t
                ("eventType", ctypes.c_ulonglong),
                ("eventData", ctypes.c_ulonglong),      # the XID for nvmlEventTypeXidCriticalError (999: unknown)
                ("gpuInstanceId", ctypes.c_uint),
                ("computeInstanceId", ctypes.c_uint)]


class Event(NamedTuple):
    """One event as the sampler records it: the GPU by index and UUID (-1 and "-": a device NVML
    did not name), its kind (xid, ecc_dbe, ecc_sbe) and the XID (0 for ECC events)."""

    gpu: int
    uuid: str
    kind: str
    data: int
    gpu_instance: Optional[int] = None
    compute_instance: Optional[int] = None


def decode(raw: EventData, devices: Dict[int, Tuple[int, str]]) -> Event:
    """An event from NVML's struct; `devices`: device handle -> (index, UUID)."""
    index, uuid = devices.get(raw.device or 0, (-1, "-"))
    kind = next((name for bit, name in KINDS.items() if raw.eventType & bit), f"0x{raw.eventType:x}")

    def instance(v: int) -> Optional[int]:
        return None if v == NO_INSTANCE else int(v)
    return Event(index, uuid, kind, int(raw.eventData) if kind == "xid" else 0,
                 instance(raw.gpuInstanceId), instance(raw.computeInstanceId))


class NvmlError(Exception):
    def __init__(self, call: str, code: int, text: str):
        super().__init__(f"{call}: {text} ({code})")
        self.code = code


class Nvml:
    """NVML's event set over every GPU of the node. `lib`: the library (a stand-in in tests)."""

    def __init__(self, lib: Any = None):
        self.lib = lib if lib is not None else ctypes.CDLL("libnvidia-ml.so.1")
        self.lib.nvmlErrorString.restype = ctypes.c_char_p
        self.set = ctypes.c_void_p()
        self.devices: Dict[int, Tuple[int, str]] = {}   # handle -> (index, UUID)
        self.registered: Dict[int, int] = {}            # index -> the event bits watched there
        self.notes: List[str] = []                      # why a GPU is not watched
        self.started = False

    def _call(self, name: str, *args: Any) -> int:
        rc = int(getattr(self.lib, name)(*args))
        if rc != SUCCESS and rc != ERROR_TIMEOUT:
            raise NvmlError(name, rc, (self.lib.nvmlErrorString(rc) or b"?").decode(errors="replace"))
        return rc

    def open(self) -> None:
        """Every GPU's XID and ECC events into one set; a GPU that supports none is noted."""
        self._call("nvmlInit_v2")
        self.started = True
        count = ctypes.c_uint()
        self._call("nvmlDeviceGetCount_v2", ctypes.byref(count))
        self._call("nvmlEventSetCreate", ctypes.byref(self.set))
        for i in range(count.value):
            handle = ctypes.c_void_p()
            self._call("nvmlDeviceGetHandleByIndex_v2", ctypes.c_uint(i), ctypes.byref(handle))
            buf = ctypes.create_string_buffer(UUID_BUFFER)
            self._call("nvmlDeviceGetUUID", handle, buf, ctypes.c_uint(UUID_BUFFER))
            self.devices[handle.value or 0] = (i, buf.value.decode(errors="replace"))
            supported = ctypes.c_ulonglong()
            self._call("nvmlDeviceGetSupportedEventTypes", handle, ctypes.byref(supported))
            bits = supported.value & WATCHED
            if not bits:
                self.notes.append(f"GPU {i}: no XID/ECC events (supported 0x{supported.value:x})")
                continue
            try:
                self._call("nvmlDeviceRegisterEvents", handle, ctypes.c_ulonglong(bits), self.set)
            except NvmlError as e:   # a GPU that refuses (a vGPU, no permission) leaves the others
                self.notes.append(f"GPU {i}: {e}")
                continue
            self.registered[i] = bits

    def wait(self, timeout_ms: int) -> Optional[Event]:
        """The next event, or None after `timeout_ms` without one."""
        raw = EventData()
        if self._call("nvmlEventSetWait_v2", self.set, ctypes.byref(raw), ctypes.c_uint(timeout_ms)) == ERROR_TIMEOUT:
            return None
        return decode(raw, self.devices)

    def close(self) -> None:
        if self.set.value:
            self.lib.nvmlEventSetFree(self.set)
            self.set = ctypes.c_void_p()
        if self.started:
            self.lib.nvmlShutdown()
            self.started = False
