"""The exception tree of wmark. Every error a user can cause is a `WmarkError`.

```
WmarkError
├── SpecError                 invalid or unsupported WatermarkSpec
├── InputError                bad input text, token IDs, file or parameter
│   └── InsufficientTextError empty text, or nothing left to score
├── TokenizerError            tokenizer missing, unreadable or not the key's tokenizer
├── KeyRegistryError          registry or database problem
│   ├── KeyNotFoundError      no key with that id
│   ├── KeyRevokedError       the key is revoked and cannot be used
│   └── MasterKeyError        master key missing, malformed or wrong
├── AuthError                 missing or invalid API token (the service maps it to 401/403)
└── BackendError              model or device problem in the generator
```

The CLI turns any `WmarkError` into a one-line message and exit code 2; the service turns it
into a JSON `{code, message}` with a 4xx status. `code` is stable and machine-readable.
"""

from __future__ import annotations

__all__ = [
    "AuthError",
    "BackendError",
    "InputError",
    "InsufficientTextError",
    "KeyNotFoundError",
    "KeyRegistryError",
    "KeyRevokedError",
    "MasterKeyError",
    "SpecError",
    "TokenizerError",
    "WmarkError",
]


class WmarkError(Exception):
    """Base of every error wmark raises on purpose."""

    code = "wmark_error"
    status = 400


class SpecError(WmarkError):
    """A WatermarkSpec is invalid, or of a version this release cannot read."""

    code = "invalid_spec"
    status = 422


class InputError(WmarkError):
    """The caller's input (text, token IDs, file, parameter) cannot be used."""

    code = "invalid_input"
    status = 422


class InsufficientTextError(InputError):
    """The text is empty or too short to say anything about."""

    code = "insufficient_text"


class TokenizerError(WmarkError):
    """A tokenizer cannot be loaded, or does not match the key's tokenizer."""

    code = "tokenizer_error"
    status = 422


class KeyRegistryError(WmarkError):
    """The key registry or its database failed."""

    code = "registry_error"
    status = 409


class KeyNotFoundError(KeyRegistryError):
    """No key has this id."""

    code = "key_not_found"
    status = 404


class KeyRevokedError(KeyRegistryError):
    """The key was revoked; it can neither generate nor detect."""

    code = "key_revoked"
    status = 409


class MasterKeyError(KeyRegistryError):
    """The master key that encrypts secrets is missing, malformed or not the one used."""

    code = "master_key_error"
    status = 500


class AuthError(WmarkError):
    """Authentication or authorisation failed."""

    code = "unauthorized"
    status = 401


class BackendError(WmarkError):
    """A model could not be loaded or run."""

    code = "backend_error"
    status = 422
