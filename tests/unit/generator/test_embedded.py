"""The embedded-model assembly: parts found in order, SHA-256 checked, clear errors otherwise."""

from __future__ import annotations

import hashlib

import pytest

from wmark import BackendError
from wmark.generator.models.embedded import EmbeddedModel, _assemble


@pytest.fixture()
def parts(install_parts) -> list[bytes]:
    chunks = [b"GGUF" + bytes(range(256)) * 3, b"second part", b"third and last"]
    install_parts("wmark_fake_part", chunks)
    return chunks


def _model(chunks: list[bytes], parts: int | None = None, sha: str | None = None) -> EmbeddedModel:
    return EmbeddedModel(
        name="Fake",
        package="wmark_fake_part",
        distribution="wmark-fake-part",
        version="1.0",
        parts=parts or len(chunks),
        sha256=sha or hashlib.sha256(b"".join(chunks)).hexdigest(),
    )


def test_parts_are_concatenated_in_order_and_verified(parts, tmp_path):
    dest = tmp_path / "model.gguf"
    seen = []
    _assemble(_model(parts), dest, lambda done, total: seen.append((done, total)))
    assert dest.read_bytes() == b"".join(parts)
    assert seen[-1][0] == seen[-1][1] == len(b"".join(parts))


def test_a_missing_part_names_the_package_to_install(parts, tmp_path):
    with pytest.raises(BackendError, match=r"wmark-fake-part4==1.0.*wmark\[models\]"):
        _assemble(_model(parts, parts=4), tmp_path / "model.gguf", None)


def test_a_corrupt_part_is_refused_and_nothing_is_left_behind(parts, tmp_path):
    dest = tmp_path / "model.gguf"
    with pytest.raises(BackendError, match="corrupt"):
        _assemble(_model(parts, sha="0" * 64), dest, None)
    assert not dest.exists()


def test_every_real_part_is_installed():
    from wmark.generator.models.embedded import DRAFTER, TARGET

    for model in (TARGET, DRAFTER):
        assert len(model.part_paths()) == model.parts  # installed by the [models] extra
