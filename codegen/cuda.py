"""Thin, checked wrappers over the CUDA driver API (cuda-python). Imported only in GPU workers."""

from __future__ import annotations

import ctypes
from dataclasses import dataclass

import numpy as np
from cuda.bindings import driver

#: Errors after which the context is unusable: the worker must be replaced.
STICKY = {
    "CUDA_ERROR_ILLEGAL_ADDRESS",
    "CUDA_ERROR_MISALIGNED_ADDRESS",
    "CUDA_ERROR_ILLEGAL_INSTRUCTION",
    "CUDA_ERROR_INVALID_ADDRESS_SPACE",
    "CUDA_ERROR_INVALID_PC",
    "CUDA_ERROR_LAUNCH_FAILED",
    "CUDA_ERROR_HARDWARE_STACK_ERROR",
    "CUDA_ERROR_ASSERT",
    "CUDA_ERROR_LAUNCH_TIMEOUT",
    "CUDA_ERROR_ECC_UNCORRECTABLE",
    "CUDA_ERROR_CONTEXT_IS_DESTROYED",
    "CUDA_ERROR_UNKNOWN",
}


class CudaError(RuntimeError):
    def __init__(self, what: str, err) -> None:
        self.code = getattr(err, "name", str(err))
        self.sticky = self.code in STICKY
        super().__init__(f"{what}: {self.code}")


def check(result, what: str):
    """cuda-python returns (err, *values): raise on error, return the values."""
    err, *values = result if isinstance(result, tuple) else (result,)
    if err != driver.CUresult.CUDA_SUCCESS:
        raise CudaError(what, err)
    if not values:
        return None
    return values[0] if len(values) == 1 else tuple(values)


@dataclass
class DeviceInfo:
    name: str
    sm: str
    driver: str
    sms: int
    l2_bytes: int
    max_smem_optin: int

    def to_dict(self) -> dict:
        return dict(self.__dict__)


class Context:
    """The primary context of one device, current on this thread (shared with torch, if used)."""

    def __init__(self, ordinal: int = 0) -> None:
        check(driver.cuInit(0), "cuInit")
        self.device = check(driver.cuDeviceGet(ordinal), "cuDeviceGet")
        self.ctx = check(driver.cuDevicePrimaryCtxRetain(self.device), "cuDevicePrimaryCtxRetain")
        check(driver.cuCtxSetCurrent(self.ctx), "cuCtxSetCurrent")
        self.stream = driver.CUstream(0)
        self.info = self._info()

    def _attr(self, name: str) -> int:
        attr = getattr(driver.CUdevice_attribute, name)
        return check(driver.cuDeviceGetAttribute(attr, self.device), name)

    def _info(self) -> DeviceInfo:
        raw = check(driver.cuDeviceGetName(256, self.device), "cuDeviceGetName")
        version = check(driver.cuDriverGetVersion(), "cuDriverGetVersion")
        major = self._attr("CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR")
        minor = self._attr("CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR")
        return DeviceInfo(
            name=raw.split(b"\0")[0].decode(),
            sm=f"sm_{major}{minor}",
            driver=_driver_release() or f"{version // 1000}.{version % 1000 // 10}",
            sms=self._attr("CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT"),
            l2_bytes=self._attr("CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE"),
            max_smem_optin=self._attr("CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN"),
        )

    def synchronize(self) -> None:
        check(driver.cuCtxSynchronize(), "cuCtxSynchronize")


def _driver_release() -> str | None:
    try:
        with open("/proc/driver/nvidia/version") as f:
            for word in f.read().split():
                if word.count(".") >= 1 and word.replace(".", "").isdigit():
                    return word
    except OSError:
        return None
    return None


class Buffer:
    """A device allocation."""

    def __init__(self, nbytes: int) -> None:
        self.nbytes = max(int(nbytes), 1)
        self.ptr = check(driver.cuMemAlloc(self.nbytes), "cuMemAlloc")

    @property
    def address(self) -> int:
        return int(self.ptr)

    def upload(self, host: np.ndarray) -> None:
        host = np.ascontiguousarray(host)
        assert host.nbytes <= self.nbytes
        if host.nbytes == 0:  # an empty array (no kept blocks): nothing to copy
            return
        check(driver.cuMemcpyHtoD(self.ptr, host.ctypes.data, host.nbytes), "cuMemcpyHtoD")

    def download(self, host: np.ndarray) -> np.ndarray:
        assert host.flags.c_contiguous and host.nbytes <= self.nbytes
        check(driver.cuMemcpyDtoH(host.ctypes.data, self.ptr, host.nbytes), "cuMemcpyDtoH")
        return host

    def fill16(self, value: int, stream) -> None:
        check(driver.cuMemsetD16Async(self.ptr, value, self.nbytes // 2, stream), "cuMemsetD16Async")

    def zero(self, stream, nbytes: int | None = None) -> None:
        check(driver.cuMemsetD8Async(self.ptr, 0, nbytes or self.nbytes, stream), "cuMemsetD8Async")

    def free(self) -> None:
        if self.ptr is not None:
            driver.cuMemFree(self.ptr)
            self.ptr = None


class Module:
    """A loaded cubin and its functions."""

    def __init__(self, cubin: bytes) -> None:
        self.module = check(driver.cuModuleLoadData(cubin), "cuModuleLoadData")
        self._functions: dict[str, object] = {}

    def function(self, symbol: str, dynamic_smem: int = 0):
        if symbol not in self._functions:
            func = check(driver.cuModuleGetFunction(self.module, symbol.encode()), f"cuModuleGetFunction({symbol})")
            self._functions[symbol] = func
        func = self._functions[symbol]
        if dynamic_smem > 48 * 1024:
            attr = driver.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
            check(driver.cuFuncSetAttribute(func, attr, dynamic_smem), "cuFuncSetAttribute(max dynamic smem)")
        return func

    def unload(self) -> None:
        driver.cuModuleUnload(self.module)


def encode_tensor_map(encoding: dict, address: int) -> ctypes.Array:
    """A tiled tensor map (cuTensorMapEncodeTiled with the arguments ``encoding`` names, as
    ``codegen.launch.TensorMapArg.encoding`` gives them) over ``address`` + its offset, as the 128
    bytes a kernel takes by value: a ctypes array to launch with."""
    e = encoding
    u64, u32 = driver.cuuint64_t, driver.cuuint32_t  # the bindings take these lists as wrapped values only
    tmap = check(driver.cuTensorMapEncodeTiled(
        getattr(driver.CUtensorMapDataType, e["data_type"]), e["rank"], address + e["offset_bytes"],
        [u64(v) for v in e["global_dim"]], [u64(v) for v in e["global_strides_bytes"]], [u32(v) for v in e["box_dim"]],
        [u32(v) for v in e["element_strides"]],
        getattr(driver.CUtensorMapInterleave, e["interleave"]), getattr(driver.CUtensorMapSwizzle, e["swizzle"]),
        getattr(driver.CUtensorMapL2promotion, e["l2_promotion"]), getattr(driver.CUtensorMapFloatOOBfill, e["oob_fill"]),
    ), f"cuTensorMapEncodeTiled({e['data_type']}, dims {e['global_dim']}, strides {e['global_strides_bytes']}, "
       f"box {e['box_dim']}, {e['swizzle']})")
    return (ctypes.c_ubyte * 128).from_buffer_copy(ctypes.string_at(tmap.getPtr(), 128))


def launch(func, grid, block, smem: int, stream, args: list, cluster=(1, 1, 1)) -> None:
    """Launch with arguments given as ctypes values (pointers as c_void_p, ints as c_int, a tensor
    map as its 128-byte array). A ``cluster`` shape other than (1, 1, 1) launches thread-block
    clusters of that shape (cuLaunchKernelEx with CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION; the grid is
    in blocks and a multiple of it); otherwise a plain cuLaunchKernel."""
    holders = (ctypes.c_void_p * len(args))(*[ctypes.addressof(a) for a in args])
    launch_prepared(func, grid, block, smem, stream, ctypes.addressof(holders), tuple(cluster))


def cluster_config(grid, block, smem: int, stream, cluster) -> driver.CUlaunchConfig:
    """cuLaunchKernelEx's configuration of a cluster launch: grid and block in threads' blocks, the
    dynamic shared memory, the stream, and one attribute, the cluster dimension."""
    if any(g % c for g, c in zip(grid, cluster, strict=True)):
        raise ValueError(f"grid {tuple(grid)} is not a multiple of the cluster {tuple(cluster)}")
    attr = driver.CUlaunchAttribute()
    attr.id = driver.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION
    attr.value.clusterDim.x, attr.value.clusterDim.y, attr.value.clusterDim.z = (int(c) for c in cluster)
    config = driver.CUlaunchConfig()
    config.gridDimX, config.gridDimY, config.gridDimZ = (int(g) for g in grid)
    config.blockDimX, config.blockDimY, config.blockDimZ = (int(b) for b in block)
    config.sharedMemBytes = int(smem)
    config.hStream = stream
    config.attrs = [attr]
    config.numAttrs = 1
    return config


class Event:
    def __init__(self) -> None:
        self.event = check(driver.cuEventCreate(driver.CUevent_flags.CU_EVENT_DEFAULT), "cuEventCreate")

    def record(self, stream) -> None:
        check(driver.cuEventRecord(self.event, stream), "cuEventRecord")

    def elapsed_ms(self, start: Event) -> float:
        check(driver.cuEventSynchronize(self.event), "cuEventSynchronize")
        return float(check(driver.cuEventElapsedTime(start.event, self.event), "cuEventElapsedTime"))


def launch_prepared(func, grid, block, smem: int, stream, params: int, cluster: tuple = (1, 1, 1)) -> None:
    """Launch with a prepared argument array: ``params`` is the address of an array of pointers, one
    per kernel argument, each to that argument's value (codegen.nn fills the values in place). A
    ``cluster`` (a tuple) other than (1, 1, 1) is a thread-block cluster launch (cuLaunchKernelEx)."""
    if cluster == (1, 1, 1):
        check(driver.cuLaunchKernel(func, *grid, *block, smem, stream, params, 0), "cuLaunchKernel")
        return
    config = cluster_config(grid, block, smem, stream, cluster)
    check(driver.cuLaunchKernelEx(config, func, params, 0), f"cuLaunchKernelEx(cluster {cluster}, grid {tuple(grid)})")
