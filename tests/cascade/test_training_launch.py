"""Every training launch builds DeepSpeed's CPU extension with the same tools into one cache."""

from __future__ import annotations

import os
import sys
from pathlib import Path

from cascade.training.launch import extension_build_env, torch_extensions_dir


def _fake_ninja(folder: Path) -> Path:
    folder.mkdir(parents=True)
    ninja = folder / "ninja"
    ninja.write_text("#!/bin/sh\nexit 0\n")
    ninja.chmod(0o755)
    return folder


def test_each_ninja_gets_its_own_cache_folder(tmp_path: Path) -> None:
    first, second = _fake_ninja(tmp_path / "a"), _fake_ninja(tmp_path / "b")
    base = {"XDG_CACHE_HOME": str(tmp_path / "cache")}
    one = torch_extensions_dir({**base, "PATH": f"{first}{os.pathsep}{second}"})
    other = torch_extensions_dir({**base, "PATH": f"{second}{os.pathsep}{first}"})
    again = torch_extensions_dir({**base, "PATH": f"{first}{os.pathsep}{second}"})
    # Two ninjas record one build differently: sharing a folder rebuilt it at every switch.
    assert one != other and one == again
    assert one.startswith(str(tmp_path / "cache" / "cascade" / "torch_extensions"))


def test_a_launch_finds_this_interpreters_tools_first(tmp_path: Path) -> None:
    tools = str(Path(sys.executable).parent)
    env = {"PATH": f"/usr/bin{os.pathsep}/bin", "XDG_CACHE_HOME": str(tmp_path)}
    extension_build_env(env)
    assert env["PATH"].split(os.pathsep)[:2] == [tools, "/usr/bin"]
    assert env["TORCH_EXTENSIONS_DIR"] == torch_extensions_dir(env)
    # Whoever launches (pytest, an Airflow task with the venv on PATH), one folder.
    from_a_task = {"PATH": f"{tools}{os.pathsep}/usr/bin", "XDG_CACHE_HOME": str(tmp_path)}
    extension_build_env(from_a_task)
    assert from_a_task["TORCH_EXTENSIONS_DIR"] == env["TORCH_EXTENSIONS_DIR"]
    assert from_a_task["PATH"].count(tools) == 1
