"""What the Comfy Registry archive holds: `comfy node publish` zips the git-tracked files minus the .comfyignore
patterns (plus [tool.comfy] includes, which this pack does not use). The archive must carry the whole runtime and
none of the development tree."""
from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

tomllib = pytest.importorskip("tomllib")  # Python 3.11+

ROOT = Path(__file__).resolve().parents[2]


def _tracked() -> list[str]:
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("not a git checkout")
    out = subprocess.run(["git", "-C", str(ROOT), "ls-files"], capture_output=True, text=True, check=True).stdout
    return [line for line in out.splitlines() if line.strip()]


def _patterns() -> list[str]:
    lines = (ROOT / ".comfyignore").read_text().splitlines()
    return [s.strip() for s in lines if s.strip() and not s.lstrip().startswith("#")]


def _ignored(path: str, patterns: list[str]) -> bool:
    """The .comfyignore rules this file uses: `dir/` (a directory anywhere below it) and plain root file names."""
    for p in patterns:
        if p.endswith("/"):
            if path.startswith(p) or f"/{p}" in f"/{path}":
                return True
        elif path == p:
            return True
    return False


def test_comfyignore_uses_only_the_simple_rules():
    """The check below understands `dir/` and root file names only; a wildcard would need gitignore semantics."""
    assert all(not any(c in p for c in "*?[!") for p in _patterns())


def test_registry_archive_is_the_runtime_only():
    patterns = _patterns()
    shipped = [p for p in _tracked() if not _ignored(p, patterns)]
    tops = {p.split("/")[0] for p in shipped}
    assert {"__init__.py", "engine", "nodes", "web", "example_workflows", "pyproject.toml", "requirements.txt",
            "LICENSE", "README.md"} <= tops
    assert not tops & {"tests", "bench", "scripts", ".ci"}
    assert not [p for p in shipped if p.startswith("docs/images/")]
    assert tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["comfy"].get("includes", []) == []
    size = sum((ROOT / p).stat().st_size for p in shipped if (ROOT / p).is_file())
    assert size < 2_000_000, f"the registry archive would hold {size} bytes"


MEDIA = (".png", ".jpg", ".jpeg", ".webp", ".gif", ".ogg", ".flac", ".wav", ".mp3", ".gz", ".npy", ".safetensors")


def test_images_audio_and_results_stay_small():
    """What bloats a clone is never code: thumbnails, clips and bench results together stay under 150 KB."""
    heavy = [p for p in _tracked() if p.endswith(MEDIA) or p.startswith("bench/results/")]
    size = sum((ROOT / p).stat().st_size for p in heavy if (ROOT / p).is_file())
    assert size <= 150_000, f"images, audio and bench results take {size} bytes: " + ", ".join(
        sorted(heavy, key=lambda p: -(ROOT / p).stat().st_size)[:5])


def test_a_shallow_clone_stays_under_3_5_mb(tmp_path):
    """What `git clone --depth 1` (the README's install line) puts on a user's disk, .git included: code, tests
    and docs, which grow with features. Checks the committed tree, so run it after committing."""
    _tracked()
    dest = tmp_path / "clone"
    subprocess.run(["git", "clone", "-q", "--depth", "1", ROOT.as_uri(), str(dest)], check=True,
                   capture_output=True)
    size = sum(p.stat().st_size for p in dest.rglob("*") if p.is_file() and not p.is_symlink())
    print(f"a shallow clone takes {size} bytes")
    assert size <= 3_500_000, f"a shallow clone takes {size} bytes; keep results, images and audio small"
