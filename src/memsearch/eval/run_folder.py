"""An eval run folder's records and who may write it (docs/design.md §10).

- ``check_run_folder``: before anything is built or created, refuse what cannot work: a folder
  that exists without ``--resume``, ``--resume`` of a missing or half-made folder, or a resume
  whose config, data or model identity differs from the recorded run.
- ``claim_run_folder``: create the folder (an atomic ``mkdir``: of two processes that start
  together, exactly one gets it) or reopen it for ``--resume``, and take an exclusive ``flock``
  on ``OUT/.lock`` for the rest of the process, so two writers never append to one run
  (``FolderLock``; a pipeline folder is locked the same way, ``hold_folder_lock``).
  ``config.json`` and ``run.json`` are written atomically (temp file + rename).
- ``create_marked_folder`` / ``check_made_by``: the marker (``MARKER``) a command writes into a
  folder the moment it creates it, and the check that a later ``--resume`` (or pipeline re-run)
  writes only into a folder whose marker names that command.
- ``replacing``: a file written whole under a temporary name, then renamed onto its own (records,
  and the report's page and plots).
- ``model_identity``: what answered each role, by content: SHA-256 of the embedded GGUF file,
  of a local model's config and weight files, of an adapter's files; for a served model only
  its name and URL can be recorded.
- ``storage_error``: a failed write (disk full, read-only, permissions) as one line that names
  the file, says how many tasks are saved and that ``--resume`` continues.
"""

from __future__ import annotations

import atexit
import contextlib
import errno
import fcntl
import json
import os
import stat
import uuid
from collections.abc import Iterator
from functools import lru_cache
from pathlib import Path
from typing import Any, Callable

from pydantic import ValidationError

from memsearch.config import BackendConfig, HFSettings, OpenAISettings, config_json, tokenizer_problem
from memsearch.config.backend import without_addresses
from memsearch.errors import InputError, StorageError
from memsearch.io import dumps_pretty, sha256_file
from memsearch.records.trajectory import CALL_ROLES
from memsearch.registry import memory_mode

RECORDS = ("config.json", "run.json")
# What a run writes besides its records: refused on --resume unless each is a plain file.
# Failed attempts of tasks a resume ran again (``eval.attempts``).
FAILED_ATTEMPTS = "failed_attempts.jsonl"
RUN_FILES = ("trajectories.jsonl", "metrics.jsonl", "summary.json", FAILED_ATTEMPTS)
# Written into a folder as it is created, naming the command that made it: the only proof that a
# folder is ours to write again (a model folder's config.json looks like a half-made run's).
MARKER = ".memsearch-folder.json"
RUN_COMMAND = "eval run"
# Files of a local model folder that decide what it computes (weights, architecture, vocabulary).
_MODEL_FILE_SUFFIXES = (".safetensors", ".bin", ".gguf", ".json", ".model", ".txt")
_STORAGE_ERRNOS = {errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES, errno.EPERM, errno.EFBIG, errno.EIO}


@contextlib.contextmanager
def replacing(path: Path) -> Iterator[Path]:
    """Yield a new temporary sibling of ``path`` (same suffix) for the block to write; when the
    block succeeds it is renamed onto ``path``. A crash leaves the old file or the new one, never
    half of one, and a symlink at ``path`` is replaced, never written through."""
    # Not mkstemp: its 0600 mode would survive the rename; the writer creates the file, umask mode.
    tmp = path.with_name(f".{path.stem}.{os.getpid()}-{uuid.uuid4().hex[:8]}.tmp{path.suffix}")
    try:
        yield tmp
        os.replace(tmp, path)
    finally:
        if os.path.lexists(tmp):
            os.unlink(tmp)


def write_record(path: Path, obj: Any) -> None:
    """Pretty strict JSON (``io.dumps_pretty``: never a bare NaN or Infinity) written whole
    (``replacing``) and synced to disk before it takes the name."""
    text = dumps_pretty(obj, path)
    with replacing(path) as tmp, open(tmp, "x", encoding="utf-8", newline="\n") as fh:
        fh.write(text)
        fh.flush()
        os.fsync(fh.fileno())


def _read_record(out: Path, name: str) -> dict[str, Any]:
    path = out / name
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        problem = "missing"
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        problem = f"unreadable ({exc})"
    raise InputError(f"{out}: incomplete run folder ({path} {problem}); delete it and start again")


def create_marked_folder(out: Path, command: str) -> None:
    """Create ``out`` (its parents as needed) holding the marker naming ``command``.

    The folder is made under a temporary name, marked, then renamed into place: no kill leaves
    an unmarked folder that ``--resume`` would refuse, and of two processes creating the same
    folder exactly one gets it (a rename onto a folder that holds a marker fails), the other an
    ``InputError``."""
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.{os.getpid()}-{uuid.uuid4().hex[:8]}.tmp")
    tmp.mkdir()  # not mkdtemp: its 0700 mode would survive the rename
    try:
        mark_folder(tmp, command)
        if os.path.lexists(out):
            raise FileExistsError(errno.EEXIST, "exists", str(out))
        os.rename(tmp, out)
    except OSError as exc:
        if exc.errno not in (errno.EEXIST, errno.ENOTEMPTY, errno.ENOTDIR):
            raise
        raise InputError(
            f"{out}: output folder already exists (another process just created it); choose a new folder"
        ) from None
    finally:
        if tmp.is_dir():
            (tmp / MARKER).unlink(missing_ok=True)
            tmp.rmdir()


def claim_folder(out: Path, command: str, earlier: Callable[[Path], bool]) -> bool:
    """Make ``out`` the folder `memsearch {command}` writes: create it marked (returns True), or,
    when it exists, check that the command made it (``check_made_by``) and mark it if an earlier
    version did (returns False)."""
    if not out.exists():
        create_marked_folder(out, command)
        return True
    check_made_by(out, command, earlier)
    mark_folder(out, command)
    return False


def mark_folder(out: Path, command: str) -> None:
    """Write the marker naming ``command`` into ``out`` unless it has one: a folder the command
    made, or one an earlier version made that it has just recognised (``check_made_by``)."""
    if not (out / MARKER).is_file():
        write_record(out / MARKER, {"made_by": command})


def check_made_by(out: Path, command: str, earlier: Callable[[Path], bool]) -> None:
    """Refuse (``InputError``; nothing is written) to write again into the existing folder ``out``
    unless `memsearch {command}` made it: its marker names ``command``, or, in a folder without a
    marker, ``earlier(out)`` recognises a folder that an earlier version of the command made."""
    try:
        made_by = json.loads((out / MARKER).read_text(encoding="utf-8"))["made_by"]
    except FileNotFoundError:
        if earlier(out):
            return
        raise InputError(
            f"{out}: not a folder made by `memsearch {command}` (no {MARKER}); it writes only into a folder it "
            "created, so nothing was written: choose a new --out"
        ) from None
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise InputError(f"{out / MARKER}: unreadable ({exc}); expected {{\"made_by\": \"{command}\"}}") from None
    if made_by != command:
        raise InputError(
            f"{out}: made by `memsearch {made_by}`, not `memsearch {command}`; continue it with that command, "
            "or choose a new --out"
        )


def _earlier_run_folder(out: Path) -> bool:
    """A run folder of an earlier version (no marker), recognised by content: a ``config.json``
    object and a ``run.json`` object holding the data fingerprint and model identities that
    `eval run` has always recorded (a model's or a training run's folder has no ``run.json``).
    ``check_run_folder`` then also requires both to equal the resumed run's config, data and models."""
    records = []
    for name in RECORDS:
        try:
            records.append(json.loads((out / name).read_text(encoding="utf-8")))
        except (OSError, ValueError):
            return False
    config, run = records
    return isinstance(config, dict) and isinstance(run, dict) and {"data", "models"} <= set(run)


def check_run_folder(out: Path, resume: bool, config: dict[str, Any], run_info: dict[str, Any]) -> None:
    """Refuse a run that cannot start in ``out``; creates and changes nothing."""
    if not resume:
        if out.exists():
            raise InputError(
                f"{out}: output folder already exists; pass --resume to continue that run, or choose a new folder"
            )
        return
    if not out.is_dir():
        raise InputError(f"{out}: nothing to resume (no such folder)")
    check_made_by(out, RUN_COMMAND, _earlier_run_folder)
    check_plain_files(out, (*RECORDS, *RUN_FILES, LOCK))
    if never_started(out):
        return  # killed between creating the folder and writing its records: start it afresh
    saved_config = _as_read(_read_record(out, "config.json"))
    saved_run = _read_record(out, "run.json")
    if _what_runs(saved_config) != _what_runs(config):
        raise InputError(f"{out}: config differs from the run being resumed (config.json); resume with the same config")
    if saved_run.get("data") != run_info["data"]:
        raise InputError(f"{out}: data fingerprint differs from the run being resumed; resume on the same data")
    saved_models, models = without_addresses(saved_run.get("models") or {}), without_addresses(run_info["models"])
    if saved_models != models:
        changed = sorted(role for role in set(models) | set(saved_models) if saved_models.get(role) != models.get(role))
        raise InputError(
            f"{out}: the model identity of {', '.join(changed)} differs from the run being resumed "
            "(run.json: models); resume with the same model files"
        )


# Settings recorded in a run's config.json that change no task of the run: a resume may differ in
# them. The matrix's resamples are used once all groups ran (``eval.matrix.compare``), so a matrix
# whose comparison was refused can be resumed with a corrected value.
_NOT_RUN_SETTINGS = (("matrix", "bootstrap_resamples"),)


def _as_read(config: Any) -> Any:
    """A saved ``config.json`` with its backend tables as this version writes them: an earlier
    one wrote every kind's keys in each (``config.legacy_backend_dump``); a table the settings
    refuse stays as saved, so it differs."""
    backends = config.get("backends") if isinstance(config, dict) else None
    if not isinstance(backends, dict):
        return config
    read = {}
    for role, table in backends.items():
        try:
            read[role] = config_json(BackendConfig.model_validate(table)) if table is not None else None
        except ValidationError:
            read[role] = table
    return {**config, "backends": read}


def _what_runs(config: Any) -> Any:
    """``config`` (a run's recorded config) without ``_NOT_RUN_SETTINGS`` and without where its
    served models answer (``config.backend.ADDRESS_KEYS``: a resume may find them on other ports)."""
    if not isinstance(config, dict):
        return config
    config = without_addresses(config)
    for table, key in _NOT_RUN_SETTINGS:
        if isinstance(config.get(table), dict):
            config[table].pop(key, None)
    return config


def check_plain_files(out: Path, names: tuple[str, ...]) -> None:
    """Refuse (``InputError``, one problem per file) a folder in which any of ``names`` exists as
    something other than a plain file: a folder, a FIFO, or a symlink, which a writer would
    follow out of ``out`` (an append to ``trajectories.jsonl`` growing a file elsewhere)."""
    problems = []
    for name in names:
        path = out / name
        try:
            mode = path.lstat().st_mode
        except FileNotFoundError:
            continue
        if stat.S_ISREG(mode):
            continue
        if stat.S_ISLNK(mode):
            what = (f"a symlink (to {os.readlink(path)}): records are written only as plain files inside the "
                    f"folder, never through a link; put the file itself there (cp --remove-destination "
                    f"\"$(readlink -f {path})\" {path}) and run again")
        else:
            what = f"{'a folder' if stat.S_ISDIR(mode) else 'no plain file'}, expected the plain file memsearch " \
                   "writes there; move it away and run again"
        problems.append(f"{path}: is {what}")
    if problems:
        raise InputError("\n".join(problems))


def never_started(out: Path) -> bool:
    """True for a folder a run created but was killed in before it wrote both records and any
    trajectory: nothing in it is worth keeping, so ``--resume`` starts the run there afresh."""
    return not (out / "trajectories.jsonl").exists() and not all((out / name).is_file() for name in RECORDS)


LOCK = ".lock"


class FolderLock:
    """An exclusive ``flock`` on ``OUT/.lock``: one writer process per folder (an eval run folder,
    a pipeline folder). Held until ``release`` or the process ends; the kernel drops it when the
    process dies, so the lock of a killed process is taken over by the next writer, which writes
    its own pid into the file (what a refused writer is told). ``what`` names the folder in the
    refusal (``"run folder"``), ``then`` what to do once the holder is gone.

    The lock file must be a plain file made by this class: a folder, a FIFO or a symlink at
    ``OUT/.lock`` is refused (``InputError``), never followed or written through."""

    def __init__(self, out: Path, what: str = "run folder", then: str = "then --resume") -> None:
        self.path = out / LOCK
        fd = _open_lock_file(self.path)
        self._fh = os.fdopen(fd, "r+", encoding="utf-8")
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            self._fh.seek(0)
            holder = self._fh.read(200).strip() or "another process"
            self._fh.close()
            raise InputError(
                f"{out}: another memsearch process ({holder}) is writing this {what} "
                f"({self.path} is locked); wait for it to finish, or stop it, {then}"
            ) from None
        self._fh.seek(0)
        self._fh.truncate()
        self._fh.write(f"pid {os.getpid()}\n")
        self._fh.flush()

    def release(self) -> None:
        if not self._fh.closed:
            fcntl.flock(self._fh.fileno(), fcntl.LOCK_UN)
            self._fh.close()


RunFolderLock = FolderLock  # the name eval run folders have always used


def _open_lock_file(path: Path) -> int:
    """A read-write descriptor of the plain file ``path`` (created if missing), or ``InputError``."""
    fix = f"remove it (memsearch made no such {path.name}) and run again"
    try:
        # O_NOFOLLOW: a symlink is never followed (the pid would be written into its target);
        # O_NONBLOCK: opening a FIFO must not wait for a reader.
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, 0o644)
    except IsADirectoryError:
        raise InputError(f"{path}: is a folder, expected the plain lock file memsearch writes; {fix}") from None
    except OSError as exc:
        if exc.errno != errno.ELOOP:
            raise
        raise InputError(f"{path}: is a symlink, expected the plain lock file memsearch writes; {fix}") from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise InputError(f"{path}: not a plain file, expected the plain lock file memsearch writes; {fix}")
    return fd


# Folders this process holds (``hold_folder_lock``), by resolved path.
_HELD: dict[Path, FolderLock] = {}


def hold_folder_lock(out: Path, what: str, then: str) -> FolderLock:
    """This process's ``FolderLock`` on ``out``, taken on the first call and held until the process
    ends (or ``release_folder_lock``): for a command that writes a folder through many steps and
    re-enters it (a pipeline and its stages), where a second ``flock`` of the same process would
    refuse the process itself."""
    key = Path(out).resolve()
    lock = _HELD.get(key)
    if lock is None or lock._fh.closed:
        if not _HELD:
            atexit.register(_release_held)  # closed, not left to the garbage collector (ResourceWarning)
        lock = _HELD[key] = FolderLock(Path(out), what, then)
    return lock


def _release_held() -> None:
    for folder in list(_HELD):
        release_folder_lock(folder)


def release_folder_lock(out: Path) -> None:
    """Release the lock ``hold_folder_lock`` took on ``out`` (no-op when none is held)."""
    lock = _HELD.pop(Path(out).resolve(), None)
    if lock is not None:
        lock.release()


def claim_run_folder(out: Path, resume: bool, config: dict[str, Any], run_info: dict[str, Any]) -> FolderLock:
    """Create ``out`` (or reopen it with ``resume``) and lock it for this process.

    The checks of ``check_run_folder`` are repeated under the lock: another process may have
    created or changed the folder since they were first made."""
    if not resume:
        create_marked_folder(out, RUN_COMMAND)  # appears with its marker: resumable whenever it is killed
    else:
        check_made_by(out, RUN_COMMAND, _earlier_run_folder)  # before the lock file is made in it
    lock = FolderLock(out)
    try:
        if resume:
            check_run_folder(out, True, config, run_info)
            mark_folder(out, RUN_COMMAND)  # an earlier version's folder, just checked: marked from now on
        if not resume or never_started(out):
            write_record(out / "config.json", config)
            write_record(out / "run.json", run_info)
    except BaseException:
        lock.release()
        raise
    return lock


@lru_cache(maxsize=256)
def _file_sha256(path: str, size: int, mtime_ns: int) -> str:
    # Keyed by size and mtime too, so a file rewritten in place is hashed again.
    return sha256_file(path)


def _hash_file(path: Path) -> str:
    st = path.stat()
    return _file_sha256(str(path), st.st_size, st.st_mtime_ns)


def _folder_identity(folder: Path) -> dict[str, str]:
    """SHA-256 of every file in a model/adapter/tokenizer folder that decides what it computes."""
    return {
        p.name: _hash_file(p)
        for p in sorted(folder.iterdir())
        if p.is_file() and p.suffix in _MODEL_FILE_SUFFIXES and not p.name.startswith(".")
    }


def _model_files(model: str) -> dict[str, str]:
    if model == "embedded":
        from memsearch.assets.embedded import gguf_path

        path = gguf_path()
        return {path.name: _hash_file(path)}
    folder = Path(model)
    if not folder.is_dir():
        raise InputError(f"{model}: no such model folder (expected 'embedded' or a local Hugging Face model folder)")
    return _folder_identity(folder)


def model_identity(config) -> dict[str, Any]:
    """Per role (and the budget tokenizer): what produced the completions, by content."""
    out: dict[str, Any] = {}
    for role in CALL_ROLES:
        backend = getattr(config.backends, role)
        entry: dict[str, Any] = {"kind": backend.kind}
        if isinstance(backend, HFSettings):
            entry["model"] = backend.model
            entry["model_files"] = _model_files(backend.model)
            if backend.weights != "float32":  # the engine: recorded off the reference only, as earlier runs have it
                entry["weights"] = backend.weights
            if backend.adapter:
                adapter = Path(backend.adapter)
                if not adapter.is_dir():
                    raise InputError(f"{adapter}: no such adapter folder")
                from memsearch.assets.adapter import check_memory_format, verify_adapter

                # Both refused before any run folder exists.
                fingerprint = verify_adapter(adapter, base_model=backend.model)
                if role == "memory" and memory_mode(config.agent.memory).operations:
                    check_memory_format(adapter, fingerprint, config.agent.memory_format)
                entry["adapter_files"] = _folder_identity(adapter)
        elif isinstance(backend, OpenAISettings):
            # A served model's weights are not ours to read: its name and URL are all we know.
            entry.update(model=backend.model, base_url=backend.base_url)
        out[role] = entry
    tokenizer = config.tokenizer
    if problem := tokenizer_problem(tokenizer):
        raise InputError(f"tokenizer: {problem}")
    out["tokenizer"] = (
        {"name": tokenizer}
        if not Path(tokenizer).is_dir()
        else {"name": tokenizer, "files": _folder_identity(Path(tokenizer))}
    )
    return out


def storage_error(exc: OSError, path: Path, saved: int, expected: int) -> StorageError | None:
    """``exc`` as one actionable line when it is a storage failure (disk full, read-only,
    permissions, quota), else ``None`` (then it is a bug and keeps its traceback)."""
    if exc.errno not in _STORAGE_ERRNOS:
        return None
    where = exc.filename or path
    return StorageError(
        f"{where}: {os.strerror(exc.errno)}; {saved} of {expected} task(s) are saved in {path.parent}; "
        "free space or fix permissions, then run the same command with --resume to continue"
    )
