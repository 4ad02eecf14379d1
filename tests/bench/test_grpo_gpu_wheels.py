"""bench/grpo_gpu.py's ``install_wheels`` on real (small, built here) wheels: of each distribution
it installs the one wheel the running interpreter supports, never a build for another CPython
(a cp312 ``pydantic_core`` unzipped into 3.11 broke pydantic there), and names what has none."""

from __future__ import annotations

import base64
import hashlib
import importlib.util
import json
import subprocess
import sys
import zipfile
from pathlib import Path

from packaging.tags import sys_tags

from memsearch.assets.samples import repository_root

_BENCH = repository_root() / "bench" / "grpo_gpu.py"
THIS = f"cp{sys.version_info.major}{sys.version_info.minor}"
OTHER = f"cp{sys.version_info.major}{sys.version_info.minor + 1}"  # a CPython this one is not
PLATFORM = next(iter(sys_tags())).platform


def make_wheel(folder: Path, name: str, tag: str) -> Path:
    """A minimal valid wheel of ``name`` 1.0 tagged ``tag``: one module recording which build it is."""
    path = folder / f"{name}-1.0-{tag}.whl"
    dist_info = f"{name}-1.0.dist-info"
    files = {
        f"{name}.py": f"BUILD = {tag!r}\n",
        f"{dist_info}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.0\n",
        f"{dist_info}/WHEEL": f"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: false\nTag: {tag}\n",
    }
    record = []
    with zipfile.ZipFile(path, "w") as z:
        for arc, text in files.items():
            data = text.encode()
            z.writestr(arc, data)
            digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
            record.append(f"{arc},sha256={digest},{len(data)}")
        z.writestr(f"{dist_info}/RECORD", "\n".join([*record, f"{dist_info}/RECORD,,"]) + "\n")
    return path


def test_install_wheels_takes_the_build_this_interpreter_supports(tmp_path):
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    for name, tags in {
        "probe_ext": (f"{THIS}-{THIS}-{PLATFORM}", f"{OTHER}-{OTHER}-{PLATFORM}"),  # two CPython builds
        "probe_pure": ("py3-none-any", f"{THIS}-{THIS}-{PLATFORM}"),  # pip prefers the specific build
        "probe_foreign": (f"{OTHER}-{OTHER}-{PLATFORM}",),  # nothing for this interpreter
    }.items():
        for tag in tags:
            make_wheel(wheels, name, tag)
    script = (
        "import importlib.util, json, sys\n"
        f"spec = importlib.util.spec_from_file_location('grpo_gpu', {str(_BENCH)!r})\n"
        "bench = importlib.util.module_from_spec(spec); spec.loader.exec_module(bench)\n"
        f"error = bench.install_wheels([{str(wheels)!r}], __import__('pathlib').Path({str(tmp_path / 'site')!r}))\n"
        "import probe_ext, probe_pure\n"
        "foreign = importlib.util.find_spec('probe_foreign') is not None\n"
        "print(json.dumps({'error': error, 'ext': probe_ext.BUILD, 'pure': probe_pure.BUILD, 'foreign': foreign}))\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    got = json.loads(done.stdout.strip().splitlines()[-1])
    assert got["ext"] == got["pure"] == f"{THIS}-{THIS}-{PLATFORM}"
    assert not got["foreign"]
    assert got["error"] == f"no wheel for this interpreter ({THIS}, {sys.platform}) of: probe-foreign"
    # One build of each distribution landed: two dist-info folders, not three or four.
    assert sorted(p.name for p in (tmp_path / "site").glob("*.dist-info")) == [
        "probe_ext-1.0.dist-info", "probe_pure-1.0.dist-info"]


def test_a_folder_of_fitting_wheels_installs_without_an_error(tmp_path):
    spec = importlib.util.spec_from_file_location("grpo_gpu_bench", _BENCH)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    wheels = [str(make_wheel(tmp_path, "probe_one", "py3-none-any")),
              str(make_wheel(tmp_path, "probe_two", f"{THIS}-abi3-{PLATFORM}"))]
    chosen, unfit = bench.pick_wheels(wheels)
    assert sorted(chosen) == sorted(wheels) and unfit == []
