"""Prompt text -> token IDs with the model's tokenizer.json, where a chat's control tokens are the template's.

A chat template writes control tokens (`<|im_start|>`, `<|im_end|>` ...) around each message's
content, and tokenizer.json turns their text into their IDs wherever it occurs. Rendering the
template and encoding the result whole would do that inside a content too: a user who writes
`<|im_end|>\\n<|im_start|>system` would open a system turn of their own. So, as serving engines do
(transformers' `split_special_tokens`), a content's control-token text is encoded as plain text:
the contents' control-token text is hidden behind markers while the template renders, the
rendered text is cut at the template's control tokens, and the text between them (contents
restored) is encoded with special tokens off (`Tokenizer.encode_special_tokens`).

A conversation whose contents hold no control-token text is encoded whole, as before: the same
IDs, to the token (the cut above can differ at a section's first token for tokenizers that
prefix only the first section with a space marker, SentencePiece's "first" scheme).

Encoding goes through `encode_batch`, which releases the GIL (`encode` holds it for the whole
text: a 1 MB prompt stopped every other thread of the server for a second or two).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence

import jinja2
from tokenizers import Tokenizer
from transformers import PreTrainedTokenizerBase

from wmark.errors import InputError

__all__ = ["PromptEncoder"]

_MARKERS = range(0xE000, 0xF900)  # Unicode's private use area: text that templates pass through


class PromptEncoder:
    """Encodes raw prompts and chat conversations for one model.

    Args:
        tokenizer_json: the model's tokenizer.json (its IDs are what keys are bound to).
        chat: transformers' tokenizer of the model, for its chat template (may have none).
    """

    def __init__(self, tokenizer_json: bytes, chat: PreTrainedTokenizerBase) -> None:
        text = tokenizer_json.decode("utf-8")
        self.chat = chat
        self.tokenizer = Tokenizer.from_str(text)
        self._plain = Tokenizer.from_str(text)  # the same, with control tokens read as plain text
        self._plain.encode_special_tokens = True
        specials = {t.content: i for i, t in self.tokenizer.get_added_tokens_decoder().items() if t.special}
        self._special_ids = specials
        self._special_id_set = frozenset(specials.values())
        # longest first: at one position the longest control token wins, as tokenizers matches
        self._control = (
            re.compile("|".join(re.escape(s) for s in sorted(specials, key=len, reverse=True)))
            if specials
            else None
        )
        vocab = self.tokenizer.get_vocab(with_added_tokens=True)
        self.max_token_chars = max((len(token) for token in vocab), default=1) or 1

    def encode_raw(self, text: str) -> list[int]:
        """Token IDs of `text` as written (control-token text is control tokens: the client wrote
        the whole prompt)."""
        return self._ids(self.tokenizer.encode_batch([text], add_special_tokens=False)[0].ids)

    def encode_messages(self, messages: Sequence[Mapping[str, str]]) -> list[int]:
        """Token IDs of a conversation (`{"role", "content"}` dicts) through the chat template,
        ending with the assistant's turn to speak; control tokens only where the template puts them.

        Raises:
            InputError: the model has no chat template, or its template refuses the messages
                (some refuse roles that do not alternate).
        """
        if not getattr(self.chat, "chat_template", None):
            raise InputError("this model has no chat template: use --raw")
        control = self._control
        if control is None or not any(control.search(m["content"]) for m in messages):
            rendered = self._render([dict(m) for m in messages])
            ids = self.tokenizer.encode_batch([rendered], add_special_tokens=False)[0].ids
            # a control token the normaliser made out of other text (full-width forms, ...) is
            # not the template's either: then count differs, and the careful way is taken
            if control is None or sum(i in self._special_id_set for i in ids) == len(
                control.findall(rendered)
            ):
                return self._ids(ids)
        return self._ids(self._encode_hiding_contents(messages))

    def _encode_hiding_contents(self, messages: Sequence[Mapping[str, str]]) -> list[int]:
        """The template rendered with the contents' control-token text behind markers, cut at the
        template's control tokens; the sections between them encoded with special tokens off."""
        assert self._control is not None
        source = str(getattr(self.chat, "chat_template", ""))
        used = [source, *(m["content"] for m in messages)]
        marker = next((chr(c) for c in _MARKERS if all(chr(c) not in text for text in used)), None)
        if marker is None:  # every private-use character appears in the conversation
            raise InputError("the messages use every private-use character; they cannot be encoded safely")
        hidden: list[str] = []

        def hide(match: re.Match[str]) -> str:
            hidden.append(match.group())
            return f"{marker}{len(hidden) - 1}{marker}"

        rendered = self._render([{**m, "content": self._control.sub(hide, m["content"])} for m in messages])
        hidden_text = re.compile(f"{marker}(\\d+){marker}")
        sections, controls, start = [], [], 0
        for match in self._control.finditer(rendered):  # only the template's are left
            sections.append(rendered[start : match.start()])
            controls.append(self._special_ids[match.group()])
            start = match.end()
        sections.append(rendered[start:])
        texts = [hidden_text.sub(lambda m: hidden[int(m.group(1))], s) for s in sections]
        encoded = self._plain.encode_batch(texts, add_special_tokens=False)
        ids: list[int] = []
        for i, section in enumerate(encoded):
            ids.extend(section.ids)
            if i < len(controls):
                ids.append(controls[i])
        return ids

    def _render(self, messages: list[dict[str, str]]) -> str:
        try:
            return str(self.chat.apply_chat_template(messages, add_generation_prompt=True, tokenize=False))
        except jinja2.TemplateError as exc:
            raise InputError(f"the model's chat template refuses these messages: {str(exc)[:200]}") from None

    @staticmethod
    def _ids(ids: Sequence[int]) -> list[int]:
        if not ids:
            raise InputError("the prompt has no tokens in this model's vocabulary")
        return [int(i) for i in ids]
