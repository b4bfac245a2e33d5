"""gpunode-validator's settings: NVIDIA's operator-validator env vars, declared once."""

from __future__ import annotations

from dataclasses import dataclass

from gpunode.common.settings import CommonSettings, group, setting
from gpunode.validator.checks import COMPONENTS, DEFAULT_CDI_KIND, DEFAULT_RUNTIME_NAME, TOOLKIT_CHECKS

__all__ = ["ValidatorSettings", "toolkit_checks"]


def toolkit_checks(text: str) -> str:
    """``--toolkit-checks``: a comma list of cdi, runtime (normalised, blanks dropped)."""
    parts = [p.strip() for p in text.split(",") if p.strip()]
    if not parts or any(p not in TOOLKIT_CHECKS for p in parts):
        raise ValueError("a comma list of cdi, runtime")
    return ",".join(parts)


@dataclass(frozen=True)
class ValidatorSettings:
    common: CommonSettings = group(CommonSettings)
    component: str | None = setting(
        "--component", short="-c", env="COMPONENT", choices=COMPONENTS, help="the check to run"
    )
    wait_for: tuple[str, ...] = setting(
        "--wait-for",
        env="WAIT_FOR",
        repeatable=True,
        metavar="COMPONENT",
        help="wait until COMPONENT-ready (or this file) exists; repeatable",
    )
    timeout: float = setting(
        "--timeout", env="WAIT_TIMEOUT", type=float, default=300.0, help="--wait-for limit in s (0: none)"
    )
    validations_dir: str = setting(
        "--validations-dir", env="OUTPUT_DIR", default="/run/nvidia/validations", help="status files"
    )
    host_root: str = setting(
        "--host-root", env=("HOST_ROOT", "GPUNODE_HOST_ROOT"), default="/", help="where the host's / is"
    )
    kubelet_dir: str = setting(
        "--kubelet-dir", env="KUBELET_DIR", default="/var/lib/kubelet", help="the kubelet's directory"
    )
    toolkit_checks: str = setting(
        "--toolkit-checks", env="TOOLKIT_CHECKS", type=toolkit_checks, default="cdi,runtime"
    )
    nvidia_runtime_name: str = setting(
        "--nvidia-runtime-name", env="NVIDIA_RUNTIME_NAME", default=DEFAULT_RUNTIME_NAME
    )
    cdi_kind: str = setting(
        "--cdi-kind", env="GPUNODE_CDI_KIND", default=DEFAULT_CDI_KIND, help="kind of the CDI spec"
    )
    plugin_http_port: int = setting(
        "--plugin-http-port", env="GPUNODE_HTTP_PORT", type=int, default=9451, help="-1: skip /readyz"
    )
    with_workload: bool = setting(
        "--with-workload", env="WITH_WORKLOAD", type=bool, default=True, help="cuda: run the CUDA check"
    )
