"""Model servers a run starts, checks and stops (vLLM, SGLang, ``transformers serve``,
llama-cpp-python's server): ``ServiceSpec`` and the launch templates in ``engines``, the
processes in ``process``."""

from memsearch.serving.engines import ServiceSpec, launch_command
from memsearch.serving.process import (
    RunningService,
    check_ports_free,
    running_services,
    served_identity,
    stop_on_signals,
)

__all__ = ["RunningService", "ServiceSpec", "check_ports_free", "launch_command", "running_services",
           "served_identity", "stop_on_signals"]
