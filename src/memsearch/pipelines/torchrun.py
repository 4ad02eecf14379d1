"""The torchrun launcher of a trainer stage (``pipelines.trainer_stages``): a trainer config with
more than one rank trains as torchrun processes, children of this process, whose process group
is stopped with the stage (``serving.ownership``), so that no rank outlives an interrupt.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from memsearch.errors import InputError


def train_under_torchrun(folder: Path, kind: str, cfg: Any, resume: bool, ranks: int) -> None:
    """Train ``cfg`` into ``folder`` as ``ranks`` torchrun processes (``memsearch.train.launch``),
    their output passed through. The config JSON lies beside the folder, which the trainer owns.
    A collapse-guard stop is raised as ``CollapseError`` (the caller decides what it means), any
    other failure as ``InputError``; an interrupt stops every rank (their process group) first."""
    import subprocess

    from memsearch.serving.ownership import child_processes, kill_groups
    from memsearch.serving.process import stop_process
    from memsearch.train.grpo.collapse import CollapseError
    from memsearch.train.launch import launch_command, launch_environment, write_config

    config = folder.with_name(f"{folder.name}.launch.json")
    folder.parent.mkdir(parents=True, exist_ok=True)
    write_config(cfg, config)
    collapse = folder / "collapse.json"
    before = collapse.stat().st_mtime_ns if collapse.is_file() else None
    command = launch_command(kind, config, folder, resume, ranks)
    proc = subprocess.Popen(command, env=launch_environment(cfg), start_new_session=True)
    try:
        code = proc.wait()
    except BaseException:  # Ctrl-C, SIGTERM as SystemExit: no rank may outlive the stage
        # torchrun starts each rank in a session of its own and stops them on SIGTERM; the ranks
        # are noted first so that none is left running if torchrun itself must be killed.
        ranks_started = child_processes(proc.pid)
        stop_process(proc)
        kill_groups(ranks_started)
        raise
    if code == 0:
        return
    if collapse.is_file() and collapse.stat().st_mtime_ns != before:
        raise CollapseError(f"{folder}: the collapse guard stopped the run ({collapse})")
    raise InputError(f"{folder.name}: the trainer under torchrun exited with status {code} "
                     f"(its output above says why): {' '.join(command)}")
