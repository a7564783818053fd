"""The token policy kind: a transformers image-text-to-text model (any family of `mmrl.families`) behind the policy
interface, with an action codec for a VLA."""

from .policy import *  # noqa: F403
