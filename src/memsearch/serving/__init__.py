"""Model servers a run starts, checks and stops (vLLM, SGLang, ``transformers serve``,
llama-cpp-python's server): ``ServiceSpec`` and the launch templates in ``engines``, the
processes in ``process``; who owns a server and its port, and servers a previous invocation
left running, in ``ownership``."""

from memsearch.serving.engines import ServiceSpec, launch_command
from memsearch.serving.ownership import Orphan, process_start_time, recorded_orphans, stop_orphan
from memsearch.serving.process import (
    PortTaken,
    RunningService,
    ServiceDied,
    check_ports_free,
    running_services,
    served_identity,
    stop_on_signals,
)

__all__ = ["Orphan", "PortTaken", "RunningService", "ServiceDied", "ServiceSpec", "check_ports_free",
           "launch_command", "process_start_time", "recorded_orphans", "running_services", "served_identity",
           "stop_on_signals", "stop_orphan"]
