"""Extension isolation through vLLM's own plugin loader, against the real siblings (issue 14, finding 6).

A third-party distribution that calls ``sys.exit()`` at import must not take vLLM down, and one that
declares an official extension name (``eplb``) must not replace the official sibling, whatever the
``sys.path`` order. Each case runs in a fresh process (vLLM caches its plugins).
"""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys
import textwrap

ROOT = pathlib.Path(__file__).resolve().parents[1]
SIBLING_EXTENSIONS = sorted(p.parent.name for p in ROOT.glob("packages/*/src/vllm_ascend/*/_extension.py"))


def add_dist(root: pathlib.Path, dist: str, ext_name: str, source: str) -> str:
    """A throw-away distribution (``.dist-info`` with one entry point) and its module under ``root``."""
    module = f"fake_{dist.replace('-', '_')}"
    (root / f"{module}.py").write_text(textwrap.dedent(source))
    info = root / f"{dist.replace('-', '_')}-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text(f"[vllm_ascend.extensions]\n{ext_name} = {module}:EXTENSION\n")
    return module


def run_with(root: pathlib.Path, code: str) -> dict:
    """Run ``code`` on the reference device with ``root`` first on sys.path; return its last JSON line."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("VLLM_")}
    env.update(
        HF_HUB_OFFLINE="1",
        VLLM_ENABLE_V1_MULTIPROCESSING="0",
        VLLM_ASCEND_DEVICE="reference",
        PYTHONPATH=os.pathsep.join([str(root), env.get("PYTHONPATH", "")]),
    )
    proc = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, env=env, timeout=300
    )
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_sys_exit_in_an_extension_is_contained_and_vllm_keeps_loading(tmp_path):
    add_dist(tmp_path, "thirdparty-quitter", "quitter", "import sys\nsys.exit(2)\n")
    found = run_with(
        tmp_path,
        """
        import json
        from vllm.plugins import load_general_plugins
        from vllm.model_executor import model_loader
        from vllm_ascend.core.extensions import extension_records
        load_general_plugins()
        records = extension_records()
        print(json.dumps({
            "status": {k: r.status.value for k, r in records.items()},
            "reason": records["quitter"].reason,
            "netloader_reaches_vllm": model_loader._LOAD_FORMAT_TO_MODEL_LOADER.get("netloader") is not None,
        }))
        """,
    )
    assert found["status"] == {"quitter": "failed", **{name: "loaded" for name in SIBLING_EXTENSIONS}}
    assert found["reason"] == "import failed: SystemExit(2): the extension called sys.exit()"
    assert found["netloader_reaches_vllm"] is True


def test_third_party_dist_cannot_take_an_official_extension_name(tmp_path):
    module = add_dist(
        tmp_path,
        "thirdparty-eplb",
        "eplb",
        """
        from vllm_ascend.core.extensions import ExtensionDescriptor
        from vllm_ascend.core.registry import CONFIG_SECTIONS

        def register():
            CONFIG_SECTIONS.register("eplb_config", "builtins:dict")

        EXTENSION = ExtensionDescriptor(
            name="eplb", version="1.0", core_requires=">=0.1", provides=("config_sections",), register=register
        )
        """,
    )
    found = run_with(
        tmp_path,
        f"""
        import json, sys
        from vllm.plugins import load_general_plugins
        from vllm_ascend.core.doctor import collect
        from vllm_ascend.core.registry import CONFIG_SECTIONS
        load_general_plugins()
        rows = [e for e in collect()["extensions"] if e["name"] == "eplb"]
        print(json.dumps({{
            "rows": [(r["dist"], r["status"], r["reason"]) for r in rows],
            "section_owner": CONFIG_SECTIONS.owner("eplb_config"),
            "validator": CONFIG_SECTIONS.get("eplb_config").__module__,
            "impostor_imported": "{module}" in sys.modules,
        }}))
        """,
    )
    assert found["rows"] == [
        ["vllm-ascend-eplb", "loaded", ""],
        [
            "thirdparty-eplb",
            "shadowed",
            "extension name 'eplb' is already provided by vllm-ascend-eplb "
            "(official vllm-ascend distributions take precedence)",
        ],
    ]
    assert (found["section_owner"], found["validator"]) == ("vllm-ascend-eplb", "vllm_ascend.eplb.config")
    assert found["impostor_imported"] is False
