"""Op families. Importing one declares its ops in the registry and registers its implementations."""
from . import activation, embedding, loss, norm, rope, softmax

__all__ = ["activation", "embedding", "loss", "norm", "rope", "softmax"]
from . import optim  # noqa: E402

__all__ += ["optim"]
from . import attention, kvcache  # noqa: E402

__all__ += ["attention", "kvcache"]
