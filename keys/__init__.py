"""wmark.keys: the key registry in SQL (keys, tokenizers), secrets sealed under a master key.

from wmark.keys import KeyRegistry, RegistryConfig
registry = KeyRegistry.open(RegistryConfig.from_env())
"""

from __future__ import annotations

from wmark.keys.config import RegistryConfig
from wmark.keys.crypto import MasterKey
from wmark.keys.registry import KeyInfo, KeyRegistry

__all__ = ["KeyInfo", "KeyRegistry", "MasterKey", "RegistryConfig"]
