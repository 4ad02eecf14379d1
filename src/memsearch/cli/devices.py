"""``memsearch devices``: a config's GPU layout (its ``[devices]`` table, ``memsearch.devices``),
or the ``CUDA_VISIBLE_DEVICES`` value of one of its users, for shell recipes::

    CUDA_VISIBLE_DEVICES=$(memsearch devices --config configs/memory_policy_gpu.toml --for reader) vllm serve ...

Imports stay inside the body, so ``memsearch --help`` stays instant.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from memsearch.cli.common import Overrides, friendly


@friendly
def devices(
    config: Annotated[Path, typer.Option(
        "--config", help="Any memsearch config with a [devices] table (trainer, pipeline).")],
    for_: Annotated[Optional[str], typer.Option(
        "--for", help="Print only the CUDA_VISIBLE_DEVICES value of this use: 'train' or a service name.")] = None,
    check: Annotated[bool, typer.Option(
        help="Also refuse a layout naming a GPU this machine does not have (needs torch's CUDA).")] = False,
    set_: Overrides = None,
) -> None:
    """The GPU layout of a config: which GPUs train and which serve (one line per GPU), or with --for
    the comma-separated GPUs of one use; refuses a layout where two uses share a GPU."""
    from memsearch.config import config_from_tables, read_config_file
    from memsearch.devices import LayoutOf
    from memsearch.errors import InputError

    layout = config_from_tables(read_config_file(config), set_, LayoutOf, str(config)).devices
    if check:
        import torch

        layout.check_count(torch.cuda.device_count())
    if for_ is not None:
        if not layout.gpus_of(for_):
            raise InputError(f"{config}: devices.{for_}: no GPUs listed; expected a non-empty list of GPU indices")
        typer.echo(layout.visible(for_))
        return
    if layout.empty:
        typer.echo(f"{config}: no [devices] layout: every process uses what CUDA_VISIBLE_DEVICES gives it")
    for line in layout.lines():
        typer.echo(line)
