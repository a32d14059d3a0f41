"""`hanlm chat`: the session in-process (streaming, history, /reset) and the real command driven
through a pseudo-terminal, as a user at a terminal would."""

import io
import os
import pty
import select
import subprocess
import sys
import time

import pytest

from conftest import TINY_PRETRAIN, trained_and_exported
from hanlm.chat.session import PROMPT, ChatSession, run_repl
from hanlm.config import GenerateSection
from hanlm.inference import chat_prompt, generate, load

GREEDY = GenerateSection(greedy=True, repetition_penalty=1.3, max_new_tokens=12)


@pytest.fixture(scope="module")
def model_dir(demo_run, tmp_path_factory):
    """A tiny model trained 4 steps on the demo world and exported (its tokenizer carries the
    chat template); what it says does not matter here, only how it is said."""
    values = {
        **TINY_PRETRAIN,
        "pretrain.max_steps": 4,
        "logging.eval_every": 4,
        "logging.eval_batches": 1,
    }
    return trained_and_exported(demo_run, tmp_path_factory.mktemp("chat") / "run", values)


@pytest.fixture(scope="module")
def loaded(model_dir):
    return load(model_dir, device="cpu")


def test_reply_streams_the_same_answer_generate_gives(loaded):
    # A strong penalty and a fixed length give varied text; the streamer holds back runs of
    # punctuation (until a space), which an answer of dots alone would be.
    settings = GREEDY.model_copy(update={"repetition_penalty": 2.0, "min_new_tokens": 12})
    session = ChatSession(loaded, settings, system="짧게 답하세요.")
    pieces = []
    answer = session.reply("서울은 어디에 있나요?", on_text=pieces.append)
    assert len(pieces) > 1, "the answer should arrive piece by piece"
    assert "".join(pieces).strip() == answer
    messages = [
        {"role": "system", "content": "짧게 답하세요."},
        {"role": "user", "content": "서울은 어디에 있나요?"},
    ]
    expected = generate(loaded, [messages], settings)[0]["text"].strip()
    assert answer == expected


def test_history_is_kept_and_reset_forgets_it(loaded):
    session = ChatSession(loaded, GREEDY)
    first = session.reply("안녕")
    session.reply("또 만나요")
    assert [m["role"] for m in session.messages()] == ["user", "assistant"] * 2
    assert first in chat_prompt(loaded, session.messages())
    session.reset()
    assert session.messages() == []


def test_old_turns_are_dropped_when_the_context_is_full(loaded):
    settings = GREEDY.model_copy(update={"max_new_tokens": 40})  # context of the model: 64
    session = ChatSession(loaded, settings)
    for text in ("첫 번째 질문입니다", "두 번째 질문입니다", "세 번째 질문입니다"):
        session.reply(text)
    assert session.history[0]["content"] != "첫 번째 질문입니다"


def test_a_message_longer_than_the_context_keeps_its_end_with_a_warning(loaded, capsys):
    session = ChatSession(loaded, GREEDY)
    answer = session.reply("서울은 한국의 수도이다. " * 8000)  # about 100k characters
    assert isinstance(answer, str)
    [line] = [line for line in capsys.readouterr().err.splitlines() if "dropped" in line]
    assert line.startswith("warning: the prompt has") and "the last 52 kept" in line


def test_repl_commands_and_end_of_input(loaded):
    lines = iter(["", "/help", "안녕", "/reset", "안녕"])

    def read(prompt):
        assert prompt == PROMPT
        try:
            return next(lines)
        except StopIteration:
            raise EOFError from None  # Ctrl-D

    out = io.StringIO()
    assert run_repl(loaded, GREEDY, read=read, out=out) == 0
    text = out.getvalue()
    assert "unknown command /help" in text
    assert text.count("model> ") == 2
    assert "(conversation forgotten)" in text


# --- through a pseudo-terminal -----------------------------------------------------------------------


class Terminal:
    """A child process on a pseudo-terminal: write keystrokes, read what it prints."""

    def __init__(self, args, cwd):
        self.master, slave = pty.openpty()
        env = {**os.environ, "COLUMNS": "200", "TERM": "dumb", "PYTHONUNBUFFERED": "1"}
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "hanlm", *map(str, args)],
            stdin=slave,
            stdout=slave,
            stderr=slave,
            cwd=cwd,
            env=env,
            close_fds=True,
        )
        os.close(slave)
        self.seen = ""

    def read_until(self, needle: str, timeout: float = 120) -> str:
        """Everything printed up to and including `needle` since the last call."""
        deadline = time.monotonic() + timeout
        while needle not in self.seen:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise AssertionError(f"{needle!r} never came; the terminal shows {self.seen!r}")
            ready, _, _ = select.select([self.master], [], [], remaining)
            if ready:
                try:
                    chunk = os.read(self.master, 4096)
                except OSError:  # the child closed the terminal
                    chunk = b""
                if not chunk:
                    raise AssertionError(f"{needle!r} never came; the terminal shows {self.seen!r}")
                self.seen += chunk.decode("utf-8", errors="replace")
        head, _, tail = self.seen.partition(needle)
        self.seen = tail
        return head + needle

    def type(self, text: str) -> None:
        os.write(self.master, text.encode())

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        os.close(self.master)


def test_chat_in_a_terminal_answers_resets_and_exits(model_dir, loaded, tmp_path):
    expected = ChatSession(loaded, GREEDY).reply("안녕하세요")
    terminal = Terminal(
        ["chat", model_dir, "--greedy", "--repetition-penalty", "1.3", "--max-new-tokens", "12",
         "--run", tmp_path / "norun"],
        cwd=tmp_path,
    )  # fmt: skip
    try:
        banner = terminal.read_until(PROMPT)
        assert "/reset" in banner and "/exit" in banner
        terminal.type("안녕하세요\n")
        shown = terminal.read_until(PROMPT)
        answer = shown.split("model> ", 1)[1].rsplit("\r\n", 1)[0]
        # the terminal turns \n into \r\n; the answer is the library's
        assert answer.replace("\r\n", "\n").strip() == expected
        terminal.type("/reset\n")
        assert "(conversation forgotten)" in terminal.read_until(PROMPT)
        terminal.type("/exit\n")
        assert terminal.proc.wait(timeout=60) == 0
    finally:
        terminal.close()
