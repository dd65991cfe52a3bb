"""Compatibility knowledge (CUDA toolkits, drivers, images, wheels) as sourced data files."""

from .tables import (
    BnbRelease,
    FlashAttnRelease,
    MinorCompatFloor,
    PrebuiltWheel,
    Toolkit,
    TorchRelease,
    bitsandbytes_release,
    cuda_archs,
    cuda_image_oses,
    cuda_image_tag,
    cuda_image_tags,
    cuda_runtime_wheels,
    cudnn_versions,
    data_sources,
    flash_attn_prebuilt,
    flash_attn_release,
    forward_compat_branches,
    image_end_of_life,
    minor_compat,
    minor_compat_floor,
    resolve_cuda,
    toolkits,
    torch_index_url,
    torch_release,
    torch_releases,
    validate_all,
)

__all__ = [
    "BnbRelease", "FlashAttnRelease", "MinorCompatFloor", "PrebuiltWheel", "Toolkit", "TorchRelease",
    "bitsandbytes_release", "cuda_archs", "cuda_image_oses", "cuda_image_tag", "cuda_image_tags",
    "cuda_runtime_wheels", "cudnn_versions", "data_sources", "flash_attn_prebuilt", "flash_attn_release",
    "forward_compat_branches", "image_end_of_life", "minor_compat", "minor_compat_floor", "resolve_cuda",
    "toolkits", "torch_index_url", "torch_release", "torch_releases", "validate_all",
]
