"""Argument checks of the Python API: each failure is a TypeError (not a tensor, wrong kind) or a ValueError (wrong
dtype, device, shape, value) naming the argument and what is allowed, before any kernel runs."""
import torch


def check_tensor(name: str, t) -> None:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name}: must be a torch.Tensor, got {type(t).__name__}")
    if t.device.type != "cpu":
        raise ValueError(f"{name}.device = {t.device}: rotary's kernels run on the CPU; pass {name}.cpu()")


def check_float_tensor(name: str, t, allowed) -> None:
    check_tensor(name, t)
    if t.dtype not in allowed:
        names = ", ".join(str(a).replace("torch.", "") for a in allowed)
        raise ValueError(f"{name}.dtype = {str(t.dtype).replace('torch.', '')}: allowed {names}")


def check_int_tensor(name: str, t) -> None:
    check_tensor(name, t)
    if t.dtype not in (torch.int32, torch.int64):
        raise ValueError(f"{name}.dtype = {str(t.dtype).replace('torch.', '')}: allowed int32, int64")


def compiling() -> bool:
    """True while torch.compile traces (torch 2.x). Checks that read a tensor's values on the host are skipped
    then, so that the trace has no graph break; the kernels check the same values again and name the field."""
    dynamo = getattr(torch, "_dynamo", None)
    return bool(dynamo is not None and hasattr(dynamo, "is_compiling") and dynamo.is_compiling())
