"""fusion-cache: nvFuser's Python frontend, run as generated CUDA kernels kept in a persistent store.

Scripts written for nvFuser's frontend run by changing the import:
`from nvfuser import FusionDefinition, DataType` -> `from fusion_cache import FusionDefinition, DataType`.
"""
from fusion_cache.frontend.definition import Fusion, FusionDefinition, FusionDefinitionError
from fusion_cache.frontend.dtypes import DataType
from fusion_cache.frontend.layout import compute_contiguity, compute_tensor_descriptor
from fusion_cache.frontend.trie import FusionCache
from fusion_cache.frontend.values import Scalar, Tensor, Vector

# after the names above: the frontends build FusionDefinitions (cheap: no torch._dynamo here)
from .frontends import from_torchscript, register_backend  # noqa: E402

__version__ = "0.1.0"


def version() -> str:
    return __version__


__all__ = [
    "DataType",
    "Fusion",
    "FusionCache",
    "FusionDefinition",
    "FusionDefinitionError",
    "Scalar",
    "Tensor",
    "Vector",
    "compute_contiguity",
    "from_torchscript",
    "register_backend",
    "compute_tensor_descriptor",
    "version",
]
