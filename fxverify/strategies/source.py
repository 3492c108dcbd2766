"""A drawn GraphModule as runnable Python: a module class with its parameters,
buffers, constants and submodules written out, the graph's ``forward``, and the
code that builds its inputs. This is what a falsifying example prints.

>>> import torch
>>> from fxverify.cases.catalogue import InputSpec
>>> gm = torch.fx.symbolic_trace(torch.nn.Sequential(torch.nn.ReLU()))
>>> print(module_source(gm, (InputSpec((2,)),)).splitlines()[-2])  # doctest: +NORMALIZE_WHITESPACE
inputs = input_configs([InputSpec(shape=(2,), dtype='float32', low=None, high=None,
                                  memory_format='contiguous_format')], (2,))[0].make(0)
"""

from __future__ import annotations

import textwrap
from collections.abc import Sequence

import torch
from torch import fx, nn

from fxverify.cases.catalogue import InputSpec


def tensor_source(tensor: torch.Tensor) -> str:
    """A ``torch.tensor(...)`` expression rebuilding ``tensor`` exactly.

    >>> tensor_source(torch.tensor([1.5, float("nan")]))
    "torch.tensor([1.5, float('nan')], dtype=torch.float32)"
    """
    values = tensor.detach().double().tolist() if tensor.is_floating_point() else tensor.tolist()
    text = repr(values).replace("nan", "float('nan')").replace("inf", "float('inf')")
    return f"torch.tensor({text}, dtype={tensor.dtype})"


def _module_line(name: str, module: nn.Module) -> list[str]:
    dtypes = {t.dtype for t in [*module.parameters(), *module.buffers()] if t.is_floating_point()}
    cast = f".to({dtypes.pop()})" if len(dtypes) == 1 and torch.float32 not in dtypes else ""
    lines = [f"self.{name} = torch.nn.{module!r}{cast}"]
    state = module.state_dict()
    if state:
        entries = ", ".join(f"{key!r}: {tensor_source(value)}" for key, value in state.items())
        lines.append(f"self.{name}.load_state_dict({{{entries}}})")
    return lines


def module_source(module: fx.GraphModule, inputs: Sequence[InputSpec], seed: int = 0) -> str:
    """Python source that rebuilds ``module`` (as ``RandomGraph``) and its inputs, and runs it."""
    init: list[str] = []
    for name, child in module.named_children():
        init.extend(_module_line(name, child))
    for name, param in module.named_parameters(recurse=False):
        init.append(f"self.{name} = torch.nn.Parameter({tensor_source(param)}, requires_grad={param.requires_grad})")
    for name, buffer in module.named_buffers(recurse=False):
        init.append(f"self.register_buffer({name!r}, {tensor_source(buffer)})")
    for name, value in vars(module).items():
        if isinstance(value, torch.Tensor):
            init.append(f"self.{name} = {tensor_source(value)}")
    body = "\n".join(["def __init__(self):", "    super().__init__()", *("    " + line for line in init)])
    forward = textwrap.dedent(module.code).strip()
    specs = ", ".join(repr(spec) for spec in inputs)
    return "\n".join([
        "import torch",
        "inf, nan = float('inf'), float('nan')",
        "from fxverify.cases.catalogue import InputSpec",
        "from fxverify.cases.inputs import input_configs",
        "",
        "class RandomGraph(torch.nn.Module):",
        textwrap.indent(body, "    "),
        "",
        textwrap.indent(forward, "    "),
        "",
        "module = RandomGraph()" + ("" if module.training else ".eval()"),
        f"inputs = input_configs([{specs}], ({inputs[0].shape[0]},))[0].make({seed})",
        "outputs = module(*inputs)",
    ])
