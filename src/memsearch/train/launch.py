"""One trainer run from a saved config: the entry point of a trainer started under torchrun.

A pipeline stage whose layout has several training ranks (``training_ranks``) does not train in
its own process: it writes the trainer config as JSON beside the stage folder and starts

    python -m torch.distributed.run --standalone --nproc_per_node N -m memsearch.train.launch grpo CONFIG OUT

(``launch_command``), one rank a training GPU, or ``devices.cpu_ranks`` gloo ranks when the
layout names no training GPU. Each rank validates the config (``GRPOConfig`` / ``SFTConfig``)
and runs ``train_grpo`` / ``train_sft``, which apply the layout (``CUDA_VISIBLE_DEVICES``) and
join torchrun's process group themselves, exactly as ``memsearch train`` under torchrun.
Exit status: 0 trained, 2 refused (``InputError``, its message on stderr), 3 stopped by the
collapse guard (``collapse.json`` in OUT).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

KINDS = ("grpo", "sft")


def training_ranks(cfg: Any) -> int:
    """Ranks a trainer config's layout asks for: one per training GPU, else ``devices.cpu_ranks``."""
    return len(cfg.devices.train) or cfg.devices.cpu_ranks


def write_config(cfg: Any, path: Path) -> None:
    """``cfg`` as JSON at ``path``, atomically (a crash leaves the old file or none)."""
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    tmp.write_text(cfg.model_dump_json(indent=2) + "\n", encoding="utf-8")
    os.replace(tmp, path)


def launch_command(kind: str, config: Path, out: Path, resume: bool, ranks: int) -> list[str]:
    """The torchrun command line that trains ``kind`` from ``config`` into ``out`` on ``ranks``
    ranks (``--standalone``: a rendezvous of its own on a free local port)."""
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={ranks}",
            "-m", "memsearch.train.launch", kind, str(config), str(out), *(["--resume"] if resume else [])]


def launch_environment(cfg: Any, environ: dict[str, str] | None = None) -> dict[str, str]:
    """The ranks' environment: this one, with every GPU hidden when the layout names none (the
    ``cpu_ranks`` ranks are CPU processes on gloo, whatever GPUs the node has)."""
    env = dict(os.environ if environ is None else environ)
    if not cfg.devices.train:
        env["CUDA_VISIBLE_DEVICES"] = ""
    return env


def main(argv: list[str] | None = None) -> int:
    """``KIND CONFIG_JSON OUT [--resume]``: one rank of a trainer run; returns the exit status."""
    from memsearch.errors import InputError
    from memsearch.train.grpo.collapse import CollapseError

    args = list(sys.argv[1:] if argv is None else argv)
    resume = "--resume" in args
    args = [a for a in args if a != "--resume"]
    if len(args) != 3 or args[0] not in KINDS:
        print(f"usage: python -m memsearch.train.launch {{{'|'.join(KINDS)}}} CONFIG_JSON OUT [--resume]",
              file=sys.stderr)
        return 2
    kind, config, out = args
    try:
        if kind == "grpo":
            from memsearch.train.config import GRPOConfig
            from memsearch.train.grpo.trainer import train_grpo as train

            cfg: Any = GRPOConfig.model_validate_json(Path(config).read_text(encoding="utf-8"))
        else:
            from memsearch.train.config import SFTConfig
            from memsearch.train.sft.trainer import train_sft as train

            cfg = SFTConfig.model_validate_json(Path(config).read_text(encoding="utf-8"))
        train(cfg, out, resume=resume, echo=lambda line: print(line, flush=True))
    except InputError as exc:
        print(f"error: {exc}", file=sys.stderr, flush=True)
        return 2
    except CollapseError as exc:
        print(f"stopped: {exc}", file=sys.stderr, flush=True)
        return 3
    return 0


if __name__ == "__main__":
    sys.exit(main())
