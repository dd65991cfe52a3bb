"""The names of the labels imgbuild stamps on an image and reads back: the io.imgbuild.* contract
and the org.opencontainers.image.* keys it sets. One home for every reader and writer: the
recipe refuses ``PREFIX`` keys, the resolver reads a base's labels, the plan stamps them
(plan/labels.py), lock, inspect, check and the engine read them; ``weights push`` writes
OCI_TITLE as the OCI annotation of the same name. Names only: no imports, so
every layer can use it."""

PREFIX = "io.imgbuild."
CUDA_VERSION = PREFIX + "cuda.version"
CUDA_FLAVOR = PREFIX + "cuda.flavor"
CUDA_SOURCE = PREFIX + "cuda.source"
DRIVER_MIN = PREFIX + "cuda.driver.min"
DRIVER_MIN_COMPAT = PREFIX + "cuda.driver.min-compat"
CUDNN_VERSION = PREFIX + "cudnn.version"
TORCH_VERSION = PREFIX + "torch.version"
PYTHON_VERSION = PREFIX + "python.version"
INSTALLER = PREFIX + "installer"  # what installed the Python packages: "uv 0.13.9" or "pip"
OS = PREFIX + "os"  # lets an image built on this one know its OS without pulling it
CUDA_ARCH = PREFIX + "cuda.arch"
GPUS = PREFIX + "gpus"  # the GPUs the recipe targets (gpus:), ";"-separated: the image tests check each
RECIPE_DIGEST = PREFIX + "recipe.digest"
WEIGHTS = PREFIX + "weights"
# annotations of an SBOM attached as a referrer (analysis/sbom.py), not image labels
SBOM = PREFIX + "sbom"
SBOM_PLATFORM = PREFIX + "sbom.platform"

OCI_TITLE = "org.opencontainers.image.title"
OCI_VERSION = "org.opencontainers.image.version"
OCI_BASE_NAME = "org.opencontainers.image.base.name"
OCI_BASE_DIGEST = "org.opencontainers.image.base.digest"
OCI_CREATED = "org.opencontainers.image.created"
OCI_REVISION = "org.opencontainers.image.revision"
OCI_SOURCE = "org.opencontainers.image.source"
OCI_PREFIX = "org.opencontainers.image."  # what a base may set besides the names above (the SBOM keeps them all)
