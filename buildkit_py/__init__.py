"""imgbuild: CUDA-aware container image builds from declarative recipes."""

__version__ = "0.1.0"
