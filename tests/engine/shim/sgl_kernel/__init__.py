"""Stand-in for SGLang's CPU kernel package `sgl_kernel` (test tier only, docs/engine-on-cpu.md).

SGLang 0.5.23 with SGLANG_USE_CPU_ENGINE=1 imports `sgl_kernel` (the CPU build of sgl-kernel,
which is not on PyPI: it is compiled from SGLang's source tree) at module import time, e.g.
sglang/kernels/ops/kvcache/cache_move.py:10. On a CPU without AMX SGLang's layers take their
torch-native paths, so only a few of these ops are ever called. This module gives those few in
plain torch and makes every other name a stub that raises, naming the op, when it is *called*,
so an op we have not provided shows up as a clear error instead of an import failure.
"""

from __future__ import annotations

import ctypes
import sys
import types

import torch


class MissingCpuKernel(NotImplementedError):
    pass


def _stub(name: str):
    def op(*_args, **_kwargs):
        raise MissingCpuKernel(
            f"sgl_kernel.{name} is not provided by pd-operator's CPU shim "
            "(tests/engine/shim/sgl_kernel); give it a torch implementation there"
        )

    op.__name__ = name
    return op


def assign_req_to_token_pool_cpu(
    req_pool_indices, req_to_token, start_offset, end_offset, out_cache_loc, _max_ctx
):
    """req_to_token[req, start:end] = the next (end-start) entries of out_cache_loc, per request."""
    offset = 0
    for req, start, end in zip(
        req_pool_indices.tolist(), start_offset.tolist(), end_offset.tolist()
    ):
        length = end - start
        req_to_token[req, start:end] = out_cache_loc[offset : offset + length].to(
            req_to_token.dtype
        )
        offset += length


def copy_all_layer_kv_cache_cpu(data_ptrs, strides, tgt_loc, src_loc):
    """For each buffer (raw pointer + row stride in bytes) copy row src_loc[i] to tgt_loc[i]."""
    for ptr, stride in zip(data_ptrs.tolist(), strides.tolist()):
        for tgt, src in zip(tgt_loc.tolist(), src_loc.tolist()):
            ctypes.memmove(ptr + tgt * stride, ptr + src * stride, stride)


def silu_and_mul(x: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    d = x.shape[-1] // 2
    y = torch.nn.functional.silu(x[..., :d]) * x[..., d:]
    if out is not None:
        out.copy_(y)
        return out
    return y


def __getattr__(name: str):
    if name.startswith("__"):
        raise AttributeError(name)
    return _stub(name)


class _StubModule(types.ModuleType):
    def __getattr__(self, name: str):
        if name.startswith("__"):
            raise AttributeError(name)
        return _stub(f"{self.__name__.split('.', 1)[1]}.{name}")


for _sub in ("mamba", "flash_attn", "kvcacheio", "elementwise", "allreduce", "spatial"):
    sys.modules[f"{__name__}.{_sub}"] = _StubModule(f"{__name__}.{_sub}")
