"""A GGUF model's own chat template, rendered so that message text can never become a turn marker.

The template (Jinja, from the file's ``tokenizer.chat_template``) is rendered with a placeholder
in place of each message's text. The rendered string is then split at the placeholders into
pieces: the template's own scaffolding, whose special tokens (``<|im_start|>``, ...) are meant,
and the messages' text, which is data. The caller tokenises the first kind with special tokens
parsed and the second without, so a message that says ``<|im_end|>`` is just those characters,
for every template, without knowing any template's tokens.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from ._types import ChatMessage

__all__ = ["ChatTemplate", "Piece"]

Piece = tuple[str, bool]
"""A piece of a prompt: its text, and whether that text is the template's (special tokens on)."""

_SLOT = re.compile("\ue000(\\d+)\ue001")  # private-use characters: no template writes them


class ChatTemplate:
    """A chat template, rendered the way llama-cpp-python's chat handlers render it.

    Raises:
        ValueError: the template does not compile (at construction) or refuses the messages
            (at :meth:`pieces`, e.g. a template that allows no system role).
    """

    def __init__(self, source: str, *, bos_token: str, eos_token: str) -> None:
        import jinja2
        from llama_cpp.llama_chat_format import Jinja2ChatFormatter

        try:
            self._format: Any = Jinja2ChatFormatter(
                template=source, eos_token=eos_token, bos_token=bos_token
            )
        except jinja2.TemplateError as exc:
            raise ValueError(f"the model's chat template does not compile: {exc}") from None
        self.bos_token = bos_token

    def pieces(self, messages: Sequence[ChatMessage]) -> list[Piece]:
        """The prompt for ``messages`` followed by the opening of the assistant's turn."""
        import jinja2

        slots = [{"role": m.role, "content": f"\ue000{i}\ue001"} for i, m in enumerate(messages)]
        try:
            rendered = str(self._format(messages=slots).prompt)
        except jinja2.TemplateError as exc:
            raise ValueError(f"the model's chat template failed: {exc}") from None
        out: list[Piece] = []
        for k, part in enumerate(_SLOT.split(rendered)):
            if k % 2:
                out.append((messages[int(part)].content, False))
            elif part:
                if "\ue000" in part or "\ue001" in part:
                    # The template cut or rewrote a message's text: it cannot be kept as data.
                    raise ValueError("the model's chat template rewrites message text")
                out.append((part, True))
        return out

    def text(self, messages: Sequence[ChatMessage]) -> str:
        """The rendered prompt as one string (for logs and tests; never tokenise this)."""
        return "".join(text for text, _ in self.pieces(messages))
