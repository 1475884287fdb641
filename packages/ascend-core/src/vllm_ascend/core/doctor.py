"""``vllm-ascend doctor``: what is installed, what was detected, and whether the platform can activate."""

from __future__ import annotations

import argparse
import json
import os
from importlib import metadata
from typing import Any

from vllm_ascend.core._version import __version__
from vllm_ascend.core.device.detection import Detection, DeviceMode, detect
from vllm_ascend.core.envs import EnvError
from vllm_ascend.core.extensions import all_extension_records
from vllm_ascend.core.plugin import PLATFORM_QUALNAMES
from vllm_ascend.core.registry import ALL_REGISTRIES, CliCommand
from vllm_ascend.core.vllm_version import SUPPORTED_VLLM_RANGE, installed_vllm


def _platform_check(mode: DeviceMode) -> str:
    """Empty when the platform class imports and is usable; else why not."""
    found = installed_vllm()
    if found is None:
        return "vLLM is not installed"
    if not found.supported:
        return f"{found.dist} {found.version} is outside the supported range {SUPPORTED_VLLM_RANGE}"
    qualname = PLATFORM_QUALNAMES[mode.value]
    try:
        from vllm.utils.import_utils import resolve_obj_by_qualname

        platform = resolve_obj_by_qualname(qualname)
        platform.profile()
    except Exception as exc:
        return f"cannot load {qualname}: {type(exc).__name__}: {exc}"
    return ""


def _host() -> dict[str, Any]:
    """The host CPU's ISA and the vLLM kernel library the reference device loads on it (found without
    loading it: a library built for a wider ISA than the host's would kill the doctor with SIGILL)."""
    from vllm_ascend.core.device.host import (
        host_isa,
        kernel_library_file,
        selected_kernel_library,
    )

    isa = host_isa()
    host: dict[str, Any] = {
        "arch": isa.arch,
        "isa": isa.describe(),
        "kernel_library": None,
        "kernel_file": None,
    }
    found = installed_vllm()
    if found is None or not found.supported:
        host["kernel_problem"] = "vLLM is not installed" if found is None else "vLLM version not supported"
        return host
    try:
        from vllm_ascend.core.platform import ReferencePlatform

        module = selected_kernel_library(ReferencePlatform.import_kernels)
    except Exception as exc:
        host["kernel_problem"] = f"{type(exc).__name__}: {exc}"
        return host
    host["kernel_library"] = module
    host["kernel_file"] = kernel_library_file(module) if module else None
    host["kernel_problem"] = "" if host["kernel_file"] else "vLLM's CPU kernel library was not found"
    return host


def _device_details(mode: DeviceMode) -> tuple[dict[str, Any], str]:
    """The active profile, SOC and adaptor as plain data, and a problem text when they cannot be resolved."""
    try:
        from vllm_ascend.core.device.config import check_ascend_device_type, get_device_adaptor

        config = check_ascend_device_type()
        adaptor = type(get_device_adaptor())
    except Exception as exc:
        return {
            "soc": None,
            "emulates": None,
            "profile": None,
            "adaptor": None,
        }, f"device {mode.value}: {type(exc).__name__}: {exc}"
    details = {
        "soc": config.soc_name,
        "emulates": config.emulates.value if config.emulates is not None else None,
        "profile": config.profile.as_dict(),
        "adaptor": {"class": f"{adaptor.__module__}.{adaptor.__qualname__}", "family": adaptor.family},
    }
    return details, ""


def collect() -> dict[str, Any]:
    """Everything the doctor reports, as plain data."""
    found = installed_vllm()
    try:
        torch_version: str | None = metadata.version("torch")
    except metadata.PackageNotFoundError:
        torch_version = None
    host = _host() if torch_version else None
    device: dict[str, Any]
    detection: Detection | None
    try:
        detection = detect()
    except EnvError as exc:
        device = {
            "requested": os.environ.get("VLLM_ASCEND_DEVICE"),
            "mode": "invalid",
            "reason": str(exc),
            "requested_explicitly": True,
        }
        detection = None
    else:
        device = {
            "requested": detection.requested,
            "mode": detection.mode.value,
            "reason": detection.reason,
            "requested_explicitly": detection.explicitly_requested,
        }
    problem = ""
    active = bool(detection is not None and detection.active)
    device.update({"soc": None, "emulates": None, "profile": None, "adaptor": None})
    if detection is None:
        problem = device["reason"]
    elif detection.active:
        details, problem = _device_details(detection.mode)
        device.update(details)
        problem = problem or _platform_check(detection.mode)
        if not problem:
            _load_vllm_plugins()
    elif detection.explicitly_requested:
        problem = detection.reason
    device["platform"] = (
        PLATFORM_QUALNAMES[detection.mode.value]
        if detection is not None and detection.active and not problem
        else None
    )
    device["problem"] = problem
    return {
        "core": __version__,
        "vllm": {
            "dist": found.dist if found else None,
            "version": found.version if found else None,
            "supported_range": SUPPORTED_VLLM_RANGE,
            "supported": bool(found and found.supported),
        },
        "torch": torch_version,
        "host": host,
        "device": device,
        "extensions": [
            _with_reachability(_import_deferred(rec.as_dict()), active) for rec in all_extension_records()
        ],
        "probes": _probes(),
    }


def _probes() -> dict[str, dict[str, str]]:
    """Each sibling's run-time dependency check (``DOCTOR_PROBES``): name -> label -> line."""
    from vllm_ascend.core.registry import DOCTOR_PROBES

    results: dict[str, dict[str, str]] = {}
    for name in DOCTOR_PROBES.names():
        try:
            results[name] = {str(k): str(v) for k, v in DOCTOR_PROBES.get(name)().items()}
        except Exception as exc:
            results[name] = {"problem": f"{type(exc).__name__}: {exc}"}
    return results


def _import_deferred(record: dict[str, Any]) -> dict[str, Any]:
    """Import the lazy paths a loaded extension registered that loading only checked without importing
    (heavy registries, e.g. workers); one that fails to import turns the record ``failed``."""
    if record["status"] != "loaded":
        return record
    for registry in ALL_REGISTRIES.values():
        for name in registry.names():
            if registry.import_at_load or registry.owner(name) != record["dist"]:
                continue
            try:
                registry.get(name)
            except Exception as exc:
                path = registry.entry(name).value
                record["status"] = "failed"
                record["reason"] = (
                    f"registered path does not resolve: {registry.kind} {name!r} -> {path!r}: "
                    f"{type(exc).__name__}: {exc}"
                )
                return record
    return record


def _with_reachability(record: dict[str, Any], active: bool) -> dict[str, Any]:
    """The extension record plus every entry it registered and whether vLLM reaches it.

    vLLM's own registries only hold the plugin's entries when the platform is active, so
    reachability is reported only then (``None`` otherwise).
    """
    from vllm_ascend.core.vllm_bridge import reachability

    record["registered"] = reachability(record["dist"]) if active else None
    return record


def _load_vllm_plugins() -> None:
    """Run vLLM's own general-plugin loading, as every vLLM process does (fills vLLM's registries)."""
    from vllm.plugins import load_general_plugins

    load_general_plugins()


def exit_code(report: dict[str, Any]) -> int:
    """Non-zero when the platform was requested (npu/reference) but cannot activate."""
    device = report["device"]
    return 1 if device["requested_explicitly"] and device["problem"] else 0


def render(report: dict[str, Any]) -> str:
    vllm = report["vllm"]
    device = report["device"]
    lines = [
        f"vllm-ascend-core  {report['core']}",
        "vLLM              "
        + (
            f"{vllm['dist']} {vllm['version']} "
            + ("(supported)" if vllm["supported"] else f"(UNSUPPORTED; need {vllm['supported_range']})")
            if vllm["version"]
            else f"not installed (need {vllm['supported_range']})"
        ),
        f"torch             {report['torch'] or 'not installed'}",
        *_host_lines(report.get("host")),
        f"device            {device['mode']} (VLLM_ASCEND_DEVICE={device['requested']}): {device['reason']}",
        f"platform          {device['platform'] or 'inactive'}"
        + (f" -- {device['problem']}" if device["problem"] else ""),
        *_profile_lines(device),
        "",
    ]
    rows = [("extension", "dist", "version", "status", "detail")]
    for ext in report["extensions"]:
        rows.append((ext["name"], ext["dist"], ext["version"], ext["status"], _detail(ext)))
    if len(rows) == 1:
        rows.append(("(none installed)", "", "", "", ""))
    widths = [max(len(row[i]) for row in rows) for i in range(4)]
    for i, row in enumerate(rows):
        lines.append("  ".join(cell.ljust(widths[j]) for j, cell in enumerate(row[:4])) + "  " + row[4])
        if i == 0:
            lines.append("  ".join("-" * w for w in widths) + "  " + "-" * 6)
    for name, probe in report.get("probes", {}).items():
        lines.append("")
        lines.extend(f"{name}: {label:<14} {line}" for label, line in probe.items())
    return "\n".join(lines)


def _host_lines(host: dict[str, Any] | None) -> list[str]:
    if host is None:
        return []
    if host["kernel_file"]:
        name = host["kernel_library"] or "loaded"
        kernels = f"{name} ({host['kernel_file']}): the reference device's, chosen by vLLM's CPU platform"
    else:
        kernels = f"none ({host['kernel_problem']})"
    return [f"host ISA          {host['isa']}", f"vLLM kernels      {kernels}"]


def _detail(ext: dict[str, Any]) -> str:
    """Why it failed, or each registered entry and whether vLLM reaches it."""
    if ext["reason"]:
        return ext["reason"]
    registered = ext.get("registered")
    if registered is None:
        return "provides " + (", ".join(ext["provides"]) or "nothing") + " (platform inactive)"
    if not registered:
        return "registers nothing"
    return "; ".join(
        f"{row['registry']}:{row['name']} -> {row['via']} ({'reached' if row['reached'] else 'NOT REACHED'})"
        for row in registered
    )


def _profile_lines(device: dict[str, Any]) -> list[str]:
    profile, adaptor = device["profile"], device["adaptor"]
    if profile is None or adaptor is None:
        return []
    soc = f" on {device['soc']}" if device["soc"] else ""
    if device.get("emulates"):
        soc = f" (VLLM_ASCEND_REFERENCE_FAMILY: emulating {device['emulates']})"
    traits = [
        f"cpu-binding={profile['cpu_binding']}",
        f"dist={profile['dist_backend']}",
        f"dtypes={'/'.join(profile['supported_dtypes'])}",
        f"block={profile['preferred_block_size']}",
    ]
    if profile["eager_only"]:
        traits.append("eager-only")
    elif profile.get("eager_by_default"):
        traits.append("eager unless compilation/graphs are asked for")
    return [
        f"profile           {profile['name']}{soc}: {', '.join(traits)}",
        f"capabilities      {', '.join(profile['capabilities']) or 'none'}",
        f"adaptor           {adaptor['class']} ({adaptor['family']})",
        *_serving_lines(profile),
    ]


def _serving_lines(profile: dict[str, Any]) -> list[str]:
    """What serving on this profile does, read from the same fields the platform and runner read."""
    caps = set(profile["capabilities"])
    if "graph_capture" in caps:
        graphs = "ACL graph capture"
    else:
        graphs = "none: eager only (cudagraph_mode / compilation other than NONE are refused)"
    kernels = (
        "Triton where it can run, else the torch references"
        if "triton" in caps or profile["device_type"] is None
        else "torch implementations only (no Triton on this family)"
    )
    return [
        f"worker            {profile['worker']}",
        f"graphs            {graphs}",
        f"kernels           {kernels}",
        f"quant weights     {profile['quant_weight_format']} layout"
        + (", sparse/compressed int8 (W8A8S/W8A8SC)" if "sparse_weight" in caps else ""),
    ]


def _configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="print the report as JSON")


def _run(args: argparse.Namespace) -> int:
    report = collect()
    print(json.dumps(report, indent=2) if args.json else render(report))
    return exit_code(report)


DOCTOR = CliCommand(
    "doctor", "Report vLLM/torch versions, the detected device and every extension's status", _configure, _run
)
