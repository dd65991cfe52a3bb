"""What CUDA a base image carries, for ``cuda.source: nvidia`` on a named ``base.image``: read from an
``nvidia/cuda`` tag (no network), or from the labels and env of the base's config (an imgbuild base
labels its CUDA; NVIDIA's images and the images built on them carry NVIDIA's env). A base that shows
none of these is not a CUDA base, and an image labelled with CUDA it lacks would break the contract,
so the resolver refuses it (``cuda_rule.cuda_rule``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from buildkit_py import label_keys as K
from buildkit_py import reference
from buildkit_py.errors import UsageError
from buildkit_py.recipe.model import CudaFlavor

# nvidia/cuda tags: 12.4.1-cudnn-runtime-ubuntu22.04, 11.8.0-cudnn8-devel-ubuntu22.04, 12.4.1-base-ubuntu22.04
_TAG_RE = re.compile(r"^(?P<cuda>\d+\.\d+(?:\.\d+)?)-(?:(?P<cudnn>cudnn\d*)-)?"
                     rf"(?P<flavor>{'|'.join(CudaFlavor.words())})-(?P<os>[a-z]+\d+(?:\.\d+)?)\Z")
# NVIDIA's own Dockerfiles (gitlab.com/nvidia/container-images/cuda dist/<ver>/<os>/<flavor>): the
# runtime tier sets NV_LIBCUBLAS_VERSION (and NCCL's), the devel tier NV_CUDA_CUDART_DEV_VERSION,
# the cuDNN variants NV_CUDNN_VERSION; every tier sets CUDA_VERSION.
_DEVEL_ENV = "NV_CUDA_CUDART_DEV_VERSION"
_RUNTIME_ENV = "NV_LIBCUBLAS_VERSION"
# Official Docker Hub images known to carry no CUDA: refused without asking any registry.
_PLAIN_OS = re.compile(r"^library/(debian|ubuntu|python|alpine|fedora|rockylinux|almalinux|centos|amazonlinux|"
                       r"busybox|redhat/ubi\d+)\Z")


@dataclass(frozen=True)
class CudaBase:
    """CUDA facts of a base: ``cuda`` (X.Y or X.Y.Z) None where none was found; ``flavor`` and
    ``cudnn`` (a major) None where unknown; ``evidence`` says where they were read."""
    cuda: str | None
    flavor: str | None  # a CudaFlavor word from a tag or NVIDIA's env; an imgbuild label's word as written
    cudnn: str | None
    os: str | None
    evidence: str


def _parse(ref: str) -> reference.Reference | None:
    try:
        return reference.parse_reference(ref)
    except UsageError:
        return None


def from_tag(ref: str) -> CudaBase | None:
    """An ``nvidia/cuda:<tag>`` reference (under any registry or mirror path) read from its tag."""
    parsed = _parse(ref)
    if parsed is None or not (parsed.repository == "nvidia/cuda" or parsed.repository.endswith("/nvidia/cuda")):
        return None
    m = _TAG_RE.match(parsed.tag or "")
    if not m:
        return None
    # "cudnn8" names its major; a bare "cudnn" (12.x tags) leaves it to the images data: ""
    cudnn_tag = m.group("cudnn")
    cudnn = cudnn_tag.removeprefix("cudnn") if cudnn_tag else None
    return CudaBase(m.group("cuda"), m.group("flavor"), cudnn, m.group("os"), f"its tag {parsed.tag}")


def plain_os_image(ref: str) -> bool:
    """An official OS or Python image of Docker Hub (debian, ubuntu, python, ...): no CUDA inside."""
    parsed = _parse(ref)
    return parsed is not None and parsed.registry == reference.DOCKER_HUB and bool(_PLAIN_OS.match(parsed.repository))


def from_config(labels: dict[str, str], env: dict[str, str]) -> CudaBase:
    """From a base's config: imgbuild's labels first, then NVIDIA's env."""
    if K.CUDA_VERSION in labels:
        return CudaBase(labels[K.CUDA_VERSION], labels.get(K.CUDA_FLAVOR), labels.get(K.CUDNN_VERSION),
                        labels.get(K.OS), "its io.imgbuild labels")
    cuda = env.get("CUDA_VERSION")
    if not cuda:
        return CudaBase(None, None, None, None, f"its config (no {K.CUDA_VERSION} label, no CUDA_VERSION env)")
    flavor = CudaFlavor.DEVEL if _DEVEL_ENV in env else CudaFlavor.RUNTIME if _RUNTIME_ENV in env else CudaFlavor.BASE
    cudnn = env.get("NV_CUDNN_VERSION", "").split(".")[0] or None
    return CudaBase(cuda, flavor, cudnn, None, "its env (CUDA_VERSION and NVIDIA's NV_* variables)")


def needs_config(source: str, ref: str) -> bool:
    """Must the base's config be read to know its CUDA? With source: nvidia, unless its tag or its
    name (a plain OS image) already says."""
    return source == "nvidia" and from_tag(ref) is None and not plain_os_image(ref)
