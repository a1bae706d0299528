"""CPU stand-ins for the two CUDA calls on SGLang 0.5.23's Mooncake prefill sender path (test tier).

Loaded by every Python process of an engine started by tests/engine/run.py (PYTHONPATH holds this
directory), and only when SGLANG_USE_CPU_ENGINE=1 on a host where torch sees no CUDA device.

sglang/srt/disaggregation/prefill.py:1746-1762 (`_send_kv_chunk`), when the sender is Mooncake's
(`supports_host_tensor_indices = True`, sglang/srt/disaggregation/mooncake/conn.py:3312), copies
the page indices into a `pin_memory=True` host tensor and records a `torch.cuda.Event` on
`torch.cuda.current_stream()` for the transfer worker to wait on (mooncake/conn.py:2540). With no
NVIDIA driver each of those raises "Found no NVIDIA driver on your system", the prefill's
scheduler dies at the first request and the decode reports "Lost connection with prefill
instance". On a CPU the copy is already done when it returns, so:

- `pin_memory=True` in torch.empty / torch.zeros is dropped (pinning is a CUDA DMA notion);
- `torch.cuda.current_stream()` returns None, and `torch.cuda.Event` is an event that is always
  complete (record/wait do nothing, synchronize returns at once, query is True).

Nothing else of torch or SGLang is changed.
"""

import os

if os.environ.get("SGLANG_USE_CPU_ENGINE") == "1":
    import functools

    import torch

    if not torch.cuda.is_available():

        def _unpinned(fn):
            @functools.wraps(fn)
            def wrapper(*args, **kwargs):
                kwargs.pop("pin_memory", None)
                return fn(*args, **kwargs)

            return wrapper

        class _CompletedEvent:
            """torch.cuda.Event on a CPU: the work it marks is done when record() is called."""

            def __init__(self, *_args, **_kwargs):
                pass

            def record(self, _stream=None):
                return None

            def wait(self, _stream=None):
                return None

            def synchronize(self):
                return None

            def query(self):
                return True

        torch.empty = _unpinned(torch.empty)
        torch.zeros = _unpinned(torch.zeros)
        torch.cuda.Event = _CompletedEvent
        torch.cuda.current_stream = lambda *_args, **_kwargs: None
