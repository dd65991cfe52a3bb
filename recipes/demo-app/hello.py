"""Demo entrypoint: proves the CUDA runtime library loads by name, with or without a GPU."""

import ctypes
import json
import os

import numpy

lib = ctypes.CDLL("libcudart.so.12")
version = ctypes.c_int()
lib.cudaRuntimeGetVersion(ctypes.byref(version))
count = ctypes.c_int()
status = lib.cudaGetDeviceCount(ctypes.byref(count))
print(json.dumps({
    "cudart": version.value,
    "gpus": count.value if status == 0 else 0,
    "cuda_status": status,
    "numpy": numpy.__version__,
    "require_cuda": os.environ.get("NVIDIA_REQUIRE_CUDA"),
}))
