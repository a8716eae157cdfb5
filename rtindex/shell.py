"""The interactive SQL shell of ``rtindex sql DIR``: statements end with ``;``, lines that start
with a dot are shell commands, and an error in one statement leaves the shell running.

On a terminal it prompts and keeps a readline history (``$RTINDEX_HISTORY``, by default
``~/.rtindex_history``; set it empty to keep none). Otherwise it reads statements from
standard input without prompts, so ``rtindex sql DIR < queries.sql`` runs a script, and
exits with status 1 when any statement failed.
"""

from __future__ import annotations

import contextlib
import os
import sys
from typing import Callable

import sqlglot.errors
from sqlglot.dialects.dialect import Dialect
from sqlglot.tokens import TokenType

from rtindex.sql.parse import DIALECT

PROMPT, CONTINUE = "rtindex> ", "    ...> "
HISTORY_ENV = "RTINDEX_HISTORY"
HISTORY_LENGTH = 1000
HELP = """\
Statements end with ';' and may span lines: SELECT ... FROM collection ...;
(docs/sql.md has the dialect). Shell commands:
  .collections   the collections, their documents, shards and size on disk
  .help          this text
  .quit          leave (Ctrl-D does too)"""


class Splitter:
    """Cuts lines of input into whole statements at ``;``, using the SQL dialect's own
    tokenizer, so a ``;`` inside a string or a comment does not end a statement."""

    def __init__(self):
        self._text = ""

    @property
    def pending(self) -> bool:
        """Whether an unfinished statement is waiting for more lines."""
        return bool(self._text.strip())

    def reset(self) -> None:
        self._text = ""

    def feed(self, line: str) -> list[str]:
        """Add a line; the statements it completed (without their ``;``)."""
        self._text += line + "\n"
        try:
            tokens = Dialect.get_or_raise(DIALECT).tokenize(self._text)
        except sqlglot.errors.TokenError:  # an open string or comment: the statement goes on
            return []
        done, start = [], 0
        for tok in tokens:
            if tok.token_type == TokenType.SEMICOLON:
                statement = self._text[start:tok.start].strip()
                if statement:
                    done.append(statement)
                start = tok.end + 1
        self._text = self._text[start:]
        return done

    def rest(self) -> str | None:
        """What is left at the end of input (a last statement without ``;``), if anything."""
        text, self._text = self._text.strip(), ""
        return text or None


class _History:
    """The readline history of a terminal session, loaded from and saved to ``path``.

    ``merge`` replaces the lines of a statement typed over several lines by the whole
    statement, so the up arrow brings back all of it at once.
    """

    def __init__(self, readline, path: str):
        self._rl = readline
        self._path = path
        self._start = 0
        if path:
            with contextlib.suppress(OSError):  # no history yet
                readline.read_history_file(path)
        readline.set_history_length(HISTORY_LENGTH)
        self.mark()

    def mark(self) -> None:
        """The next statement starts at the next line typed."""
        self._start = self._rl.get_current_history_length()

    def merge(self, statement: str) -> None:
        rl, end = self._rl, self._rl.get_current_history_length()
        if end - self._start > 1:
            for pos in range(end - 1, self._start - 1, -1):
                rl.remove_history_item(pos)
            rl.add_history(" ".join(statement.split("\n")) + ";")

    def save(self) -> None:
        if not self._path:
            return
        try:
            self._rl.write_history_file(self._path)
        except OSError as e:
            print(f"rtindex sql: cannot save the history to {self._path}: {e.strerror} (set {HISTORY_ENV} "
                  "to another file, or to nothing to keep no history)", file=sys.stderr)


class _NoHistory:
    """Input that is not a terminal (or a Python without readline) keeps no history."""

    def mark(self) -> None:
        pass

    def merge(self, statement: str) -> None:
        pass

    def save(self) -> None:
        pass


def _open_history(interactive: bool) -> _History | _NoHistory:
    if not interactive:
        return _NoHistory()
    try:
        import readline  # also makes input() editable: arrows, Ctrl-R
    except ImportError:
        return _NoHistory()
    return _History(readline, os.environ.get(HISTORY_ENV, os.path.join(os.path.expanduser("~"), ".rtindex_history")))


def run(run_statement: Callable[[str], None], commands: dict[str, Callable[[], None]], *,
        failures: tuple[type[Exception], ...], interactive: bool, banner: str) -> int:
    """Read and run statements until the end of input or ``.quit``; the exit status.

    ``run_statement(sql)`` prints one result; one of the ``failures`` it raises is reported
    in a line, and the shell goes on (anything else is a bug, and its traceback shows).
    ``commands`` maps each extra dot command (``.collections``) to what it prints. At the end
    of piped input a last statement without ``;`` runs too; on a terminal, Ctrl-D leaves
    without running a half-typed one.
    """
    splitter, history, failed = Splitter(), _open_history(interactive), False

    def attempt(action: Callable[..., None], *args: str) -> None:
        nonlocal failed
        try:
            action(*args)
        except BrokenPipeError:  # whoever read the output has gone: so does the shell
            raise
        except failures as e:
            failed = True
            print(f"error: {e}", file=sys.stderr, flush=True)
        except KeyboardInterrupt:
            print("interrupted", file=sys.stderr, flush=True)
        sys.stdout.flush()

    if interactive:
        print(banner)
    try:
        while True:
            try:
                line = input((CONTINUE if splitter.pending else PROMPT) if interactive else "")
            except EOFError:
                if interactive:
                    print()  # Ctrl-D leaves the cursor after the prompt
                break
            except KeyboardInterrupt:  # Ctrl-C drops the statement being typed, not the shell
                print()
                splitter.reset()
                history.mark()
                continue
            word = line.strip().rstrip(";").strip()
            if not splitter.pending and word.startswith("."):
                if word in (".quit", ".exit"):
                    break
                if word == ".help":
                    print(HELP)
                elif word in commands:
                    attempt(commands[word])
                else:
                    failed = True
                    print(f"error: unknown command {word} (.help lists the commands)", file=sys.stderr)
                history.mark()
                continue
            for statement in splitter.feed(line):
                history.merge(statement)
                attempt(run_statement, statement)
                history.mark()
    finally:
        history.save()
    if not interactive:
        rest = splitter.rest()
        if rest is not None:
            attempt(run_statement, rest)
    return 1 if failed and not interactive else 0
