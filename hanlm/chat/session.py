"""`hanlm chat`: an interactive conversation with a model folder in the terminal.

The conversation goes through the model's chat template; the answer streams as it is written
(transformers' TextIteratorStreamer); the history is kept across turns, the oldest turns dropped
when it outgrows the model's context. `/reset` forgets the history, `/exit` or Ctrl-D quits,
Ctrl-C stops an answer being written (and quits at the prompt).
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import TextIO

from hanlm.config import GenerateSection
from hanlm.console import info
from hanlm.inference import (
    LoadedModel,
    StopFlag,
    chat_prompt,
    context_length,
    seed_everything,
    stream,
)

PROMPT = "you> "
HELP = "/reset forgets the conversation, /exit or Ctrl-D quits"


class ChatSession:
    """The history of one conversation and how to extend it by one answer."""

    def __init__(self, loaded: LoadedModel, settings: GenerateSection, system: str | None = None):
        self.loaded, self.settings, self.system = loaded, settings, system
        self.history: list[dict[str, str]] = []
        self.stop = StopFlag()

    def reset(self) -> None:
        self.history = []

    def messages(self) -> list[dict[str, str]]:
        head = [{"role": "system", "content": self.system}] if self.system else []
        return head + self.history

    def _fitted_prompt(self) -> str:
        """The template text, dropping the oldest exchanges until prompt + answer fit."""
        limit = context_length(self.loaded.model)
        while True:
            text = chat_prompt(self.loaded, self.messages())
            if limit is None or len(self.history) <= 1:
                return text
            length = len(self.loaded.tokenizer(text, add_special_tokens=False)["input_ids"])
            if length + self.settings.max_new_tokens <= limit:
                return text
            self.history = self.history[2:]

    def reply(self, user_text: str, on_text: Callable[[str], None] | None = None) -> str:
        """Add the user's turn, stream the answer through `on_text`, keep and return it."""
        self.history.append({"role": "user", "content": user_text})
        self.stop.event.clear()
        pieces: list[str] = []
        try:
            for piece in stream(self.loaded, self._fitted_prompt(), self.settings, stop=self.stop):
                pieces.append(piece)
                if on_text is not None and piece:
                    on_text(piece)
        except KeyboardInterrupt:
            self.stop.event.set()  # the generating thread stops at its next token
            raise
        finally:  # an interrupted answer stays in the history as far as it got
            answer = "".join(pieces).strip()
            self.history.append({"role": "assistant", "content": answer})
        return answer


def run_repl(
    loaded: LoadedModel,
    settings: GenerateSection,
    *,
    system: str | None = None,
    read: Callable[[str], str] = input,
    out: TextIO | None = None,
) -> int:
    """The interactive loop; returns the exit status (0 on /exit, Ctrl-D or Ctrl-C)."""
    out = out or sys.stdout
    seed_everything(settings.seed)
    session = ChatSession(loaded, settings, system)
    info(f"chat with {loaded.path} ({HELP})")
    while True:
        try:
            line = read(PROMPT)
        except (EOFError, KeyboardInterrupt):
            out.write("\n")
            out.flush()
            return 0
        text = line.strip()
        if not text:
            continue
        if text == "/exit":
            return 0
        if text == "/reset":
            session.reset()
            out.write("(conversation forgotten)\n")
            out.flush()
            continue
        if text.startswith("/"):
            out.write(f"unknown command {text.split()[0]}: {HELP}\n")
            out.flush()
            continue

        def show(piece: str) -> None:
            out.write(piece)
            out.flush()

        out.write("model> ")
        out.flush()
        try:
            session.reply(text, on_text=show)
        except KeyboardInterrupt:
            out.write(" [stopped]")
        out.write("\n")
        out.flush()
