"""scripts/setup_env.sh --full installs the parity oracle qwen-tts without its demo app's requirements. pip
reports a package's missing requirements (its "dependency resolver" ERROR block) whenever it installs something
that package depends on, so the oracle's model requirements go in before it, and the script says in one line
that such a message, should one appear later, is expected and harmless."""
import base64
import hashlib
import re
import subprocess
import sys
import venv
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = (ROOT / "scripts" / "setup_env.sh").read_text()


def test_the_oracles_requirements_are_installed_before_it_and_the_message_is_explained():
    lines = SCRIPT.splitlines()
    oracle = next(i for i, line in enumerate(lines) if re.search(r"pip --no-deps qwen-tts==", line))
    deps = next(i for i, line in enumerate(lines) if re.search(r"^\s*pip transformers==.* accelerate==", line))
    assert deps < oracle, "installing qwen-tts' requirements after it makes pip print its resolver ERROR block"
    after = [line for line in lines[oracle + 1:] if re.match(r"\s*pip\b", line)]
    assert not after, f"pip installs after qwen-tts inside the setup block: {after}"
    note = " ".join(lines[oracle + 1:oracle + 4])
    for word in ("expected and harmless", "gradio", "dependency resolver"):
        assert word in note, note


def _wheel(folder: Path, name: str, requires: list[str]) -> None:
    info = f"{name}-1.0.dist-info"
    files = {f"{name}/__init__.py": "",
             f"{info}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.0\n"
                                 + "".join(f"Requires-Dist: {r}\n" for r in requires),
             f"{info}/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"}
    def digest(text: str) -> str:
        return base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).rstrip(b"=").decode()

    record = "".join(f"{k},sha256={digest(v)},{len(v.encode())}\n" for k, v in files.items()) + f"{info}/RECORD,,\n"
    with zipfile.ZipFile(folder / f"{name}-1.0-py3-none-any.whl", "w") as z:
        for k, v in files.items():
            z.writestr(k, v)
        z.writestr(f"{info}/RECORD", record)


def test_pip_prints_the_resolver_error_only_when_a_requirement_follows_the_package(tmp_path):
    """The rule the script's order rests on, on two local wheels: 'oracle' needs 'dep' and an absent app."""
    (tmp_path / "wheels").mkdir()
    _wheel(tmp_path / "wheels", "oracle", ["dep", "missing-app"])
    _wheel(tmp_path / "wheels", "dep", [])

    def install(env, *args):
        cmd = [sys.executable, "-m", "pip", "--python", str(env / "bin" / "python"), "install", "-q",
               "--disable-pip-version-check", "--no-index", "--find-links", str(tmp_path / "wheels"), *args]
        return subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=True).stderr

    for order, noisy in (("oracle first", True), ("dep first", False)):
        env = tmp_path / order.replace(" ", "_")
        venv.create(env, with_pip=False)
        steps = [("--no-deps", "oracle"), ("dep",)] if order == "oracle first" else [("dep",), ("--no-deps", "oracle")]
        err = "".join(install(env, *step) for step in steps)
        assert ("dependency resolver" in err) is noisy, (order, err)
