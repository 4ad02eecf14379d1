"""The one-writer lock of a folder (issue 54): ``eval.run_folder.FolderLock``, shared by eval run
folders and pipeline folders (``hold_folder_lock``). A second process is refused naming the
holder's pid; the lock of a killed process is taken over; a ``.lock`` that is a folder, a FIFO or
a symlink is refused, never followed. Real processes: flock locks are per open file, so a second
process is modelled by a second real process (or a second open file, as the run-folder tests do)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from memsearch.errors import InputError
from memsearch.eval.run_folder import FolderLock, hold_folder_lock, release_folder_lock

# A process that takes the lock of the folder argv[1], says so, then waits to be killed.
_HOLDER = """
import sys, time
from pathlib import Path
from memsearch.eval.run_folder import hold_folder_lock
hold_folder_lock(Path(sys.argv[1]), "pipeline folder", "then run the pipeline again")
print("held", flush=True)
time.sleep(120)
"""


def _holder(folder: Path) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-c", _HOLDER, str(folder)], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "held"
    return proc


def test_a_second_process_is_refused_naming_the_holder_and_takes_over_once_it_is_killed(tmp_path):
    folder = tmp_path / "pipeline"
    folder.mkdir()
    holder = _holder(folder)
    try:
        with pytest.raises(InputError) as refused:
            FolderLock(folder, "pipeline folder", "then run the pipeline again")
        assert str(refused.value) == (
            f"{folder}: another memsearch process (pid {holder.pid}) is writing this pipeline folder "
            f"({folder / '.lock'} is locked); wait for it to finish, or stop it, then run the pipeline again"
        )
    finally:
        holder.send_signal(signal.SIGKILL)  # kill -9: no clean-up runs, the file still names it
        holder.wait(timeout=30)
        holder.stdout.close()
    assert (folder / ".lock").read_text() == f"pid {holder.pid}\n"
    lock = FolderLock(folder)  # the kernel dropped the dead holder's flock: taken over
    try:
        assert (folder / ".lock").read_text() == f"pid {os.getpid()}\n"
    finally:
        lock.release()


def test_a_stale_lock_file_of_a_process_that_is_gone_is_taken_over(tmp_path):
    (tmp_path / ".lock").write_text("pid 999999999\n")  # written by a process that no longer exists
    lock = FolderLock(tmp_path)
    lock.release()
    assert (tmp_path / ".lock").read_text() == f"pid {os.getpid()}\n"


def test_the_process_that_holds_a_pipeline_folder_can_reenter_it_and_release_it(tmp_path):
    first = hold_folder_lock(tmp_path, "pipeline folder", "then run the pipeline again")
    assert hold_folder_lock(tmp_path / ".", "pipeline folder", "then run the pipeline again") is first
    release_folder_lock(tmp_path)
    again = FolderLock(tmp_path)  # released: anyone may take it
    again.release()


def _as_folder(path: Path) -> str:
    path.mkdir()
    return "is a folder"


def _as_fifo(path: Path) -> str:
    os.mkfifo(path)
    return "not a plain file"


def _as_symlink(path: Path) -> str:
    target = path.parent.parent / "outside.txt"
    target.write_text("precious\n")
    path.symlink_to(target)
    return "is a symlink"


def _as_dangling_symlink(path: Path) -> str:
    path.symlink_to(path.parent.parent / "nowhere")
    return "is a symlink"


@pytest.mark.parametrize("make", [_as_folder, _as_fifo, _as_symlink, _as_dangling_symlink])
def test_a_lock_path_that_is_no_plain_file_is_refused_and_never_followed(tmp_path, make):
    folder = tmp_path / "run"
    folder.mkdir()
    what = make(folder / ".lock")
    started = time.perf_counter()
    with pytest.raises(InputError, match=rf"^{folder / '.lock'}: {what}, expected the plain lock file"):
        FolderLock(folder)
    assert time.perf_counter() - started < 5  # a FIFO is not waited on
    outside = tmp_path / "outside.txt"
    assert not outside.exists() or outside.read_text() == "precious\n"
    assert not (tmp_path / "nowhere").exists()
