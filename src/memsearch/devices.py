"""Device placement as configuration: which GPUs of a node train and which serve.

One ``[devices]`` table is the single source of truth for a node's layout. The trainers read it
(``TrainerConfig.devices``), the pipelines pass theirs to every stage they train, and shell
recipes read it through ``memsearch devices --config FILE --for NAME`` (the
``CUDA_VISIBLE_DEVICES`` value of one user), so a documented ``vllm serve`` and a torchrun launch
cannot be given overlapping GPUs by hand::

    [devices]
    train = [0, 1, 2, 3, 4, 5, 6]     # one training rank per GPU (torchrun --nproc_per_node 7)
    services = { reader = [7] }       # each served model on GPUs of its own

A layout where a service and a training rank (or two services) share a GPU is refused, naming
the GPU, unless ``allow_shared = true``: vLLM takes 90 % of a device's memory by default, so a
shared GPU is an out-of-memory at start-up, not a slowdown. An empty layout (the default) places
nothing: the process uses what ``CUDA_VISIBLE_DEVICES`` and torchrun give it, as before.

The check that the GPUs a layout names are there and compute runs where a run starts
(``experiment.device_check``): this module only describes and applies layouts.
"""

from __future__ import annotations

import os

from pydantic import ConfigDict, Field, model_validator

from memsearch.config import KeyProblems, StrictConfig
from memsearch.errors import InputError

TRAIN = "train"  # the name of the trainer's GPUs in ``DeviceLayout.gpus_of``


class DeviceLayout(StrictConfig):
    """Which GPUs (indices as ``nvidia-smi`` numbers them) train and which serve."""

    train: list[int] = Field(
        default_factory=list,
        description="GPUs of the trainer, one rank each in this order (rank r on train[r]); [] = the process "
        "uses what CUDA_VISIBLE_DEVICES and torchrun give it",
    )
    services: dict[str, list[int]] = Field(
        default_factory=dict,
        description="GPUs of each served model by name (e.g. reader = [7]): what `memsearch devices --for NAME` "
        "prints for its server's CUDA_VISIBLE_DEVICES",
    )
    cpu_ranks: int = Field(
        1,
        ge=1,
        description="With no training GPU named: torchrun processes (gloo) for each training stage; > 1 tests the "
        "multi-rank path on a CPU",
    )
    allow_shared: bool = Field(
        False,
        description="Allow a GPU in two uses (a service and the trainer, or two services): only when you have "
        "capped each server's memory yourself (vLLM --gpu-memory-utilization)",
    )

    @model_validator(mode="after")
    def _valid_layout(self) -> DeviceLayout:
        problems = []
        uses = {TRAIN: self.train, **self.services}
        if self.cpu_ranks > 1 and self.train:
            problems.append(("cpu_ranks", f"{self.cpu_ranks}: for a CPU run only; with training GPUs {self.train} "
                             "there is one rank per GPU (leave cpu_ranks at 1)"))
        if TRAIN in self.services:
            problems.append((f"services.{TRAIN}", f"'{TRAIN}' names the trainer's GPUs; name the service otherwise"))
        for name, gpus in uses.items():
            key = TRAIN if name == TRAIN else f"services.{name}"
            if any(g < 0 for g in gpus):
                problems.append((key, f"{gpus}: expected GPU indices >= 0"))
            if len(set(gpus)) != len(gpus):
                problems.append((key, f"{gpus}: a GPU is listed twice"))
            if name != TRAIN and not gpus:
                problems.append((key, "[]: expected at least one GPU for a service"))
        if not self.allow_shared:
            owner: dict[int, str] = {}
            for name, gpus in uses.items():
                for gpu in gpus:
                    if gpu in owner and owner[gpu] != name:
                        problems.append((
                            "services" if name != TRAIN else TRAIN,
                            f"GPU {gpu} is given to both {owner[gpu]!r} and {name!r}: a server takes most of a "
                            "GPU's memory (vLLM 90 % by default), so the other cannot load; give each its own GPUs, "
                            "or set devices.allow_shared = true once each server's memory is capped",
                        ))
                    owner.setdefault(gpu, name)
        if problems:
            raise KeyProblems(*problems)
        return self

    @property
    def empty(self) -> bool:
        return not self.train and not self.services

    def gpus_of(self, name: str) -> list[int]:
        """The GPUs of ``name`` (``"train"`` or a service); ``InputError`` naming the known uses."""
        if name == TRAIN:
            return list(self.train)
        if name not in self.services:
            known = ", ".join([TRAIN, *self.services]) if self.train else ", ".join(self.services) or "none"
            raise InputError(f"devices: no use named {name!r} in this layout; expected one of: {known}")
        return list(self.services[name])

    def visible(self, name: str) -> str:
        """``CUDA_VISIBLE_DEVICES`` for ``name``: its GPUs, comma-separated."""
        return ",".join(str(g) for g in self.gpus_of(name))

    def check_count(self, count: int) -> None:
        """Refuse (``InputError``) a layout naming a GPU this node does not have (``count`` GPUs)."""
        missing = sorted({g for gpus in (self.train, *self.services.values()) for g in gpus if g >= count})
        if missing:
            raise InputError(f"devices: GPU {', '.join(map(str, missing))} named in the layout, but this node has "
                             f"{count} GPU(s) (0-{count - 1}); expected indices below {count}")

    def lines(self) -> list[str]:
        """One line per GPU in use: ``GPU 7: reader``."""
        users: dict[int, list[str]] = {}
        for name, gpus in {TRAIN: self.train, **self.services}.items():
            for g in gpus:
                users.setdefault(g, []).append(name)
        return [f"GPU {g}: {', '.join(names)}" for g, names in sorted(users.items())]


class LayoutOf(StrictConfig):
    """The ``[devices]`` table of any memsearch config, its other tables ignored (``memsearch devices``)."""

    model_config = ConfigDict(extra="ignore")

    devices: DeviceLayout = Field(default_factory=DeviceLayout, description="The config's GPU layout")


def apply_training_layout(layout: DeviceLayout, local_world: int | None = None,
                          environ: dict[str, str] | None = None) -> None:
    """Make this process see the trainer's GPUs: ``CUDA_VISIBLE_DEVICES`` set to ``layout.train``
    (so local rank r runs on ``train[r]``), before CUDA reads it.

    Refuses (``InputError``) when the variable is already set to other GPUs (two sources of truth
    that disagree), when torchrun started more local ranks than the layout has training GPUs, or
    when CUDA was initialised before the layout could apply. An empty ``train`` changes nothing."""
    env = os.environ if environ is None else environ
    if not layout.train:
        return
    wanted = ",".join(str(g) for g in layout.train)
    given = env.get("CUDA_VISIBLE_DEVICES")
    if given is not None and given.replace(" ", "") != wanted:
        raise InputError(f"devices.train: CUDA_VISIBLE_DEVICES={given} is set and differs from the layout's "
                         f"training GPUs {wanted}; unset it (the layout places the ranks) or make them agree")
    world = local_world if local_world is not None else int(env.get("LOCAL_WORLD_SIZE", "1"))
    if world > len(layout.train):
        raise InputError(f"devices.train: {world} local ranks but {len(layout.train)} training GPU(s) "
                         f"({wanted}); expected torchrun --nproc_per_node {len(layout.train)}")
    if given is None:
        import torch

        if torch.cuda.is_initialized():
            raise InputError("devices.train: CUDA was initialised before the device layout was applied, so "
                             f"CUDA_VISIBLE_DEVICES cannot take effect; set CUDA_VISIBLE_DEVICES={wanted} yourself")
        env["CUDA_VISIBLE_DEVICES"] = wanted
