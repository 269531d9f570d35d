"""Prompt sets for `wmark eval`: JSONL files, the built-in sets, and local CNN/DailyMail and ELI5.

A prompt set is JSONL, one prompt per line:

    {"id": "q1", "messages": [{"role": "system", "content": "..."}, {"role": "user", "content": "..."}]}
    {"id": "q2", "prompt": "a user message", "reference": "an optional reference answer"}

"messages" go through the target's chat template as they are; "prompt" is one user message.
The built-in sets (`BUILTIN_SETS`) were written for this project: ELI5-style questions, short
news-like passages to summarise (with reference summaries), and code tasks. The paper's data
sets are read only from local copies (no download), in the usual formats (a `datasets`
`save_to_disk` folder, the Hub's parquet files, CSV, JSONL), and turned into prompts with the
paper's templates (docs/algorithms.md §9): `cnn_dailymail:PATH` and `eli5:PATH`. CNN/DailyMail
has two templates (`PROMPT_TEMPLATES`): "chat" (a system and a user message through the target's
chat template) and "hu-huang" (Hu and Huang's plain-text System:/INPUT:/OUTPUT: prompt, sent
without any chat template; docs/algorithms.md §12).
"""

from __future__ import annotations

import csv
import hashlib
import json
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

import numpy as np

from wmark.errors import InputError

__all__ = [
    "BUILTIN_SETS",
    "PROMPT_TEMPLATES",
    "Prompt",
    "PromptSet",
    "cnn_dailymail_prompts",
    "eli5_prompts",
    "load_prompt_set",
    "parse_prompts",
    "read_records",
]

BUILTIN_SETS: dict[str, tuple[str, ...]] = {
    "eli5-mini": ("eli5-mini",),
    "summaries-mini": ("summaries-mini",),
    "code-mini": ("code-mini",),
    "builtin": ("eli5-mini", "summaries-mini", "code-mini"),
}
SYSTEM_PROMPT = "You are a helpful assistant."
CNN_INSTRUCTION = "Summarize the following article in 3-5 sentences:\n\n"
ELI5_INSTRUCTION = "Please explain like I'm five:\n\n"
CNN_MAX_ARTICLE_CHARS = 3000  # articles this long or longer are skipped
CNN_ARTICLE_PREFIX = 1500  # the article is cut to this many characters in the prompt
SHUFFLE_SEED = 42
# Hu and Huang's summarisation prompt: plain text, the article cut to 1,000 characters.
HU_HUANG_TEMPLATE = "System:Summarize the following article.\nINPUT:{article}\nOUTPUT:"
HU_HUANG_ARTICLE_PREFIX = 1000
PROMPT_TEMPLATES = ("chat", "hu-huang")
_ROLES = frozenset({"system", "user", "assistant"})


@dataclass(frozen=True)
class Prompt:
    """One prompt of a set.

    Attributes:
        id: unique within its set.
        messages: (role, content) pairs for the chat template, or None.
        prompt: a single user message, or None (exactly one of messages and prompt is set).
        reference: a reference answer (for ROUGE-L), if any.
        raw: `prompt` is the model's input exactly as it is: no chat template even in a chat
            run (a plain-text template such as Hu and Huang's).
    """

    id: str
    messages: tuple[tuple[str, str], ...] | None = None
    prompt: str | None = None
    reference: str | None = None
    raw: bool = False

    @property
    def sha256(self) -> str:
        """Hash of the prompt's content (rows of a changed prompt are not reused)."""
        content: list[object] = [self.messages, self.prompt, self.reference]
        if self.raw:  # appended only when set, so the hashes of existing runs' prompts stay the same
            content.append("raw")
        data = json.dumps(content, ensure_ascii=False)
        return hashlib.sha256(data.encode()).hexdigest()

    def chat_messages(self) -> list[dict[str, str]]:
        """The messages as chat-template input (a "prompt" is one user message)."""
        if self.messages is not None:
            return [{"role": role, "content": content} for role, content in self.messages]
        return [{"role": "user", "content": self.prompt or ""}]


@dataclass(frozen=True)
class PromptSet:
    """A named list of prompts."""

    name: str
    prompts: tuple[Prompt, ...]


def parse_prompts(text: str, source: str) -> tuple[Prompt, ...]:
    """Parse JSONL prompt lines; errors name `source` and the line number.

    Raises:
        InputError: a line is not JSON, lacks an id or content, or repeats an id.
    """
    prompts: list[Prompt] = []
    seen: set[str] = set()
    for lineno, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        where = f"{source}, line {lineno}"
        try:
            data = json.loads(line)
        except json.JSONDecodeError as exc:
            raise InputError(f"{where}: not valid JSON ({exc.msg})") from None
        prompt = _prompt_from(data, where)
        if prompt.id in seen:
            raise InputError(f"{where}: duplicate id {prompt.id!r}")
        seen.add(prompt.id)
        prompts.append(prompt)
    if not prompts:
        raise InputError(f"{source}: no prompts")
    return tuple(prompts)


def _prompt_from(data: Any, where: str) -> Prompt:
    if not isinstance(data, dict):
        raise InputError(f"{where}: expected a JSON object")
    unknown = set(data) - {"id", "messages", "prompt", "reference"}
    if unknown:
        raise InputError(f"{where}: unknown field(s) {', '.join(sorted(unknown))}")
    pid = data.get("id")
    if not isinstance(pid, str | int) or isinstance(pid, bool) or not str(pid).strip():
        raise InputError(f'{where}: "id" must be a non-empty string')
    if ("messages" in data) == ("prompt" in data):
        raise InputError(f'{where}: give exactly one of "messages" and "prompt"')
    reference = data.get("reference")
    if reference is not None and not isinstance(reference, str):
        raise InputError(f'{where}: "reference" must be a string')
    if "prompt" in data:
        if not isinstance(data["prompt"], str) or not data["prompt"].strip():
            raise InputError(f'{where}: "prompt" must be a non-empty string')
        return Prompt(str(pid), prompt=data["prompt"], reference=reference)
    messages = data["messages"]
    if not isinstance(messages, list) or not messages:
        raise InputError(f'{where}: "messages" must be a non-empty list')
    pairs = []
    for m in messages:
        if not isinstance(m, dict) or m.get("role") not in _ROLES or not isinstance(m.get("content"), str):
            raise InputError(
                f'{where}: each message needs a "role" ({", ".join(sorted(_ROLES))}) and "content"'
            )
        pairs.append((str(m["role"]), str(m["content"])))
    if not any(role == "user" and content.strip() for role, content in pairs):
        raise InputError(f"{where}: no user message with content")
    return Prompt(str(pid), messages=tuple(pairs), reference=reference)


def load_prompt_set(spec: str, *, limit: int | None = None, template: str = "chat") -> PromptSet:
    """A built-in set name, `cnn_dailymail:PATH`, `eli5:PATH`, or a JSONL file.

    Args:
        spec: what to load.
        limit: keep the first `limit` prompts (of each built-in part, for "builtin").
        template: a `PROMPT_TEMPLATES` name; "hu-huang" only for `cnn_dailymail:PATH` (the
            template is a summarisation prompt; other sets bring their own text).

    Raises:
        InputError: unknown set or template, unreadable or malformed file.
    """
    if limit is not None and limit < 1:
        raise InputError("--limit must be at least 1")
    if template not in PROMPT_TEMPLATES:
        raise InputError(f"unknown prompt template {template!r}; known: {', '.join(PROMPT_TEMPLATES)}")
    if template != "chat" and not spec.startswith("cnn_dailymail:"):
        raise InputError(f"--prompt-template {template} applies to cnn_dailymail:PATH prompts only")
    if spec in BUILTIN_SETS:
        prompts: list[Prompt] = []
        for part in BUILTIN_SETS[spec]:
            text = resources.files("wmark.eval").joinpath(f"prompt_sets/{part}.jsonl").read_text("utf-8")
            prompts += parse_prompts(text, f"{part}.jsonl")[:limit]
        return PromptSet(spec, tuple(prompts))
    kind, _, location = spec.partition(":")
    if kind in ("cnn_dailymail", "eli5") and location:
        if kind == "cnn_dailymail":
            return PromptSet(spec, cnn_dailymail_prompts(Path(location), limit=limit, template=template))
        return PromptSet(spec, eli5_prompts(Path(location), limit=limit))
    path = Path(spec)
    if not path.is_file():
        known = ", ".join(BUILTIN_SETS)
        raise InputError(
            f"{spec}: no such prompt file or set (built-in: {known}; or cnn_dailymail:PATH, eli5:PATH)"
        )
    try:
        text = path.read_text("utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError(f"{spec}: cannot read ({exc})") from None
    return PromptSet(path.name, parse_prompts(text, str(path))[:limit])


def cnn_dailymail_prompts(
    path: Path, *, limit: int | None = None, split: str = "test", template: str = "chat"
) -> tuple[Prompt, ...]:
    """CNN/DailyMail 3.0.0 as the paper uses it: shuffle(seed=42), articles < 3000 characters.

    Template "chat": [system "You are a helpful assistant.", user "Summarize the following article
    in 3-5 sentences:\\n\\n" + article[:1500]] through the chat template (S1's prompt).
    Template "hu-huang": the plain text `HU_HUANG_TEMPLATE` with article[:1000], no chat template
    (the prompt the paper's appendix D.1 names). Either way the `highlights` are the reference.
    """
    records = read_records(path, split, required=("article", "highlights"))
    out = []
    for i in _shuffled(len(records)):
        article = str(records[i]["article"])
        if len(article) >= CNN_MAX_ARTICLE_CHARS:
            continue
        pid = str(records[i].get("id") or f"cnn-{i}")
        reference = str(records[i]["highlights"])
        if template == "hu-huang":
            text = HU_HUANG_TEMPLATE.format(article=article[:HU_HUANG_ARTICLE_PREFIX])
            out.append(Prompt(pid, prompt=text, reference=reference, raw=True))
        else:
            messages = (("system", SYSTEM_PROMPT), ("user", CNN_INSTRUCTION + article[:CNN_ARTICLE_PREFIX]))
            out.append(Prompt(pid, messages=messages, reference=reference))
        if limit is not None and len(out) >= limit:
            break
    return tuple(out)


def eli5_prompts(path: Path, *, limit: int | None = None, split: str = "train") -> tuple[Prompt, ...]:
    """ELI5 (sentence-transformers/eli5) as the paper uses it: shuffle(seed=42), no reference.

    Each prompt is [system "You are a helpful assistant.", user "Please explain like I'm five:\\n\\n"
    + question].
    """
    records = read_records(path, split, required=("question",))
    out = []
    for i in _shuffled(len(records))[:limit]:
        messages = (("system", SYSTEM_PROMPT), ("user", ELI5_INSTRUCTION + str(records[i]["question"])))
        out.append(Prompt(f"eli5-{i}", messages=messages))
    return tuple(out)


def _shuffled(n: int) -> list[int]:
    # `datasets.Dataset.shuffle(seed=42)` is this permutation: np.random.default_rng(seed).permutation(n).
    return [int(i) for i in np.random.default_rng(SHUFFLE_SEED).permutation(n)]


def read_records(path: Path, split: str, *, required: Sequence[str] = ()) -> list[dict[str, Any]]:
    """Rows of a local data set: a `save_to_disk` folder (one split or a DatasetDict), a folder of
    parquet/arrow/jsonl/csv files (the split's files when their names mention it), or one file.

    Raises:
        InputError: nothing readable there, or a required column is missing.
    """
    if not path.exists():
        raise InputError(f"{path}: no such file or folder")
    files = _data_files(path, split)
    if not files:
        raise InputError(f"{path}: no data files (.arrow, .parquet, .jsonl, .json, .csv) for split {split!r}")
    records = [row for f in files for row in _read_file(f)]
    missing = [c for c in required if records and c not in records[0]]
    if not records or missing:
        raise InputError(
            f"{path}: expected columns {', '.join(required)} (missing: {', '.join(missing) or 'rows'})"
        )
    return records


_SUFFIXES = (".arrow", ".parquet", ".jsonl", ".json", ".csv")


def _data_files(path: Path, split: str) -> list[Path]:
    if path.is_file():
        return [path]
    if (path / "dataset_dict.json").is_file():  # DatasetDict.save_to_disk: one folder per split
        splits = json.loads((path / "dataset_dict.json").read_text()).get("splits", [])
        if split not in splits:
            raise InputError(f"{path}: no split {split!r} (splits: {', '.join(splits)})")
        return _data_files(path / split, split)
    if (path / "state.json").is_file():  # Dataset.save_to_disk
        state = json.loads((path / "state.json").read_text())
        return [path / f["filename"] for f in state.get("_data_files", [])]
    found = sorted(p for p in path.rglob("*") if p.is_file() and p.suffix in _SUFFIXES)
    named = [p for p in found if split in p.name]
    return named or found


def _read_file(path: Path) -> Iterator[dict[str, Any]]:
    suffix = path.suffix
    try:
        if suffix == ".csv":
            with path.open(newline="", encoding="utf-8") as f:
                yield from csv.DictReader(f)
        elif suffix in (".jsonl", ".json"):
            text = path.read_text("utf-8")
            if suffix == ".json" and text.lstrip().startswith("["):
                yield from json.loads(text)
            else:
                yield from (json.loads(line) for line in text.splitlines() if line.strip())
        else:
            yield from _read_arrow(path)
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, csv.Error) as exc:
        raise InputError(f"{path}: cannot read ({exc})") from None


def _read_arrow(path: Path) -> list[dict[str, Any]]:
    try:
        import pyarrow as pa
        import pyarrow.ipc
        import pyarrow.parquet
    except ImportError:
        raise InputError(
            f"{path}: reading .arrow/.parquet needs pyarrow (pip install 'wmark[scan]')"
        ) from None
    if path.suffix == ".parquet":
        table = pyarrow.parquet.read_table(path)
    else:  # `datasets` writes Arrow IPC streams; plain Arrow files are accepted too
        try:
            with pa.memory_map(str(path)) as source:
                table = pyarrow.ipc.open_stream(source).read_all()
        except pa.ArrowInvalid:
            with pa.memory_map(str(path)) as source:
                table = pyarrow.ipc.open_file(source).read_all()
    rows: list[dict[str, Any]] = table.to_pylist()
    return rows
